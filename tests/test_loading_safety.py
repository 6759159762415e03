"""Loading what others made runs no code the user did not ask for. The attacks are built here: a folder like our
checkpoint whose model code writes a marker file when imported, one whose auto_map names a module of its own, and
a step folder whose state.pt (or rng file) writes a marker when unpickled. Without the opt-in no marker is ever
written and each refusal is one line; with it the remote-code folder loads and its code runs; our own folders and
steps load as before."""

import csv
import json
import os
import shutil

import pytest
import torch
from conftest import REPO, one_line_error, run_pretrain
from test_eval_cli import evaluate_in_process, run_eval
from test_resume import TINY, config_for

from cramming import hub, pretraining
from cramming.checkpoints.pickled import load_saved
from cramming.errors import UserError
from cramming.export import export_step
from cramming.model_code import blob_id, foreign_code, ours
from cramming.train.init_from import open_source
from cramming.train.state import capture_rng, restore_rng


class WritesMarker:
    """Unpickling this runs os.system: what a crafted state.pt would do."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def tampered(run_dir, tmp_path, marker):
    """Our checkpoint, its modeling code changed to write `marker` when imported."""
    folder = tmp_path / "tampered"
    shutil.copytree(run_dir / "checkpoint", folder)
    code = folder / "modeling_crammed.py"
    code.write_text(f"open({str(marker)!r}, 'w').close()\n" + code.read_text())
    return folder


def poisoned_step(run_dir, tmp_path, marker, name="state.pt"):
    """A whole step folder whose `name` runs a command when unpickled."""
    step = tmp_path / "step-00000002"
    shutil.copytree(max((run_dir / "checkpoints").glob("step-*")), step)
    saved = torch.load(step / name, weights_only=False)  # our own file, built by this test
    saved["python" if name.startswith("rng") else "state"] = WritesMarker(marker)
    torch.save(saved, step / name)
    return step


def custom_task(tmp_path) -> list[str]:
    with open(tmp_path / "t.csv", "w", newline="") as fh:
        csv.writer(fh).writerows([("text", "label"), *[(f"example {i}", i % 2) for i in range(16)]])
    return ["eval=custom", f"eval.train_file={tmp_path}/t.csv", f"eval.dev_file={tmp_path}/t.csv", "impl=cpu",
            "eval.recipe.epochs=1"]


# ---------------------------------------------------------------- model code


def test_our_checkpoint_runs_only_our_code_and_a_changed_file_is_named(source_run, tmp_path):
    assert foreign_code(source_run / "checkpoint") is None
    folder = tampered(source_run, tmp_path, tmp_path / "marker")
    assert foreign_code(folder) == "modeling_crammed.py"
    (folder / "modeling_crammed.py").write_bytes(ours()["modeling_crammed.py"])
    assert foreign_code(folder) is None
    (folder / "attention.py").write_text("# a relative import of the model, changed\n")  # reached through imports
    assert foreign_code(folder) == "attention.py"
    os.remove(folder / "attention.py")
    assert foreign_code(folder) == "attention.py"  # missing is not ours either


def test_an_auto_map_naming_its_own_module_or_another_repo_is_foreign(source_run, tmp_path):
    folder = tmp_path / "own"
    shutil.copytree(source_run / "checkpoint", folder)
    config = json.loads((folder / "config.json").read_text())
    for module in ("evil", "someone/repo--modeling_crammed"):
        config["auto_map"]["AutoModel"] = f"{module}.Model"
        (folder / "config.json").write_text(json.dumps(config))
        assert foreign_code(folder) == f"{module}.py"
    (folder / "tokenizer_config.json").write_text(json.dumps({"auto_map": {"AutoTokenizer": ["tok.Slow", None]}}))
    config["auto_map"].pop("AutoModel")
    (folder / "config.json").write_text(json.dumps(config))
    assert foreign_code(folder) == "tok.py"  # a tokenizer's code counts too


def test_eval_refuses_foreign_code_before_importing_it_and_runs_it_when_allowed(source_run, tmp_path):
    marker = tmp_path / "marker"
    folder = tampered(source_run, tmp_path, marker)
    with pytest.raises(UserError) as err:
        evaluate_in_process(f"checkpoint={folder}", *custom_task(tmp_path), tmp_path=tmp_path)
    assert f"loading it would run {folder / 'modeling_crammed.py'}" in str(err.value)
    assert "eval.trust_remote_code=true" in str(err.value) and "\n" not in str(err.value)
    assert not marker.exists()
    path = evaluate_in_process(f"checkpoint={folder}", *custom_task(tmp_path), "eval.trust_remote_code=true",
                               tmp_path=tmp_path)
    assert marker.exists() and json.loads(path.read_text())["complete"]


def test_our_own_checkpoint_needs_no_option(source_run, tmp_path):
    path = evaluate_in_process(f"checkpoint={source_run / 'checkpoint'}", *custom_task(tmp_path), tmp_path=tmp_path)
    assert json.loads(path.read_text())["model_type"] == "crammed"


def test_init_from_refuses_foreign_code_unless_allowed_and_never_runs_it(source_run, tmp_path):
    marker = tmp_path / "marker"
    folder = tampered(source_run, tmp_path, marker)
    with pytest.raises(UserError, match=r"train.init_from=.*modeling_crammed.py, model code that is not this "
                                        r"cramming's own; .*allow it with train.trust_remote_code=true"):
        open_source(str(folder))
    assert open_source(str(folder), allow_code=True).kind == "checkpoint"
    assert open_source(str(source_run / "checkpoint")).kind == "checkpoint"
    assert not marker.exists()  # init_from reads tensors; it never imports the folder's code


# ---------------------------------------------------------------- the hub


def mock_hub(monkeypatch, snapshot, listed: dict):
    """The hub client: snapshot_download copies only the files its patterns match (as the real one fetches
    only those), model_info lists each file's blob id."""
    import fnmatch
    from types import SimpleNamespace

    import huggingface_hub

    fetched = []

    def snapshot_download(repo_id, allow_patterns=None, local_files_only=False):
        target = snapshot.parent / "cache"
        target.mkdir(exist_ok=True)
        for path in snapshot.iterdir():
            if any(fnmatch.fnmatch(path.name, p) for p in allow_patterns):
                fetched.append(path.name)
                shutil.copy(path, target / path.name)
        return str(target)

    def model_info(self, repo_id, files_metadata=False):
        return SimpleNamespace(siblings=[SimpleNamespace(rfilename=n, blob_id=b) for n, b in listed.items()])

    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    monkeypatch.setattr(huggingface_hub.HfApi, "model_info", model_info)
    monkeypatch.setattr(hub, "offline_reason", lambda: None)  # as if the hub were reachable
    return fetched



def test_a_files_id_is_gits_blob_id_as_the_hub_lists_it():
    """The hub lists each file's git blob id: sha1 of "blob <size>\\0" and the bytes (`git hash-object`). The mock
    hub (mock_hub) lists ids with blob_id itself, so only this pins the rule to git's."""
    assert blob_id(b"hello\n") == "ce013625030ba8dba906f756967f9e9ca394464a"  # printf 'hello\n' | git hash-object --stdin
    assert blob_id(b"") == "e69de29bb2d1d6434b8b29ae775ad8c2e48c5391"  # git's empty blob

def test_a_hub_id_fetches_code_only_when_it_is_ours_or_allowed(source_run, tmp_path, monkeypatch):
    snapshot = tmp_path / "repo"
    shutil.copytree(source_run / "checkpoint", snapshot)
    listed = {p.name: blob_id(p.read_bytes()) for p in snapshot.iterdir()}
    fetched = mock_hub(monkeypatch, snapshot, listed)
    folder = hub.model_folder("checkpoint", "someone/crammed")
    assert foreign_code(folder) is None and "modeling_crammed.py" in fetched

    (snapshot / "modeling_crammed.py").write_text("raise SystemExit('ran')\n")
    listed["modeling_crammed.py"] = blob_id(b"raise SystemExit('ran')\n")
    shutil.rmtree(tmp_path / "cache")
    fetched.clear()
    with pytest.raises(UserError, match="its model code on the hub is not this cramming's own; .*"
                                        "eval.trust_remote_code=true"):
        hub.model_folder("checkpoint", "someone/crammed")
    assert not any(name.endswith(".py") for name in fetched)  # nothing of it downloaded
    folder = hub.model_folder("checkpoint", "someone/crammed", allow_code=True)
    assert (folder / "modeling_crammed.py").read_text().startswith("raise SystemExit")


def test_an_in_library_hub_model_fetches_no_code(tmp_path, monkeypatch):
    from test_init_from import tiny_bert

    snapshot = tmp_path / "repo"
    tiny_bert(snapshot, ["a", "b"])
    (snapshot / "stray.py").write_text("raise SystemExit('ran')\n")
    fetched = mock_hub(monkeypatch, snapshot, {})
    hub.model_folder("checkpoint", "bert-base-uncased")
    assert "stray.py" not in fetched and "config.json" in fetched


# ---------------------------------------------------------------- step folders


def test_rng_files_written_before_load_as_plain_data_and_restore_the_same_streams(tmp_path):
    import random

    import numpy as np

    old = {**capture_rng(), "numpy": np.random.get_state()}  # NumPy's state as it was saved before: arrays
    torch.save(old, tmp_path / "rng-0.pt")
    expected = (random.random(), np.random.rand(), torch.rand(1))
    restore_rng(load_saved(tmp_path / "rng-0.pt"))
    assert (random.random(), np.random.rand(), torch.rand(1)) == expected
    torch.save(capture_rng(), tmp_path / "rng-1.pt")
    expected = (random.random(), np.random.rand(), torch.rand(1))
    restore_rng(load_saved(tmp_path / "rng-1.pt"))
    assert (random.random(), np.random.rand(), torch.rand(1)) == expected


@pytest.mark.parametrize("name", ["state.pt", "rng-0.pt"])
def test_a_poisoned_step_is_refused_by_resume_init_from_and_export(source_run, tmp_path, name):
    marker = tmp_path / "marker"
    step = poisoned_step(source_run, tmp_path, marker, name)
    line = rf"{step / name} holds more than tensors and plain data \(it asks for posix.system\)"
    with pytest.raises(UserError, match=line):
        pretraining.pretrain(config_for(*TINY, "train.max_steps=4", f"train.resume={step}"), tmp_path / "run")
    if name == "state.pt":
        with pytest.raises(UserError, match=line):
            open_source(str(step))
        with pytest.raises(UserError, match=line):
            export_step(step)
    assert not marker.exists()


def test_a_missing_resume_folder_is_refused_before_any_work(tmp_path, capsys):
    with pytest.raises(UserError, match=r"train.resume=\S+nowhere: no such folder"):
        pretraining.pretrain(config_for(*TINY, f"train.resume={tmp_path / 'nowhere'}"), tmp_path / "run")
    assert "data:" not in capsys.readouterr().out  # nothing prepared, no model built


# ---------------------------------------------------------------- the command line


@pytest.mark.slow
def test_the_command_line_refuses_every_attack_in_one_line(source_run, tmp_path):
    import subprocess
    import sys

    marker = tmp_path / "marker"
    folder = tampered(source_run, tmp_path, marker)
    one_line_error(run_eval(f"checkpoint={folder}", *custom_task(tmp_path), tmp_path=tmp_path, in_process=True),
                   "modeling_crammed.py", "eval.trust_remote_code=true")
    smoke = [*TINY, "train.max_steps=2", f"data.cache_dir={tmp_path / 'cache'}"]
    one_line_error(run_pretrain(*smoke, f"train.init_from={folder}", run_dir=tmp_path / "a", in_process=True),
                   "train.trust_remote_code=true")
    step = poisoned_step(source_run, tmp_path, marker)
    one_line_error(run_pretrain(*smoke, f"train.resume={step}", run_dir=tmp_path / "b", in_process=True),
                   "posix.system")
    one_line_error(run_pretrain(*smoke, f"train.init_from={step}", run_dir=tmp_path / "c", in_process=True),
                   "posix.system")
    exported = subprocess.run([sys.executable, "-m", "cramming.export", str(step)], cwd=REPO, capture_output=True,
                              text=True, timeout=300, check=False)
    one_line_error(exported, "posix.system")
    assert not marker.exists()
    allowed = run_eval(f"checkpoint={folder}", *custom_task(tmp_path), "eval.trust_remote_code=true",
                       tmp_path=tmp_path)
    assert allowed.returncode == 0, allowed.stderr[-2000:]
    assert marker.exists()
