"""`python -m cramming.report <run or sweep dirs...>`: compare runs in one table, loss curves and a scaling fit.

Everything is read from what pretrain.py leaves in a run folder (metrics.jsonl, train_summary.json, .hydra/,
eval/results.json), so it works offline, without torch, on finished, running and crashed runs alike: a run is
any folder holding a metrics.jsonl, found recursively under the arguments (Hydra multirun layouts included).
What the report shows (table, plots, scaling fit, report.md) is in report_plots.py.

Run folders are data someone else may have written (docs/security.md): a file that is a link leading out of its
run is not read, a file that cannot be read (not UTF-8, not JSON, too large, YAML with aliases) counts as absent,
and a metrics line that is not a record (a step that is not a number) is skipped; the report says how many.
"""

import argparse
import json
import math
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from .errors import UserError, exit_on_user_error
from .outputs import claim_folder
from .renames import RENAMED, moved
from .report_plots import REPORT_FILES, REPORT_TITLE, write_report
from .untrusted import JSON_LIMIT, check_size, leads_outside, text_lines
from .untrusted import read_json as read_untrusted_json

# Config keys that differ between any two runs without describing the experiment.
NOISE_KEYS = {"name", "data.cache_dir", "train.resume"}
NOISE_PREFIXES = ("hydra",)
# Where the GLUE evaluator's results.json may sit, relative to a run folder (eval_after writes eval/); the
# averaged weights' (train.averaging: final-<kind>/) go to eval-<kind>/.
RESULTS_PLACES = ("eval/results.json", "results.json", "checkpoint/results.json", "eval/*/results.json")
AVERAGED_PLACES = ("eval-*/results.json",)


@dataclass
class Run:
    path: Path
    config: dict  # flattened dotted keys -> values
    curve: list[dict]  # training lines in order; steps undone by a rollback or resume left out
    final: dict | None = None  # the validation line of metrics.jsonl
    summary: dict | None = None  # train_summary.json, finished runs only
    glue: float | None = None  # GLUE average of the pretrained model
    glue_comparable: bool = True
    averaged_glue: float | None = None  # GLUE average of the averaged weights (train.averaging)
    name: str = ""
    events: list[dict] = field(default_factory=list)

    @property
    def finished(self) -> bool:
        return self.summary is not None

    def value(self, key: str):
        """The numbers of the table: the summary where the run finished, else the last logged line."""
        s, last = self.summary or {}, self.curve[-1] if self.curve else {}
        if key == "final_train_loss":  # the summary's is the very last step's, logged or not
            return s["final_train_loss"] if s.get("final_train_loss") is not None else last.get("loss")
        if key == "val_loss":
            return s.get("val_loss", (self.final or {}).get("val_loss"))
        if key == "tokens":
            return s.get("tokens", last.get("tokens"))
        if key == "tokens_per_s":
            if "tokens_per_s" in s:
                return s["tokens_per_s"]
            return last["tokens"] / last["elapsed_s"] if last.get("elapsed_s") and last.get("tokens") else None
        if key == "train_flops":  # forward FLOPs per token x 3 (forward + backward) x tokens trained
            fpt, tokens = s.get("flops_per_token"), s.get("tokens")
            return 3 * fpt * tokens if fpt and tokens else None
        if key == "glue_avg":
            return self.glue
        if key == "averaged_val_loss":
            return (s.get("averaging") or {}).get("val_loss")
        if key == "averaged_glue":
            return self.averaged_glue
        return s.get(key)


def flatten(tree: dict, prefix: str = "") -> dict:
    out = {}
    for key, value in tree.items():
        if isinstance(value, dict) and value:
            out.update(flatten(value, f"{prefix}{key}."))
        else:
            out[f"{prefix}{key}"] = value
    return out


def parse_overrides(items) -> dict:
    """Hydra override strings (`arch.position=rotary`, `+key=value`) as key -> YAML-typed value."""
    out = {}
    for item in items if isinstance(items, list) else []:
        if not isinstance(item, str) or "=" not in item or item.startswith("~"):
            continue
        key, value = item.split("=", 1)
        try:
            value = yaml.safe_load(value)
        except yaml.YAMLError:
            pass  # not YAML (e.g. an unbalanced quote): keep the raw string
        key = key.lstrip("+")
        out[RENAMED.get(key, key)] = value  # a run from before its option moved into a section
    return out


# The numbers of a train_summary.json the report reads: a summary where one is not a number is not read.
SUMMARY_NUMBERS = ("steps", "tokens", "tokens_per_s", "val_loss", "final_train_loss", "flops_per_token", "parameters",
                   "untrained_val_loss", "budget_hours", "mfu", "energy_kwh", "seconds_to_target")
SKIPPED: list[str] = []  # what could not be read, said under the report's table


def readable(path: Path, run: Path | None = None) -> bool:
    """A run's file that is there and may be read: not a link leading out of its run folder."""
    if not path.is_file():
        return False
    if run is not None and leads_outside(run, path):
        SKIPPED.append(f"{path}: a link leading outside its run folder, not read")
        return False
    return True


def read_json(path: Path, run: Path | None = None):
    if not readable(path, run):
        return None
    try:
        return read_untrusted_json(path)
    except (OSError, UserError) as err:
        SKIPPED.append(str(err))
        return None


class PlainYaml(yaml.SafeLoader):
    """YAML without aliases: Hydra never writes them, and a few nested ones can stand for billions of values."""

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            raise yaml.YAMLError("aliases are not read")
        return super().compose_node(parent, index)


def read_yaml(path: Path, run: Path | None = None):
    if not readable(path, run):
        return None
    try:
        check_size(path, JSON_LIMIT, "run config")
        return yaml.load(path.read_text(encoding="utf-8"), Loader=PlainYaml)  # a SafeLoader without aliases
    except (OSError, UnicodeDecodeError, UserError, yaml.YAMLError) as err:
        SKIPPED.append(f"{path}: not read ({(str(err).splitlines() or [''])[0][:120]})")
        return None


def metrics_record(line: str) -> dict | None:
    """A metrics.jsonl line as a record: an object whose step (where it has one) is a whole number and whose
    losses are numbers; None for anything else (a line cut short by a crash, a line someone else wrote)."""
    try:
        record = json.loads(line)
    except (ValueError, RecursionError):
        return None
    if not isinstance(record, dict) or not isinstance(record.get("step", 0), int) or isinstance(record.get("step"), bool):
        return None
    if any(k in record and not isinstance(record[k], int | float) for k in ("loss", "val_loss", "tokens", "elapsed_s")):
        return None
    return record


def read_metrics(path: Path, run: Path | None = None) -> tuple[list[dict], dict | None, list[dict]]:
    """Training lines, the validation line and the events. A line that is not a record (cut short by a crash,
    or not one pretrain.py writes) is skipped and counted; a line whose step is not past the previous one (after a
    rollback or a resume) replaces what it rewinds over."""
    curve, final, events, bad = [], None, [], 0
    try:
        lines = list(text_lines(path)) if readable(path, run) else []
    except UserError as err:
        SKIPPED.append(str(err))
        lines = []
    for line in lines:
        record = metrics_record(line)
        if record is None:
            bad += line.strip() != ""
            continue
        if "event" in record:
            events.append(record)
        elif "val_loss" in record:
            final = record
        elif "loss" in record and "step" in record:
            while curve and curve[-1]["step"] >= record["step"]:
                curve.pop()
            curve.append(record)
    if bad:
        SKIPPED.append(f"{path}: {bad} line(s) that are not metrics records skipped")
    return curve, final, events


def load_run(path: Path) -> Run:
    """The config comes from one source per run, so sources never disagree: Hydra's composed config, else the
    summary's; then the group choices (`arch=crammed-bert-tiny`) and the command line's overrides."""
    summary = read_json(path / "train_summary.json", path)
    summary = summary if isinstance(summary, dict) else None
    if summary is not None and (bad := next((k for k in SUMMARY_NUMBERS if k in summary and summary[k] is not None
                                             and not isinstance(summary[k], int | float)), None)):
        SKIPPED.append(f"{path / 'train_summary.json'}: {bad} is not a number; the summary was not read")
        summary = None
    config = read_yaml(path / ".hydra" / "config.yaml", path)
    if not isinstance(config, dict):
        config = (summary or {}).get("config") or {}
    config = config if isinstance(config, dict) else {}
    hydra = read_yaml(path / ".hydra" / "hydra.yaml", path)  # its config group choices: arch=..., data=...
    try:
        choices = {k: v for k, v in hydra["hydra"]["runtime"]["choices"].items() if not k.startswith("hydra/")}
    except (KeyError, TypeError, AttributeError):
        choices = {}
    config = flatten(moved(config)) | choices | parse_overrides(read_yaml(path / ".hydra" / "overrides.yaml", path))
    curve, final, events = read_metrics(path / "metrics.jsonl", path)
    return Run(path=path, config=config, curve=curve, final=final, summary=summary, events=events)


def glue_of(results) -> tuple[float, bool, str] | None:
    """(average, comparable, finished_at) of the pretrained model in a results.json, or None if it has none."""
    try:
        average = float(results["models"]["pretrained"]["glue"]["average"])
    except (KeyError, TypeError, ValueError):
        return None
    if math.isnan(average):
        return None
    return average, bool(results.get("comparable", True)), str(results.get("finished_at", ""))


def attach_glue(runs: list[Run], roots: list[Path]) -> None:
    """Each run's newest GLUE result: from its own folder, or any results.json under the arguments whose
    `checkpoint` is the run's (eval.py's own outputs/eval/<date>/ folders); the same for its averaged weights
    (a checkpoint named final-<kind>)."""
    found = {run.path: [] for run in runs}
    averaged = {run.path: [] for run in runs}
    for run in runs:
        found[run.path] += [p for pattern in RESULTS_PLACES for p in run.path.glob(pattern) if readable(p, run.path)]
        averaged[run.path] += [p for pattern in AVERAGED_PLACES for p in run.path.glob(pattern) if readable(p, run.path)]
    for root in roots:
        for path in root.rglob("results.json"):
            results = read_json(path, root)
            checkpoint = results.get("checkpoint") if isinstance(results, dict) else None
            if isinstance(checkpoint, str) and Path(checkpoint).parent.resolve() in found:
                kind = averaged if Path(checkpoint).name.startswith("final-") else found
                kind[Path(checkpoint).parent.resolve()].append(path)
    for run in runs:
        scores = [g for p in set(found[run.path]) if (g := glue_of(read_json(p)))]
        if scores:
            run.glue, run.glue_comparable, _ = max(scores, key=lambda g: g[2])
        scores = [g for p in set(averaged[run.path]) if (g := glue_of(read_json(p)))]
        if scores:
            run.averaged_glue = max(scores, key=lambda g: g[2])[0]


def our_report_file(entry: Path) -> bool:
    """An entry of a report folder that a report of ours wrote (its report.md opens with our title)."""
    if entry.name not in REPORT_FILES or not entry.is_file():
        return False
    if entry.name != "report.md":
        return (entry.parent / "report.md").is_file() and our_report_file(entry.parent / "report.md")
    with open(entry, "rb") as fh:
        return fh.read(len(REPORT_TITLE)) == REPORT_TITLE


def natural_key(text: str):
    """So that job 10_ sorts after 9_."""
    return [int(part) if part.isdigit() else part for part in re.split(r"(\d+)", text)]


def collect_runs(paths: list[str]) -> list[Run]:
    SKIPPED.clear()
    roots = []
    for given in paths:
        path = Path(given).expanduser()
        if not path.exists():
            raise UserError(f"{given}: no such file or folder")
        roots.append(path.parent if path.is_file() else path)
    dirs = {}
    for root, given in zip(roots, paths):
        found = [p.parent.resolve() for p in root.rglob("metrics.jsonl")]
        if not found:
            raise UserError(f"{given}: no run found (a run folder holds a metrics.jsonl from pretrain.py)")
        dirs.update(dict.fromkeys(found))
    runs = [load_run(path) for path in dirs]
    common = Path(os.path.commonpath([str(r.path) for r in runs]))
    for run in runs:
        name = run.path.relative_to(common).as_posix()
        run.name = run.path.name if name == "." else name
    attach_glue(runs, [r.resolve() for r in roots])
    return sorted(runs, key=lambda r: natural_key(r.name))


def is_noise(key: str) -> bool:
    return key in NOISE_KEYS or key.startswith(NOISE_PREFIXES)


def differing_keys(runs: list[Run]) -> list[str]:
    """Config keys with more than one value among the runs that have them, in config order. A key one run
    lacks (an older schema, a `+key` override) is not by itself a difference."""
    keys = dict.fromkeys(k for run in runs for k in run.config if not is_noise(k))
    return [k for k in keys
            if len({json.dumps(r.config[k], sort_keys=True, default=str) for r in runs if k in r.config}) > 1]


def parse_args(argv=None):
    parser = argparse.ArgumentParser(prog="python -m cramming.report", description=__doc__.splitlines()[0])
    parser.add_argument("paths", nargs="+", help="run folders, sweep folders, or folders holding either")
    parser.add_argument("--out", help="where report.md, runs.csv and the plots go (default: <first path>/report)")
    parser.add_argument("--group", help="colour the loss curves by this config key (e.g. arch.position)")
    parser.add_argument("--smooth", type=float, default=0.0,
                        help="EMA weight for the plotted training loss, 0 (raw, default) to below 1")
    return parser.parse_args(argv)


@exit_on_user_error
def main(argv=None) -> Path:
    args = parse_args(argv)
    if not 0.0 <= args.smooth < 1.0:
        raise UserError(f"--smooth {args.smooth}: must be at least 0 and below 1")
    runs = collect_runs(args.paths)
    keys = differing_keys(runs)
    if args.group and not any(args.group in r.config for r in runs):
        raise UserError(f"--group {args.group}: no run has this config key; keys that differ between the runs: "
                        f"{', '.join(keys) or 'none'}")
    first = Path(args.paths[0])
    out = Path(args.out) if args.out else (first.parent if first.is_file() else first) / "report"
    claim_folder(out, our_report_file, "a report")
    path, table = write_report(runs, keys, out, args.group, args.smooth, args.paths)
    print(table)
    for line in dict.fromkeys(SKIPPED):
        print(f"skipped: {line}")
    print(f"report: {path.resolve()}", flush=True)
    return path


if __name__ == "__main__":
    main()
