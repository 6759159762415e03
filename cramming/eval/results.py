"""Summaries of an evaluation: seed statistics, the GLUE table in the paper's column order, the CSV log."""

import csv
import os
import statistics
from pathlib import Path

from ..atomic import atomic_open, locked
from ..errors import UserError
from ..outputs import writing
from ..untrusted import text_lines
from .glue_metrics import glue_average
from .tasks import GLUE_COLUMNS as COLUMNS  # the GLUE paper's order; each column a key of glue_average's scores
from .tasks import GLUE_TASKS


def score_key(task: str, split: str) -> str:
    """The column a task's dev split feeds: MNLI's two dev sets are two columns; SuperGLUE's diagnostics, extra
    splits of RTE, are their own."""
    spec = GLUE_TASKS.get(task)
    keys = dict(zip((name for name, _, _ in spec.dev_splits), spec.keys)) if spec else {}
    return keys.get(split, task if split == "dev" else split)


def seed_statistics(values: list[float]) -> dict:
    return {
        "median": statistics.median(values),
        "min": min(values),
        "max": max(values),
        "std": statistics.stdev(values) if len(values) > 1 else 0.0,
        "values": values,
    }


def markdown_table(rows: dict[str, dict[str, float]], columns=COLUMNS) -> str:
    """rows: label -> {score key: median main metric}; `columns` (title, key) in the benchmark's order (GLUE's by
    default) appear only if some row has them."""
    present = [(title, key) for title, key in columns if any(key in scores for scores in rows.values())]
    extra = {k for scores in rows.values() for k in scores} - {k for _, k in columns} - {"average"}
    present += [(k, k) for k in sorted(extra)]  # custom tasks
    header = "| model | " + " | ".join(t for t, _ in present) + " | avg |"
    lines = [header, "|" + "---|" * (len(present) + 2)]
    for label, scores in rows.items():
        cells = [f"{scores[k]:.1f}" if k in scores else "–" for _, k in present]
        avg = scores.get("average")
        lines.append(f"| {label} | " + " | ".join(cells) + f" | {'–' if avg is None else f'{avg:.1f}'} |")
    return "\n".join(lines)


def glue_summary(scores: dict[str, float], include_wnli: bool) -> dict:
    glue_keys = {k for _, k in COLUMNS}
    return glue_average({k: v for k, v in scores.items() if k in glue_keys}, include_wnli=include_wnli)


TABLE_COLUMNS = ["finished_at", "checkpoint", "model"]  # a results table's first columns: how one of ours is told


def append_csv(path: Path, row: dict) -> None:
    """One row per evaluation; columns grow as new tasks appear (the file is rewritten then), under a lock, so the
    jobs of a sweep that share the table never lose each other's rows."""
    if path.is_symlink():  # the user's link to a shared table: that table is the one updated
        if not path.exists():
            raise UserError(f"{path} is a link to nothing ({os.readlink(path)})")
        path = path.resolve()
    with writing(path.parent, path.name), locked(path):  # a read-only or full folder: WriteFault, one line
        rows = []
        if path.exists():
            try:
                reader = csv.DictReader(text_lines(path))
                rows = list(reader)
            except csv.Error as err:
                raise UserError(f"{path}: not a results table ({err}); give eval.results_table a new file") from None
            if path.stat().st_size and list(reader.fieldnames or [])[:3] != TABLE_COLUMNS:
                raise UserError(f"{path} is not a results table of cramming's (its header is not "
                                f"{','.join(TABLE_COLUMNS)},...); it was left as it is")
        rows.append({k: ("" if v is None else v) for k, v in row.items()})
        fields = list(dict.fromkeys(k for r in rows for k in r))
        with atomic_open(path, "w", newline="") as fh:
            writer = csv.DictWriter(fh, fieldnames=fields, restval="")
            writer.writeheader()
            writer.writerows(rows)
