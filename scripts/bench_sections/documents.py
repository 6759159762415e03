"""Section 8: training steps with data.document_masking=true against the same model without it.

Two cases, the MLM of crammed-bert-tiny and the CLM of gpt-tiny (4 x 256 each), each built as pretrain.py builds
it (cramming.run.build_run: the kernels resolved with documents, the objective with documents, impl.loss=auto,
torch.compile on GPU), twice from the same seed: once with data.document_masking=true
(the objective adds each row's document ids; the model restarts positions at each document and its attention
kernel masks the pairs across documents) and once without. The batches are packed rows as the data pipeline
writes them: [CLS], then random ids 5..vocab-1 in which each position closes a document ([SEP]) with probability
4 / seq, so document lengths are geometric with mean seq / 4 (32 tokens at seq 128) and the row's last document
runs on past its end, as packed documents do. Both sides take full training steps (Run.step: forward with labels,
backward, clip, AdamW) on the same batches, one timed step at a time in turn, after a warm-up step each; the
median step counts. The figure is tokens/s with / without (1.0 = free; the target: at most 10 % slower on CPU).
The FLOPs are the same; what masking costs is the mask (SDPA's boolean mask instead of its unmasked path, the
Triton kernel's per-token ids) and the restarted positions. On CPU it is measured at one torch thread and at the
default count, as sections 6 and 7 are.
"""

import torch

from .common import at_each_thread_count, compose_config, table, taking_turns, target, thread_counts, timed

CASES = ["crammed-bert-tiny", "gpt-tiny"]
SMOKE_ARCH = ["arch.num_layers=1", "arch.hidden_size=64", "arch.num_heads=2", "arch.ffn_size=128"]
DOCUMENTS_PER_ROW = 4  # each position closes a document with probability DOCUMENTS_PER_ROW / seq
TARGET = 0.9  # with / without: at most 10 % slower


def build(arch_name: str, documents: bool, seq: int, vocab: int, device, smoke: bool) -> dict:
    """One side, the run pretrain.py builds (cramming.run.build_run), from the same seed as the other."""
    from cramming.run import build_run

    overrides = [f"arch={arch_name}", f"data.vocab_size={vocab}", f"data.seq_length={seq}",
                 f"impl={'gpu' if device.type == 'cuda' else 'cpu'}",
                 f"data.document_masking={str(documents).lower()}", *(SMOKE_ARCH if smoke else [])]
    config = compose_config(overrides)
    torch.manual_seed(0)
    run = build_run(config)
    return {"run": run, "model": run.model.train(), "objective": run.objective, "attention": run.runtime.attention,
            "config": config}


def packed_batch(index: int, batch: int, seq: int, vocab: int, generator, device) -> torch.Tensor:
    """Batch `index`, the same for both sides: [CLS] + random ids, [SEP] closing documents of geometric length."""
    from cramming.data.tokenizer import SPECIAL_IDS

    generator.manual_seed(1000 + index)
    ids = torch.randint(5, vocab, (batch, seq), generator=generator, device=device)
    ends = torch.rand((batch, seq), generator=generator, device=device) < DOCUMENTS_PER_ROW / seq
    ids = ids.masked_fill(ends, SPECIAL_IDS["sep"])
    ids[:, 0] = SPECIAL_IDS["cls"]
    return ids


def check_sides(sides: dict, seq: int, vocab: int, device) -> None:
    """Refuse to time a pair in which only the masked side's batches carry document ids: else the ratio is noise."""
    generator = torch.Generator(device=device)
    ids = packed_batch(0, 2, seq, vocab, generator, device)
    carried = {name: "document_ids" in side["objective"].batch(ids, generator) for name, side in sides.items()}
    if carried != {"with": True, "without": False}:
        raise RuntimeError(f"document ids in the batches of each side: {carried}; expected only the masked side's")


def measure(sides: dict, batch: int, seq: int, vocab: int, rounds: int, device) -> dict:
    """Median step seconds of each side, the steps taking turns on the same batches after a warm-up step."""
    generator = torch.Generator(device=device)

    def step(side, index):
        ids = packed_batch(index, batch, seq, vocab, generator, device)
        return timed(lambda: side["run"].step(ids, generator), device)

    medians, times = taking_turns(sides, rounds, step)
    return {"step_s": medians, "times": times, "ratio": medians["without"] / medians["with"]}


def documents_per_row(batch: int, seq: int, vocab: int, rounds: int, device) -> float:
    """The mean count of documents a row of the timed batches holds (its last one cut off by the row's end)."""
    from cramming.data.tokenizer import SPECIAL_IDS
    from cramming.train.objectives import documents_of

    generator = torch.Generator(device=device)
    rows = [documents_of(packed_batch(r, batch, seq, vocab, generator, device), SPECIAL_IDS["sep"])["document_ids"]
            for r in range(rounds)]
    return float(torch.cat(rows)[:, -1].float().add(1).mean())


def report(case: str, sides: dict, results: dict, batch: int, seq: int, on_cpu: bool) -> tuple[list, list]:
    """(table rows, targets) of one case: each side at each thread count, the ratio on the masked row."""
    rows, targets = [], []
    objective = sides["with"]["config"].arch.objective
    for threads, r in results.items():
        for name in ("with", "without"):
            rows.append([threads, f"{case} ({objective})", "true" if name == "with" else "false",
                         sides[name]["attention"], r["step_s"][name] * 1e3, batch * seq / r["step_s"][name],
                         f"{r['ratio']:.3f}x" if name == "with" else ""])
        targets.append(target("documents", f"{case} ({objective}): training tokens/s, data.document_masking=true / "
                              f"false ({threads} torch thread{'s' if threads > 1 else ''})", r["ratio"],
                              f">= {TARGET}x" if on_cpu else "report", ">=" if on_cpu else "report", TARGET))
    return rows, targets


def measure_case(case: str, counts: list, batch: int, seq: int, vocab: int, rounds: int, device,
                 smoke: bool) -> tuple[list, list, dict]:
    """(table rows, targets, result) of one model: both sides built, checked and timed at each thread count."""
    sides = {"with": build(case, True, seq, vocab, device, smoke),
             "without": build(case, False, seq, vocab, device, smoke)}
    check_sides(sides, seq, vocab, device)
    results = at_each_thread_count(counts, lambda: measure(sides, batch, seq, vocab, rounds, device))
    rows, targets = report(case, sides, results, batch, seq, device.type == "cpu")
    return rows, targets, {"objective": sides["with"]["config"].arch.objective,
                           "attention": {name: side["attention"] for name, side in sides.items()},
                           "results": {str(k): r for k, r in results.items()}}


def run(args, device) -> dict:
    batch, seq, vocab, rounds = ((2, 32, 512, 1) if args.smoke else
                                 (128 if device.type == "cuda" else 16, 128, args.vocab, args.train_rounds))
    counts = thread_counts(device)
    per_row = documents_per_row(batch, seq, vocab, rounds, device)
    print(f"  {', '.join(CASES)}: batch {batch} x {seq}, vocab {vocab}, {per_row:.1f} documents per row, {rounds} "
          f"timed steps each, torch threads {counts}", flush=True)
    rows, targets, cases = [], [], {}
    for case in CASES:
        case_rows, case_targets, cases[case] = measure_case(case, counts, batch, seq, vocab, rounds, device, args.smoke)
        rows, targets = rows + case_rows, targets + case_targets
    markdown = (f"crammed-bert-tiny (MLM) and gpt-tiny (CLM), batch {batch} x {seq}, vocab {vocab}, "
                f"{'bf16 autocast + compile' if device.type == 'cuda' else 'fp32'}; packed rows of random ids with "
                f"documents of geometric length (mean {seq // DOCUMENTS_PER_ROW} tokens; {per_row:.1f} documents per "
                f"row); median of {rounds} alternating training steps each. Target: with / without >= {TARGET}x"
                f"{' on CPU' if device.type == 'cuda' else ''}.\n\n"
                + table(["torch threads", "model", "data.document_masking", "attention", "step (ms, median)",
                         "tokens/s", "with / without"], rows))
    return {"status": "ok", "batch": batch, "seq": seq, "vocab": vocab, "documents_per_row": per_row,
            "cases": cases, "targets": targets, "markdown": markdown}
