"""The exportable presets against Cramming's own at equal budget, measured on the machine at hand.

    python scripts/compare_presets.py --docs     # about 50 minutes on 2 cores, then docs/huggingface.md's table
    python scripts/compare_presets.py --smoke    # seconds-sized, tiny sizes: the same path, numbers meaning nothing

Stages, each skipped when its output is already complete (run the same command again after an interruption):
  1. corpus    record.py's: the python-docs corpus plus the shared prose (../shared/data) where there is any
  2. prepare   as record.py's: one tokenizer and one set of token sequences for every run
  3. pretrain  pretrain.py arch=<preset> train=cpu-smoke impl=cpu on that data, every preset for the same budget,
               two side by side with one CPU thread each, each beside its reference where there is one
               (crammed-bert-tiny runs twice: once beside modernbert-tiny, once beside bert-tiny)
  4. finetune  eval.py on RTE (Cramming's recipe, the whole training set) for each preset, two jobs at a time,
               when <shared>/glue exists; skipped, with the reason in the report, otherwise
  5. report    <out>/presets.md; --docs also writes it into docs/huggingface.md between its presets markers
"""

import argparse
import json
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "scripts")]

from record import State, last_line, launch, open_state, say, stage_corpus

from cramming.outputs import remove

# name of a run: (preset, kind, the run it is compared against). Rounds run two at a time, side by side.
RUNS = {
    "crammed-bert-tiny": ("crammed-bert-tiny", "masked", None),
    "modernbert-tiny": ("modernbert-tiny", "masked", "crammed-bert-tiny"),
    "crammed-bert-tiny-2": ("crammed-bert-tiny", "masked", None),
    "bert-tiny": ("bert-tiny", "masked", "crammed-bert-tiny-2"),
    "gpt-tiny": ("gpt-tiny", "causal", None),
    "llama-tiny": ("llama-tiny", "causal", "gpt-tiny"),
}
ROUNDS = [("crammed-bert-tiny", "modernbert-tiny"), ("crammed-bert-tiny-2", "bert-tiny"), ("gpt-tiny", "llama-tiny")]
FINETUNED = ["crammed-bert-tiny", "modernbert-tiny", "bert-tiny", "gpt-tiny", "llama-tiny"]  # not the repeat
# RTE epochs: eval.py's 5 do not fit. Measured on 2 cores: one epoch of one seed on a 4 x 256 model (2,490
# examples, then the 277 of dev) takes about 1.2 minutes with two jobs at a time, so 5 models x 3 seeds x 5 epochs
# would be 45 minutes on top of the pretraining's 27; 2 epochs are 18, and the whole run about 46 minutes.
EPOCHS = 2
MARKER = "presets"


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=REPO / "outputs" / "presets")
    p.add_argument("--shared", type=Path, default=REPO.parent / "shared" / "data", help="GLUE and the prose")
    p.add_argument("--minutes", type=float, default=8.0, help="pretraining budget of each run")
    p.add_argument("--seeds", type=int, default=3, help="RTE fine-tuning seeds per model (median and range)")
    p.add_argument("--epochs", type=int, default=EPOCHS,
                   help=f"RTE epochs (eval.py's default is 5; {EPOCHS} fits the run's time on 2 cores)")
    p.add_argument("--jobs", type=int, default=2, help="fine-tuning processes at a time (one thread each)")
    p.add_argument("--docs", action="store_true", help="also write the table into docs/huggingface.md")
    p.add_argument("--smoke", action="store_true", help="tiny sizes and budgets: checks the path in seconds")
    args = p.parse_args(argv)
    if args.smoke:
        args.minutes, args.seeds, args.epochs = 0.1, 1, 1
    return args


def data_overrides(args) -> list[str]:
    """What every run shares: data, tokenizer, sequences, validation rows, seed (record.py's, which prepared it)."""
    import record

    shared = [o for o in record.data_overrides(args) if not o.startswith("arch")]
    # the smoke's python-docs alone (300k characters, no prose) holds out no 64-token sequence at the usual 1 %
    return [*shared, "data.validation_fraction=0.05"] if args.smoke else shared


def stage_prepare(args, state: State) -> dict:
    """record.py's prepare stage, on these overrides (the same data folder as record.py's outside --smoke)."""
    import record

    return record.stage_prepare(args, state, data_overrides(args))


def arch_overrides(args, preset: str) -> list[str]:
    small = ["arch.num_layers=2", "arch.hidden_size=32", "arch.num_heads=2", "arch.ffn_size=64"] if args.smoke else []
    return [f"arch={preset}", *small]


def stage_pretrain(args, state: State) -> None:
    shared = data_overrides(args)
    for i, pair in enumerate(ROUNDS):
        stage = f"pretrain-{i + 1}"
        if state.done(stage):
            continue
        started, procs = time.time(), {}
        for name in pair:
            folder = args.out / "runs" / name
            remove(folder)  # a link there is removed, never what it leads to
            folder.mkdir(parents=True)
            procs[name] = launch(["pretrain.py", *shared, *arch_overrides(args, RUNS[name][0]), f"name=presets-{name}",
                                  f"budget={args.minutes / 60}", "train.checkpoint_every_minutes=null",
                                  "train.resume=never", f"hydra.run.dir={folder}"], args.out / "runs" / f"{name}.log")
        say(f"pretraining {' and '.join(pair)} for {args.minutes:g} min each, side by side")
        while any(p.poll() is None for p in procs.values()):
            time.sleep(2 if args.smoke else 60)
            parts = []
            for name in pair:
                last = last_line(args.out / "runs" / name / "metrics.jsonl", "loss")
                parts.append(f"{name} step {last.get('step', 0)} loss {last.get('loss', float('nan')):.3f}")
            say("  " + " | ".join(parts))
        for name, proc in procs.items():
            if proc.returncode != 0 or not (args.out / "runs" / name / "train_summary.json").is_file():
                log = args.out / "runs" / f"{name}.log"
                tail = log.read_text(encoding="utf-8", errors="replace").strip().splitlines()[-1:]
                sys.exit(f"error: pretrain.py arch={RUNS[name][0]} failed (exit {proc.returncode}): {tail}; see {log}")
        state.finish(stage, started)


def summary(args, name: str) -> dict:
    return json.loads((args.out / "runs" / name / "train_summary.json").read_text())


def complete(job_dir: Path) -> bool:
    try:
        return json.loads((job_dir / "results.json").read_text()).get("complete", False)
    except (OSError, ValueError):
        return False


def finetune_jobs(args) -> list[dict]:
    jobs = []
    for name in FINETUNED:
        extra = ["eval.max_train_examples=48", "eval.recipe.max_length=64"] if args.smoke else []
        jobs.append({"name": name, "args": [
            "eval.py", f"checkpoint={summary(args, name)['checkpoint']}", "eval.tasks=[rte]",
            f"eval.data_dir={args.shared / 'glue'}", f"eval.seeds={args.seeds}", f"eval.recipe.epochs={args.epochs}",
            "impl=cpu", f"hydra.run.dir={args.out / 'rte' / name}", *extra]})
    return jobs


def stage_finetune(args, state: State) -> None:
    if state.done("finetune"):
        return
    if not (args.shared / "glue").is_dir():
        state.data["finetune_skipped"] = f"no GLUE data ({args.shared / 'glue'} does not exist)"
        say(f"fine-tuning skipped: {state.data['finetune_skipped']}")
        return
    started, folder = time.time(), args.out / "rte"
    folder.mkdir(parents=True, exist_ok=True)
    waiting = [j for j in finetune_jobs(args) if not complete(folder / j["name"])]
    running, failed = {}, []
    say(f"fine-tuning on RTE: {len(waiting)} eval.py jobs ({args.seeds} seeds, {args.epochs} epochs each; eval.py's "
        f"default is 5 epochs), {args.jobs} at a time")
    while waiting or running:
        while waiting and len(running) < args.jobs:
            job = waiting.pop(0)
            running[job["name"]] = (launch(job["args"], folder / f"{job['name']}.log"), time.time())
        time.sleep(1 if args.smoke else 10)
        for name, (proc, since) in list(running.items()):
            if proc.poll() is not None:
                del running[name]
                ok = proc.returncode == 0 and complete(folder / name)
                failed += [] if ok else [name]
                state.data.setdefault("job_minutes", {})[name] = round((time.time() - since) / 60, 2)
                say(f"  {name}: {'done' if ok else f'FAILED (exit {proc.returncode})'} in "
                    f"{(time.time() - since) / 60:.1f} min; {len(waiting) + len(running)} to go")
    if failed:
        sys.exit(f"error: fine-tuning failed for {', '.join(failed)}; see {folder}/<job>.log, then run again")
    state.finish("finetune", started)


def rte(args, name: str) -> dict | None:
    """Median and range of RTE dev accuracy over the seeds, from eval.py's results.json."""
    path = args.out / "rte" / name / "results.json"
    if not path.is_file():
        return None
    dev = json.loads(path.read_text())["models"]["pretrained"]["tasks"]["rte"]["summary"]["dev"]
    return {"median": dev["median"], "min": dev["min"], "max": dev["max"]}


def facts(args, name: str) -> dict:
    s = summary(args, name)
    return {"parameters": s["parameters"], "steps": s["steps"], "tokens": s["tokens"],
            "tokens_per_s": s["tokens_per_s"], "val_loss": s["val_loss"], "rte": rte(args, name)}


def signed(x: float, digits: int) -> str:
    return f"{x:+.{digits}f}".replace("-", "−")


def report(args, state: State) -> str:
    rows = {name: facts(args, name) for name in RUNS}
    m, settings = state.data["machine"], state.data["settings"]
    minutes = {k: v["seconds"] / 60 for k, v in state.data.items() if isinstance(v, dict) and "seconds" in v}
    pretrain = sum(v for k, v in minutes.items() if k.startswith("pretrain-"))
    wall = (f"pretraining {pretrain:.1f} min (3 rounds of two runs)"
            + (f", RTE fine-tuning {minutes['finetune']:.1f} min ({settings['jobs']} jobs at a time)"
               if "finetune" in minutes else ""))
    text = (f"Budget **{settings['minutes']:g} minutes** of pretraining per run, two runs side by side with one CPU "
            f"thread each. Machine: {m['cpu']}, {m['cpus_usable']} usable CPUs; torch {m['torch']}, transformers "
            f"{m['transformers']}; started {m['date']}. Command: `{state.data['command']}`. Wall time: {wall}.\n\n")
    if state.data.get("finetune_skipped"):
        text += f"RTE not fine-tuned: {state.data['finetune_skipped']}.\n\n"
    else:
        text += (f"RTE: eval.py's recipe (Cramming's: AdamW lr 4e-5, batch 16, cosine with 10 % warm-up) on the whole "
                 f"training set, **{settings['epochs']} epoch{'s' if settings['epochs'] != 1 else ''}** (eval.py's "
                 f"default is 5: they do not fit this run's time on 2 cores), dev accuracy, median over "
                 f"{settings['seeds']} seeds (range).\n\n")
    text += ("| preset | kind | beside | parameters | steps | tokens seen | tokens/s | val loss | Δ loss | "
             "RTE acc | Δ RTE |\n|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|\n")
    pair = {a: b for x, y in ROUNDS for a, b in ((x, y), (y, x))}
    for name, (preset, kind, ref) in RUNS.items():
        r = rows[name]
        label = preset if name == preset else f"{preset} (again)"
        loss_kind = "MLM" if kind == "masked" else "next-token"
        ref_rte = rows[ref]["rte"] if ref else None
        if ref and ref_rte is None and RUNS[ref][0] in rows:  # the repeat is not fine-tuned: the first run's RTE
            ref_rte = rows[RUNS[ref][0]]["rte"]
        dloss = signed(r["val_loss"] - rows[ref]["val_loss"], 3) if ref else ""
        drte = signed(r["rte"]["median"] - ref_rte["median"], 1) if ref and r["rte"] and ref_rte else ""
        cell = (f"{r['rte']['median']:.1f} ({r['rte']['min']:.1f}–{r['rte']['max']:.1f})" if r["rte"] else "—")
        text += (f"| {'**' + label + '**' if not ref else label} | {kind} ({loss_kind} loss) | {RUNS[pair[name]][0]} | "
                 f"{r['parameters'] / 1e6:.2f} M | {r['steps']:,} | {r['tokens'] / 1e6:.2f} M | "
                 f"{r['tokens_per_s']:,.0f} | {r['val_loss']:.3f} | {dloss} | {cell} | {drte} |\n")
    text += ("\nBold: a reference. Δ: the preset minus its reference (the run beside it: crammed-bert-tiny for the "
             "masked presets, gpt-tiny for llama-tiny); a lower loss is better, and masked and causal losses do "
             "not compare. crammed-bert-tiny ran twice, beside modernbert-tiny and beside bert-tiny; the two runs "
             "show the noise of the measure. Only the first is fine-tuned, and bert-tiny's Δ RTE is against it.\n")
    return text


KEPT = ("minutes", "seeds", "epochs", "smoke")  # fixed once started


def main(argv=None) -> None:
    args = parse_args(argv)
    command = ["python", "scripts/compare_presets.py", *(sys.argv[1:] if argv is None else argv)]
    state = open_state(args, KEPT, "comparison", command=" ".join(command))
    stage_corpus(args, state)
    stage_prepare(args, state)
    stage_pretrain(args, state)
    stage_finetune(args, state)
    text = report(args, state)
    (args.out / "presets.md").write_text(text, encoding="utf-8")
    if args.docs:
        from record_report import replace_between

        replace_between(REPO / "docs" / "huggingface.md", MARKER, text)
    say(f"results: {args.out / 'presets.md'}")
    print(text, flush=True)


if __name__ == "__main__":
    main()
