"""Section 7: training steps with token dropping (arch.token_dropping.keep=0.5) against the same model without it.

The model is crammed-bert-tiny at the paper's depth, 12 layers (the reference's split: layer 5 updates the kept
tokens attending to all, layers 6-10 see the kept ones only),
built as pretrain.py builds it (cramming.run.build_run: the MLM objective's masking, impl.loss=auto,
torch.compile on GPU), twice from the same seed: once with arch.token_dropping.keep=0.5 and once without. Both
take full training steps (Run.step: forward with labels, backward, clip, AdamW) on the same random token
batches (ids 5..vocab-1), one timed step at a time in turn, after a warm-up step each; the median step counts. The
figure is the ratio of the medians: how many more tokens per second dropping trains, beside the ratio the FLOPs
count predicts (cramming.run.flops_per_token, whose kept-only layers count at k tokens). On CPU it is
measured at one torch thread and at the default count, as section 6 is.
"""

import torch

from .common import at_each_thread_count, compose_config, table, taking_turns, target, thread_counts, timed

ARCH = ["arch=crammed-bert-tiny", "arch.num_layers=12"]
SMOKE_ARCH = ["arch=crammed-bert-tiny", "arch.num_layers=3", "arch.hidden_size=64", "arch.num_heads=2",
              "arch.ffn_size=128"]
KEEP = 0.5


def build(keep, seq: int, vocab: int, device, smoke: bool) -> dict:
    """One side, the run pretrain.py builds (cramming.run.build_run), from the same seed as the other."""
    from cramming.run import build_run

    overrides = [*(SMOKE_ARCH if smoke else ARCH), f"data.vocab_size={vocab}", f"data.seq_length={seq}",
                 f"impl={'gpu' if device.type == 'cuda' else 'cpu'}", f"arch.token_dropping.keep={keep}"]
    config = compose_config(overrides)
    torch.manual_seed(0)
    run = build_run(config)
    run.model.train()
    return {"run": run, "flops": run.flops, "config": config}


def measure(sides: dict, batch: int, seq: int, vocab: int, rounds: int, device) -> dict:
    """Median step seconds of each side, the steps taking turns on the same batches after a warm-up step."""
    generator = torch.Generator(device=device)

    def step(side, index):
        generator.manual_seed(1000 + index)
        ids = torch.randint(5, vocab, (batch, seq), generator=generator, device=device)
        return timed(lambda: side["run"].step(ids, generator), device)

    medians, times = taking_turns(sides, rounds, step)
    return {"step_s": medians, "times": times, "speedup": medians["full"] / medians["dropping"]}


def run(args, device) -> dict:
    batch, seq, vocab, rounds = (2, 32, 512, 1) if args.smoke else (16, 128, args.vocab, args.train_rounds)
    sides = {"dropping": build(KEEP, seq, vocab, device, args.smoke), "full": build("null", seq, vocab, device,
                                                                                      args.smoke)}
    predicted = sides["full"]["flops"] / sides["dropping"]["flops"]
    from cramming.model.token_dropping import dropping_layers, kept_only_layers

    arch = sides["dropping"]["config"].arch
    layers, dropping, kept_only = arch.num_layers, dropping_layers(arch), kept_only_layers(arch)
    counts = thread_counts(device)
    print(f"  crammed-bert-tiny x {layers} layers: batch {batch} x {seq}, vocab {vocab}, keep {KEEP}, {rounds} timed "
          f"steps each, torch threads {counts}", flush=True)
    results = at_each_thread_count(counts, lambda: measure(sides, batch, seq, vocab, rounds, device))
    tokens = batch * seq
    rows, targets = [], []
    for threads, r in results.items():
        for name in ("dropping", "full"):
            label = f"arch.token_dropping.keep={KEEP}" if name == "dropping" else "no dropping"
            rows.append([threads, label, sides[name]["flops"] / 1e6, r["step_s"][name] * 1e3,
                         tokens / r["step_s"][name], f"{r['speedup']:.2f}x" if name == "dropping" else ""])
        targets.append(target("token-dropping", f"training tokens/s, keep {KEEP} / no dropping ({threads} torch "
                              f"thread{'s' if threads > 1 else ''}; FLOPs predict {predicted:.2f}x)",
                              r["speedup"], "report", "report", None))
    markdown = (f"crammed-bert-tiny at {layers} layers (dropping layers [{dropping.start}, {dropping.stop}), kept-only "
                f"[{kept_only.start}, {kept_only.stop})), batch {batch} x {seq}, vocab {vocab}, "
                f"{'bf16 autocast + compile' if device.type == 'cuda' else 'fp32'}; median of {rounds} alternating "
                f"training steps each. The FLOPs count predicts {predicted:.2f}x.\n\n"
                + table(["torch threads", "model", "fwd MFLOPs/token", "step (ms, median)", "tokens/s", "speed-up"],
                        rows))
    return {"status": "ok", "batch": batch, "seq": seq, "vocab": vocab, "keep": KEEP, "predicted": predicted,
            "results": {str(k): {key: v for key, v in r.items()} for k, r in results.items()}, "targets": targets,
            "markdown": markdown}
