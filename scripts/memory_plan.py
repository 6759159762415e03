"""The arithmetic behind docs/distributed.md: per-GPU memory under DDP and FSDP2, and the time of one optimizer
step's compute against its communication, for our presets and a family of wider models.

Parameter counts are exact (each model is built on the meta device from conf/arch/crammed-bert.yaml with the
width and depth changed). Everything else is a stated model, not a measurement:
- training state: fp32 weights + fp32 gradients + AdamW's two fp32 moments = 16 bytes per parameter; DDP keeps
  all of it on every GPU, FSDP2 a 1/N shard plus two unsharded blocks (weights and gradients) in flight;
- activations: 34 * hidden bytes per token and layer (bf16, SDPA/flash attention, no recomputation; Korthikanti
  et al. 2022, "Reducing Activation Recomputation in Large Transformer Models"), for one microbatch;
- compute: 6 * parameters * tokens per step / (GPUs * peak * MFU);
- communication: ring collectives move (N-1)/N of the payload per GPU. DDP all-reduces the fp32 gradients once
  per optimizer step (we reduce on the last microbatch only: 2x payload); FSDP2 all-gathers the fp32 weights for
  the forward and again for the backward of every microbatch and reduce-scatters the gradients once per step.

Usage: python scripts/memory_plan.py [--gpu-gib 141] [--gpus 8] [--bandwidth-gbs 450] [--markdown]
"""

import argparse
from pathlib import Path

import torch
from hydra import compose, initialize_config_dir

from cramming.data.tokenizer import SPECIAL_IDS
from cramming.impl import Runtime
from cramming.run import build_model
from cramming.validation import load_config

REPO = Path(__file__).resolve().parents[1]
# (name, layers, hidden, heads): our recipe, then wider and deeper members of the same family
FAMILY = [("crammed-bert", 16, 768, 12), ("24x1024", 24, 1024, 16), ("24x2048", 24, 2048, 16),
          ("32x4096", 32, 4096, 32), ("48x6144", 48, 6144, 48), ("80x8192", 80, 8192, 64)]
GIB = 2**30


def parameters(layers: int, hidden: int, heads: int) -> int:
    overrides = ["arch=crammed-bert", f"arch.num_layers={layers}", f"arch.hidden_size={hidden}",
                 f"arch.num_heads={heads}", f"arch.ffn_size={4 * hidden}"]
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        config = load_config(compose(config_name="pretrain", overrides=overrides))
    with torch.device("meta"):
        model = build_model(config.arch, config.data.vocab_size, SPECIAL_IDS,
                            Runtime(torch.device("cpu"), "bf16", False))
    return sum(p.numel() for p in model.parameters())


def plan(args) -> list[dict]:
    rows, n = [], args.gpus
    tokens_micro, tokens_step = args.microbatch * args.seq, args.batch * args.seq
    for name, layers, hidden, heads in FAMILY:
        p = parameters(layers, hidden, heads)
        block = 12 * hidden * hidden  # weights of one block (attention 4h^2 + GLU FFN ~8h^2)
        activations = 34 * hidden * layers * tokens_micro
        ddp = 16 * p + activations
        fsdp = 16 * p / n + 2 * 8 * block + activations
        compute = 6 * p * tokens_step / (n * args.peak_tflops * 1e12 * args.mfu)
        bandwidth = args.bandwidth_gbs * 1e9
        accumulation = max(1, args.batch // (args.microbatch * n))
        ddp_comm = 2 * (n - 1) / n * 4 * p / bandwidth
        fsdp_comm = (2 * accumulation + 1) * (n - 1) / n * 4 * p / bandwidth
        rows.append(dict(model=name, params=p, ddp_gib=ddp / GIB, fsdp_gib=fsdp / GIB, compute_s=compute,
                         ddp_comm_s=ddp_comm, fsdp_comm_s=fsdp_comm, accumulation=accumulation,
                         ddp_fits=ddp <= args.usable * args.gpu_gib * GIB,
                         fsdp_fits=fsdp <= args.usable * args.gpu_gib * GIB))
    return rows


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gpus", type=int, default=8)
    ap.add_argument("--gpu-gib", type=float, default=141.0, help="memory per GPU (H200: 141, H100: 80, A6000: 48)")
    ap.add_argument("--usable", type=float, default=0.9, help="share of it the allocator can give us")
    ap.add_argument("--peak-tflops", type=float, default=989.4, help="dense bf16 peak (H100/H200 SXM datasheet)")
    ap.add_argument("--mfu", type=float, default=0.4, help="assumed model FLOP utilisation")
    ap.add_argument("--bandwidth-gbs", type=float, default=450.0,
                    help="per-GPU collective bandwidth, GB/s (NVLink 4 one way: 450; 400 Gb/s InfiniBand: 50)")
    ap.add_argument("--batch", type=int, default=8192, help="sequences per optimizer step")
    ap.add_argument("--microbatch", type=int, default=128)
    ap.add_argument("--seq", type=int, default=128)
    args = ap.parse_args()
    print(f"{args.gpus} GPUs x {args.gpu_gib:g} GiB ({args.usable:.0%} usable), {args.peak_tflops:g} TFLOP/s at "
          f"{args.mfu:.0%} MFU, {args.bandwidth_gbs:g} GB/s per GPU; batch {args.batch} x {args.seq} tokens, "
          f"microbatch {args.microbatch}\n")
    print("| model | parameters | DDP GiB/GPU | FSDP2 GiB/GPU | compute s/step | DDP comm s/step | "
          "FSDP2 comm s/step |")
    print("|---|---|---|---|---|---|---|")
    for r in plan(args):
        ddp = f"{r['ddp_gib']:,.1f}" + ("" if r["ddp_fits"] else " (does not fit)")
        fsdp = f"{r['fsdp_gib']:,.1f}" + ("" if r["fsdp_fits"] else " (does not fit)")
        print(f"| {r['model']} | {r['params'] / 1e6:,.0f} M | {ddp} | {fsdp} | {r['compute_s']:.3f} | "
              f"{r['ddp_comm_s']:.3f} | {r['fsdp_comm_s']:.3f} |")


if __name__ == "__main__":
    main()
