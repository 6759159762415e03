"""The border with files, folders and other processes, as docs/security.md writes it down: what cramming writes.
Each test builds the attack (a user's folder, two launches at once, a full or read-only file system) and checks
the rule: nothing of the user's deleted or changed, each refusal one line with exit code 2, no debris.

Rules 3, 4, 6 and 8 (what is read) are in test_border_reading.py."""

import contextlib
import json
import os
import shutil
import subprocess
import sys
import textwrap
from datetime import datetime
from pathlib import Path

import pytest
import torch
from conftest import REPO, one_line_error, run_command
from test_resume import TINY

from cramming import run_folder
from cramming.checkpoints.model_folder import save_checkpoint
from cramming.checkpoints.step_folder import complete_checkpoints
from cramming.errors import UserError
from cramming.export import export_step
from cramming.outputs import fault_reason
from cramming.train.checkpointing import Checkpointer, load_checkpoint
from cramming.train.state import TrainState


def snapshot(folder: Path) -> dict:
    """Every file under `folder` and its bytes: what "nothing of the user's changed" compares."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


@contextlib.contextmanager
def small_disk(folder: Path, size: str, read_only: bool = False):
    """A tmpfs of `size` mounted on `folder` (remounted read-only after `folder`'s setup when asked): where the
    machine lets this process mount, else the test is skipped."""
    folder.mkdir(parents=True, exist_ok=True)
    mounted = subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(folder)], capture_output=True, check=False)
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here ({mounted.stderr.decode().strip()[:100]})")
    try:
        yield folder
    finally:
        subprocess.run(["umount", "-l", str(folder)], check=False)


def remount_read_only(folder: Path) -> None:
    subprocess.run(["mount", "-o", "remount,ro", str(folder)], check=True)


# ---------------------------------------------------------------- 1. never delete what cramming did not create


@pytest.mark.slow  # a new interpreter (or two): the command as a user runs it
def test_an_export_into_a_folder_holding_the_users_files_is_refused_and_changes_nothing(source_run, tmp_path):
    users = tmp_path / "mine"
    users.mkdir()
    (users / "notes.txt").write_text("my notes")
    (users / "config.json").write_text('{"mine": true}')  # a name a save writes: still not a folder of ours
    before = snapshot(users)
    result = subprocess.run([sys.executable, "-m", "cramming.export", str(source_run / "checkpoints" / "step-00000003"),
                             str(users)], cwd=REPO, capture_output=True, text=True, timeout=300, check=False)
    one_line_error(result, str(users), "notes.txt", "did not write")
    assert snapshot(users) == before and sorted(os.listdir(tmp_path)) == ["mine"]


@pytest.mark.slow  # a new interpreter (or two): the command as a user runs it
def test_an_export_into_the_current_folder_is_refused(source_run, tmp_path):
    here = tmp_path / "here"
    here.mkdir()
    (here / "keep.txt").write_text("keep")
    result = subprocess.run([sys.executable, "-m", "cramming.export", str(source_run / "checkpoints" / "step-00000003"),
                             "."], cwd=here, capture_output=True, text=True, timeout=300,
                            env={**os.environ, "PYTHONPATH": str(REPO)})
    one_line_error(result, "current folder")
    assert os.listdir(here) == ["keep.txt"]


def test_an_export_replaces_an_earlier_export_and_writes_into_an_empty_folder(source_run, tmp_path):
    step = source_run / "checkpoints" / "step-00000003"
    out = export_step(step, tmp_path / "out")
    (out / "README.md").write_text("stale")
    again = export_step(step, tmp_path / "out")  # an earlier export: ours to replace
    assert again == out and (out / "README.md").read_text() != "stale"
    (tmp_path / "empty").mkdir()
    assert (export_step(step, tmp_path / "empty") / "model.safetensors").is_file()
    assert not list(tmp_path.glob("*.tmp")) and not list(tmp_path.glob("*.old*"))  # no debris


def test_a_refused_eval_leaves_the_folder_it_was_given_as_it_was(tmp_path):
    """hydra.run.dir names a folder of the user's whose files look like bookkeeping (*.log): before, the refusal's
    cleanup removed it whole. Now a folder holding anything but a run of ours is refused before Hydra writes."""
    users = tmp_path / "logs"
    users.mkdir()
    (users / "training.log").write_text("a week of notes")
    before = snapshot(users)
    result = run_command("eval.py", ["checkpoint=/nowhere", f"hydra.run.dir={users}"])
    one_line_error(result, str(users), "training.log")
    assert snapshot(users) == before and sorted(os.listdir(users)) == ["training.log"]
    empty = tmp_path / "empty"
    empty.mkdir()
    one_line_error(run_command("eval.py", ["checkpoint=/nowhere", f"hydra.run.dir={empty}"]), "/nowhere")
    assert empty.is_dir() and os.listdir(empty) == []  # the user's empty folder stays; only Hydra's files went


def test_a_refused_run_removes_the_folders_it_made_and_nothing_above(tmp_path):
    made = tmp_path / "new" / "deep" / "run"
    one_line_error(run_command("eval.py", ["checkpoint=/nowhere", f"hydra.run.dir={made}"]), "/nowhere")
    assert not (tmp_path / "new").exists() and tmp_path.is_dir()


# ---------------------------------------------------------------- 2. a run's folder is its own


def test_two_launches_in_the_same_second_get_two_folders(tmp_path, monkeypatch):
    class Frozen(datetime):
        @classmethod
        def now(cls, tz=None):
            return datetime(2026, 1, 2, 3, 4, 5)

    monkeypatch.setattr(run_folder, "datetime", Frozen)
    monkeypatch.chdir(tmp_path)
    first = run_folder.new_run_folder("outputs", "x")
    second = run_folder.new_run_folder("outputs", "x")
    assert (first, second) == ("outputs/x/2026-01-02_03-04-05", "outputs/x/2026-01-02_03-04-05-2")
    assert Path(first).is_dir() and Path(second).is_dir()


@pytest.mark.slow  # a new interpreter (or two): the command as a user runs it
def test_concurrent_launches_of_one_name_each_write_their_own_folder(tmp_path):
    """Two real pretrain.py launches started together: each its own run folder, its own metrics."""
    args = [sys.executable, str(REPO / "pretrain.py"), *TINY, "train.max_steps=2", "name=twin",
            "train.checkpoint_every_minutes=null"]
    runs = [subprocess.Popen(args, cwd=tmp_path, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for _ in range(2)]
    outputs = [run.communicate(timeout=300) for run in runs]
    assert all(run.returncode == 0 for run in runs), [err[-2000:] for _, err in outputs]
    folders = sorted((tmp_path / "outputs" / "twin").iterdir())
    assert len(folders) == 2
    for folder in folders:
        steps = [json.loads(line)["step"] for line in (folder / "metrics.jsonl").read_text().splitlines()]
        assert steps == [1, 2, 2]  # one run's two steps and its final validation, not two runs interleaved


def test_a_second_launch_into_a_folder_in_use_is_refused(tmp_path):
    folder = tmp_path / "run"
    folder.mkdir()
    holder = subprocess.Popen([sys.executable, "-c", textwrap.dedent(f"""
        import fcntl, os, sys, time
        fd = os.open({str(folder)!r}, os.O_RDONLY)
        fcntl.flock(fd, fcntl.LOCK_EX)
        print("held", flush=True)
        time.sleep(60)
    """)], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        one_line_error(run_command("eval.py", ["checkpoint=/nowhere", f"hydra.run.dir={folder}"]),
                       str(folder), "in use by another running launch")
    finally:
        holder.kill()
    assert os.listdir(folder) == []
    one_line_error(run_command("eval.py", ["checkpoint=/nowhere", f"hydra.run.dir={folder}"]), "/nowhere")


@pytest.mark.parametrize("name", ["../../escaped", "ABSOLUTE/escaped", "a/../../escaped", "a//b"])
def test_a_name_cannot_leave_outputs(name, tmp_path):
    """pretrain.py runs from the repository: outputs/<name> must stay inside REPO/outputs."""
    name = name.replace("ABSOLUTE", str(tmp_path))
    result = run_command("pretrain.py", [f"name={name}", "dryrun=true", *TINY])
    one_line_error(result, f"name={name!r} is invalid")
    assert not (REPO / "escaped").exists() and not (REPO.parent / "escaped").exists()
    assert not (tmp_path / "escaped").exists() and not (REPO / "outputs" / "a").exists()


def test_a_run_may_continue_in_its_own_fixed_folder(tmp_path):
    """A requeued job with a fixed hydra.run.dir: the folder holds a run of ours (.hydra/), so it is used."""
    folder = tmp_path / "fixed"
    first = run_command("pretrain.py", [*TINY, "train.max_steps=2", "name=fixed", f"hydra.run.dir={folder}"])
    assert first.returncode == 0, first.stderr[-2000:]
    again = run_command("pretrain.py", [*TINY, "train.max_steps=2", "name=fixed", f"hydra.run.dir={folder}"])
    assert again.returncode == 0, again.stderr[-2000:]


# ---------------------------------------------------------------- 7. faults are lines, not debris


def tiny_model():
    torch.manual_seed(0)
    return torch.nn.Linear(160, 160)


def test_a_full_disk_during_a_step_checkpoint_is_one_line_and_the_last_one_stays_whole(tmp_path):
    with small_disk(tmp_path / "disk", "200k") as disk:
        model = tiny_model()
        opt, scaler = torch.optim.AdamW(model.parameters()), torch.amp.GradScaler("cpu", enabled=False)
        checkpointer = Checkpointer(disk, None, 5, {"seed": 0})
        checkpointer.save(model, opt, scaler, TrainState(step=1))
        with pytest.raises(UserError) as err:
            checkpointer.save(model, opt, scaler, TrainState(step=2))
        assert str(disk / "checkpoints") in str(err.value) and "the disk is full" in str(err.value)
        assert "\n" not in str(err.value)
        assert sorted(p.name for p in (disk / "checkpoints").iterdir()) == ["step-00000001"]  # no half step-2
        assert [p.name for p in complete_checkpoints(disk)] == ["step-00000001"]
        fresh = tiny_model()
        with torch.no_grad():
            fresh.weight.zero_()
        state = load_checkpoint(disk / "checkpoints" / "step-00000001", fresh, torch.optim.AdamW(fresh.parameters()),
                                torch.amp.GradScaler("cpu", enabled=False))
        assert state.step == 1 and torch.equal(fresh.weight, model.weight)  # resumable as it was


def test_a_read_only_folder_during_a_save_is_one_line(tmp_path):
    with small_disk(tmp_path / "disk", "1m") as disk:
        (disk / "checkpoints").mkdir()
        remount_read_only(disk)
        model = tiny_model()
        with pytest.raises(UserError, match=r"cannot write checkpoint step-00000001 in .*: the file system is "
                                            r"read-only"):
            Checkpointer(disk, None, 2, {}).save(model, torch.optim.AdamW(model.parameters()),
                                                 torch.amp.GradScaler("cpu", enabled=False), TrainState(step=1))


@pytest.mark.slow  # a new interpreter (or two): the command as a user runs it
def test_a_full_disk_during_an_export_leaves_no_half_folder(source_run, tmp_path):
    with small_disk(tmp_path / "disk", "64k") as disk:
        result = subprocess.run([sys.executable, "-m", "cramming.export",
                                 str(source_run / "checkpoints" / "step-00000003"), str(disk / "out")], cwd=REPO,
                                capture_output=True, text=True, timeout=300, check=False)
        one_line_error(result, "cannot write the model folder out", "the disk is full")
        assert os.listdir(disk) == []


def test_a_full_disk_during_the_final_checkpoint_removes_its_temporary_folder(source_run, tmp_path):
    from cramming.checkpoints.model_folder import is_complete
    from cramming.run import build_model  # noqa: F401  the model class: a real save's files

    source = source_run / "checkpoint"
    summary = json.loads((source / "train_summary.json").read_text())
    from transformers import PreTrainedTokenizerFast

    from cramming.model import CrammedForMaskedLM

    model = CrammedForMaskedLM.from_pretrained(source)
    tokenizer = PreTrainedTokenizerFast.from_pretrained(source)
    with small_disk(tmp_path / "disk", "96k") as disk, pytest.raises(UserError, match="the disk is full"):
        save_checkpoint(model, tokenizer, summary, disk)
    with small_disk(tmp_path / "disk2", "96k") as disk:
        with contextlib.suppress(UserError):
            save_checkpoint(model, tokenizer, summary, disk)
        assert os.listdir(disk) == [] and not is_complete(disk / "checkpoint")


def test_a_write_fault_is_told_from_other_errors(tmp_path):
    assert fault_reason(OSError(28, "No space left on device"), tmp_path) == "the disk is full"
    assert fault_reason(OSError(30, "Read-only file system"), tmp_path) == "the file system is read-only"
    assert fault_reason(ValueError("a bug"), tmp_path) is None
    assert fault_reason(RuntimeError("file write failed"), tmp_path) is None  # the folder has room and is writable


# ---------------------------------------------------------------- 5. write only where the user pointed


def test_a_read_only_checkpoint_keeps_its_scores_in_the_run_folder(source_run, tmp_path):
    from test_loading_safety import custom_task

    with small_disk(tmp_path / "ro", "4m") as disk:
        shutil.copytree(source_run / "checkpoint", disk / "checkpoint")
        remount_read_only(disk)
        before = snapshot(disk)
        result = run_command("eval.py", [f"checkpoint={disk / 'checkpoint'}", *custom_task(tmp_path),
                                         f"hydra.run.dir={tmp_path / 'eval'}",
                                         f"eval.results_table={tmp_path / 'results.csv'}"])
        assert result.returncode == 0, result.stderr[-2000:]
        assert "not updated (the file system is read-only); the scores are in results.json" in result.stdout
        assert json.loads((tmp_path / "eval" / "results.json").read_text())["complete"]
        assert snapshot(disk) == before


@pytest.mark.parametrize("command", ["report", "race", "onnx"])
def test_other_outputs_into_a_folder_or_file_of_the_users_are_refused(source_run, tmp_path, command):
    """python -m cramming.report --out, python -m cramming.race --out, and an ONNX graph onto an existing file."""
    from cramming import race, report
    from cramming.export_onnx import export_onnx

    users = tmp_path / "mine"
    users.mkdir()
    (users / "draft.md").write_text("my draft")
    before = snapshot(users)
    if command == "report":
        with pytest.raises(SystemExit) as stop:
            report.main([str(source_run), "--out", str(users)])
    elif command == "race":
        with pytest.raises(SystemExit) as stop:
            race.main(["--a", "train.lr=1e-3", "--b", "train.lr=2e-3", "--seeds", "2", "--out", str(users),
                       "train.target_loss=5"])
    else:
        with pytest.raises(UserError, match="draft.md already exists; it was left as it is"):
            export_onnx(source_run / "checkpoint", users / "draft.md")
        stop = None
    assert stop is None or stop.value.code == 2
    assert snapshot(users) == before


def test_a_manifest_that_is_not_one_is_one_line(tmp_path):
    from cramming.sweep import read_manifest

    (tmp_path / "manifest.json").write_text(json.dumps({"jobs": [{"job": "one"}]}))
    with pytest.raises(UserError, match="manifest.json: not a sweep manifest"):
        read_manifest(tmp_path)
    (tmp_path / "manifest.json").write_bytes(b"\xff\xfe")
    with pytest.raises(UserError, match="not valid UTF-8"):
        read_manifest(tmp_path)


def test_a_read_only_results_table_keeps_the_scores_in_results_json(source_run, tmp_path):
    from test_loading_safety import custom_task

    with small_disk(tmp_path / "ro", "1m") as disk:
        remount_read_only(disk)
        result = run_command("eval.py", [f"checkpoint={source_run / 'checkpoint'}", *custom_task(tmp_path),
                                         f"hydra.run.dir={tmp_path / 'eval'}", f"eval.results_table={disk / 'r.csv'}"])
        assert result.returncode == 0, result.stderr[-2000:]
        assert f"results table: {disk / 'r.csv'} not updated (the file system is read-only)" in result.stdout
        assert json.loads((tmp_path / "eval" / "results.json").read_text())["complete"]


def test_a_run_folder_whose_bookkeeping_links_out_is_refused(source_run, tmp_path):
    """A run folder of ours to continue in, whose .hydra/overrides.yaml is a link to a file of the user's: Hydra
    would write through it."""
    folder = tmp_path / "run"
    shutil.copytree(source_run / ".hydra", folder / ".hydra") if (source_run / ".hydra").is_dir() else None
    (folder / ".hydra").mkdir(parents=True, exist_ok=True)
    (folder / ".hydra" / "hydra.yaml").write_text("hydra:\n  help:\n    template: cramming\n")
    victim = tmp_path / "victim.yaml"
    victim.write_text("mine")
    (folder / ".hydra" / "overrides.yaml").unlink(missing_ok=True)
    (folder / ".hydra" / "overrides.yaml").symlink_to(victim)
    one_line_error(run_command("eval.py", ["checkpoint=/nowhere", f"hydra.run.dir={folder}"]),
                   "overrides.yaml is a link leading outside")
    assert victim.read_text() == "mine"


def test_a_link_under_outputs_cannot_take_a_run_elsewhere(tmp_path, monkeypatch):
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (tmp_path / "outputs").mkdir()
    (tmp_path / "outputs" / "lnk").symlink_to(elsewhere)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(SystemExit):
        run_folder.new_run_folder("outputs", "lnk")
    assert os.listdir(elsewhere) == []
    (tmp_path / "real").mkdir()  # outputs/ itself a link (to scratch space, say) is the user's choice: allowed
    (tmp_path / "outputs").rename(tmp_path / "old-outputs")
    (tmp_path / "outputs").symlink_to(tmp_path / "real")
    assert Path(run_folder.new_run_folder("outputs", "x")).resolve().is_relative_to(tmp_path / "real")


def test_files_named_like_ours_are_not_taken_for_ours(source_run, tmp_path):
    """A model folder needs a run's train_summary.json, a report folder a report.md of ours, a results table our
    header: a user's files of those names are left as they are."""
    from cramming import report

    users = tmp_path / "model"
    users.mkdir()
    (users / "config.json").write_text('{"mine": 1}')
    (users / "train_summary.json").write_text('{"mine": 2}')
    with pytest.raises(UserError, match="not a model folder cramming wrote"):
        export_step(source_run / "checkpoints" / "step-00000003", users)
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "report.md").write_text("# My notes\n")
    (notes / "runs.csv").write_text("a,b\n")
    before = snapshot(notes)
    with pytest.raises(SystemExit):
        report.main([str(source_run), "--out", str(notes)])
    assert snapshot(notes) == before


def test_a_results_table_that_is_not_ours_is_left_as_it_is(source_run, tmp_path):
    from test_loading_safety import custom_task

    table = tmp_path / "notes.md"
    table.write_text("my precious notes\nline2\n")
    result = run_command("eval.py", [f"checkpoint={source_run / 'checkpoint'}", *custom_task(tmp_path),
                                     f"hydra.run.dir={tmp_path / 'eval'}", f"eval.results_table={table}"])
    assert result.returncode == 0, result.stderr[-2000:]
    assert "is not a results table of cramming's" in result.stdout
    assert table.read_text() == "my precious notes\nline2\n"


def test_a_leftover_temporary_step_that_is_a_link_is_removed_not_followed(tmp_path):
    users = tmp_path / "users"
    users.mkdir()
    (users / "keep.txt").write_text("keep")
    (tmp_path / "checkpoints").mkdir()
    (tmp_path / "checkpoints" / "step-00000001.tmp").symlink_to(users)
    (tmp_path / "checkpoints" / "step-00000007.tmp").symlink_to(users)
    model = tiny_model()
    Checkpointer(tmp_path, None, 2, {}).save(model, torch.optim.AdamW(model.parameters()),
                                             torch.amp.GradScaler("cpu", enabled=False), TrainState(step=1))
    assert os.listdir(users) == ["keep.txt"]
    assert sorted(os.listdir(tmp_path / "checkpoints")) == ["step-00000001"]


@pytest.mark.parametrize("fault", ["full", "read-only"])
def test_a_run_folder_on_a_full_or_read_only_disk_is_one_line(tmp_path, fault):
    """Hydra writes .hydra/ and the job's log before any of the job runs: a fault there is one line too."""
    with small_disk(tmp_path / "disk", "64k") as disk:
        if fault == "full":
            with contextlib.suppress(OSError), open(disk / "filler", "wb") as fh:
                fh.write(b"x" * (1 << 20))
        else:
            remount_read_only(disk)
        before = sorted(os.listdir(disk))
        result = run_command("eval.py", ["checkpoint=/nowhere", f"hydra.run.dir={disk / 'run'}"])
        one_line_error(result, "the disk is full" if fault == "full" else "Read-only file system")
        assert sorted(os.listdir(disk)) == before


def test_a_race_writes_only_into_a_new_or_empty_folder(tmp_path):
    """Its run folders' logs would be written over a user's files, or through a link."""
    from cramming import race

    out = tmp_path / "race"
    (out / "a" / "seed-0").mkdir(parents=True)
    victim = tmp_path / "victim.txt"
    victim.write_text("mine")
    (out / "a" / "seed-0" / "race.log").symlink_to(victim)
    with pytest.raises(SystemExit) as stop:
        race.main(["--a", "train.lr=1e-3", "--b", "train.lr=2e-3", "--seeds", "2", "--out", str(out),
                   "train.target_loss=5"])
    assert stop.value.code == 2 and victim.read_text() == "mine"


def test_a_results_table_given_as_a_link_updates_the_table_it_names(tmp_path):
    from cramming.eval.results import append_csv

    shared = tmp_path / "shared.csv"
    row = {"finished_at": "2026", "checkpoint": "c", "model": "m", "rte": 1.0}
    append_csv(shared, row)
    (tmp_path / "mine.csv").symlink_to(shared)
    append_csv(tmp_path / "mine.csv", {**row, "model": "n"})
    assert (tmp_path / "mine.csv").is_symlink() and shared.read_text().count("\n") == 3
    (tmp_path / "t.csv.lock").mkdir()  # a folder where the lock file goes
    with pytest.raises(UserError, match="t.csv.lock is not a lock file"):
        append_csv(tmp_path / "t.csv", row)


def test_a_name_part_longer_than_a_file_name_may_be_is_one_line(tmp_path):
    one_line_error(run_command("pretrain.py", ["name=" + "x" * 300, "dryrun=true", *TINY]), "none over 200 bytes")


def test_a_share_into_a_dangling_link_or_its_own_folder_is_refused(tmp_path):
    from test_resume import config_for

    from cramming.data.prepare import prepare_data
    from cramming.data.share import export_prepared

    folder, _ = prepare_data(config_for(*TINY, f"data.cache_dir={tmp_path / 'cache'}").data)
    (tmp_path / "dangling").symlink_to(tmp_path / "nowhere")
    with pytest.raises(UserError, match="already exists"):
        export_prepared(folder, tmp_path / "dangling")
    with pytest.raises(UserError, match="lies inside the prepared folder"):
        export_prepared(folder, folder / "sub")
    assert sorted(os.listdir(tmp_path)) == ["cache", "dangling"]


def test_a_read_only_cache_when_data_must_be_prepared_is_one_line(tmp_path):
    with small_disk(tmp_path / "cache", "1m") as cache:
        remount_read_only(cache)
        result = run_command("pretrain.py", [*TINY, "train.max_steps=1", f"data.cache_dir={cache}",
                                             f"hydra.run.dir={tmp_path / 'run'}"])
        one_line_error(result, "the file system is read-only")
    assert not (tmp_path / "run").exists()


def test_the_report_skips_summaries_and_lines_that_are_not_what_a_run_writes(source_run, tmp_path, capsys):
    from cramming import report

    run = tmp_path / "run"
    shutil.copytree(source_run, run)
    summary = json.loads((run / "train_summary.json").read_text())
    (run / "train_summary.json").write_text(json.dumps({**summary, "val_loss": [1], "steps": "x"}))
    with open(run / "metrics.jsonl", "a") as fh:
        fh.write('{"step": 9, "loss": ' + "[" * 100_000 + "]" * 100_000 + "}\n")
    report.main([str(run), "--out", str(tmp_path / "report")])
    out = capsys.readouterr().out
    assert "steps is not a number; the summary was not read" in out and "not metrics records skipped" in out
