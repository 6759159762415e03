"""Sweeps: a multirun grid writes one folder per job and a manifest; eval_after fine-tunes the fresh
checkpoint, checked before training; the objective a sweeper receives."""

import json
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
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
    cases = {"/no/such": ["eval_after=true", "eval_overrides=['eval.tasks=[sst2]','eval.data_dir=/no/such']"],
             "eval_overrides": ["eval_after=true", "eval_overrides=['eval.bogus=1']"],
             "needs eval_after=true": ["sweep_objective=glue_average"]}
    with ThreadPoolExecutor(len(cases)) as pool:  # three interpreters at once: most of each is start-up
        results = pool.map(lambda i: run_pretrain(*TINY, *list(cases.values())[i], run_dir=tmp_path / str(i)),
                           range(len(cases)))
        for i, (fragment, result) in enumerate(zip(cases, results)):
            one_line_error(result, fragment)
            assert not (tmp_path / str(i) / "checkpoint").exists() and not (tmp_path / str(i) / "metrics.jsonl").exists()


def test_swept_values_are_told_from_fixed_ones():
    from cramming.sweep import is_swept, name_jobs_by_swept_keys

    assert is_swept("1,2") and is_swept("interval(0.1,0.2)") and is_swept("[a],[b]")
    assert not is_swept("[local,global]") and not is_swept("'a,b'") and not is_swept("{x:1,y:2}")
    argv = ["pretrain.py", "-m", "arch.position=learned,rotary", "budget=0.1", "+experiment=x", "hydra.run.dir=d"]
    named = name_jobs_by_swept_keys(argv)
    assert named[2] == "hydra.job.config.override_dirname.exclude_keys=[name,budget,experiment]"
    assert named[:2] + named[3:] == argv
    assert name_jobs_by_swept_keys(argv[:1] + argv[2:]) == argv[:1] + argv[2:]  # not a multirun: unchanged


def test_a_failing_job_does_not_end_the_sweep(tmp_path):
    """The middle job's value composes but fails validation (3 heads do not divide 64): the other two still run,
    the manifest says which failed and why, and the sweep exits 1 with one line naming the failed job's log."""
    tiny = [o for o in TINY if not o.startswith("arch.num_heads=")]
    result = run_pretrain("-m", *tiny, "arch.num_heads=2,3,4", f"hydra.sweep.dir={tmp_path}")
    assert result.returncode == 1, result.stderr[-3000:]
    assert "Traceback" not in result.stderr
    jobs = json.loads((tmp_path / "manifest.json").read_text())["jobs"]
    assert [job["status"] for job in jobs] == ["finished", "failed", "finished"]
    failed = jobs[1]
    assert failed["exit_code"] == 2 and "arch.num_heads=3" in failed["error"]
    assert failed["error"] in Path(failed["log"]).read_text()
    for job in (jobs[0], jobs[2]):
        assert (Path(job["dir"]) / "checkpoint" / "model.safetensors").is_file() and job["objective"] > 0
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert errors[0] == failed["error"]  # the job's own line, once
    assert len(errors) == 2 and errors[1] == result.stderr.strip().splitlines()[-1]
    assert errors[1].startswith("error: 1 of 3 sweep jobs failed: #1 ") and failed["log"] in errors[1]


def test_the_sweep_outcome_counts_this_launch_only(tmp_path, capsys):
    """A sweep continued in the same folder: an earlier launch's failed entry does not fail this one."""
    from omegaconf import OmegaConf

    from cramming.sweep import SweepOutcome, record_job

    config = OmegaConf.create({"hydra": {"sweep": {"dir": str(tmp_path)}}})
    record_job(tmp_path, 0, tmp_path / "0", [], status="failed", error="error: earlier")
    record_job(tmp_path, 1, tmp_path / "1", [], status="stopped", error="stopped: earlier")
    outcome = SweepOutcome()
    outcome.on_multirun_start(config)
    record_job(tmp_path, 1, tmp_path / "1", [], status="finished", objective=1.0)
    outcome.on_multirun_end(config)  # job 0 is the earlier launch's: no exit
    record_job(tmp_path, 2, tmp_path / "2", [], status="failed", error="error: now", log=str(tmp_path / "2.log"))
    with pytest.raises(SystemExit) as exit_:
        outcome.on_multirun_end(config)
    assert exit_.value.code == 1
    assert capsys.readouterr().err.startswith(f"error: 1 of 2 sweep jobs failed: #2 {tmp_path / '2.log'} ")
