"""The border with files someone else wrote (docs/security.md, rules 3, 4, 6 and 8): what is checked is what is
loaded, nothing is read outside its folder, sizes are checked before anything is allocated, and step and run
folders are data. Each test builds the attack as real files, and checks the one line (or the skip, said so) and
that nothing of it ran or was read."""

import json
import os
import shutil
import struct
import subprocess
import sys

import numpy as np
import pytest
import torch
from conftest import REPO, glue_folder, one_line_error, run_command
from test_border import snapshot
from test_loading_safety import custom_task
from test_resume import TINY, config_for

from cramming import hub, model_code, pretraining, report
from cramming.checkpoints.pickled import load_saved
from cramming.errors import UserError
from cramming.eval.checkpoint import check_checkpoint
from cramming.eval.finetune import Checkpoint
from cramming.eval.recipe import update_card
from cramming.export import export_step
from cramming.push import push
from cramming.train.checkpointing import find_resume
from cramming.train.init_from import open_source
from cramming.train.state import capture_rng
from cramming.untrusted import available_memory


def copy_of(folder, tmp_path, name="copy"):
    target = tmp_path / name
    shutil.copytree(folder, target, symlinks=True)
    return target


def marker_module(path, marker):
    """A module that writes `marker` when imported: what foreign code would do."""
    path.write_text(f"open({str(marker)!r}, 'w').close()\nclass Model: pass\nclass Config: pass\n")


def eval_args(checkpoint, tmp_path, *extra):
    """eval.py on `checkpoint`: a small task of its own unless `extra` chooses the benchmark."""
    task = [] if any(arg.startswith("eval=") for arg in extra) else custom_task(tmp_path)
    return [f"checkpoint={checkpoint}", *task, f"hydra.run.dir={tmp_path / 'eval'}",
            f"eval.results_table={tmp_path / 'results.csv'}", "impl=cpu", *extra]


# ---------------------------------------------------------------- 3. what is checked is what is loaded


def test_a_versioned_config_naming_other_code_is_refused_before_it_runs(source_run, tmp_path):
    """transformers reads config.<version>.json when config.json names it in configuration_files, and that file's
    auto_map decides the code: the check reads it too."""
    folder = copy_of(source_run / "checkpoint", tmp_path)
    marker = tmp_path / "ran"
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "configuration_files": ["config.4.0.0.json"]}))
    versioned = {**config, "auto_map": {**config["auto_map"], "AutoConfig": "evil.Config",
                                        "AutoModelForSequenceClassification": "evil.Model"}}
    (folder / "config.4.0.0.json").write_text(json.dumps(versioned))
    marker_module(folder / "evil.py", marker)
    assert model_code.foreign_code(folder) == "evil.py"
    one_line_error(run_command("eval.py", eval_args(folder, tmp_path)), "evil.py", "eval.trust_remote_code=true")
    assert not marker.exists()


def test_a_file_swapped_after_the_check_is_never_imported(source_run, tmp_path, monkeypatch):
    """Our checkpoint passes the check; then its model code is replaced. It loads with this package's classes, so
    the replaced file never runs."""
    from cramming.eval import checkpoint as checking
    from cramming.eval import recipe

    folder = copy_of(source_run / "checkpoint", tmp_path)
    marker = tmp_path / "ran"
    real = checking.check_checkpoint

    def swapped_after(checkpoint):
        found = real(checkpoint)
        for name in ("modeling_crammed.py", "heads.py", "configuration_crammed.py"):
            code = (folder / name).read_text()
            (folder / name).write_text(f"open({str(marker)!r}, 'w').close()\n" + code)
        return found

    monkeypatch.setattr(recipe, "check_checkpoint", swapped_after)
    result = run_command("eval.py", eval_args(folder, tmp_path))
    assert result.returncode == 0, result.stderr[-2000:]
    assert not marker.exists()


def test_a_checkpoint_of_an_earlier_version_needs_no_opt_in(source_run, tmp_path, monkeypatch):
    """Model code that a release of cramming saved but that differs from this installation's is ours: its digest is
    in the record of shipped code. A version no release saved is foreign."""
    folder = copy_of(source_run / "checkpoint", tmp_path)
    older = (folder / "modeling_crammed.py").read_text() + "\n# as an earlier release saved it\n"
    (folder / "modeling_crammed.py").write_text(older)
    assert model_code.foreign_code(folder) == "modeling_crammed.py"
    record = {name: set(ids) for name, ids in model_code.shipped().items()}
    record["modeling_crammed.py"].add(model_code.blob_id(older.encode()))
    monkeypatch.setattr(model_code, "shipped", lambda: {name: frozenset(ids) for name, ids in record.items()})
    assert model_code.foreign_code(folder) is None
    result = run_command("eval.py", eval_args(folder, tmp_path))
    assert result.returncode == 0, result.stderr[-2000:]


def test_the_record_of_shipped_code_holds_this_installation_and_its_history():
    recorded = json.loads(model_code.SHIPPED.read_text())
    for name, data in model_code.ours().items():
        assert model_code.blob_id(data) in recorded.get(name, []), \
            f"{name} changed: run python scripts/shipped_model_code.py to record it"
    history = subprocess.run(["git", "log", "--format=%H", "-n", "3", "--", "cramming/model"], cwd=REPO,
                             capture_output=True, text=True)
    if history.returncode != 0 or not history.stdout.strip():
        pytest.skip("no git history here")
    for commit in history.stdout.split():
        listing = subprocess.run(["git", "ls-tree", commit, "cramming/model/"], cwd=REPO, capture_output=True,
                                 text=True, check=True).stdout
        for line in listing.splitlines():
            _, _, blob, path = line.split(maxsplit=3)
            if path.endswith(".py") and not path.endswith("/registry.py"):
                assert blob in recorded[os.path.basename(path)], f"{path} at {commit[:8]} is not recorded"


def test_a_tokenizer_auto_map_in_the_older_list_form_is_read(source_run, tmp_path):
    folder = copy_of(source_run / "checkpoint", tmp_path)
    marker = tmp_path / "ran"
    saved = json.loads((folder / "tokenizer_config.json").read_text())
    (folder / "tokenizer_config.json").write_text(json.dumps({**saved, "auto_map": ["tok.Slow", "tok.Fast"]}))
    marker_module(folder / "tok.py", marker)
    assert model_code.foreign_code(folder) == "tok.py"
    one_line_error(run_command("eval.py", eval_args(folder, tmp_path)), "tok.py")
    assert not marker.exists()


# ---------------------------------------------------------------- 4. read only inside the folder


def test_push_refuses_a_link_leading_out_and_uploads_nothing(source_run, tmp_path, monkeypatch):
    import huggingface_hub

    secret = tmp_path / "secret.txt"
    secret.write_text("private key")
    folder = copy_of(source_run / "checkpoint", tmp_path)
    (folder / "notes.txt").symlink_to(secret)
    sent = []
    monkeypatch.setattr(huggingface_hub.HfApi, "create_repo", lambda self, *a, **k: "https://hub/x")
    monkeypatch.setattr(huggingface_hub.HfApi, "upload_folder", lambda self, **k: sent.append(k))
    with pytest.raises(UserError, match=r"notes.txt is a link to .*secret.txt, outside .*; push uploads reads only"):
        push(folder, "someone/model")
    assert sent == []


def test_the_card_never_copies_a_linked_file_in(source_run, tmp_path):
    folder = copy_of(source_run / "checkpoint", tmp_path)
    outside = tmp_path / "elsewhere.json"
    outside.write_text(json.dumps({**json.loads((folder / "train_summary.json").read_text()), "name": "LEAKED"}))
    (folder / "train_summary.json").unlink()
    (folder / "train_summary.json").symlink_to(outside)
    before = (folder / "README.md").read_text()
    line = update_card(Checkpoint(folder), {"benchmark": "x", "kind": "custom", "seeds": 1, "data": {}, "metrics": {},
                                            "comparable": False, "scores": {"t": 1.0}, "finished_at": "2026"})
    assert "not updated" in line and "leads outside" in line
    assert (folder / "README.md").read_text() == before and "LEAKED" not in before


def test_an_index_entry_leading_outside_is_refused(source_run, tmp_path):
    folder = copy_of(source_run / "checkpoint", tmp_path)
    weights = folder / "model.safetensors"
    outside = tmp_path / "elsewhere.safetensors"
    shutil.move(weights, outside)
    (folder / "model.safetensors.index.json").write_text(json.dumps(
        {"metadata": {}, "weight_map": {"encoder.tokens.weight": "../elsewhere.safetensors"}}))
    with pytest.raises(UserError, match=r"weight_map names .*elsewhere.safetensors.*leads outside"):
        check_checkpoint(folder)


def test_eval_on_a_hub_id_never_writes_into_the_hub_cache(source_run, tmp_path, monkeypatch):
    cache = tmp_path / "hub"
    monkeypatch.setattr(hub.huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    snapshot_dir = cache / "models--someone--crammed" / "snapshots" / "abc"
    snapshot_dir.parent.mkdir(parents=True)
    shutil.copytree(source_run / "checkpoint", snapshot_dir)
    monkeypatch.setattr(hub, "_from_hub", lambda *args: snapshot_dir)
    before = snapshot(cache)
    result = run_command("eval.py", eval_args("someone/crammed", tmp_path))
    assert result.returncode == 0, result.stderr[-2000:]
    assert snapshot(cache) == before and "model card" not in result.stdout
    assert (tmp_path / "eval" / "results.json").is_file()


def test_auto_resume_skips_odd_siblings_before_any_data_is_prepared(source_run, tmp_path, monkeypatch, capsys):
    runs = tmp_path / "outputs" / "odd"
    current = runs / "2026-01-02_00-00-00"
    current.mkdir(parents=True)
    (runs / "linked").symlink_to(source_run)  # a sibling that is a link to a run elsewhere
    broken = runs / "broken" / "checkpoints" / "step-00000005"
    shutil.copytree(source_run / "checkpoints" / "step-00000003", broken)
    (broken / "config.json").write_text("{not json")
    named = runs / "named" / "checkpoints"
    shutil.copytree(source_run / "checkpoints" / "step-00000003", named / "step-abc")
    (runs / "file").write_text("not a run")
    monkeypatch.setattr(pretraining, "prepare", lambda *a: (_ for _ in ()).throw(AssertionError("data prepared")))
    config = config_for(*TINY, "name=source", "train.max_steps=3", "train.checkpoint_every_minutes=0.0001")
    assert find_resume("auto", current, config) is None
    said = capsys.readouterr().out
    assert f"not resuming from {broken}" in said and "not valid JSON" in said


def test_the_report_reads_no_link_out_and_skips_lines_that_are_not_records(source_run, tmp_path, capsys):
    run = copy_of(source_run, tmp_path, "run")
    lines = (run / "metrics.jsonl").read_text().splitlines()
    (run / "metrics.jsonl").write_text("\n".join([lines[0], '{"step": "three", "loss": 1.0}', *lines[1:]]) + "\n")
    secret = tmp_path / "secret.json"
    secret.write_text(json.dumps({"name": "LEAKED", "tokens": 1}))
    (run / "train_summary.json").unlink()
    (run / "train_summary.json").symlink_to(secret)
    path = report.main([str(run), "--out", str(tmp_path / "report")])
    out = capsys.readouterr().out
    assert "skipped:" in out and "1 line(s) that are not metrics records" in out and "link leading outside" in out
    assert "LEAKED" not in path.read_text()


# ---------------------------------------------------------------- 6. sizes before allocation


@pytest.mark.parametrize("key, value", [("vocab_size", 10**9), ("hidden_size", 10**6)])
def test_a_config_far_larger_than_its_weights_is_refused_before_anything_is_built(source_run, tmp_path, key, value):
    folder = copy_of(source_run / "checkpoint", tmp_path)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, key: value}))
    one_line_error(run_command("eval.py", eval_args(folder, tmp_path)), "config.json does not match its weights",
                   f"{value}")


def test_weights_larger_than_memory_are_refused_without_being_read(source_run, tmp_path):
    """A sparse safetensors file: a header naming one tensor of twice this machine's memory, the rest holes."""
    free = available_memory()
    if free is None:
        pytest.skip("this machine's available memory cannot be read")
    folder = copy_of(source_run / "checkpoint", tmp_path)
    rows = 2 * free // (4 * 1024) + 1
    header = json.dumps({"huge": {"dtype": "F32", "shape": [rows, 1024], "data_offsets": [0, rows * 1024 * 4]}})
    with open(folder / "model.safetensors", "wb") as fh:
        fh.write(struct.pack("<Q", len(header)) + header.encode())
        fh.truncate(8 + len(header) + rows * 1024 * 4)
    one_line_error(run_command("eval.py", eval_args(folder, tmp_path)), "more than the", "available")


def test_a_tokenizer_file_of_hundreds_of_megabytes_is_not_parsed(source_run, tmp_path):
    folder = copy_of(source_run / "checkpoint", tmp_path)
    with open(folder / "tokenizer.json", "r+b") as fh:
        fh.truncate(300 << 20)  # sparse: 300 MB that cost nothing to make
    one_line_error(run_command("eval.py", eval_args(folder, tmp_path)), "tokenizer.json", "300.0 MiB",
                   "larger than any tokenizer file")


def test_a_zero_stride_random_state_is_refused_before_it_is_copied(source_run, tmp_path):
    step = copy_of(source_run / "checkpoints" / "step-00000003", tmp_path, "step-00000003")
    rng = capture_rng()
    rng["torch"] = torch.zeros(1, dtype=torch.uint8).expand(10**10)  # 10 GB as a view of one byte
    torch.save(rng, step / "rng-0.pt")
    assert (step / "rng-0.pt").stat().st_size < 100_000
    with pytest.raises(UserError, match=r"rng-0.pt: state\['torch'\] is a view of 10,000,000,000 elements"):
        load_saved(step / "rng-0.pt")
    with pytest.raises(UserError, match="is a view of"):
        pretraining.pretrain(config_for(*TINY, "name=source", "train.max_steps=4", f"train.resume={step}"),
                             tmp_path / "run")


def test_a_line_of_hundreds_of_megabytes_in_a_task_file_is_one_line(source_run, tmp_path):
    glue = glue_folder(tmp_path)
    with open(glue / "RTE" / "train.tsv", "ab") as fh:
        fh.write(b"99\t")
        fh.truncate(fh.tell() + (200 << 20))  # a 200 MB second sentence, never written out
    result = run_command("eval.py", eval_args(source_run / "checkpoint", tmp_path, "eval=glue", "eval.tasks=[rte]",
                                              f"eval.data_dir={glue}"))
    one_line_error(result, "train.tsv line 50 is longer than 4.0 MiB")


def test_invalid_utf8_in_a_tsv_names_the_line_and_byte(tmp_path):
    from cramming.eval.tasks import load_task

    glue = glue_folder(tmp_path)
    path = glue / "RTE" / "dev.tsv"
    lines = path.read_bytes().split(b"\n")
    lines[3] = lines[3].replace(b"cat", b"c\xffat", 1)
    path.write_bytes(b"\n".join(lines))
    with pytest.raises(UserError, match=r"dev.tsv line 4: not valid UTF-8 at byte \d+ \(invalid start byte\)"):
        load_task("rte", str(glue))


def test_token_ids_past_the_embedding_table_in_prepared_data_are_refused(tmp_path):
    from cramming.data.prepare import prepare_data

    config = config_for(*TINY, f"data.cache_dir={tmp_path / 'cache'}")
    folder, meta = prepare_data(config.data)
    prepared = shutil.copytree(folder, tmp_path / "prepared")
    stream = np.fromfile(prepared / "train.bin", dtype=meta["dtype"])
    stream[10] = meta["vocab_size"] + 7  # as many tokens as before: only the largest id tells
    stream.tofile(prepared / "train.bin")
    result = run_command("pretrain.py", [*TINY, "train.max_steps=1", f"data.prepared={prepared}",
                                         f"hydra.run.dir={tmp_path / 'run'}"])
    one_line_error(result, "train.bin holds token id", f"{meta['vocab_size'] + 7}", "past the vocabulary")


# ---------------------------------------------------------------- 8. step and run folders are data


@pytest.mark.slow  # a new interpreter: the command as a user runs it
def test_an_interpolation_in_a_step_config_is_never_resolved(source_run, tmp_path, monkeypatch):
    monkeypatch.setenv("CRAMMING_TEST_SECRET", "hunter2")
    step = copy_of(source_run / "checkpoints" / "step-00000003", tmp_path, "step-00000003")
    saved = torch.load(step / "state.pt", weights_only=True)
    saved["config"]["arch"]["norm"] = "${oc.env:CRAMMING_TEST_SECRET}"
    torch.save(saved, step / "state.pt")
    result = subprocess.run([sys.executable, "-m", "cramming.export", str(step), str(tmp_path / "out")], cwd=REPO,
                            capture_output=True, text=True, timeout=300, env={**os.environ})
    one_line_error(result, "holds an interpolation", "never resolves")
    assert "hunter2" not in result.stdout + result.stderr and not (tmp_path / "out").exists()


def test_a_step_written_by_a_newer_version_is_one_line(source_run, tmp_path):
    step = copy_of(source_run / "checkpoints" / "step-00000003", tmp_path, "step-00000003")
    saved = torch.load(step / "state.pt", weights_only=True)
    saved["state"]["tokens_per_expert"] = 3
    torch.save(saved, step / "state.pt")
    with pytest.raises(UserError, match="keys this cramming does not know .tokens_per_expert.; a newer cramming"):
        export_step(step, tmp_path / "out")
    with pytest.raises(UserError, match="a newer cramming"):
        open_source(str(step))
    result = run_command("pretrain.py", [*TINY, "name=source", "train.max_steps=4", f"train.resume={step}",
                                         f"hydra.run.dir={tmp_path / 'run'}"])
    one_line_error(result, "tokens_per_expert")


def test_a_step_with_tensors_of_the_wrong_shapes_is_one_line(source_run, tmp_path):
    step = copy_of(source_run / "checkpoints" / "step-00000003", tmp_path, "step-00000003")
    saved = torch.load(step / "state.pt", weights_only=True)
    name = next(k for k in saved["model"] if k.endswith("qkv.weight"))
    saved["model"][name] = torch.zeros(3, 5)
    torch.save(saved, step / "state.pt")
    result = run_command("pretrain.py", [*TINY, "name=source", "train.max_steps=4", f"train.resume={step}",
                                         f"hydra.run.dir={tmp_path / 'run'}"])
    one_line_error(result, "does not fit this run's model", "size mismatch")
    with pytest.raises(UserError, match="do not fit the model its config describes"):
        export_step(step, tmp_path / "out")


@pytest.mark.parametrize("key, value, says", [
    ("num_layers", 10**9, "describes 1,000,000,000 layers but its weights hold 1"),
    ("max_seq_length", 10**10, "the model its config.json describes"),
    ("num_heads", 0, "config.json: num_heads=0 is invalid: must be > 0"),
])
def test_other_sizes_a_config_gives_are_refused_before_anything_is_built(source_run, tmp_path, key, value, says):
    folder = copy_of(source_run / "checkpoint", tmp_path)
    config = json.loads((folder / "config.json").read_text())
    config = {**config, key: value}
    (folder / "config.json").write_text(json.dumps(config))
    one_line_error(run_command("eval.py", eval_args(folder, tmp_path)), says)


def test_a_pickled_weights_file_that_asks_for_code_is_one_line(source_run, tmp_path):
    from test_loading_safety import WritesMarker

    folder = copy_of(source_run / "checkpoint", tmp_path)
    marker = tmp_path / "ran"
    (folder / "model.safetensors").unlink()
    torch.save({"encoder.tokens.weight": WritesMarker(marker)}, folder / "pytorch_model.bin")
    one_line_error(run_command("eval.py", eval_args(folder, tmp_path)), "pytorch_model.bin: holds more than tensors",
                   "posix.system")
    assert not marker.exists()


def test_a_config_nested_past_pythons_recursion_limit_is_one_line(source_run, tmp_path):
    folder = copy_of(source_run / "checkpoint", tmp_path)
    config = json.loads((folder / "config.json").read_text())
    text = json.dumps(config)
    (folder / "config.json").write_text(text[:-1] + ', "deep": ' + "[" * 100_000 + "]" * 100_000 + "}")
    one_line_error(run_command("eval.py", eval_args(folder, tmp_path)), str(folder))


def test_a_prepared_folder_whose_counts_are_not_its_files_is_one_line(tmp_path):
    from cramming.data.prepare import prepare_data

    folder, meta = prepare_data(config_for(*TINY, f"data.cache_dir={tmp_path / 'cache'}").data)
    prepared = shutil.copytree(folder, tmp_path / "prepared")
    (prepared / "meta.json").write_text(json.dumps({**meta, "train_sequences": meta["train_sequences"] * 50}))
    result = run_command("pretrain.py", [*TINY, "train.max_steps=1", f"data.prepared={prepared}",
                                         f"hydra.run.dir={tmp_path / 'run'}"])
    one_line_error(result, "meta.json: says", "train sequences, but train.bin holds")


def test_a_short_write_is_a_full_disk(tmp_path):
    from cramming.outputs import fault_reason

    assert fault_reason(OSError("247118 requested and 96256 written"), tmp_path) == "the disk is full"


def test_pickled_weights_are_checked_as_safetensors_are(source_run, tmp_path):
    """A pytorch_model.bin read memory-mapped: a zero-stride view refused, its shapes held against the config."""
    from safetensors.torch import load_file

    folder = copy_of(source_run / "checkpoint", tmp_path)
    weights = load_file(folder / "model.safetensors")
    (folder / "model.safetensors").unlink()
    name = next(k for k in weights if k.endswith("tokens.weight"))
    torch.save({**weights, name: torch.zeros(1).expand(10**6, weights[name].shape[1])}, folder / "pytorch_model.bin")
    one_line_error(run_command("eval.py", eval_args(folder, tmp_path)), "is a view of")
    torch.save({**weights, name: torch.zeros(7, weights[name].shape[1])}, folder / "pytorch_model.bin")
    one_line_error(run_command("eval.py", eval_args(folder, tmp_path)), "config.json does not match its weights")


@pytest.mark.parametrize("damage", ["vocabulary", "odd-bytes", "periods"])
def test_a_prepared_folder_that_is_not_what_prepare_writes_is_one_line(tmp_path, damage):
    from cramming.data.prepare import prepare_data

    folder, meta = prepare_data(config_for(*TINY, f"data.cache_dir={tmp_path / 'cache'}").data)
    prepared = shutil.copytree(folder, tmp_path / "prepared")
    if damage == "vocabulary":
        (prepared / "meta.json").write_text(json.dumps({**meta, "vocab_size": 10**9}))
        says = "its tokenizer has"
    elif damage == "odd-bytes":
        with open(prepared / "train.bin", "ab") as fh:
            fh.write(b"\x01")
        says = "not a whole number of"
    else:
        np.save(prepared / "train_periods.npy", np.zeros(3, dtype=np.int32))
        says = "not one count per training sequence"
    result = run_command("pretrain.py", [*TINY, "train.max_steps=1", f"data.prepared={prepared}",
                                         "data.ordering=sentence-length", f"hydra.run.dir={tmp_path / 'run'}"])
    one_line_error(result, says)


def test_a_step_whose_tokenizer_names_code_is_refused(source_run, tmp_path):
    step = copy_of(source_run / "checkpoints" / "step-00000003", tmp_path, "step-00000003")
    config = json.loads((step / "tokenizer" / "tokenizer_config.json").read_text())
    (step / "tokenizer" / "tokenizer_config.json").write_text(json.dumps({**config, "auto_map": ["evil.Tok", None]}))
    with pytest.raises(UserError, match=r"its tokenizer config names code \(evil.py\)"):
        export_step(step, tmp_path / "out")
    with pytest.raises(UserError, match="names code"):
        open_source(str(step))


@pytest.mark.parametrize("change", ["unknown-option", "unknown-section", "interpolated-name", "interpolated-key"])
def test_what_a_step_says_beyond_this_version_is_one_line(source_run, tmp_path, change):
    step = copy_of(source_run / "checkpoints" / "step-00000003", tmp_path, "step-00000003")
    saved = torch.load(step / "state.pt", weights_only=True)
    config = json.loads((step / "config.json").read_text())
    if change == "unknown-option":
        config["data"]["future_option"] = 1
    elif change == "unknown-section":
        saved["experts"] = {}
    elif change == "interpolated-name":
        saved["config"]["name"] = config["name"] = "${oc.env:HOME}"
    else:
        saved["config"]["data"]["${oc.env:HOME}"] = config["data"]["${oc.env:HOME}"] = 1
    torch.save(saved, step / "state.pt")
    (step / "config.json").write_text(json.dumps(config))
    result = run_command("pretrain.py", [*TINY, "name=source", "train.max_steps=4", f"train.resume={step}",
                                         f"hydra.run.dir={tmp_path / 'run'}"])
    says = {"unknown-option": "data.future_option", "unknown-section": "experts"}.get(change, "interpolation")
    one_line_error(result, says)
    if change != "unknown-option":
        with pytest.raises(UserError, match=says):
            export_step(step, tmp_path / "out")


def test_a_hub_snapshot_of_our_checkpoint_is_ours(source_run, tmp_path, monkeypatch):
    """In the hub cache every file of a snapshot is a link to a blob of its repository: inside, and ours."""
    cache = tmp_path / "hub"
    monkeypatch.setattr(hub.huggingface_hub.constants, "HF_HUB_CACHE", str(cache))
    repo = cache / "models--someone--tiny"
    snapshot_dir = repo / "snapshots" / "abc"
    (repo / "blobs").mkdir(parents=True)
    snapshot_dir.mkdir(parents=True)
    for path in (source_run / "checkpoint").iterdir():
        blob = repo / "blobs" / model_code.blob_id(path.read_bytes())
        shutil.copy(path, blob)
        (snapshot_dir / path.name).symlink_to(os.path.relpath(blob, snapshot_dir))
    assert model_code.foreign_code(snapshot_dir, hub.bounds(snapshot_dir)) is None
    hub.refuse_foreign_code("checkpoint", "someone/tiny", snapshot_dir, "eval.trust_remote_code")
    check_checkpoint(snapshot_dir)


@pytest.mark.parametrize("key, value, says", [
    ("norm_eps", "tiny", "norm_eps is not of its declared type"),
    ("position", "spiral", "position='spiral' is no option"),
    ("hidden_dropout", 3.0, "hidden_dropout=3.0 is invalid"),
    ("pad_token_id", 10**6, "the special token ids"),
])
def test_a_config_value_of_the_wrong_kind_is_one_line(source_run, tmp_path, key, value, says):
    folder = copy_of(source_run / "checkpoint", tmp_path)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, key: value}))
    one_line_error(run_command("eval.py", eval_args(folder, tmp_path)), says)


def test_kernels_a_config_names_are_the_portable_ones_on_load(source_run, tmp_path):
    """A config.json naming the Triton kernels (which need a GPU) loads with SDPA and PyTorch's rotary, as every
    checkpoint is saved."""
    folder = copy_of(source_run / "checkpoint", tmp_path)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "attention_impl": "triton", "rotary_impl": "triton"}))
    result = run_command("eval.py", eval_args(folder, tmp_path))
    assert result.returncode == 0, result.stderr[-2000:]


DEEP = "[" * 100_000 + "]" * 100_000  # nested past Python's recursion limit: json.loads raises RecursionError


@pytest.mark.parametrize("where", ["pretraining-jsonl", "step-tokenizer", "squad"])
def test_json_nested_past_the_recursion_limit_is_one_line(source_run, tmp_path, where):
    if where == "pretraining-jsonl":
        data = tmp_path / "docs.jsonl"
        data.write_text('{"text": "a fine document"}\n{"text": ' + DEEP + "}\n")
        result = run_command("pretrain.py", [*TINY, "data=local-text", f"data.path={data}", "train.max_steps=1",
                                             f"data.cache_dir={tmp_path / 'cache'}", f"hydra.run.dir={tmp_path / 'r'}"])
        one_line_error(result, "docs.jsonl line 2", "nests too deeply")
    elif where == "step-tokenizer":
        step = copy_of(source_run / "checkpoints" / "step-00000003", tmp_path, "step-00000003")
        (step / "tokenizer" / "tokenizer.json").write_text(DEEP)
        with pytest.raises(UserError, match="its tokenizer could not be loaded"):
            export_step(step, tmp_path / "out")
    else:
        from cramming.eval.squad_data import read_squad_file

        (tmp_path / "dev-v1.1.json").write_text('{"data": ' + DEEP + "}")
        with pytest.raises(UserError, match="nests too deeply"):
            read_squad_file(tmp_path / "dev-v1.1.json", 1)


def test_a_folder_or_fifo_where_a_data_file_should_be_is_one_line(tmp_path):
    from cramming.untrusted import read_text, text_lines

    (tmp_path / "sub.txt").mkdir()
    os.mkfifo(tmp_path / "pipe.txt")
    for path in (tmp_path / "sub.txt", tmp_path / "pipe.txt"):
        with pytest.raises(UserError, match="a file cramming reads must be a regular file"):
            read_text(path)
        with pytest.raises(UserError, match="a file cramming reads must be a regular file"):
            list(text_lines(path))


@pytest.mark.parametrize("spans, metadata", [([[0, 16], [0, 16]], {}), ([[0, 16], [20, 36]], {}),
                                             ([[0, 16], [16, 32]], {"format": 1})])
def test_a_safetensors_header_that_lies_is_refused(tmp_path, spans, metadata):
    """Two tensors over the same bytes, a gap between them, a __metadata__ that is not strings: safetensors' own
    reader fails on each deep inside loading."""
    from cramming.checkpoints.model_folder import check_safetensors

    header = {"a": {"dtype": "F32", "shape": [4], "data_offsets": spans[0]},
              "b": {"dtype": "F32", "shape": [4], "data_offsets": spans[1]}, "__metadata__": metadata}
    text = json.dumps(header).encode()
    path = tmp_path / "model.safetensors"
    path.write_bytes(struct.pack("<Q", len(text)) + text + bytes(max(end for _, end in spans)))
    with pytest.raises(UserError, match="byte ranges overlap or leave gaps|__metadata__ is not a table of strings"):
        check_safetensors(path)


def test_the_card_leaves_out_evaluations_that_are_not_eval_pys(source_run, tmp_path):
    folder = copy_of(source_run / "checkpoint", tmp_path)
    (folder / "eval_results.json").write_text(json.dumps([5, {"benchmark": "GLUE", "seeds": 1, "scores": "x",
                                                              "comparable": True, "finished_at": "2026"}]))
    line = update_card(Checkpoint(folder), {"benchmark": "B", "kind": "custom", "seeds": 1, "data": {},
                                            "metrics": {}, "comparable": False, "scores": {"t": 1.0},
                                            "finished_at": "2026-01-01"})
    assert line.startswith("model card:") and "not updated" not in line
    assert "### B (`eval=custom`), 1 seed(s)" in (folder / "README.md").read_text()


def test_a_bert_folder_whose_config_has_a_value_of_the_wrong_kind_is_one_line(tmp_path):
    from test_init_from import tiny_bert

    folder = tmp_path / "bert"
    tiny_bert(folder, ["a", "b"])
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "layer_norm_eps": "x"}))
    with pytest.raises(UserError, match="could not be loaded as a BertForMaskedLM .*layer_norm_eps"):
        open_source(str(folder))


def test_a_custom_task_with_more_classes_than_a_classifier_takes_is_one_line(tmp_path):
    from cramming.eval.custom import MAX_CLASSES, load_custom_task

    rows = "\n".join(f"example {i},label{i}" for i in range(MAX_CLASSES + 1))
    (tmp_path / "t.csv").write_text("text,label\n" + rows + "\n")
    with pytest.raises(UserError, match=f"{MAX_CLASSES + 1:,} distinct labels"):
        load_custom_task(str(tmp_path / "t.csv"), str(tmp_path / "t.csv"), ["text"], "label", None)


def test_a_zero_shot_row_of_the_wrong_kinds_is_one_line(tmp_path):
    from cramming.eval.zero_shot import read_items

    path = tmp_path / "hellaswag.jsonl"
    path.write_text(json.dumps({"activity_label": 5, "ctx_a": "a", "ctx_b": "b", "endings": ["x", "y"],
                                "label": 0}) + "\n")
    with pytest.raises(UserError, match="activity_label must be text"):
        read_items(path)


def test_an_exported_dataset_that_is_not_one_is_one_line(tmp_path):
    from cramming.data.prepare import prepare_data
    from cramming.data.share import export_prepared

    folder, _ = prepare_data(config_for(*TINY, f"data.cache_dir={tmp_path / 'cache'}").data)
    out = export_prepared(folder, tmp_path / "shared", "parquet")
    (out / "train.parquet").write_bytes(b"not parquet at all")
    result = run_command("pretrain.py", [*TINY, "train.max_steps=1", f"data.prepared={out}",
                                         f"data.cache_dir={tmp_path / 'cache2'}", f"hydra.run.dir={tmp_path / 'run'}"])
    one_line_error(result, "could not be read as an exported dataset")


def test_a_config_swapped_after_the_check_is_not_the_one_loaded(source_run, tmp_path, monkeypatch):
    """The config is read once, when it is checked: a config.json replaced afterwards (here by one whose position
    table would take 100 GB) is never what the models are built from."""
    from cramming.eval import checkpoint as checking
    from cramming.eval import recipe

    folder = copy_of(source_run / "checkpoint", tmp_path)
    real = checking.check_checkpoint

    def swapped_after(checkpoint):
        found = real(checkpoint)
        config = json.loads((folder / "config.json").read_text())
        (folder / "config.json").write_text(json.dumps({**config, "max_seq_length": 400_000_000}))
        return found

    monkeypatch.setattr(recipe, "check_checkpoint", swapped_after)
    result = run_command("eval.py", eval_args(folder, tmp_path))
    assert result.returncode == 0, result.stderr[-2000:]


def test_a_link_out_of_a_data_folder_is_refused_and_never_echoed(tmp_path, source_run):
    secret = tmp_path / "secret.tsv"
    secret.write_text("index\tsentence1\tsentence2\tlabel\nTOKEN=hunter2\n")
    glue = glue_folder(tmp_path)
    (glue / "RTE" / "dev.tsv").unlink()
    (glue / "RTE" / "dev.tsv").symlink_to(secret)
    result = run_command("eval.py", eval_args(source_run / "checkpoint", tmp_path, "eval=glue", "eval.tasks=[rte]",
                                              f"eval.data_dir={glue}"))
    one_line_error(result, "dev.tsv is a link leading outside it")
    assert "hunter2" not in result.stdout + result.stderr


def test_a_link_out_of_a_pretraining_data_folder_is_refused(tmp_path):
    elsewhere = tmp_path / "elsewhere.txt"
    elsewhere.write_text("words from somewhere else\n" * 50)
    data = tmp_path / "data"
    data.mkdir()
    (data / "mine.txt").write_text("my own words\n" * 50)
    (data / "theirs.txt").symlink_to(elsewhere)
    for path in (data, f"{data}/*.txt"):
        result = run_command("pretrain.py", [*TINY, "data=local-text", f"data.path={path}", "data_only=true",
                                             f"data.cache_dir={tmp_path / 'cache'}", f"hydra.run.dir={tmp_path / 'r'}"])
        one_line_error(result, "theirs.txt", "outside")


def test_a_tokenizer_folder_with_a_link_out_is_refused(source_run, tmp_path):
    folder = tmp_path / "tok"
    folder.mkdir()
    shutil.copy(source_run / "checkpoint" / "tokenizer_config.json", folder)
    shutil.copy(source_run / "checkpoint" / "tokenizer.json", tmp_path / "outside.json")
    (folder / "tokenizer.json").symlink_to(tmp_path / "outside.json")
    from cramming.data.tokenizer import load_pretrained_tokenizer

    with pytest.raises(UserError, match="tokenizer.json is a link to .*outside.json"):
        load_pretrained_tokenizer(str(folder), 32)


def test_texts_are_cut_to_what_truncation_can_keep_before_they_are_tokenized(source_run):
    """A 4 MiB line (the longest a task file may hold) is tokenized as its first CHARS_PER_TOKEN x max_length
    characters: the ids truncation keeps are the same, and no tokenizer sees megabytes."""
    from transformers import PreTrainedTokenizerFast

    from cramming.eval.classifier_head import encode_texts
    from cramming.eval.finetune import CHARS_PER_TOKEN, clipped
    from cramming.eval.tasks import Example

    tokenizer = PreTrainedTokenizerFast.from_pretrained(source_run / "checkpoint")
    long = "words of a sentence " * 200_000
    assert len(clipped([long], 32)[0]) == CHARS_PER_TOKEN * 32 and clipped(None, 32) is None
    whole = tokenizer([long[:100_000]], truncation=True, max_length=32)["input_ids"]
    assert encode_texts(tokenizer, [Example(long, None, 0)], 32) == whole


def test_a_number_of_thousands_of_digits_in_json_is_one_line(tmp_path):
    """Python refuses to convert integers of more than 4,300 digits: a JSON file holding one is one line."""
    from cramming.eval.files import json_objects
    from cramming.untrusted import read_json

    (tmp_path / "config.json").write_text('{"vocab_size": ' + "9" * 5000 + "}")
    with pytest.raises(UserError, match="config.json: not a JSON file"):
        read_json(tmp_path / "config.json")
    (tmp_path / "rows.jsonl").write_text('{"label": ' + "9" * 5000 + "}\n")
    with pytest.raises(UserError, match="rows.jsonl line 1: not a JSON row"):
        list(json_objects(tmp_path / "rows.jsonl"))


def test_saved_state_nested_deeper_than_python_recurses_is_walked(tmp_path):
    """A state.pt whose lists nest 5,000 deep (a pickle loads it) is checked without recursion, its view found."""
    from cramming.untrusted import plain_data

    deep = inner = []
    for _ in range(5000):
        inner.append([])
        inner = inner[0]
    inner.append(torch.zeros(1).expand(1000))
    limit = sys.getrecursionlimit()
    sys.setrecursionlimit(50_000)  # torch.save pickles by recursion: the attacker's writer is allowed more
    try:
        torch.save({"state": deep}, tmp_path / "state.pt")
    finally:
        sys.setrecursionlimit(limit)
    with pytest.raises(UserError, match="is a view of 1,000 elements"):
        load_saved(tmp_path / "state.pt")
    inner.append("${oc.env:HOME}")
    with pytest.raises(UserError, match="holds an interpolation"):
        plain_data(deep, "config")
