"""What a run prints besides results: the CPU-recipe note, progress bars with totals and sane units, no stray
DeepSpeed warning."""

import importlib.util
import os
import re
import subprocess
import sys

import pytest
from conftest import REPO, run_pretrain
from test_data import data_config, make_corpus

NOTE = "note: train.batch_size=8192 is a GPU recipe"


def test_the_gpu_batch_recipe_on_a_cpu_is_noted_once(tmp_path):
    """A 72-second CPU run on the default recipe made 3 steps and nothing said why; now the first line says it."""
    default = run_pretrain("dryrun=true", "arch=crammed-bert-tiny", "impl=cpu", run_dir=tmp_path / "a")
    assert default.returncode == 0, default.stderr[-2000:]
    lines = default.stdout.splitlines()
    assert [line for line in lines if line.startswith("note: ")] == [(
        f"{NOTE} (the batch grows to it over 60% of the budget), so on this CPU each step is slow and a short run "
        "makes few steps; for CPU runs use train=cpu-smoke (batch 64)")]
    smoke = run_pretrain("dryrun=true", "arch=crammed-bert-tiny", "impl=cpu", "train=cpu-smoke", run_dir=tmp_path / "b")
    assert smoke.returncode == 0 and "note: " not in smoke.stdout


def test_the_note_is_only_for_cpus_and_big_batches():
    from types import SimpleNamespace

    from cramming.cli import cpu_recipe_note

    def config(batch):
        return SimpleNamespace(train=SimpleNamespace(batch_size=batch, batch_ramp=0.6))

    assert cpu_recipe_note(config(8192), "cuda") is None
    assert cpu_recipe_note(config(64), "cpu") is None
    assert cpu_recipe_note(config(4096), "cpu").startswith("note: train.batch_size=4096 is a GPU recipe")


def test_data_bars_count_characters_out_of_the_files_size(tmp_path, capsys, monkeypatch):
    from tqdm import tqdm

    from cramming.data import prepare

    updates = []

    class Recording(tqdm):
        def update(self, n=1):
            updates.append((self.desc, self.total, self.unit))
            return super().update(n)

    monkeypatch.setattr(prepare, "tqdm", Recording)
    texts = make_corpus(tmp_path / "src")
    size = (tmp_path / "src" / "corpus.txt").stat().st_size
    prepare.prepare_data(data_config(tmp_path / "src", tmp_path / "cache"))
    for bar in ("training tokenizer", "tokenizing"):  # while reading: out of the file's bytes, in characters
        assert {(total, unit) for desc, total, unit in updates if desc == bar} == {(size, "char")}
    err = capsys.readouterr().err
    chars = f"{sum(map(len, texts)) / 1000:.1f}k"  # read to the end: 100 % of what was read
    for bar in ("training tokenizer", "tokenizing"):
        assert re.search(rf"{bar}: 100%\|[^|]*\| {chars}/{chars} \[[^]]*char/s\]", err), err[-1500:]
    assert "s/char" not in err and "doc" not in err


def test_python_docs_corpus_bar_has_a_total(tmp_path, capsys):
    from cramming.data.python_docs import _python_files, build_corpus, default_roots

    files = sum(1 for root in default_roots() for _ in _python_files(root))
    build_corpus(tmp_path / "corpus.jsonl", max_chars=20_000)
    err = capsys.readouterr().err
    assert re.search(rf"python-docs corpus: +\d+%\|[^|]*\| \d+/{files} ", err), err[-1000:]


@pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None, reason="DeepSpeed is not installed (dev extra)")
def test_deepspeed_cpu_accelerator_warning_is_quiet():
    """accelerate imports DeepSpeed in save_pretrained, and DeepSpeed warns "Setting accelerator to CPU" on every
    CPU run; only that line is dropped, its other warnings still print."""
    script = ("import cramming\nfrom deepspeed.utils import logger\nfrom deepspeed.accelerator import get_accelerator\n"
              "get_accelerator()\nlogger.warning('a real DeepSpeed warning')\n")
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": ""}
    result = subprocess.run([sys.executable, "-c", script], cwd=REPO, env=env, capture_output=True, text=True, check=False,
                            timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    output = result.stdout + result.stderr
    assert "a real DeepSpeed warning" in output and "Setting accelerator to CPU" not in output
