"""The record run's Hugging Face side: `BertForMaskedLM` pretrained the way `run_mlm.py` and the Trainer do it, for
the same wall-clock budget, on the same token sequences as ours (scripts/record.py starts this as a subprocess).

Hugging Face's usual recipe, as the record decides it: `BertConfig` defaults (post-norm, GELU MLP, dropout 0.1,
learned positions) with the intermediate size that gives it our parameter count; `DataCollatorForLanguageModeling`
at 15 % (80/10/10); torch AdamW at the Trainer's defaults (betas 0.9/0.999, eps 1e-8, gradient clipping 1.0) with
weight decay 0.01 off biases and LayerNorm (as the Trainer groups them); a fixed batch; the Trainer's linear
schedule (warm-up, then linear decay to 0), laid over the budget as fractions because a wall-clock budget has no
step count to give it. The one pretraining-from-scratch departure from `run_mlm.py`'s fine-tuning defaults: a peak
learning rate of 5e-4 with 6 % warm-up (RoBERTa's small-model setting) instead of 5e-5 with none.

Measured exactly as ours is: the clock starts once the model is built, stops at the budget, and pauses while the
validation loss is measured (every --validate-every minutes, on our validation sequences with our masks, through
cramming.train.heldout.heldout_metrics). Writes <out>/metrics.jsonl, <out>/summary.json and <out>/checkpoint/
(save_pretrained plus the tokenizer, which eval.py fine-tunes like any checkpoint); summary.json comes last.
"""

import argparse
import json
import sys
import time
from contextlib import nullcontext
from pathlib import Path

import torch

sys.path[:0] = [str(Path(__file__).resolve().parents[1]), str(Path(__file__).resolve().parent)]

HF_RECIPE = {"lr": 5e-4, "warmup": 0.06, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.01,
             "grad_clip": 1.0, "mlm_probability": 0.15, "batch_size": 64}


def equal_parameters_config(arch: dict, meta: dict):
    """BertConfig with our dimensions and the intermediate size whose parameter count is closest to ours."""
    from transformers import BertConfig, BertForMaskedLM

    def config(intermediate: int):
        return BertConfig(vocab_size=meta["vocab_size"], hidden_size=arch["hidden_size"],
                          num_hidden_layers=arch["num_layers"], num_attention_heads=arch["num_heads"],
                          intermediate_size=intermediate, max_position_embeddings=meta["seq_length"],
                          pad_token_id=meta["special_ids"]["pad"])

    def count(intermediate: int) -> int:
        with torch.device("meta"):
            return sum(p.numel() for p in BertForMaskedLM(config(intermediate)).parameters())

    base, per_unit = count(1), count(101) - count(1)  # parameters grow linearly with the intermediate size
    intermediate = max(1, round(1 + (arch["parameters"] - base) * 100 / per_unit))
    return config(intermediate)


def decay_groups(model, weight_decay: float) -> list[dict]:
    """The Trainer's grouping: no weight decay on biases and LayerNorm weights."""
    plain = [p for n, p in model.named_parameters() if n.endswith("bias") or "LayerNorm" in n]
    decayed = [p for n, p in model.named_parameters() if not (n.endswith("bias") or "LayerNorm" in n)]
    return [{"params": decayed, "weight_decay": weight_decay}, {"params": plain, "weight_decay": 0.0}]


def linear_with_warmup(fraction: float, warmup: float) -> float:
    """get_linear_schedule_with_warmup's shape over the budget fraction instead of the step count."""
    return fraction / warmup if fraction < warmup else max(0.0, (1 - fraction) / (1 - warmup))


def validation_measure(train_cfg, folder, meta, batch_size: int):
    """Our validation loss on our validation sequences and masks, for any masked LM: measure(model) -> metrics."""
    from cramming.train.heldout import heldout_metrics
    from cramming.train.objectives import build_objective

    objective = build_objective("mlm", train_cfg, meta, torch.device("cpu"))
    return lambda model: heldout_metrics(model, objective, folder, meta, train_cfg, batch_size,
                                            torch.device("cpu"), nullcontext)


def train(model, collator, batches, seconds: float, validation, log) -> dict:
    """The budget loop; `validation` (our PeriodicHeldout) pauses the clock. Returns steps, tokens, seconds."""
    r = HF_RECIPE
    optimizer = torch.optim.AdamW(decay_groups(model, r["weight_decay"]), lr=r["lr"], betas=r["betas"],
                                  eps=r["eps"], fused=True)
    steps = tokens = 0
    start = time.perf_counter()
    model.train()
    while (elapsed := time.perf_counter() - start - validation.seconds) < seconds:
        for group in optimizer.param_groups:
            group["lr"] = r["lr"] * linear_with_warmup(elapsed / seconds, r["warmup"])
        features = collator([{"input_ids": row} for row in next(batches)])
        loss = model(**features).loss
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), r["grad_clip"])
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        steps += 1
        tokens += features["input_ids"].numel()
        elapsed = time.perf_counter() - start - validation.seconds
        log({"step": steps, "loss": loss.item(), "lr": optimizer.param_groups[0]["lr"], "tokens": tokens,
             "elapsed_s": round(elapsed, 3)})
        if validation.due(elapsed):
            at = time.perf_counter()
            record = validation.measure()
            validation.seconds += time.perf_counter() - at  # the clock stops while validating
            model.train()
            log({"step": steps, "event": "validation", "tokens": tokens, "elapsed_s": round(elapsed, 6), **record})
    return {"steps": steps, "tokens": tokens, "train_seconds": time.perf_counter() - start - validation.seconds,
            "validation_seconds": validation.seconds}


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--overrides", required=True, help="JSON list: our pretrain.py overrides (data, train)")
    parser.add_argument("--arch", required=True, help="JSON: our model's dimensions and parameter count")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--minutes", type=float, required=True)
    parser.add_argument("--validate-every", type=float, required=True, help="minutes of budget")
    args = parser.parse_args(argv)

    from bench_sections.common import compose_config
    from transformers import BertForMaskedLM, DataCollatorForLanguageModeling

    from cramming.atomic import write_atomic
    from cramming.data.loader import train_batches
    from cramming.data.prepare import load_tokenizer, prepare_data
    from cramming.pretraining import seed_everything
    from cramming.train.heldout import PeriodicHeldout

    config = compose_config(json.loads(args.overrides))
    folder, meta = prepare_data(config.data)  # the cache the driver already built
    seed_everything(config.seed)
    tokenizer = load_tokenizer(folder)
    model = BertForMaskedLM(equal_parameters_config(json.loads(args.arch), meta))
    collator = DataCollatorForLanguageModeling(tokenizer, mlm_probability=HF_RECIPE["mlm_probability"])
    batches = train_batches(folder, meta, config.data.ordering, config.seed, HF_RECIPE["batch_size"], 0, False)
    measure = validation_measure(config.train, folder, meta, 64)
    args.out.mkdir(parents=True, exist_ok=True)
    with open(args.out / "metrics.jsonl", "w", encoding="utf-8") as fh:
        def log(record):
            fh.write(json.dumps(record) + "\n")
            fh.flush()

        untrained = measure(model)
        log({"step": 0, "event": "validation", "tokens": 0, "elapsed_s": 0.0, **untrained})
        validation = PeriodicHeldout(args.validate_every, lambda: measure(model))
        result = train(model, collator, batches, args.minutes * 60, validation, log)
        final = measure(model)
        log({"step": result["steps"], **final})
    model.save_pretrained(args.out / "checkpoint")
    tokenizer.save_pretrained(args.out / "checkpoint")
    summary = {**result, **final, "untrained_val_loss": untrained["val_loss"], "recipe": HF_RECIPE,
               "parameters": sum(p.numel() for p in model.parameters()),
               "intermediate_size": model.config.intermediate_size,
               "tokens_per_s": result["tokens"] / result["train_seconds"], "checkpoint": str(args.out / "checkpoint")}
    write_atomic(args.out / "summary.json", json.dumps(summary, indent=2))  # last: the run is complete


if __name__ == "__main__":
    main()
