"""`python -m cramming.report` on hand-written run folders: table, CSV, plots, scaling fit, bad input."""

import csv
import json
import re
import subprocess
import sys

import numpy as np
import pytest
import yaml
from conftest import REPO, last_line_path, one_line_error
from matplotlib.image import imread

from cramming.report import collect_runs, differing_keys, main, read_metrics
from cramming.report_plots import fit_power_law, labels_for, loss_figure

A, B, FLOPS_PER_TOKEN = 30.0, 0.05, 1_000_000  # the grid's validation losses follow A * C^-B exactly
# A 2 x 2 grid: (job folder, arch.position, train.lr, tokens trained, finished)
GRID = [
    ("0_arch.position=rotary,train.lr=0.001", "rotary", 0.001, 1_000_000, True),
    ("1_arch.position=rotary,train.lr=0.0005", "rotary", 0.0005, 4_000_000, True),
    ("2_arch.position=learned,train.lr=0.001", "learned", 0.001, 16_000_000, True),
    ("3_arch.position=learned,train.lr=0.0005", "learned", 0.0005, 2_000_000, False),
]


def write_run(folder, position, lr, tokens, finished, job, steps=20):
    """What pretrain.py leaves behind; a finished run's config comes from its summary, an unfinished one's from
    .hydra/config.yaml, as for a run that crashed before writing a summary."""
    config = {"name": "grid", "seed": 0, "budget": 0.1, "arch": {"position": position, "num_layers": 2},
              "train": {"lr": lr, "batch_size": 64}, "data": {"cache_dir": f"/tmp/cache-{job}"}}
    (folder / ".hydra").mkdir(parents=True)
    overrides = ["name=grid", f"arch.position={position}", f"train.lr={lr}"]
    (folder / ".hydra" / "overrides.yaml").write_text(yaml.safe_dump(overrides))
    logged = steps if finished else steps // 2
    lines = [{"step": s, "loss": 10.0 - 3.0 * s / steps, "lr": lr, "batch_size": 64, "tokens": s * tokens // steps,
              "tokens_per_s": 1000.0, "grad_norm": 1.0, "elapsed_s": 0.5 * s, "budget_fraction": s / steps,
              "seq_length": 128} for s in range(1, logged + 1)]
    if not finished:
        (folder / ".hydra" / "config.yaml").write_text(yaml.safe_dump(config))
        (folder / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
        return
    val_loss = A * (3 * FLOPS_PER_TOKEN * tokens) ** -B
    lines.append({"step": steps, "val_loss": val_loss, "val_accuracy": 0.1, "val_predicted_tokens": 100})
    (folder / "metrics.jsonl").write_text("".join(json.dumps(line) + "\n" for line in lines))
    summary = {"name": "grid", "parameters": 3_000_000 + job, "flops_per_token": FLOPS_PER_TOKEN, "steps": steps,
               "tokens": tokens, "tokens_per_s": 2000.0, "mfu": None, "final_train_loss": 7.0,
               "val_loss": val_loss, "val_accuracy": 0.1, "untrained_val_loss": 10.2, "config": config,
               "wall_seconds": {"setup": 1, "compile": 0, "train": 10, "checkpoint": 0, "eval": 1}}
    (folder / "train_summary.json").write_text(json.dumps(summary))


@pytest.fixture
def sweep(tmp_path):
    """A Hydra multirun folder, nested as multirun/<name>/<date>/<job>; job 0 was evaluated on GLUE."""
    root = tmp_path / "multirun" / "grid" / "2026-01-01_00-00-00"
    for job, (name, position, lr, tokens, finished) in enumerate(GRID):
        write_run(root / name, position, lr, tokens, finished, job)
    results = {"checkpoint": str(root / GRID[0][0] / "checkpoint"), "comparable": True, "finished_at": "2026",
               "models": {"pretrained": {"glue": {"average": 71.25}}}}
    (root / GRID[0][0] / "eval").mkdir()
    (root / GRID[0][0] / "eval" / "results.json").write_text(json.dumps(results))
    (root / "manifest.json").write_text("{}")
    return tmp_path / "multirun"


def run_report(*args):
    return subprocess.run([sys.executable, "-m", "cramming.report", *map(str, args)], check=False, cwd=REPO,
                          capture_output=True, text=True, timeout=60)


def test_report_end_to_end(sweep, tmp_path):
    result = run_report(sweep, "--out", tmp_path / "out")
    assert result.returncode == 0, result.stderr[-2000:]
    path = last_line_path(result, "report: ")
    assert path == (tmp_path / "out" / "report.md").resolve()
    text = path.read_text()

    header = next(line for line in text.splitlines() if line.startswith("| run |"))
    assert "| arch.position | train.lr |" in header  # the two keys that differ, and nothing else
    assert "cache_dir" not in header and "name" not in header and "num_layers" not in header
    rows = [line for line in text.splitlines() if line.startswith("| ") and not line.startswith("| run")]
    assert len(rows) == 4
    for (name, position, lr, _, finished), row in zip(GRID, rows):
        assert name in row and f"| {position} | {lr} |" in row
        assert ("finished" if finished else "incomplete") in row
    assert "71.2" in rows[0] and "1,000,000" in rows[0]
    incomplete = text.split("## Incomplete runs")[1]
    assert GRID[3][0] in incomplete and "10 steps" in incomplete and GRID[0][0] not in incomplete

    with open(tmp_path / "out" / "runs.csv", newline="") as fh:
        table = list(csv.DictReader(fh))
    assert [r["run"] for r in table] == [g[0] for g in GRID]
    assert [r["status"] for r in table] == ["finished"] * 3 + ["incomplete"]
    assert table[0]["glue_avg"] == "71.25" and table[3]["val_loss"] == "" and table[3]["tokens"] == "1000000"

    for name in ("loss_vs_tokens.png", "loss_vs_time.png", "scaling.png"):
        image = imread(tmp_path / "out" / name)
        assert image.ndim == 3 and image.shape[0] > 200 and image.shape[1] > 200 and image.std() > 0
        assert f"]({name})" in text

    a = float(re.search(r"a = ([0-9.e+-]+)\*\*", text).group(1))
    b = float(re.search(r"b = ([0-9.e+-]+)\*\*", text).group(1))
    assert a == pytest.approx(A, rel=0.05) and b == pytest.approx(B, rel=0.05)


def test_loss_figures_have_one_line_per_run(sweep):
    runs = collect_runs([str(sweep)])
    keys = differing_keys(runs)
    assert keys == ["arch.position", "train.lr"]
    labels = labels_for(runs, keys)
    assert labels[0] == "position=rotary lr=0.001"
    for x in ("tokens", "elapsed_s"):
        ax = loss_figure(runs, x, labels).axes[0]
        assert len(ax.get_lines()) == 4
        assert [line.get_label() for line in ax.get_lines()] == labels
    assert len(ax.collections) == 3  # a validation dot for each finished run, none for job 3
    assert ax.get_lines()[3].get_xdata()[-1] == 5.0  # the incomplete run stops where its log does


def test_group_colours_by_key(sweep, tmp_path, capsys):
    main([str(sweep), "--out", str(tmp_path / "g"), "--group", "arch.position", "--smooth", "0.5"])
    assert capsys.readouterr().out.strip().splitlines()[-1].startswith("report: ")
    runs = collect_runs([str(sweep)])
    lines = loss_figure(runs, "tokens", labels_for(runs, ["train.lr"], "arch.position"),
                        groups=[r.config["arch.position"] for r in runs]).axes[0].get_lines()
    assert lines[0].get_color() == lines[1].get_color() != lines[2].get_color() == lines[3].get_color()
    assert lines[0].get_label() == "arch.position=rotary: lr=0.001"
    assert "smoothed by an EMA of weight 0.5" in (tmp_path / "g" / "report.md").read_text()


def test_fit_recovers_a_noisy_power_law():
    rng = np.random.default_rng(0)
    compute = np.geomspace(1e12, 1e17, 8)
    loss = 25.0 * compute**-0.06 * np.exp(rng.normal(0, 0.01, compute.size))
    fit = fit_power_law(compute, loss)
    assert fit["a"] == pytest.approx(25.0, rel=0.05) and fit["b"] == pytest.approx(0.06, rel=0.05)
    assert fit["r2"] > 0.95


def test_fewer_than_three_finished_runs_skip_the_fit(sweep, tmp_path, capsys):
    root = sweep / "grid" / "2026-01-01_00-00-00"
    main([str(root / GRID[0][0]), str(root / GRID[3][0]), "--out", str(tmp_path / "two")])
    text = (tmp_path / "two" / "report.md").read_text()
    assert "no fit: it needs at least 3 finished runs" in text
    assert not (tmp_path / "two" / "scaling.png").exists()


def test_runs_are_listed_in_job_number_order(tmp_path):
    """Hydra numbers a sweep's job folders 0_, 1_, ..., 10_: the table lists them by number (10_ after 9_, 2_
    before 10_), not as text would sort them."""
    root = tmp_path / "multirun"
    for job in (10, 2, 9, 11):
        write_run(root / f"{job}_train.lr={job}e-4", "rotary", job * 1e-4, 1_000_000, False, job)
    assert [r.name for r in collect_runs([str(root)])] == [f"{job}_train.lr={job}e-4" for job in (2, 9, 10, 11)]


def test_metrics_survive_rollbacks_and_a_cut_line(tmp_path):
    lines = [{"step": s, "loss": float(s), "tokens": s} for s in (1, 2, 3, 4)]
    lines += [{"step": 2, "event": "rollback"}, {"step": 3, "loss": 30.0, "tokens": 3}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(x) + "\n" for x in lines) + '{"step": 4, "lo')
    curve, final, events = read_metrics(tmp_path / "metrics.jsonl")
    assert [(r["step"], r["loss"]) for r in curve] == [(1, 1.0), (2, 2.0), (3, 30.0)]
    assert final is None and [e["event"] for e in events] == ["rollback"]


@pytest.mark.parametrize("case", ["missing", "no-runs"])
def test_bad_input_is_one_error_line(tmp_path, case):
    target = tmp_path / "nowhere" if case == "missing" else tmp_path
    one_line_error(run_report(target), str(target))
