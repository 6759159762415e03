"""`python pretrain.py` end to end, as a user runs it: real text, multirun, dryrun, and the bad-input contract
(exit code 2, one `error:` line, no traceback) for config, data and hub errors."""

import json
import os
import subprocess
import sys
import textwrap

import pytest
from conftest import REPO, last_line_path, one_line_error, run_pretrain

CPU_TINY = ["arch=crammed-bert-tiny", "impl=cpu", "train=cpu-smoke"]


def test_real_text_one_minute_budget_learns(real_pretrain_run, tmp_path):
    """About a minute of training on real English lowers the validation loss below the untrained model's,
    and the checkpoint loads in a fresh interpreter that never imports cramming."""
    run_dir, result = real_pretrain_run
    checkpoint = str(last_line_path(result, "checkpoint: "))
    summary = json.loads((run_dir / "checkpoint" / "train_summary.json").read_text())
    assert set(summary["wall_seconds"]) == {"setup", "compile", "train", "checkpoint", "eval", "autotune"}
    lines = (run_dir / "metrics.jsonl").read_text().splitlines()
    records = [json.loads(line) for line in lines]
    assert len(records) >= summary["steps"] and records[-1]["val_loss"] == summary["val_loss"]
    # The clock logic, not the machine's speed: the budget (0.015 h = 54 s) is spent, never cut short, and the run
    # took no step once it was: every step but the last began inside the budget, the last one ended past it.
    steps = [r for r in records if "loss" in r]
    assert [r["step"] for r in steps] == list(range(1, summary["steps"] + 1))
    assert all(r["budget_fraction"] < 1 for r in steps[:-1]) and steps[-1]["budget_fraction"] > 0.99
    assert steps[-2]["elapsed_s"] < 54 and steps[-1]["elapsed_s"] > 54 - 0.5  # logged just before the clock's check
    spent = summary["wall_seconds"]
    assert spent["train"] + spent["compile"] + spent["checkpoint"] == pytest.approx(steps[-1]["elapsed_s"], abs=1.0)
    assert summary["val_loss"] < summary["untrained_val_loss"] - 0.5
    script = textwrap.dedent(f"""
        import sys, torch
        from transformers import AutoModelForMaskedLM, AutoTokenizer
        tok = AutoTokenizer.from_pretrained({checkpoint!r}, trust_remote_code=True)
        model = AutoModelForMaskedLM.from_pretrained({checkpoint!r}, trust_remote_code=True).eval()
        assert "cramming" not in sys.modules
        batch = tok(["the [MASK] of the river", "a second sentence"], padding=True, return_tensors="pt")
        logits = model(**batch).logits
        assert logits.shape[:2] == batch["input_ids"].shape and torch.isfinite(logits).all()
        print("loaded", type(model).__name__)
    """)
    loaded = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, cwd=tmp_path)
    assert loaded.returncode == 0, loaded.stderr[-3000:]
    assert "loaded CrammedForMaskedLM" in loaded.stdout


def test_multirun_two_jobs(tmp_path, cache_dir):
    result = subprocess.run(
        [sys.executable, "pretrain.py", "-m", *CPU_TINY, "data=sanity", "train.max_steps=2", "name=sweep",
         "arch.num_layers=1,2", f"hydra.sweep.dir={tmp_path}"],
        cwd=REPO, capture_output=True, text=True, timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    jobs = sorted(p for p in tmp_path.iterdir() if p.is_dir())
    assert len(jobs) == 2
    assert [job.name for job in jobs] == ["0_arch.num_layers=1", "1_arch.num_layers=2"]  # named by the swept key
    layers, caches = [], set()
    for job in jobs:
        summary = json.loads((job / "checkpoint" / "train_summary.json").read_text())
        layers.append(summary["config"]["arch"]["num_layers"])
        caches.add(summary["data"]["cache"])
    assert layers == [1, 2] and len(caches) == 1
    assert result.stdout.count("checkpoint: ") == 2


def test_dryrun_touches_no_data_and_leaves_no_folder(tmp_path):
    result = run_pretrain("dryrun=true", "data=local-text", "data.path=/nonexistent/but/not/read",
                          run_dir=tmp_path / "dry", in_process=True)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "dryrun: config valid" in result.stdout
    assert not (tmp_path / "dry").exists()  # a dry run made nothing to keep


def test_a_refused_run_leaves_no_folder_and_a_real_one_keeps_its_own(tmp_path):
    from test_eval_cli import run_eval

    one_line_error(run_pretrain(*CPU_TINY, "train.lr=-1", run_dir=tmp_path / "pre", in_process=True), "train.lr")
    one_line_error(run_pretrain(*CPU_TINY, f"train.resume={tmp_path}/nowhere", run_dir=tmp_path / "res", in_process=True),
                   "no such folder")
    one_line_error(run_eval(f"checkpoint={tmp_path}/nowhere", tmp_path=tmp_path, in_process=True), "no such folder")
    assert sorted(p.name for p in tmp_path.iterdir()) == []  # neither run folder, nor eval's
    (tmp_path / "kept").mkdir()
    (tmp_path / "kept" / "notes.txt").write_text("mine")  # a folder of the user's is refused before Hydra writes
    one_line_error(run_pretrain(*CPU_TINY, "train.lr=-1", run_dir=tmp_path / "kept", in_process=True), "notes.txt")
    assert sorted(os.listdir(tmp_path / "kept")) == ["notes.txt"]


def test_error_missing_path(tmp_path):
    result = run_pretrain(*CPU_TINY, "data=local-text", f"data.path={tmp_path}/nope.txt", run_dir=tmp_path / "r",
                          in_process=True)
    one_line_error(result, "no such file or folder", "nope.txt")


def test_error_hub_offline(tmp_path):
    result = run_pretrain(*CPU_TINY, "data=wikitext-103", run_dir=tmp_path / "r", in_process=True)
    one_line_error(result, "cannot be reached", "data=local-text")


def test_error_bad_config_before_any_work(tmp_path):
    """A bad value stops the run before the data (which does not exist here) is touched; every other
    bad value is checked in-process in test_config.py, and every data error in test_data.py."""
    result = run_pretrain(*CPU_TINY, "data=local-text", "data.path=/does/not/matter", "arch.position=spiral",
                          run_dir=tmp_path, in_process=True)
    one_line_error(result, "arch.position='spiral'")


def test_unknown_group_option_lists_choices(tmp_path):
    result = run_pretrain("arch=crammed-bert-huge", run_dir=tmp_path, in_process=True)
    assert result.returncode != 0 and "Traceback" not in result.stderr
    assert "crammed-bert-tiny" in result.stderr  # Hydra lists the available options
