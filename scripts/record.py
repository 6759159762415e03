"""The CPU record run: what a budget buys, measured end to end on the machine at hand.

    python scripts/record.py                  # the record (about 90 minutes on 2 cores), then docs/results.md
    python scripts/record.py --smoke          # seconds-sized, tiny sizes: the same path, numbers meaning nothing

Stages, each skipped when its output is already complete (run the same command again after an interruption):
  1. corpus    the embedded python-docs corpus plus the shared prose (../shared/data), placed in <out>/corpus/ (hard links or copies: a data folder's links out are refused)
  2. prepare   one tokenizer and one set of token sequences for both pretraining runs
  3. pretrain  ours (pretrain.py, arch=crammed-bert-micro, Cramming's recipe) and Hugging Face's
               (scripts/record_hf.py: BertForMaskedLM of equal parameters, run_mlm.py's recipe) for the same
               budget, side by side with one CPU thread each, so that the machine's noise hits both alike;
               an interrupted stage starts both again
  4. finetune  eval.py (Cramming's GLUE recipe, full training sets) on ours, its random-init twin
               (eval.baseline=random-init) and HF's, one job per model and task, two at a time
  5. report    <out>/results.md and the plots (scripts/record_report.py); --docs also writes docs/results.md
"""

import argparse
import json
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO), str(REPO / "scripts")]

from cramming.outputs import remove

# (tasks, seeds, epochs of SST-2) that fit the record's time on 2 cores; the rest of the recipe is eval.py's
TASKS = ["cola", "sst2", "stsb", "rte"]
PROSE = ["gutenberg-nltk/*.txt", "tinyshakespeare/input.txt", "us-presidential-speeches/*/*.txt",
         "wikitext-2/raw/*.raw"]
THREADS = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}  # one core per process: two processes share the machine


def parse_args(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=REPO / "outputs" / "record")
    p.add_argument("--shared", type=Path, default=REPO.parent / "shared" / "data", help="GLUE and the prose")
    p.add_argument("--minutes", type=float, default=30.0, help="pretraining budget of each model")
    p.add_argument("--validate-every", type=float, default=2.0, help="minutes of budget between validations")
    p.add_argument("--tasks", default=",".join(TASKS))
    p.add_argument("--seeds", type=int, default=3, help="fine-tuning seeds per task (median and range)")
    p.add_argument("--sst2-seeds", type=int, default=1, help="SST-2's 67k examples cost most: its own count")
    p.add_argument("--sst2-epochs", type=int, default=1, help="the recipe's 5 do not fit the record's time")
    p.add_argument("--jobs", type=int, default=2, help="fine-tuning processes at a time (one thread each)")
    p.add_argument("--docs", action="store_true", help="also write docs/results.md, docs/results/*.png, README")
    p.add_argument("--smoke", action="store_true", help="tiny sizes and budgets: checks the path in seconds")
    args = p.parse_args(argv)
    if args.smoke:
        args.minutes, args.validate_every, args.seeds, args.sst2_seeds = 0.15, 0.05, 1, 1
    args.tasks = [t for t in args.tasks.split(",") if t]
    return args


def say(text: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {text}", flush=True)


class State:
    """<out>/state.json: which stages are done and how long each took (the report's wall times)."""

    def __init__(self, out: Path):
        self.path = out / "state.json"
        self.data = json.loads(self.path.read_text()) if self.path.exists() else {}

    def done(self, stage: str) -> bool:
        return self.data.get(stage, {}).get("done", False)

    def finish(self, stage: str, started: float, **facts) -> None:
        from cramming.atomic import write_atomic

        self.data[stage] = {"done": True, "seconds": round(time.time() - started, 1), **facts}
        write_atomic(self.path, json.dumps(self.data, indent=2))


def open_state(args, kept: tuple[str, ...], what: str, **first) -> State:
    """<out>'s State, the folder made when new. An --out that holds files but no state.json is someone else's
    (stages remove and rewrite their own folders in it): refused, left as it is. A run resumed with other `kept`
    settings than it started with is refused too. first: what a new run records beside its settings."""
    out = args.out
    if out.is_dir() and any(out.iterdir()) and not (out / "state.json").is_file():
        sys.exit(f"error: --out {out} holds files and is not a {what} folder (no state.json); it was left as it is: "
                 "give a new or empty folder")
    out.mkdir(parents=True, exist_ok=True)
    state = State(out)
    if not state.data.get("settings"):  # the settings a resumed run must keep
        state.data["settings"] = {k: str(v) if isinstance(v, Path) else v for k, v in vars(args).items()}
        state.data.update(first)
    else:
        changed = [k for k in kept if state.data["settings"].get(k) != getattr(args, k)]
        if changed:
            was = ", ".join(f"{k}={state.data['settings'].get(k)}" for k in changed)
            sys.exit(f"error: {out} holds a {what} with other settings ({was}); run it with those, or use --out "
                     "<new folder>")
    if "machine" not in state.data:
        from bench_sections.common import machine

        state.data["machine"] = machine()
    return state


def place(source: Path, target: Path) -> None:
    """The file in the corpus folder itself (a hard link where the file system allows, else a copy): a data folder's
    files must lie inside it (docs/security.md), so a link to the shared data would be refused."""
    try:
        os.link(source, target)
    except OSError:
        shutil.copyfile(source, target)


def stage_corpus(args, state: State) -> None:
    """Links, not copies: the shared data stays where it is."""
    from types import SimpleNamespace

    from cramming.data.python_docs import build_corpus
    from cramming.data.sources import PythonDocs

    if state.done("corpus"):
        return
    started, corpus = time.time(), args.out / "corpus"
    remove(corpus)
    corpus.mkdir(parents=True)
    cap = 300_000 if args.smoke else 20_000_000
    docs = PythonDocs(SimpleNamespace(max_chars=cap), REPO / ".cache" / "cramming")
    if not docs.corpus.exists():
        build_corpus(docs.corpus, max_chars=cap)
    place(docs.corpus, corpus / "python-docs.jsonl")
    prose = [f for pattern in (PROSE[1:2] if args.smoke else PROSE) for f in sorted(args.shared.glob(pattern))]
    for i, path in enumerate(prose):
        place(path.resolve(), corpus / f"{i:03d}-{path.parent.name}-{path.name}")
    chars = {"python-docs": docs.corpus.stat().st_size, "prose": sum(p.stat().st_size for p in prose)}
    say(f"corpus: python-docs {chars['python-docs'] / 1e6:.1f} MB + {len(prose)} prose files "
        f"{chars['prose'] / 1e6:.1f} MB")
    state.finish("corpus", started, bytes=chars, prose_files=len(prose))


def data_overrides(args) -> list[str]:
    """What both pretraining runs share: data, tokenizer, sequences, validation rows, seed."""
    small = ["arch.num_layers=1", "arch.hidden_size=32", "arch.num_heads=2", "arch.ffn_size=64",
             "data.vocab_size=1024", "data.seq_length=64", "train.validation_sequences=32"] if args.smoke else \
        ["data.vocab_size=8192", "data.seq_length=128", "train.validation_sequences=512"]
    return ["arch=crammed-bert-micro", "impl=cpu", "train=cpu-smoke", "data=local-text", "seed=0",
            f"data.path={args.out / 'corpus'}", f"data.cache_dir={args.out / 'cache'}", *small]


def stage_prepare(args, state: State, overrides: list[str] | None = None) -> dict:
    """The data every run reads, prepared once (overrides: the runs' data options; record's own by default)."""
    from bench_sections.common import compose_config

    from cramming.data.prepare import prepare_data

    started = time.time()
    folder, meta = prepare_data(compose_config(overrides or data_overrides(args)).data)
    if not state.done("prepare"):
        say(f"data: {meta['train_tokens']:,} training tokens in {meta['train_sequences']:,} sequences, "
            f"{meta['val_sequences']:,} validation sequences, vocabulary {meta['vocab_size']:,}")
        state.finish("prepare", started, cache=str(folder))
    return meta


def launch(command: list[str], log: Path) -> subprocess.Popen:
    with open(log, "w", encoding="utf-8") as fh:
        return subprocess.Popen([sys.executable, *command], cwd=REPO, stdout=fh, stderr=subprocess.STDOUT,
                                env={**os.environ, **THREADS, "PYTHONUNBUFFERED": "1"})


def last_line(path: Path, key: str) -> dict:
    """The newest metrics line holding `key`, for the progress line."""
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except OSError:
        return {}
    for line in reversed(lines):
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if key in record:
            return record
    return {}


def stage_pretrain(args, state: State) -> None:
    if state.done("pretrain"):
        return
    started, ours_dir, hf_dir = time.time(), args.out / "ours", args.out / "hf"
    for folder in (ours_dir, hf_dir):
        remove(folder)  # a link there is removed, never what it leads to
        folder.mkdir(parents=True)
    shared = data_overrides(args)
    ours = launch(["pretrain.py", *shared, "name=record-ours", f"budget={args.minutes / 60}",
                   f"train.validate_every_minutes={args.validate_every}", "train.checkpoint_every_minutes=null",
                   "train.resume=never", f"hydra.run.dir={ours_dir}"], args.out / "ours.log")
    arch = probe_arch(shared)
    hf = launch(["scripts/record_hf.py", "--overrides", json.dumps(shared), "--arch", json.dumps(arch),
                 "--out", str(hf_dir), "--minutes", str(args.minutes), "--validate-every", str(args.validate_every)],
                args.out / "hf.log")
    say(f"pretraining ours and HF's for {args.minutes:g} min each (logs: {args.out}/ours.log, hf.log)")
    while ours.poll() is None or hf.poll() is None:
        time.sleep(2 if args.smoke else 60)
        mine, theirs = last_line(ours_dir / "metrics.jsonl", "loss"), last_line(hf_dir / "metrics.jsonl", "loss")
        say(f"  ours step {mine.get('step', 0)} loss {mine.get('loss', float('nan')):.3f} | "
            f"HF step {theirs.get('step', 0)} loss {theirs.get('loss', float('nan')):.3f}")
    for name, proc, log in (("pretrain.py", ours, "ours.log"), ("record_hf.py", hf, "hf.log")):
        if proc.returncode != 0:
            tail = (args.out / log).read_text(encoding="utf-8", errors="replace").strip().splitlines()[-1:]
            sys.exit(f"error: {name} failed (exit {proc.returncode}): {tail}; see {args.out / log}")
    state.finish("pretrain", started)


def probe_arch(shared: list[str]) -> dict:
    """Our model's dimensions and parameter count (a dryrun builds it and counts), for HF's equal-size twin."""
    import torch
    from bench_sections.common import compose_config

    from cramming.impl import Runtime
    from cramming.run import build_model, count_parameters

    config = compose_config(shared)
    meta = {"pad": 0, "cls": 1, "sep": 2, "mask": 3}
    with torch.device("meta"):
        model = build_model(config.arch, config.data.vocab_size, meta, Runtime(torch.device("cpu"), "fp32", False))
    a = config.arch
    return {"num_layers": a.num_layers, "hidden_size": a.hidden_size, "num_heads": a.num_heads,
            "parameters": count_parameters(model)}


def finetune_jobs(args) -> list[dict]:
    """One eval.py per (model, task); ours carries its random-init twin (eval.baseline=random-init)."""
    ours = json.loads((args.out / "ours" / "train_summary.json").read_text())["checkpoint"]
    hf = json.loads((args.out / "hf" / "summary.json").read_text())["checkpoint"]
    jobs = []
    for task in args.tasks:
        seeds = args.sst2_seeds if task == "sst2" else args.seeds
        extra = [f"eval.per_task={{sst2: {{epochs: {args.sst2_epochs}}}}}"] if task == "sst2" else []
        if args.smoke:
            extra += ["eval.max_train_examples=48", "eval.recipe.epochs=1", "eval.recipe.max_length=64"]
        for model, checkpoint, twin in (("ours", ours, True), ("hf", hf, False)):
            jobs.append({"name": f"{model}-{task}", "task": task, "cost": (2 if twin else 1) * COST[task] * seeds,
                         "args": ["eval.py", f"checkpoint={checkpoint}", f"eval.tasks=[{task}]",
                                  f"eval.data_dir={args.shared / 'glue'}", f"eval.seeds={seeds}", "impl=cpu",
                                  f"eval.results_table={args.out / 'glue' / 'results.csv'}",
                                  f"hydra.run.dir={args.out / 'glue' / f'{model}-{task}'}",
                                  *(["eval.baseline=random-init"] if twin else []), *extra]})
    return sorted(jobs, key=lambda j: -j["cost"])  # longest first, so the two slots end together


COST = {"sst2": 5.5, "rte": 4.3, "stsb": 4.0, "cola": 3.4, "mrpc": 3.0, "qnli": 30.0, "wnli": 0.5}  # minutes, measured


def complete(job_dir: Path) -> bool:
    try:
        return json.loads((job_dir / "results.json").read_text()).get("complete", False)
    except (OSError, ValueError):
        return False


def stage_finetune(args, state: State) -> None:
    if state.done("finetune"):
        return
    started, folder = time.time(), args.out / "glue"
    folder.mkdir(parents=True, exist_ok=True)
    waiting = [j for j in finetune_jobs(args) if not complete(folder / j["name"])]
    running, failed = {}, []
    say(f"fine-tuning: {len(waiting)} eval.py jobs, {args.jobs} at a time")
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
                say(f"  {name}: {'done' if ok else f'FAILED (exit {proc.returncode})'} in "
                    f"{(time.time() - since) / 60:.1f} min; {len(waiting) + len(running)} to go")
    if failed:
        sys.exit(f"error: fine-tuning failed for {', '.join(failed)}; see {folder}/<job>.log, then run again")
    state.finish("finetune", started)


KEPT = ("minutes", "validate_every", "tasks", "seeds", "sst2_seeds", "sst2_epochs", "smoke")  # fixed once started


def main(argv=None) -> None:
    args = parse_args(argv)
    if not (args.shared / "glue").is_dir():
        sys.exit(f"error: --shared {args.shared} has no glue/ folder (GLUE tasks in the glue_data layout); "
                 "point --shared at the folder holding glue/ and the prose")
    state = open_state(args, KEPT, "record run")
    stage_corpus(args, state)
    stage_prepare(args, state)
    stage_pretrain(args, state)
    stage_finetune(args, state)
    from record_report import write_report

    started = time.time()
    path = write_report(args.out, state.data, docs=REPO / "docs" if args.docs else None)
    state.finish("report", started)
    say(f"results: {path}")


if __name__ == "__main__":
    main()
