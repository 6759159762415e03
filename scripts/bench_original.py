"""Training tokens/s of ours against the original Cramming code (JonasGeiping/cramming), same architecture, in turn.

    python scripts/bench_original.py --original /path/to/JonasGeiping-cramming     # 4 x 256 and 8 x 512, 4 rounds
    python scripts/bench_original.py --original PATH --sizes 4x256 --rounds 2 --steps 2   # a quick look

The original code is not a dependency: without --original the script says so and exits. Its package is also named
`cramming`, so its model files are loaded under the name `cramming_original` (only cramming/architectures/
crammed_bert.py and what it imports: components, attention, embeddings; transformers, einops and omegaconf, which
our environment has), never its __init__ (that wants pynvml, hydra's config tree and a GPU).

What is compared, per size (LAYERS x HIDDEN: the preset of ours with those dimensions, crammed-bert-tiny = 4 x 256,
crammed-bert-mini = 8 x 512; the original's `crammed-bert` arch config set to the same layers, width, heads and FFN
width): pre-norm LayerNorm blocks, no biases in the projections, GELU-GLU FFN (ffn_size in, ffn_size / 2 out),
scaled-sinusoidal positions, embedding and final norm, tied decoder without bias, the sparse MLM head on the
masked 25 %. The parameter lists match except that the original's LayerNorms keep biases (printed below). Dropout
is off on both sides (the original pretrains with model.train(False); ours has dropout 0).

Each side is built and stepped by its own code: ours as pretrain.py builds it with impl=cpu (SDPA attention, the
loss impl.loss=auto picks, torch's fused AdamW: cramming.run.build_run) and stepped by the run's own step
(Run.update: forward, backward, the engine's clip at 0.5, finite check and AdamW step); the original's model from
construct_crammed_bert and torch AdamW as its backend builds it for its `bert-o4` train config on a CPU (its two
weight-decay groups, lr 1e-3, betas (0.9, 0.98), eps 1e-12, weight decay 0.01, no foreach, no fused: the
single-tensor loop), stepped as its backend steps (forward, backward, clip at 0.5, AdamW step, zero_grad). fp32,
eager, no compile. Both see the same batches: random ids, masked once by our MLM objective (32 of each 128
positions) before timing, so masking is outside the timed steps on both sides (the original masks in its data
loader).

Method: torch.set_num_threads(--threads); per size both models are built and warmed up (--warmup steps each),
then --rounds rounds of --steps timed steps per side. Within a round the sides take turns step by step on the same
batch (ours, original, then original, ours, ...; the next round starts with the other side), so a burst of load
from other processes hits both sides alike. A round's tokens/s per side is batch x seq over its median step time,
and the round's ratio is ours / original tokens/s; the median and mean of the rounds are printed, then each side's
median milliseconds per phase of a step, read off the same hooks on both sides (PhaseClock: forward; backward
with the clip; the optimizer step; the rest), and every step time goes to --json if given.
"""

import argparse
import importlib
import itertools
import json
import os
import statistics
import sys
import time
import types
from pathlib import Path

import torch

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "scripts"))

PRESETS = {(4, 256): "crammed-bert-tiny", (8, 512): "crammed-bert-mini"}
CLIP = 0.5


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--original", type=Path, help="a checkout of JonasGeiping/cramming (the folder holding cramming/)")
    p.add_argument("--sizes", default="4x256,8x512", help="LAYERSxHIDDEN, comma-separated: %(default)s")
    p.add_argument("--rounds", type=int, default=4, help="alternating rounds per size")
    p.add_argument("--steps", type=int, default=6, help="timed training steps per side and round")
    p.add_argument("--warmup", type=int, default=2, help="untimed steps per side before the first round")
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--seq", type=int, default=128)
    p.add_argument("--vocab", type=int, default=8192)
    p.add_argument("--threads", type=int, default=2, help="torch.set_num_threads")
    p.add_argument("--json", type=Path, help="write the rounds and ratios here")
    args = p.parse_args(argv)
    args.sizes = [tuple(int(x) for x in s.lower().split("x")) for s in args.sizes.split(",") if s.strip()]
    if unknown := [f"{l}x{h}" for l, h in args.sizes if (l, h) not in PRESETS]:
        p.exit(2, f"error: --sizes {', '.join(unknown)}: choose from {', '.join(f'{l}x{h}' for l, h in PRESETS)}\n")
    if min(args.rounds, args.steps, args.batch, args.seq, args.vocab, args.threads) < 1 or args.warmup < 0:
        p.exit(2, "error: --rounds, --steps, --batch, --seq, --vocab and --threads must be positive\n")
    return args


def load_original(path: Path):
    """The original's crammed_bert module and its arch config folder, imported as cramming_original.*."""
    root = path / "cramming"
    if not (root / "architectures" / "crammed_bert.py").is_file():
        sys.exit(f"error: --original {path}: no cramming/architectures/crammed_bert.py there")
    for name, folder in (("cramming_original", root), ("cramming_original.architectures", root / "architectures")):
        package = types.ModuleType(name)  # a bare package: its __init__ (GPU and hydra set-up) is not run
        package.__path__ = [str(folder)]
        sys.modules[name] = package
    return importlib.import_module("cramming_original.architectures.crammed_bert"), root / "config"


def build_original(module, config_dir: Path, ours_arch, vocab: int, mask_prob: float):
    """The original's crammed-bert at our preset's dimensions, and its AdamW as its backend builds it on a CPU."""
    from omegaconf import OmegaConf

    cfg = OmegaConf.create({"arch": OmegaConf.load(config_dir / "arch" / "crammed-bert.yaml"),
                            "train": {"objective": {"mlm_probability": mask_prob}}})
    arch = cfg.arch
    arch.num_transformer_layers, arch.hidden_size = ours_arch.num_layers, ours_arch.hidden_size
    arch.intermed_size, arch.attention.num_attention_heads = ours_arch.ffn_size, ours_arch.num_heads
    arch.hidden_dropout_prob = arch.embedding.dropout_prob = arch.attention.dropout_prob = 0.0
    model = module.construct_crammed_bert(arch, vocab)
    model.train(False)  # its pretrain.py: model_engine.train(cfg.train.pretrain_in_train_mode=False)
    train = OmegaConf.load(config_dir / "train" / "bert-o4.yaml")
    optim = OmegaConf.merge(OmegaConf.load(config_dir / "train" / "optim" / "adam.yaml"), train.optim)
    no_decay = list(train.limited_decay_keys)
    named = list(model.named_parameters())
    limited = [any(k in n for k in no_decay) for n, _ in named]
    groups = [{"params": [p for (_, p), lim in zip(named, limited) if not lim], "weight_decay": optim.weight_decay},
              {"params": [p for (_, p), lim in zip(named, limited) if lim], "weight_decay": 0.0}]
    kwargs = {k: v for k, v in OmegaConf.to_container(optim).items() if k != "type"}
    kwargs["betas"] = tuple(kwargs["betas"])
    return {"model": model, "opt": torch.optim.AdamW(groups, **kwargs)}


def build_ours(preset: str, seq: int, vocab: int):
    """Ours as pretrain.py builds it (cramming.run.build_run); its step is the run's own (Run.update)."""
    from bench_sections.train import build_ours as build

    config, _, ours = build(preset, seq, vocab, torch.device("cpu"), smoke=False)
    run = ours["run"]
    run.model.train()
    return config, {"model": run.step_model, "opt": run.optimizer, "objective": run.objective,
                    "step": run.update, "loss": ours["loss"]}


def original_step(side: dict):
    """The original's training step as its backend takes one (torch_default.py's step and optimizer_step, one
    microbatch, its CPU scaler and scheduler being no-ops): forward, backward, clip, optimizer step, zero_grad."""
    def step(inputs: dict):
        loss = side["model"](**inputs)["loss"]
        loss.backward()
        torch.nn.utils.clip_grad_norm_(side["model"].parameters(), CLIP)
        side["opt"].step()
        side["opt"].zero_grad()
        return loss.detach()
    return step


PHASES = ("forward", "backward", "optimizer", "rest")


class PhaseClock:
    """The wall seconds of a step's PHASES, read off hooks that both sides' steps pass alike: the model's forward
    returning (ours' forward includes the fused loss's gradient), the optimizer's step starting and ending. So
    "backward" runs from the forward's end to the optimizer's start (the backward, the clip and, ours, the finite
    check) and "rest" from its end to the step's (zero_grad)."""

    def __init__(self, side: dict):
        self.marks = []
        side["model"].register_forward_hook(lambda *_: self.marks.append(time.perf_counter()))
        side["opt"].register_step_pre_hook(lambda *_: self.marks.append(time.perf_counter()))
        side["opt"].register_step_post_hook(lambda *_: self.marks.append(time.perf_counter()))

    def time(self, step, inputs: dict) -> tuple[list[float], float]:
        """The wall seconds of each phase, and the CPU seconds (all of the process's threads) of one step."""
        cpu = time.process_time()
        self.marks = [time.perf_counter()]
        step(inputs)
        self.marks.append(time.perf_counter())
        used = time.process_time() - cpu
        assert len(self.marks) == len(PHASES) + 1, f"{len(self.marks)} marks: a hook did not fire once"
        return [b - a for a, b in itertools.pairwise(self.marks)], used


def parameter_note(ours: torch.nn.Module, theirs: torch.nn.Module) -> dict:
    norm_bias = sum(p.numel() for n, p in theirs.named_parameters() if "norm" in n and n.endswith(".bias"))
    return {"ours": sum(p.numel() for p in ours.parameters()), "original": sum(p.numel() for p in theirs.parameters()),
            "original_norm_biases": norm_bias}


def measure(size, args, original) -> dict:
    layers, hidden = size
    torch.manual_seed(0)
    config, ours = build_ours(PRESETS[size], args.seq, args.vocab)
    assert (config.arch.num_layers, config.arch.hidden_size) == size, config.arch
    theirs = build_original(*original, config.arch, args.vocab, config.train.mask_prob)
    params = parameter_note(ours["model"], theirs["model"])
    generator = torch.Generator().manual_seed(0)

    def batches(count):
        ids = [torch.randint(5, args.vocab, (args.batch, args.seq), generator=generator) for _ in range(count)]
        return [ours["objective"].batch(row, generator) for row in ids]

    theirs["step"] = original_step(theirs)
    sides = {"ours": ours, "original": theirs}
    clocks = {name: PhaseClock(side) for name, side in sides.items()}
    for inputs in batches(args.warmup):
        for side in sides.values():
            side["step"](inputs)
    tokens = args.batch * args.seq
    rounds, phase_times = [], {name: [] for name in sides}
    for r in range(args.rounds):
        times, cpu = {name: [] for name in sides}, {name: [] for name in sides}
        for i, inputs in enumerate(batches(args.steps)):  # the same batch for both sides, in turn step by step
            for name in (["ours", "original"] if (r + i) % 2 == 0 else ["original", "ours"]):
                phases, used = clocks[name].time(sides[name]["step"], inputs)
                times[name].append(sum(phases))
                cpu[name].append(used)
                phase_times[name].append(phases)
        med = {name: statistics.median(t) for name, t in times.items()}
        rnd = {f"{name}_tokens_per_s": tokens / s for name, s in med.items()}
        rnd |= {"ratio": med["original"] / med["ours"], "step_times": times, "cpu_times": cpu,
                "cpu_ratio": statistics.median(cpu["original"]) / statistics.median(cpu["ours"]),
                "load_average": round(os.getloadavg()[0], 2)}
        rounds.append(rnd)
        print(f"  {layers} x {hidden} round {r + 1}: ours {rnd['ours_tokens_per_s']:,.0f} tokens/s, original "
              f"{rnd['original_tokens_per_s']:,.0f} tokens/s (median steps), ratio {rnd['ratio']:.3f} (CPU seconds: "
              f"{rnd['cpu_ratio']:.3f}; load average {rnd['load_average']})", flush=True)
    ratios = [r["ratio"] for r in rounds]
    phases_ms = {name: {phase: 1e3 * statistics.median(column) for phase, column in zip(PHASES, zip(*steps))}
                 for name, steps in phase_times.items()}  # over every timed step of every round
    return {"size": f"{layers}x{hidden}", "preset": PRESETS[size], "loss_impl": ours["loss"], "params": params,
            "rounds": rounds, "median_ratio": statistics.median(ratios), "mean_ratio": statistics.fmean(ratios),
            "phases_ms": phases_ms}


def main(argv=None) -> int:
    args = parse_args(argv)
    if args.original is None:
        print("skipped: give --original PATH, a checkout of https://github.com/JonasGeiping/cramming (it is not a "
              "dependency of this repository), to compare against it")
        return 0
    torch.set_num_threads(args.threads)
    original = load_original(args.original.resolve())
    print(f"torch {torch.__version__}, {torch.get_num_threads()} threads, batch {args.batch} x {args.seq}, "
          f"vocab {args.vocab}, {args.rounds} rounds x {args.steps} steps per side (after {args.warmup} warm-up)")
    results = []
    for size in args.sizes:
        result = measure(size, args, original)
        p = result["params"]
        print(f"{result['size']} ({result['preset']}, impl.loss={result['loss_impl']}): params ours {p['ours']:,}, "
              f"original {p['original']:,} (of which LayerNorm biases {p['original_norm_biases']:,}); ours/original "
              f"tokens/s: median {result['median_ratio']:.3f}x, mean {result['mean_ratio']:.3f}x, rounds "
              + ", ".join(f"{r['ratio']:.3f}" for r in result["rounds"]), flush=True)
        for name, phases in result["phases_ms"].items():
            print(f"  {name}: median ms per phase over all timed steps: "
                  + ", ".join(f"{phase} {ms:,.1f}" for phase, ms in phases.items()), flush=True)
        results.append(result)
    if args.json:
        args.json.write_text(json.dumps({"args": {k: str(v) for k, v in vars(args).items()}, "torch": torch.__version__,
                                         "results": results}, indent=1), encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
