"""Training throughput and MFU of our crammed BERT next to Hugging Face's BertForMaskedLM.

Both models get the same dimensions (layers, hidden, heads, FFN width, vocabulary, 128 positions), the
same random token batches (ids 5..vocab-1), the same masks (cramming.train.masking.mask_tokens, 25 %,
fixed count, re-seeded per step so both models see identical masks) and the same step: mask, forward,
backward, grad-norm clip, optimizer step, zero_grad. Ours is built exactly as pretrain.py builds it
(sparse MLM head, build_optimizer); HF is trained "the usual way": a full-vocabulary MLM head over every
position with labels -100 on unmasked positions, plain torch AdamW. Steps are interleaved one model at
a time (ours, HF, ours, HF, ...) so machine noise hits both; the median step time is reported.

Usage (from the repo root):
    .venv/bin/python scripts/bench_train.py                      # crammed-bert-tiny, batch 32 x 128, cpu
    .venv/bin/python scripts/bench_train.py --steps 5 --threads 2 --json bench.json
    .venv/bin/python scripts/bench_train.py --arch crammed-bert-mini --device cuda --batch 128
"""

import argparse
import json
import statistics
import time
from contextlib import nullcontext
from pathlib import Path

import torch
from hydra import compose, initialize_config_dir
from transformers import BertConfig, BertForMaskedLM

from cramming.config import load_config
from cramming.data.tokenizer import SPECIAL_IDS
from cramming.impl import resolve
from cramming.pretraining import build_model
from cramming.train.masking import mask_tokens
from cramming.train.optim import build_optimizer

REPO = Path(__file__).resolve().parents[1]
SPECIAL = SPECIAL_IDS


def parse_args():
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--arch", default="crammed-bert-tiny", choices=["crammed-bert-tiny", "crammed-bert-mini"])
    p.add_argument("--batch", type=int, default=32, help="sequences per step")
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--vocab", type=int, default=32768)
    p.add_argument("--steps", type=int, default=10, help="timed steps per model")
    p.add_argument("--rounds", type=int, default=None, help="alternations; default = --steps (one step per turn)")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps per model first")
    p.add_argument("--threads", type=int, default=None, help="torch.set_num_threads (default: torch's)")
    p.add_argument("--device", default="cpu", choices=["cpu", "cuda"])
    p.add_argument("--json", type=Path, default=None, help="also write the results here")
    return p.parse_args()


def build_ours(args, device):
    overrides = [f"arch={args.arch}", f"data.vocab_size={args.vocab}", f"data.seq_length={args.seq}",
                 f"arch.max_seq_length={max(128, args.seq)}", f"impl.device={device.type}"]
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        config = load_config(compose("pretrain", overrides=overrides))
    model = build_model(config.arch, args.vocab, SPECIAL, resolve(config.impl, config.arch)).to(device)
    return config, model, build_optimizer(model, config.train, device), config.train.grad_clip


def build_hf(arch, args, train_cfg, device):
    # Same dimensions; dropout 0 like ours (Cramming trains without dropout), so the comparison is the
    # implementation (sparse head, GLU, no biases, fused paths), not a regulariser. Everything else default.
    cfg = BertConfig(vocab_size=args.vocab, hidden_size=arch.hidden_size, num_hidden_layers=arch.num_layers,
                     num_attention_heads=arch.num_heads, intermediate_size=arch.ffn_size,
                     max_position_embeddings=max(128, args.seq), pad_token_id=SPECIAL["pad"],
                     hidden_dropout_prob=0.0, attention_probs_dropout_prob=0.0)
    model = BertForMaskedLM(cfg).to(device)
    return model, torch.optim.AdamW(model.parameters(), lr=train_cfg.lr, weight_decay=train_cfg.weight_decay)


def flops_per_step(arch, args, layer_params, head_params, decoded):
    """Standard count (Kaplan/Chinchilla-style; fwd = 2 FLOPs per MAC, bwd = 2x fwd):
    6 * N_layers * tokens + 12 * layers * seq * hidden * tokens (QK^T and AV) + 6 * N_head * decoded,
    where N_layers are the transformer-layer parameters (non-embedding, used by every token) and N_head the
    MLM head (optional transform + vocabulary projection), counted only on the positions it decodes."""
    tokens = args.batch * args.seq
    attention = 12 * arch.num_layers * args.seq * arch.hidden_size * tokens
    return 6 * layer_params * tokens + attention + 6 * head_params * decoded


def measure_peak(device, dtype, n=2048, repeats=5):
    """Best-of-`repeats` square matmul throughput in the compute dtype: the MFU denominator."""
    a, b = (torch.randn(n, n, device=device, dtype=dtype) for _ in range(2))
    best = float("inf")
    for _ in range(repeats + 1):  # the first one warms up
        sync(device)
        start = time.perf_counter()
        a @ b
        sync(device)
        best = min(best, time.perf_counter() - start)
    return 2 * n**3 / best


def sync(device):
    if device.type == "cuda":
        torch.cuda.synchronize()


def main():
    args = parse_args()
    # Flush denormals to zero: AdamW's second-moment estimates decay into the denormal range on CPU,
    # and x86 handles denormals in microcode, which makes the optimizer step many times slower.
    torch.set_flush_denormal(True)
    if args.threads:
        torch.set_num_threads(args.threads)
    rounds = args.rounds or args.steps
    if args.steps % rounds:
        raise SystemExit("--steps must be a multiple of --rounds")
    device = torch.device(args.device)
    torch.manual_seed(0)
    dtype = torch.bfloat16 if device.type == "cuda" else torch.float32
    autocast = (lambda: torch.autocast("cuda", dtype=torch.bfloat16)) if device.type == "cuda" else nullcontext

    config, ours, ours_opt, clip = build_ours(args, device)
    arch = config.arch
    hf, hf_opt = build_hf(arch, args, config.train, device)
    special = torch.tensor(list(SPECIAL.values()), device=device)
    masked = args.batch * max(1, round(config.train.mask_prob * args.seq))
    tokens = args.batch * args.seq

    def nparams(modules):
        return sum(p.numel() for m in modules for p in m.parameters())

    models = {
        "ours": dict(model=ours, opt=ours_opt, params=nparams([ours]), layers=nparams([ours.encoder.layers]),
                     head=nparams([ours.transform]) + ours.decoder.weight.numel(), decoded=masked),
        "HF": dict(model=hf, opt=hf_opt, params=nparams([hf]), layers=nparams([hf.bert.encoder]),
                   head=nparams([hf.cls.predictions.transform]) + hf.cls.predictions.decoder.weight.numel(),
                   decoded=tokens),
    }
    batch_gen = torch.Generator(device=device)

    def step(entry, index):
        """One training step on batch `index`: identical tokens and masks for both models."""
        batch_gen.manual_seed(1000 + index)
        batch = torch.randint(5, args.vocab, (args.batch, args.seq), generator=batch_gen, device=device)
        sync(device)
        start = time.perf_counter()
        inputs, labels = mask_tokens(batch, config.train.mask_prob, SPECIAL["mask"], args.vocab, special,
                                     config.train.mask_token_share, batch_gen)
        with autocast():
            loss = entry["model"](input_ids=inputs, labels=labels).loss
        loss.backward()
        # Both clip (our trainer always does; HF's Trainer does by default): same step for both.
        torch.nn.utils.clip_grad_norm_(entry["model"].parameters(), clip or float("inf"))
        entry["opt"].step()
        entry["opt"].zero_grad(set_to_none=True)
        sync(device)
        return time.perf_counter() - start

    print(f"{args.arch}: {arch.num_layers} layers, hidden {arch.hidden_size}, {arch.num_heads} heads, "
          f"ffn {arch.ffn_size} ({arch.ffn}); batch {args.batch} x {args.seq}, vocab {args.vocab}, "
          f"device {device}, {torch.get_num_threads()} threads, {args.steps} timed steps in {rounds} rounds",
          flush=True)
    peak = measure_peak(device, dtype)
    for entry in models.values():
        entry["model"].train()
        entry["times"] = []
        for i in range(args.warmup):
            step(entry, -1 - i)
    for r in range(rounds):
        for entry in models.values():
            for i in range(args.steps // rounds):
                entry["times"].append(step(entry, r * (args.steps // rounds) + i))

    results = {"arch": args.arch, "batch": args.batch, "seq": args.seq, "vocab": args.vocab,
               "device": str(device), "threads": torch.get_num_threads(), "peak_flops": peak, "models": {}}
    for name, e in models.items():
        median = statistics.median(e["times"])
        # "model FLOPs" MFU: the same useful work for both models, i.e. the MLM head counted on the masked
        # positions only (predicting unmasked tokens is thrown away by the -100 labels). "executed" MFU
        # counts the head on the positions each model actually decodes (HF: all of them).
        useful = flops_per_step(arch, args, e["layers"], e["head"], masked)
        executed = flops_per_step(arch, args, e["layers"], e["head"], e["decoded"])
        results["models"][name] = dict(
            params=e["params"], layer_params=e["layers"], head_params=e["head"], step_s=median,
            step_times=e["times"], tokens_per_s=tokens / median, model_flops=useful, executed_flops=executed,
            mfu=useful / median / peak, executed_mfu=executed / median / peak)
    speedup = results["models"]["HF"]["step_s"] / results["models"]["ours"]["step_s"]
    results["speedup"] = speedup

    print(f"peak ({dtype}, 2048^3 matmul, best of 5): {peak / 1e9:.1f} GFLOP/s")
    print("FLOPs/step = 6*N_layers*tokens + 12*layers*seq*hidden*tokens + 6*N_head*decoded "
          f"(tokens={tokens}, masked={masked}); MFU counts the head on masked positions for both, "
          "executed MFU on the positions each model decodes")
    print("\n| model | params | step time (median) | tokens/s | MFU (model FLOPs) | MFU (executed) |")
    print("|---|---:|---:|---:|---:|---:|")
    for name, m in results["models"].items():
        print(f"| {name} | {m['params'] / 1e6:.2f}M | {m['step_s'] * 1e3:.0f} ms | {m['tokens_per_s']:,.0f} | "
              f"{100 * m['mfu']:.1f}% | {100 * m['executed_mfu']:.1f}% |")
    print(f"\nspeedup ours/HF: {speedup:.2f}x (target >= 1.5x)")
    if args.json:
        args.json.write_text(json.dumps(results, indent=2))
        print(f"wrote {args.json}")


if __name__ == "__main__":
    main()
