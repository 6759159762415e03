"""Prepared data on its own: `data_only=true` prepares and prints the folder with no run, a prepared folder exports
as a Hugging Face dataset (save_to_disk or parquet) and `data.prepared` trains on it (or on the folder itself) with
the same sequences."""

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from conftest import one_line_error
from test_resume import TINY, config_for

from cramming.config import DataConfig
from cramming.data.packed import PackedTokens
from cramming.data.prepare import prepare_data
from cramming.data.share import export_prepared, use_prepared
from cramming.errors import UserError

REPO = Path(__file__).resolve().parents[1]


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    cfg = DataConfig(source="sanity", vocab_size=256, seq_length=32, max_chars=100_000, validation_fraction=0.05,
                     cache_dir=str(tmp_path_factory.mktemp("cache")))
    folder, meta = prepare_data(cfg)
    return cfg, folder, meta


def rows(folder: Path, meta: dict, split: str) -> np.ndarray:
    packed = PackedTokens(folder / f"{split}.bin", meta["dtype"], meta["seq_length"], meta["special_ids"]["cls"])
    return packed.rows(range(len(packed)))


@pytest.mark.parametrize("fmt", ["arrow", "parquet"])
def test_an_export_reads_back_as_the_same_sequences(prepared, tmp_path, fmt):
    import datasets

    cfg, folder, meta = prepared
    out = export_prepared(folder, tmp_path / "shared", fmt)
    if fmt == "arrow":  # a plain Hugging Face dataset: rows of input_ids, [CLS] first, as a run trains on them
        loaded = datasets.load_from_disk(str(out))
        assert set(loaded) == {"train", "validation"} and loaded["train"].column_names == ["input_ids"]
        assert np.array_equal(np.array(loaded["train"]["input_ids"]), rows(folder, meta, "train"))
    imported, imported_meta = use_prepared(DataConfig(**{**vars(cfg), "prepared": str(out),
                                                         "cache_dir": str(tmp_path / "elsewhere")}))
    assert imported != folder and imported.is_relative_to(tmp_path / "elsewhere")
    for split in ("train", "val"):
        assert np.array_equal(rows(imported, imported_meta, split), rows(folder, meta, split))
    assert {k: v for k, v in imported_meta.items() if k != "imported_from"} == meta
    assert (imported / "tokenizer" / "tokenizer.json").read_bytes() == (folder / "tokenizer" / "tokenizer.json").read_bytes()
    assert np.array_equal(np.load(imported / "train_periods.npy"), np.load(folder / "train_periods.npy"))
    again, _ = use_prepared(DataConfig(**{**vars(cfg), "prepared": str(out), "cache_dir": str(tmp_path / "elsewhere")}))
    assert again == imported  # imported once


def test_prepared_folders_are_taken_as_they_are(prepared, tmp_path):
    cfg, folder, meta = prepared
    found, found_meta = prepare_data(DataConfig(**{**vars(cfg), "prepared": str(folder), "source": "local-text",
                                                   "cache_dir": str(tmp_path)}))
    assert found == folder and found_meta == meta and not any(tmp_path.iterdir())  # nothing prepared again
    with pytest.raises(UserError, match="data.seq_length=64 is invalid: .* holds sequences of 32 tokens"):
        use_prepared(DataConfig(**{**vars(cfg), "prepared": str(folder), "seq_length": 64}))
    with pytest.raises(UserError, match="already exists"):
        export_prepared(folder, folder)


@pytest.mark.parametrize("make,fragment", [(lambda p: None, "does not exist"),
                                           (lambda p: p.mkdir(), "holds neither meta.json and train.bin")])
def test_a_bad_prepared_folder_is_one_line_before_any_work(tmp_path, make, fragment):
    make(tmp_path / "nothing")
    with pytest.raises(UserError) as err:
        config_for(*TINY, f"data.prepared={tmp_path / 'nothing'}")
    assert f"data.prepared='{tmp_path / 'nothing'}' is invalid" in str(err.value) and fragment in str(err.value)


@pytest.mark.slow
def test_data_only_prepares_prints_the_folder_and_makes_no_run(tmp_path):
    env = {**os.environ, "HOME": str(tmp_path / "home"), "XDG_CACHE_HOME": str(tmp_path / "xdg")}
    env.pop("CRAMMING_CACHE", None)
    command = [sys.executable, str(REPO / "pretrain.py"), "data_only=true", "data=sanity", "data.max_chars=100000",
               "data.vocab_size=256", "data.seq_length=32", "data.validation_fraction=0.05", "name=prep"]
    done = subprocess.run(command, cwd=tmp_path, capture_output=True, text=True, timeout=600, env=env, check=False)
    assert done.returncode == 0, done.stderr[-2000:]
    folder = Path(done.stdout.strip().splitlines()[-1].removeprefix("prepared: "))
    assert folder.parent == tmp_path / "xdg" / "cramming" and json.loads((folder / "meta.json").read_text())
    assert not (tmp_path / "outputs").exists()  # no run folder, not even Hydra's
    exported = subprocess.run([sys.executable, "-m", "cramming.data.share", str(folder), str(tmp_path / "out")],
                              cwd=REPO, capture_output=True, text=True, timeout=600, env=env, check=False)
    assert exported.returncode == 0 and (tmp_path / "out" / "cramming_meta.json").is_file(), exported.stderr[-2000:]
    refused = subprocess.run([sys.executable, "-m", "cramming.data.share", str(tmp_path), str(tmp_path / "o2")],
                             cwd=REPO, capture_output=True, text=True, timeout=600, env=env, check=False)
    one_line_error(refused, "is not a prepared data folder")
