"""Sweeps: a multirun grid writes one folder per job and a manifest; eval_after fine-tunes the fresh
checkpoint, checked before training; the objective a sweeper receives."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
from conftest import REPO, needs_shared, one_line_error, run_pretrain
from matplotlib.image import imread

from cramming.report import collect_runs, differing_keys
from cramming.report_plots import labels_for, loss_figure

TINY = ["arch=crammed-bert-tiny", "arch.num_layers=1", "arch.hidden_size=64", "arch.num_heads=2",
        "arch.ffn_size=128", "impl=cpu", "train=cpu-smoke", "train.validation_sequences=16", "data=sanity",
        "data.vocab_size=256", "data.seq_length=32", "data.max_chars=60000", "data.validation_fraction=0.1",
        "train.max_steps=2", "train.batch_size=16"]


def test_a_two_by_two_multirun_writes_four_runs_and_a_manifest(tmp_path):
    result = run_pretrain("-m", *TINY, "arch.position=learned,rotary", "train.lr=1e-3,2e-3",
                          f"hydra.sweep.dir={tmp_path}", in_process=True)
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
    result = run_pretrain(*TINY, "eval_after=true",
                          f"eval_overrides=['eval.data_dir={glue}','eval.tasks=[rte]','eval.max_train_examples=64',"
                          "'eval.recipe.epochs=1','eval.recipe.max_length=64']",
                          run_dir=tmp_path, in_process=True)
    assert result.returncode == 0, result.stderr[-3000:]
    results = json.loads((tmp_path / "eval" / "results.json").read_text())
    assert results["complete"] and results["checkpoint"] == str(tmp_path / "checkpoint")
    assert "average" in results["models"]["pretrained"]["glue"]
    assert result.stdout.strip().splitlines()[-1].startswith("results: ")


def test_eval_after_is_checked_before_training(tmp_path):
    cases = {"/no/such": ["eval_after=true", "eval_overrides=['eval.tasks=[sst2]','eval.data_dir=/no/such']"],
             "eval_overrides": ["eval_after=true", "eval_overrides=['eval.bogus=1']"],
             "needs eval_after=true": ["sweep_objective=glue_average"]}
    for i, (fragment, overrides) in enumerate(cases.items()):
        one_line_error(run_pretrain(*TINY, *overrides, run_dir=tmp_path / str(i), in_process=True), fragment)
        assert not (tmp_path / str(i) / "checkpoint").exists() and not (tmp_path / str(i) / "metrics.jsonl").exists()


def test_swept_values_are_told_from_fixed_ones():
    from cramming.sweep import fixed_keys, name_jobs_by_swept_keys

    swept = ["a=1,2", "b=interval(0.1,0.2)", "c=[a],[b]"]
    fixed = ["d=[local,global]", "+e='a,b'", "~f={x:1,y:2}", "g@pkg=1"]
    assert fixed_keys(swept + fixed + ["hydra.run.dir=d", "h=("]) == ["d", "e", "f", "g"]
    argv = ["pretrain.py", "-m", "arch.position=learned,rotary", "budget=0.1", "+experiment=x", "hydra.run.dir=d"]
    named = name_jobs_by_swept_keys(argv)
    assert named[2] == "hydra.job.config.override_dirname.exclude_keys=[name,budget,experiment]"
    assert named[:2] + named[3:] == argv
    assert name_jobs_by_swept_keys(argv[:1] + argv[2:]) == argv[:1] + argv[2:]  # not a multirun: unchanged


def test_a_failing_job_does_not_end_the_sweep(tmp_path):
    """The middle job's value composes but fails validation (3 heads do not divide 64): the other two still run,
    the manifest says which failed and why, and the sweep exits 1 with one line naming the failed job's log."""
    tiny = [o for o in TINY if not o.startswith("arch.num_heads=")]
    result = run_pretrain("-m", *tiny, "arch.num_heads=2,3,4", f"hydra.sweep.dir={tmp_path}", in_process=True)
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


def test_glue_average_refuses_a_partial_evaluation_before_training(tmp_path):
    """A partial GLUE average (a subset of tasks, capped examples) would rank trials on another scale."""
    glue = needs_shared("glue")
    result = run_pretrain(*TINY, "eval_after=true", "sweep_objective=glue_average",
                          f"eval_overrides=['eval.data_dir={glue}','eval.tasks=[rte]','eval.max_train_examples=64']",
                          run_dir=tmp_path, in_process=True)
    one_line_error(result, "sweep_objective=glue_average", "this evaluation is partial",
                   "eval.tasks leaves out cola, sst2, mrpc, qqp, stsb, mnli, qnli", "eval.max_train_examples=64")
    assert not (tmp_path / "metrics.jsonl").exists()


def test_an_objective_that_is_missing_or_partial_fails_the_trial():
    from types import SimpleNamespace

    from cramming.errors import UserError
    from cramming.sweep import objective_value

    val_loss, glue = SimpleNamespace(sweep_objective="val_loss"), SimpleNamespace(sweep_objective="glue_average")
    assert objective_value(val_loss, {"val_loss": 4.5}, None) == 4.5
    for summary in ({}, {"val_loss": None}, {"val_loss": float("nan")}):
        with pytest.raises(UserError, match="no finite validation loss"):
            objective_value(val_loss, summary, None)
    assert objective_value(val_loss, {"dryrun": True, "checkpoint": None}, None) is None

    def results(comparable=True, skipped=None, average=80.0):
        return {"comparable": comparable, "skipped": skipped or {},
                "models": {"pretrained": {"glue": {"average": average}}}}

    assert objective_value(glue, {"val_loss": 4.5}, results()) == 80.0
    for partial in (results(comparable=False), results(skipped={"mnli": "missing"}), results(average=float("nan"))):
        with pytest.raises(UserError, match="no comparable GLUE average"):
            objective_value(glue, {"val_loss": 4.5}, partial)


def test_dryrun_with_eval_after_checks_the_evaluation_and_trains_nothing(tmp_path):
    (tmp_path / "train.csv").write_text("text,label\ngood day,1\nawful,0\nfine,1\nbad,0\n")
    result = run_pretrain(*TINY, "dryrun=true", "eval_after=true",
                          f"eval_overrides=['eval=custom','eval.train_file={tmp_path}/train.csv',"
                          f"'eval.dev_file={tmp_path}/train.csv']", run_dir=tmp_path / "run", in_process=True)
    assert result.returncode == 0 and "Traceback" not in result.stderr, result.stderr[-3000:]
    assert "dryrun: config valid (and eval_after's evaluation" in result.stdout
    assert not (tmp_path / "run" / "eval").exists() and not (tmp_path / "run" / "checkpoint").exists()
    # ... and the evaluation really was checked: a missing task file stops the dryrun
    result = run_pretrain(*TINY, "dryrun=true", "eval_after=true",
                          f"eval_overrides=['eval=custom','eval.train_file={tmp_path}/none.csv',"
                          f"'eval.dev_file={tmp_path}/train.csv']", run_dir=tmp_path / "run2", in_process=True)
    one_line_error(result, "none.csv")


def test_a_stop_signal_during_the_last_save_leaves_eval_after_unbegun(tmp_path, monkeypatch):
    """pretrain() returns a whole run that a signal reached after its last step: the evaluation is not begun, and
    the line says the command that runs it."""
    from cramming import commands, pretraining

    (tmp_path / "train.csv").write_text("text,label\ngood day,1\nawful,0\nfine,1\nbad,0\n")
    monkeypatch.setattr(pretraining, "pretrain", lambda config, run_dir: {
        "checkpoint": "/runs/x/checkpoint", "stopped_by": "SIGTERM", "val_loss": 4.0, "averaging": None})
    monkeypatch.setattr(commands, "evaluate_after", lambda *args: pytest.fail("eval_after began"))
    result = run_pretrain(*TINY, "eval_after=true", f"eval_overrides=['eval=custom','eval.train_file={tmp_path}/"
                          f"train.csv','eval.dev_file={tmp_path}/train.csv']", run_dir=tmp_path / "run", in_process=True)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip().splitlines()[-1] == ("eval_after not run (SIGTERM): evaluate the checkpoint with "
                                                      "`python eval.py checkpoint=/runs/x/checkpoint`")


def test_parallel_jobs_lose_no_manifest_entry_and_no_results_row(tmp_path, monkeypatch):
    """Jobs that read, change and rewrite a shared file at the same moment: under the file lock none is lost (each
    read is slowed down here so that, without the lock, every job would rewrite what it read before the others)."""
    import csv
    import threading
    import time

    from cramming import sweep
    from cramming.eval import results as report

    def together(target, calls):
        threads = [threading.Thread(target=target, args=args, kwargs=kwargs) for args, kwargs in calls]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()

    read_manifest = sweep.read_manifest
    monkeypatch.setattr(sweep, "read_manifest", lambda d: (read_manifest(d), time.sleep(0.3))[0])
    together(sweep.record_job, [((tmp_path, i, tmp_path / str(i), []), {"status": "finished"}) for i in range(4)])
    assert [job["job"] for job in read_manifest(tmp_path)] == [0, 1, 2, 3]

    table = tmp_path / "results.csv"
    row = {"finished_at": "2026", "checkpoint": "c"}  # a results table's first columns (eval/results.py)
    report.append_csv(table, {**row, "model": "first", "rte": 50.0})
    reader = csv.DictReader

    def slow_reader(*args, **kwargs):
        time.sleep(0.3)
        return reader(*args, **kwargs)

    monkeypatch.setattr(csv, "DictReader", slow_reader)
    together(report.append_csv, [((table, {**row, "model": f"m{i}", "rte": float(i)}), {}) for i in range(4)])
    with open(table, newline="") as fh:
        rows = list(reader(fh))
    assert sorted(row["model"] for row in rows) == ["first", "m0", "m1", "m2", "m3"]
    assert not list(tmp_path.glob(".*.tmp"))  # every write renamed into place
