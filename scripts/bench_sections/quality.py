"""Section 2: quality per budget, the validation MLM loss each model reaches in the same wall-clock budget.

Ours: `pretrain.py arch=crammed-bert-tiny impl=cpu train=cpu-smoke data=local-text ...` as a subprocess, exactly as a
user runs it (budget-triangle learning rate, batch ramp, sparse head, fused AdamW). Hugging Face: `BertForMaskedLM`
of the same dimensions (dropout 0 like ours), in this process, trained the usual way for the same budget: the
`DataCollatorForLanguageModeling` masks at our rate (train.mask_prob), full-vocabulary head, torch AdamW.

What makes it fair: the same tokenizer and the same token sequences in the same order (our prepared cache, read by
cramming.data.loader.train_batches with the same seed), the same recipe around the model (peak lr, betas, eps,
weight decay, gradient clipping, the budget-triangle schedule and the batch-size ramp driven by the same budget
clock, microbatch 32), the same budget measured the same way (the clock starts once the model is built and stops the
step in progress when it runs out), and one evaluation for both: cramming.train.heldout.heldout_metrics on the
same validation sequences with the same masks (25 %, seeded), our model reloaded from its checkpoint. Both runs take
turns on the same machine, one after the other, so noise shows up as tokens trained, not as a different measure.
"""

import json
import subprocess
import time
from contextlib import nullcontext
from pathlib import Path

import torch

from .common import compose_config, launch, table, target, wait_ok
from .prep import data_overrides
from .train import SMOKE_ARCH


def pretrain_overrides(corpus: Path, cache: Path, args, minutes: float) -> list[str]:
    return ["arch=crammed-bert-tiny", "impl=cpu", "train=cpu-smoke", "train.resume=never",
            *data_overrides(corpus, cache, [f"data.seq_length={args.seq}", f"data.vocab_size={args.vocab}"]),
            f"budget={minutes / 60}", *(SMOKE_ARCH + ["train.validation_sequences=32"] if args.smoke else [])]


def start_ours(overrides: list[str], run_dir: Path) -> subprocess.Popen:
    return launch("pretrain.py", [*overrides, "name=bench-quality", f"hydra.run.dir={run_dir}"])


def finish_ours(proc: subprocess.Popen, run_dir: Path) -> dict:
    wait_ok(proc, "pretrain.py")
    return json.loads((run_dir / "train_summary.json").read_text())


def train_hf(config, folder: Path, meta: dict, seconds: float) -> tuple[torch.nn.Module, dict]:
    """BertForMaskedLM trained for `seconds` on our token stream, with our recipe around it."""
    from transformers import BertConfig, BertForMaskedLM, DataCollatorForLanguageModeling

    from cramming.data.loader import train_batches
    from cramming.data.prepare import load_tokenizer
    from cramming.pretraining import seed_everything
    from cramming.train.microbatch import microbatch_size
    from cramming.train.schedule import SCHEDULES, batch_size_at

    arch, cfg = config.arch, config.train
    seed_everything(config.seed)
    model = BertForMaskedLM(BertConfig(
        vocab_size=meta["vocab_size"], hidden_size=arch.hidden_size, num_hidden_layers=arch.num_layers,
        num_attention_heads=arch.num_heads, intermediate_size=arch.ffn_size, max_position_embeddings=meta["seq_length"],
        pad_token_id=meta["special_ids"]["pad"], hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0))
    optimizer = torch.optim.AdamW(model.parameters(), lr=cfg.lr, betas=tuple(cfg.betas), eps=cfg.eps,
                                  weight_decay=cfg.weight_decay)
    collator = DataCollatorForLanguageModeling(load_tokenizer(folder), mlm_probability=cfg.mask_prob)
    microbatch = microbatch_size(config)
    batches = train_batches(folder, meta, config.data.ordering, config.seed, microbatch, 0, False)
    schedule = SCHEDULES.get_or_explain(cfg.schedule)
    model.train()
    steps = tokens = 0
    start = time.perf_counter()
    while (fraction := (time.perf_counter() - start) / seconds) < 1.0:
        accumulation = batch_size_at(fraction, cfg.batch_size, microbatch, cfg.batch_ramp) // microbatch
        for group in optimizer.param_groups:
            group["lr"] = cfg.lr * schedule(fraction, cfg.warmup, cfg.cooldown)
        done = 0
        while done < accumulation:
            features = collator([{"input_ids": row} for row in next(batches)])
            (model(**features).loss / accumulation).backward()
            done += 1
            tokens += features["input_ids"].numel()
            if time.perf_counter() - start >= seconds:
                break
        if done < accumulation:  # as our trainer: the mean over the microbatches actually seen
            for p in model.parameters():
                if p.grad is not None:
                    p.grad.mul_(accumulation / done)
        torch.nn.utils.clip_grad_norm_(model.parameters(), cfg.grad_clip or float("inf"))
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        steps += 1
    elapsed = time.perf_counter() - start
    return model, {"steps": steps, "tokens": tokens, "train_seconds": elapsed, "tokens_per_s": tokens / elapsed,
                   "parameters": sum(p.numel() for p in model.parameters())}


def evaluate(model, config, folder: Path, meta: dict) -> dict:
    from cramming.train.heldout import heldout_metrics
    from cramming.train.microbatch import microbatch_size
    from cramming.train.objectives import build_objective

    objective = build_objective("mlm", config.train, meta, torch.device("cpu"))
    return heldout_metrics(model, objective, folder, meta, config.train, microbatch_size(config),
                              torch.device("cpu"), nullcontext)


def run(args, work: Path, corpus: Path, cache: Path) -> dict:
    from transformers import AutoModelForMaskedLM

    from cramming.data.prepare import prepare_data

    minutes = args.quality_minutes
    overrides = pretrain_overrides(corpus, cache, args, minutes)
    config = compose_config(overrides)
    folder, meta = prepare_data(config.data)  # the data section's cache, which pretrain.py uses too
    # One after the other, so neither slows the other; --smoke overlaps them (its numbers mean nothing anyway).
    print(f"  ours: pretrain.py for {minutes:g} min, then HF BertForMaskedLM for {minutes:g} min ...", flush=True)
    proc = start_ours(overrides, work / "quality-ours")
    summary = None if args.smoke else finish_ours(proc, work / "quality-ours")
    hf_model, hf = train_hf(config, folder, meta, minutes * 60)
    summary = summary or finish_ours(proc, work / "quality-ours")
    ours_model = AutoModelForMaskedLM.from_pretrained(summary["checkpoint"], trust_remote_code=True)
    ours_eval = evaluate(ours_model, config, folder, meta)
    hf_eval = evaluate(hf_model, config, folder, meta)
    ours = {"steps": summary["steps"], "tokens": summary["tokens"], "tokens_per_s": summary["tokens_per_s"],
            "train_seconds": summary["wall_seconds"]["train"] + summary["wall_seconds"]["compile"],
            "parameters": summary["parameters"], "val_loss_pretrain_py": summary["val_loss"],
            "untrained_val_loss": summary["untrained_val_loss"], **ours_eval}
    hf.update(hf_eval)
    ratio = ours["val_loss"] / hf["val_loss"]
    rows = [[name, m["parameters"] / 1e6, m["train_seconds"], m["steps"], m["tokens"], m["tokens_per_s"],
             m["val_loss"], m["val_accuracy"]] for name, m in (("ours (crammed-bert-tiny)", ours),
                                                                 ("HF BertForMaskedLM", hf))]
    markdown = (f"Budget {minutes:g} min each on the data section's 1x corpus ({meta['train_sequences']:,} training "
                f"sequences of {meta['seq_length']} tokens, vocabulary {meta['vocab_size']:,}); validation on "
                f"{ours['val_predicted_tokens']:,} masked tokens of the same held-out sequences. Untrained: "
                f"{ours['untrained_val_loss']:.2f}.\n\n"
                + table(["model", "params (M)", "train s", "steps", "tokens", "tokens/s", "val loss", "val acc"], rows))
    return {"status": "ok", "budget_minutes": minutes, "ours": ours, "HF": hf, "loss_ratio": ratio,
            "checkpoint": summary["checkpoint"], "markdown": markdown,
            "targets": [target("quality", f"val MLM loss ours/HF after {minutes:g} min", ratio, "< 1.0", "<", 1.0, unit="")]}
