"""Sweeps: a multirun grid writes one folder per job and a manifest; eval_after fine-tunes the fresh
checkpoint, checked before training; the objective a sweeper receives."""

import json
import subprocess
import sys
from pathlib import Path

from matplotlib.image import imread

from conftest import REPO, needs_shared, one_line_error, run_pretrain
from cramming.report import collect_runs, differing_keys
from cramming.report_plots import labels_for, loss_figure

TINY = ["arch=crammed-bert-tiny", "arch.num_layers=1", "arch.hidden_size=64", "arch.num_heads=2",
        "arch.ffn_size=128", "impl=cpu", "train=cpu-smoke", "train.validation_sequences=16", "data=sanity",
        "data.vocab_size=256", "data.seq_length=32", "data.max_chars=60000", "data.validation_fraction=0.1",
        "train.max_steps=2", "train.batch_size=16"]


def test_a_two_by_two_multirun_writes_four_runs_and_a_manifest(tmp_path):
    result = run_pretrain("-m", *TINY, "arch.position=learned,rotary", "train.lr=1e-3,2e-3",
                          f"hydra.sweep.dir={tmp_path}")
    assert result.returncode == 0, result.stderr[-3000:]
    manifest = json.loads((tmp_path / "manifest.json").read_text())["jobs"]
    assert [job["job"] for job in manifest] == [0, 1, 2, 3]
    assert all(job["status"] == "finished" and job["objective"] > 0 for job in manifest)
    grids = {tuple(sorted(o for o in job["overrides"] if o.startswith(("arch.position", "train.lr"))))
             for job in manifest}
    assert len(grids) == 4
    for job in manifest:
        summary = json.loads((tmp_path / job["dir"] / "train_summary.json").read_text())
        assert summary["val_loss"] == job["objective"]
        assert "arch.position=" in job["dir"] and "train.lr=" in job["dir"]  # readable folder names
    # the offline report over the sweep: the table of the two swept keys, and one loss line per job
    report = subprocess.run([sys.executable, "-m", "cramming.report", str(tmp_path)], cwd=REPO,
                            capture_output=True, text=True)
    assert report.returncode == 0, report.stderr[-2000:]
    text = Path(report.stdout.strip().splitlines()[-1].removeprefix("report: ")).read_text()
    assert "arch.position" in text and "train.lr" in text and text.count("finished") >= 4
    runs = collect_runs([str(tmp_path)])
    keys = differing_keys(runs)
    assert set(keys) == {"arch.position", "train.lr"}
    figure = loss_figure(runs, "tokens", labels_for(runs, keys))
    assert len(figure.axes[0].get_lines()) == 4
    assert all(imread(tmp_path / "report" / name).ndim == 3 for name in ("loss_vs_tokens.png", "loss_vs_time.png"))


def test_eval_after_fine_tunes_the_fresh_checkpoint(tmp_path):
    glue = needs_shared("glue")
    result = run_pretrain(*TINY, "eval_after=true", "sweep_objective=glue_average",
                          f"eval_overrides=['eval.data_dir={glue}','eval.tasks=[rte]','eval.max_train_examples=64',"
                          "'eval.recipe.epochs=1','eval.recipe.max_length=64']",
                          run_dir=tmp_path, timeout=600)
    assert result.returncode == 0, result.stderr[-3000:]
    results = json.loads((tmp_path / "eval" / "results.json").read_text())
    assert results["complete"] and results["checkpoint"] == str(tmp_path / "checkpoint")
    assert "average" in results["models"]["pretrained"]["glue"]
    assert result.stdout.strip().splitlines()[-1].startswith("results: ")


def test_eval_after_is_checked_before_training(tmp_path):
    result = run_pretrain(*TINY, "eval_after=true", "eval_overrides=['eval.tasks=[sst2]','eval.data_dir=/no/such']",
                          run_dir=tmp_path)
    one_line_error(result, "/no/such")
    assert not (tmp_path / "checkpoint").exists() and not (tmp_path / "metrics.jsonl").exists()
    result = run_pretrain(*TINY, "eval_after=true", "eval_overrides=['eval.bogus=1']", run_dir=tmp_path)
    one_line_error(result, "eval_overrides")
    result = run_pretrain(*TINY, "sweep_objective=glue_average", run_dir=tmp_path)
    one_line_error(result, "needs eval_after=true")


def test_swept_values_are_told_from_fixed_ones():
    from cramming.sweep import is_swept, name_jobs_by_swept_keys

    assert is_swept("1,2") and is_swept("interval(0.1,0.2)") and is_swept("[a],[b]")
    assert not is_swept("[local,global]") and not is_swept("'a,b'") and not is_swept("{x:1,y:2}")
    argv = ["pretrain.py", "-m", "arch.position=learned,rotary", "budget=0.1", "+experiment=x", "hydra.run.dir=d"]
    named = name_jobs_by_swept_keys(argv)
    assert named[2] == "hydra.job.config.override_dirname.exclude_keys=[name,budget,experiment]"
    assert named[:2] + named[3:] == argv
    assert name_jobs_by_swept_keys(argv[:1] + argv[2:]) == argv[:1] + argv[2:]  # not a multirun: unchanged
