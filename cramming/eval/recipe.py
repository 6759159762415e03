"""The evaluation recipe, top to bottom: checkpoint -> tasks (all loaded and checked first) -> fine-tune
every task with every seed (and the random-init baseline) -> results.json, the CSV log, a printed table."""

import hashlib
import json
import random
import statistics
import sys
import time
from dataclasses import asdict
from datetime import datetime, timezone
from pathlib import Path

import torch
import transformers
from tqdm import tqdm

from .. import impl as impl_
from ..atomic import write_atomic
from ..card import add_evaluation, without_paths
from ..errors import UserError
from ..hub import HubUnreachable, in_hub_cache
from ..outputs import WriteFault, fault_reason
from ..train.objectives import OBJECTIVES
from ..untrusted import link_outside
from .checkpoint import check_checkpoint, find_checkpoint
from .config import EvalRunConfig, recipe_for
from .finetune import Checkpoint, run_task, steps_per_run
from .kinds import BENCHMARKS
from .results import append_csv, markdown_table, score_key, seed_statistics

# eval.max_train_examples draws its subset with this fixed seed, not config.seed: every seed and every evaluation
# of a capped run fine-tunes on the same examples, so their scores differ by the fine-tuning alone.
SUBSET_SEED = 0


def load_tasks(config: EvalRunConfig) -> tuple[list, dict[str, str]]:
    """Every task's data, read and checked. With eval.skip_missing, a task whose data cannot be had is
    skipped and its reason kept (for smoke runs on partial glue_data folders); otherwise it is an error."""
    e = config.eval
    benchmark = BENCHMARKS[e.kind]
    data_dir = Path(e.data_dir).expanduser() if e.data_dir else None
    if data_dir is not None and data_dir.is_dir() and (link := link_outside(data_dir)) is not None:
        raise UserError(f"eval.data_dir={e.data_dir}: {link} is a link leading outside it (to {link.resolve()}); a "
                        "data folder's files must lie inside it: copy the file in")
    tasks, skipped = [], {}
    hub_down, causes = None, []  # once the hub fails, do not wait for its time-outs again for every other task
    for name in benchmark.trained(e):
        try:
            if hub_down:
                raise HubUnreachable(name, hub_down.reason)
            tasks.append(benchmark.load(name, e))
        except UserError as err:
            if not (e.skip_missing and BENCHMARKS.trait(benchmark, "skippable")):
                raise
            hub_down = err if isinstance(err, HubUnreachable) else hub_down
            skipped[name] = str(err)
            causes.append(err.reason if isinstance(err, HubUnreachable) else str(err))
            print(f"skipping {name}: {err}", flush=True)
    if not tasks:
        reasons = "; ".join(dict.fromkeys(causes))  # the hub being down is one reason, not one per task
        raise UserError(f"no task could be loaded ({', '.join(skipped)}): {reasons}")
    if e.max_train_examples:
        for task in tasks:  # the same subset for every seed, so seeds differ only in fine-tuning
            if len(task.train) > e.max_train_examples:
                task.train = random.Random(SUBSET_SEED).sample(task.train, e.max_train_examples)
    return tasks, skipped


def file_sha256(path: Path) -> str:
    with open(path, "rb") as fh:
        return hashlib.file_digest(fh, "sha256").hexdigest()


def comparability(config: EvalRunConfig, skipped: dict[str, str]) -> dict:
    """Why these scores cannot stand beside published GLUE scores ({} when they can): only the whole GLUE task set,
    every task loaded and trained on all its data, is comparable. Keys: skipped_tasks, max_train_examples,
    tasks_left_out."""
    e, why = config.eval, {}
    if skipped:
        why["skipped_tasks"] = list(skipped)
    if e.max_train_examples is not None:
        why["max_train_examples"] = e.max_train_examples
    left_out = [t for t in BENCHMARKS[e.kind].average_set if t not in e.tasks]
    if left_out:
        why["tasks_left_out"] = left_out
    return why


def describe(why: dict) -> str:
    """comparability's reasons in one line, for the printed note and the CSV."""
    say = {"skipped_tasks": lambda v: f"skipped {', '.join(v)}",
           "max_train_examples": lambda v: f"eval.max_train_examples={v}",
           "tasks_left_out": lambda v: f"not in eval.tasks: {', '.join(v)}"}
    return "; ".join(say[key](value) for key, value in why.items())


def table_scores(task, runs: list[dict], summary: dict) -> dict[str, float]:
    """A task's table cells: the median main metric per dev split (`<task>`; MNLI's two splits, two cells), or for a
    task with TaskData.columns (zero-shot's acc and acc_norm) each of those it reports, as `<task>/<metric>`."""
    if not task.columns:
        return {score_key(task.name, split): stats["median"] for split, stats in summary.items()}
    return {f"{score_key(task.name, split)}/{metric}": statistics.median(r["final"][split][metric] for r in runs)
            for split in task.dev for metric in task.columns if metric in runs[0]["final"][split]}


def finetune_tasks(config, checkpoint, tokenizer, tasks, runtime, random_init: bool, label: str, progress):
    """Every task with every seed for one model; returns per-task records and the median main scores."""
    per_task, scores = {}, {}
    for task in tasks:
        recipe = recipe_for(config.eval, task.name)
        runs = [run_task(checkpoint, tokenizer, task, recipe, config.seed + i, runtime, random_init,
                          f"{label} {task.name} seed {config.seed + i}", progress) for i in range(config.eval.seeds)]
        summary = {split: seed_statistics([r["final"][split][task.main_metric] for r in runs]) for split in task.dev}
        per_task[task.name] = {"main_metric": task.main_metric, "metrics": task.metric_names,
                               "train_examples": len(task.train), "source": task.source,
                               "recipe": asdict(recipe), "summary": summary, "runs": runs}
        scores |= table_scores(task, runs, summary)
        for split, stats in summary.items():
            tqdm.write(f"{label} {task.name}/{split}: {task.main_metric} {stats['median']:.2f} "
                       f"(min {stats['min']:.2f}, max {stats['max']:.2f})", file=sys.stdout)
    return per_task, scores


def keep_predictions(run_dir: Path, label: str, per_task: dict) -> dict[Path, dict]:
    """Take the answers a head returned with its runs (SQuAD's {split: {id: text}}) out of the records, which
    name the file instead: predictions-<task>[-<split>][-<model>]-seed<N>.json beside results.json."""
    files = {}
    for task, record in per_task.items():
        for run in record["runs"]:
            for split, answers in run.pop("predictions", {}).items():
                name = "-".join([f"predictions-{task}", *([split] if split != "dev" else []),
                                 *([label] if label != "pretrained" else []), f"seed{run['seed']}"])
                files[run_dir / f"{name}.json"] = answers
                run.setdefault("predictions_files", {})[split] = f"{name}.json"
    return files


def evaluate(config: EvalRunConfig, run_dir: Path) -> Path:
    """The evaluation top to bottom: checkpoint -> every task's data, checked -> fine-tune (or score) every model,
    task and seed -> results.json, the CSV row, the table, the model card. Returns results.json's path."""
    started = time.time()
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    checkpoint = find_checkpoint(config)
    tokenizer, model_config = check_checkpoint(checkpoint)
    benchmark = BENCHMARKS[config.eval.kind]
    if benchmark.check_model is not None:  # zero-shot: a causal LM only
        benchmark.check_model(model_config)
    tasks, skipped = load_tasks(config)  # every task's files read and checked before any training
    runtime = impl_.resolve(config.impl, training=False)  # auto: evaluation's own rule on CPUs (impl.py)
    torch.set_flush_denormal(True)  # as in pretraining: AdamW's moments decay into slow x86 denormals otherwise
    # The classifier head is new by design; transformers' per-load report of it would repeat for every run.
    transformers.logging.set_verbosity_error()
    transformers.logging.disable_progress_bar()
    why = comparability(config, skipped)
    chosen = f" (impl.precision=auto: {runtime.why})" if runtime.why else ""
    print(f"evaluating {checkpoint} on {', '.join(t.name for t in tasks)} with {config.eval.seeds} seed(s) "
          f"on {runtime.device} in {runtime.precision}{chosen}"
          + ("" if not why else f" — NOT COMPARABLE to {benchmark.title} ({describe(why)})"), flush=True)
    models, table_rows, predictions = run_models(config, checkpoint, tokenizer, tasks, runtime, run_dir)
    results = {"checkpoint": str(checkpoint), "model_type": model_config.model_type, "skipped": skipped,
               "models": models, "complete": True, "comparable": not why,
               "not_comparable_because": why,  # machine-readable: skipped_tasks, max_train_examples, tasks_left_out
               "checkpoint_sha256": (file_sha256(checkpoint / "model.safetensors")
                                     if (checkpoint / "model.safetensors").exists() else None),
               "settings": asdict(config), "device": str(runtime.device), "seconds": round(time.time() - started, 1),
               "finished_at": datetime.now(timezone.utc).isoformat()}
    return write_results(config, checkpoint, results, table_rows, predictions, run_dir)


def run_models(config, checkpoint, tokenizer, tasks, runtime, run_dir: Path) -> tuple[dict, dict, dict]:
    """Every model (pretrained, and the random-init baseline) on every task and seed, under one progress bar:
    (results.json's models, the table's rows, the prediction files to write)."""
    benchmark = BENCHMARKS[config.eval.kind]
    models = {"pretrained": False} | ({"random-init": True} if config.eval.baseline == "random-init" else {})
    results, table_rows, predictions = {}, {}, {}
    steps = len(models) * config.eval.seeds * sum(steps_per_run(t, recipe_for(config.eval, t.name)) for t in tasks)
    # One bar over every model, task, seed and epoch: the ETA is the whole evaluation's; `with` closes it on errors.
    with tqdm(total=steps, desc="fine-tuning", unit="step", mininterval=2, dynamic_ncols=True) as progress:
        for label, random_init in models.items():
            per_task, scores = finetune_tasks(config, checkpoint, tokenizer, tasks, runtime, random_init, label,
                                              progress)
            predictions |= keep_predictions(run_dir, label, per_task)
            summary = benchmark.summarise(scores, config.eval)
            results[label] = {"tasks": per_task, "scores": scores, benchmark.summary_key: summary}
            table_rows[label] = {**scores, **({"average": summary["average"]} if summary else {})}
    return results, table_rows, predictions


def objective_head(objective: str):
    """The class an objective pretrains (the card's head), or None for one not registered here."""
    return getattr(OBJECTIVES.get(objective), "head", None)


def card_entry(config, results: dict, scores: dict) -> dict:
    """What the model card says of this evaluation: the benchmark and its kind, each task's data by what it is (a
    hub id, or a folder's or file's name), its metric, the seeds, and whether published scores compare."""
    benchmark, tasks = BENCHMARKS[config.eval.kind], results["models"]["pretrained"]["tasks"]
    return {"benchmark": benchmark.title, "kind": config.eval.kind, "seeds": config.eval.seeds,
            "data": {name: without_paths(record["source"]) for name, record in tasks.items()},
            "metrics": {name: record["main_metric"] for name, record in tasks.items()},
            "comparable": results["comparable"] and BENCHMARKS.trait(benchmark, "published"),
            "scores": scores, "finished_at": results["finished_at"]}


def write_results(config, checkpoint, results: dict, table_rows: dict, predictions: dict, run_dir: Path) -> Path:
    """The prediction files, then results.json (only ever a complete one), the CSV rows, the table and the
    model card's scores; returns results.json's path."""
    benchmark, why = BENCHMARKS[config.eval.kind], results["not_comparable_because"]
    for where, answers in predictions.items():
        write_atomic(where, json.dumps(answers, indent=1, ensure_ascii=False))
    path = run_dir / "results.json"
    write_atomic(path, json.dumps(results, indent=2))
    table_line = None
    try:
        for label, row in table_rows.items():
            append_csv(Path(config.eval.results_table), {
                "finished_at": results["finished_at"], "checkpoint": str(checkpoint), "model": label,
                "comparable": results["comparable"], "not_comparable_because": describe(why),
                "seeds": config.eval.seeds, **{k: round(v, 2) for k, v in row.items()}, "results": str(path.resolve())})
    except (UserError, OSError) as err:  # the scores are whole in results.json: the table is a convenience
        reason = err.reason if isinstance(err, WriteFault) else str(err)
        table_line = f"results table: {config.eval.results_table} not updated ({reason}); the scores are in " \
                     "results.json"
    print()
    print(markdown_table(table_rows, benchmark.columns))
    if why:
        print(f"(not comparable to published {benchmark.title} scores: {describe(why)})")
    for name, reason in results["skipped"].items():
        print(f"(skipped {name}: {reason})")
    for line in (table_line, update_card(checkpoint, card_entry(config, results, table_rows["pretrained"]))):
        if line:
            print(line, flush=True)
    print(f"results: {path.resolve()}", flush=True)
    return path.resolve()


def update_card(checkpoint: Checkpoint, entry: dict) -> str | None:
    """Add the scores to the checkpoint's model card, where it is one of our folders and the user's to change: a
    hub download (the hub cache) is never written. Returns the line to print: where the card is, or why it was
    left as it is (results.json holds the scores either way)."""
    folder = checkpoint.path
    if in_hub_cache(folder):
        return None  # a hub model's snapshot: the hub's, not ours (docs/evaluation.md, *Model card*)
    card = folder / "README.md"
    if (card.exists() or card.is_symlink()) and (card.is_symlink() or not card.is_file()):
        return f"model card: {card} not updated (it is not a regular file); the scores are in results.json"
    try:
        written = add_evaluation(folder, entry, objective_head)
    except (OSError, UserError) as err:
        reason = err.reason if isinstance(err, WriteFault) else fault_reason(err, folder) or str(err)
        return f"model card: {folder / 'README.md'} not updated ({reason}); the scores are in results.json"
    return f"model card: {folder / 'README.md'} (with these scores)" if written else None
