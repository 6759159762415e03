"""What the report shows: the table (report.md and runs.csv), the loss curves, the scaling fit.

Figures are built as bare matplotlib Figures (no pyplot, so no global state and no display needed) and returned,
so tests and notebooks can inspect them before they are saved as PNG.
"""

import csv
import json
import math
from pathlib import Path

import numpy as np
from matplotlib import colormaps
from matplotlib.figure import Figure
from matplotlib.ticker import FuncFormatter, NullFormatter

# (column, heading, format) of the table after the run name and the differing keys.
COLUMNS = [
    ("status", "status", str),
    ("final_train_loss", "train loss", lambda v: f"{v:.4f}"),
    ("val_loss", "val loss", lambda v: f"{v:.4f}"),
    ("tokens", "tokens", lambda v: f"{v:,}"),
    ("tokens_per_s", "tokens/s", lambda v: f"{v:,.0f}"),
    ("parameters", "params", lambda v: f"{v / 1e6:.2f} M"),
    ("flops_per_token", "FLOPs/token", lambda v: f"{v:.3g}"),
    ("train_flops", "train FLOPs", lambda v: f"{v:.3g}"),
    ("glue_avg", "GLUE avg", lambda v: f"{v:.1f}"),
]
# Shown in report.md only where some run has a value: the averaged weights' (train.averaging) and the energy.
OPTIONAL = [
    ("averaged_val_loss", "averaged val loss", lambda v: f"{v:.4f}"),
    ("averaged_glue", "averaged GLUE", lambda v: f"{v:.1f}"),
    ("energy_kwh", "kWh", lambda v: f"{v:.3g}"),
    ("joules_per_token", "J/token", lambda v: f"{v:.3g}"),
]


def show(value) -> str:
    if value is None:
        return "–"
    return value if isinstance(value, str) else json.dumps(value)


def table_rows(runs, keys: list[str]) -> list[dict]:
    """One dict per run with raw values: the CSV's rows, formatted for markdown elsewhere."""
    rows = []
    for run in runs:
        row = {"run": run.name, **{k: run.config.get(k) for k in keys}}
        row["status"] = "finished" if run.finished else "incomplete"
        row.update({col: run.value(col) for col, _, _ in COLUMNS[1:] + OPTIONAL})
        row["path"] = str(run.path)
        rows.append(row)
    return rows


def shown_columns(runs) -> list[tuple]:
    return COLUMNS + [c for c in OPTIONAL if any(run.value(c[0]) is not None for run in runs)]


def markdown_table(runs, keys: list[str]) -> str:
    columns = shown_columns(runs)
    headings = ["run", *keys, *(h for _, h, _ in columns)]
    lines = ["| " + " | ".join(headings) + " |", "|" + "---|" * (len(keys) + 2) + "---:|" * (len(columns) - 1)]
    for run, row in zip(runs, table_rows(runs, keys)):
        cells = [run.name, *(show(row[k]) for k in keys)]
        for col, _, fmt in columns:
            value = row[col]
            cells.append("–" if value is None or value == "" else fmt(value))
            if col == "glue_avg" and run.glue is not None and not run.glue_comparable:
                cells[-1] += " †"
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    return "\n".join(lines)


def write_csv(path: Path, rows: list[dict]) -> None:
    with open(path, "w", newline="", encoding="utf-8") as fh:
        writer = csv.DictWriter(fh, fieldnames=list(rows[0]))
        writer.writeheader()
        for row in rows:
            writer.writerow({k: "" if v is None else v if isinstance(v, (str, int, float)) else json.dumps(v)
                             for k, v in row.items()})


def short_names(keys: list[str]) -> dict[str, str]:
    """`arch.position` -> `position` where the last parts are unique: shorter plot labels."""
    last = [k.rsplit(".", 1)[-1] for k in keys]
    return {k: (s if last.count(s) == 1 else k) for k, s in zip(keys, last)}


def labels_for(runs, keys: list[str], group: str | None = None, longest: int = 60) -> list[str]:
    """Plot labels: the values of the differing keys, or the run names where those would not fit a legend;
    led by the --group value where the label does not already show it."""
    short = short_names(keys)
    labels = [" ".join(f"{short[k]}={show(r.config.get(k))}" for k in keys) for r in runs]
    if not keys or max(map(len, labels)) > longest:
        labels = [r.name for r in runs]
    if group:
        tags = [f"{short.get(group, group)}={show(r.config.get(group))}" for r in runs]
        labels = [label if tag in label.split(" ") else f"{tag}: {label}" for tag, label in zip(tags, labels)]
    return labels


LINESTYLES = ["-", "--", ":", "-."]
AXES = {"tokens": "tokens", "elapsed_s": "elapsed training time (s)"}


def ema(values: list[float], weight: float) -> list[float]:
    """TensorBoard-style smoothing: an exponential moving average, debiased so it starts at the first value.
    A non-finite value stays a gap and does not poison what follows."""
    if weight <= 0:
        return list(values)
    out, average, seen = [], 0.0, 0
    for value in values:
        if not math.isfinite(value):
            out.append(math.nan)
            continue
        seen += 1
        average = weight * average + (1 - weight) * value
        out.append(average / (1 - weight**seen))
    return out


def line_styles(n: int, groups: list | None) -> list[tuple]:
    """(colour, linestyle) per run: a colour each, or one colour per group value with the line style telling
    the runs of one group apart."""
    colors = colormaps["tab10"].colors
    if groups is None:
        return [(colors[i % 10], LINESTYLES[i // 10 % 4]) for i in range(n)]
    order, count, styles = list(dict.fromkeys(map(str, groups))), {}, []
    for value in map(str, groups):
        styles.append((colors[order.index(value) % 10], LINESTYLES[count.get(value, 0) % 4]))
        count[value] = count.get(value, 0) + 1
    return styles


def loss_figure(runs, x: str, labels: list[str], groups: list | None = None, smooth: float = 0.0) -> Figure:
    """Training loss against `x` ("tokens" or "elapsed_s"): one line per run that logged a step, and a dot at
    each finished run's final validation loss."""
    fig = Figure(figsize=(10, 5), dpi=110, layout="constrained")
    ax = fig.add_subplot()
    for run, label, (color, style) in zip(runs, labels, line_styles(len(runs), groups)):
        points = [(r[x], r["loss"]) for r in run.curve if r.get(x) is not None and r.get("loss") is not None]
        if not points:
            continue
        xs, losses = zip(*points)
        ax.plot(xs, ema(list(losses), smooth), color=color, linestyle=style, linewidth=1.4, label=label)
        val = run.value("val_loss")
        if val is not None:
            ax.scatter([xs[-1]], [val], color=color, marker="o", s=30, zorder=3)
        averaged = run.value("averaged_val_loss")
        if averaged is not None:
            ax.scatter([xs[-1]], [averaged], color=color, marker="*", s=90, zorder=3)
    starred = any(run.value("averaged_val_loss") is not None for run in runs)
    ax.set_xlabel(AXES[x])
    ax.set_ylabel("training loss" + (f" (EMA {smooth:g})" if smooth > 0 else ""))
    ax.set_title(f"loss vs {AXES[x].split(' (')[0]} (dots: validation loss"
                 + ("; stars: averaged weights" if starred else "") + ")")
    ax.grid(alpha=0.3)
    if ax.get_lines():
        fig.legend(loc="outside right upper", fontsize="small")
    return fig


def fit_power_law(compute, loss) -> dict:
    """loss = a * C^(-b), by a straight line through log C and log loss (least squares in log space, where the
    noise of a loss is closer to multiplicative). R² is that of the log-log fit."""
    x, y = np.log(np.asarray(compute, dtype=float)), np.log(np.asarray(loss, dtype=float))
    slope, intercept = np.polyfit(x, y, 1)
    residual = y - (slope * x + intercept)
    total = np.sum((y - y.mean()) ** 2)
    return {"a": float(np.exp(intercept)), "b": float(-slope), "n": len(x),
            "r2": float(1 - np.sum(residual**2) / total) if total > 0 else 1.0}


def scaling_points(runs) -> tuple[list, str | None]:
    """The finished runs a fit can use, or why there is no fit."""
    points = [(run, run.value("train_flops"), run.value("val_loss")) for run in runs if run.finished]
    points = [(run, c, v) for run, c, v in points if c and v and c > 0 and v > 0]
    if len(points) < 3:
        return points, (f"no fit: it needs at least 3 finished runs with a validation loss and FLOPs per token "
                        f"(train_summary.json); these runs have {len(points)}")
    compute = [c for _, c, _ in points]
    if max(compute) <= min(compute) * (1 + 1e-9):
        return points, "no fit: every finished run used the same training compute"
    return points, None


def scaling_figure(points, labels: list[str], fit: dict) -> Figure:
    fig = Figure(figsize=(7, 5), dpi=110, layout="constrained")
    ax = fig.add_subplot()
    compute = np.array([c for _, c, _ in points])
    ax.scatter(compute, [v for _, _, v in points], color="tab:blue", zorder=3, label="finished runs")
    grid = np.geomspace(compute.min() / 1.5, compute.max() * 1.5, 100)
    ax.plot(grid, fit["a"] * grid ** -fit["b"], color="tab:red",
            label=f"{fit['a']:.4g} · C^(-{fit['b']:.4f}),  R² {fit['r2']:.3f}")
    if len(points) <= 12:
        for (_, c, v), label in zip(points, labels):
            ax.annotate(label, (c, v), fontsize="x-small", xytext=(4, 4), textcoords="offset points")
    ax.set_xscale("log")
    ax.set_yscale("log")
    plain = FuncFormatter(lambda v, _: f"{v:g}")  # losses span well under a decade: label them as numbers
    ax.yaxis.set_major_formatter(plain)
    ax.yaxis.set_minor_formatter(plain)
    if compute.max() >= 10 * compute.min():  # a decade tick is in view: leave the crowded in-between ones bare
        ax.xaxis.set_minor_formatter(NullFormatter())
    ax.set_xlabel("training compute C = 3 · forward FLOPs per token · tokens")
    ax.set_ylabel("validation loss")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize="small")
    return fig


def save(fig: Figure, path: Path) -> str:
    fig.savefig(path)
    return path.name


def progress(run) -> str:
    """How far an incomplete run got, from its last logged step."""
    if not run.curve:
        return "no training step logged"
    last = run.curve[-1]
    fraction = last.get("budget_fraction")
    return (f"{last['step']} steps, {last.get('tokens') or 0:,} tokens, {last.get('elapsed_s') or 0:.0f} s logged"
            + (f", {100 * fraction:.0f} % of the budget" if fraction is not None else ""))


def energy_notes(runs) -> list[str]:
    """What the averaged and energy columns mean, and why a run has no energy."""
    notes = []
    if any(r.value("averaged_val_loss") is not None for r in runs):
        notes.append("Averaged val loss / GLUE: the weights train.averaging kept (`final-<kind>/`: ema or lawa), "
                     "beside the last weights' in the other columns.")
    sources = sorted({r.value("energy_source") for r in runs if r.value("energy_source")})
    if sources:
        notes.append(f"kWh and J/token: the energy the run's training took (the budget clock's running time; "
                     f"validation not counted) by the hardware counter ({', '.join(sources)}; nvml = the GPUs', "
                     "rapl = the CPU packages', whole machine).")
    missing = [r for r in runs if r.finished and r.value("energy_kwh") is None]
    reasons = sorted({str(r.value("energy_unavailable")) for r in missing if r.value("energy_unavailable")})
    if reasons:
        notes.append(f"No energy for {len(missing)} finished run(s): {'; '.join(reasons)}.")
    return ["", " ".join(notes)] if notes else []


def scaling_section(runs, labels: list[str], out: Path) -> list[str]:
    """The power-law fit of final validation loss against training FLOPs, with its figure, or why there is none."""
    points, reason = scaling_points(runs)
    if reason:
        return [reason + "."]
    fit = fit_power_law([c for _, c, _ in points], [v for _, _, v in points])
    fit_labels = [labels[runs.index(run)] for run, _, _ in points]
    return [f"![scaling]({save(scaling_figure(points, fit_labels, fit), out / 'scaling.png')})", "",
            (f"val_loss ≈ a · C^(-b) with **a = {fit['a']:.6g}**, **b = {fit['b']:.6g}** "
             f"(R² = {fit['r2']:.4f} in log-log space, {fit['n']} finished runs), C = training FLOPs. "
             "A least-squares line through log C and log loss; no irreducible-loss term. It pools every "
             "finished run, whatever else differs between them.")]


# Everything write_report writes into its folder: a folder holding anything else is not a report's to replace.
REPORT_FILES = ("report.md", "runs.csv", "loss_vs_tokens.png", "loss_vs_time.png", "scaling.png")
REPORT_TITLE = b"# Experiment report\n"  # report.md's first line: how a folder of an earlier report is told


def write_report(runs, keys: list[str], out: Path, group: str | None, smooth: float,
                 sources: list[str]) -> tuple[Path, str]:
    """runs.csv, the figures, and report.md with the table, the loss curves, the scaling fit and the runs that
    did not finish. Returns report.md's path and the markdown table."""
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    write_csv(out / "runs.csv", table_rows(runs, keys))
    table = markdown_table(runs, keys)
    labels = labels_for(runs, keys, group)
    groups = [show(r.config.get(group)) for r in runs] if group else None
    finished = sum(r.finished for r in runs)
    md = [REPORT_TITLE.decode().strip(), "",
          f"{len(runs)} run(s), {finished} finished, {len(runs) - finished} incomplete, from "
          + ", ".join(f"`{s}`" for s in sources) + ".", "", "## Runs", "", table, ""]
    md.append(f"Config keys that differ between the runs: {', '.join(f'`{k}`' for k in keys)}; every other key is "
              "the same." if keys else "The runs share one config (apart from name and paths).")
    md += ["", ("Train loss: the last step's; tokens/s: the run's average; train FLOPs: 3 × forward FLOPs per "
                "token × tokens. Finished runs' numbers come from train_summary.json, incomplete runs' from their "
                "last logged step. The same table, unformatted: `runs.csv`.")]
    md += energy_notes(runs)
    if any(r.glue is not None and not r.glue_comparable for r in runs):
        md += ["", "† not comparable to published scores: a capped (eval.max_train_examples), partial or "
               "skipped-task GLUE evaluation (results.json says why under not_comparable_because)."]

    md += ["", "## Loss curves", ""]
    if any(r.curve for r in runs):
        for x in AXES:
            name = "loss_vs_tokens.png" if x == "tokens" else "loss_vs_time.png"
            md.append(f"![{name[:-4]}]({save(loss_figure(runs, x, labels, groups, smooth), out / name)})")
        md += ["", "Training loss as logged (every `train.log_every` steps), "
               + (f"smoothed by an EMA of weight {smooth:g}" if smooth else "not smoothed")
               + (f", coloured by `{group}`" if group else "") + "; dots: final validation loss. Steps undone by "
               "a rollback are left out."]
    else:
        md.append("No run has logged a training step yet.")

    md += ["", "## Scaling", ""] + scaling_section(runs, labels, out)
    incomplete = [r for r in runs if not r.finished]
    md += ["", "## Incomplete runs", ""]
    md += [f"- `{r.name}`: {progress(r)} (`{r.path}`)" for r in incomplete]
    md += ["None: every run wrote its train_summary.json."] if not incomplete else []
    eventful = [r for r in runs if r.events]
    if eventful:
        md += ["", "Non-finite steps: " + "; ".join(
            f"`{r.name}` {sum(e['event'] == 'skip' for e in r.events)} skipped, "
            f"{sum(e['event'] == 'rollback' for e in r.events)} rollback(s)" for r in eventful) + "."]
    path = out / "report.md"
    path.write_text("\n".join(md) + "\n", encoding="utf-8")
    return path, table
