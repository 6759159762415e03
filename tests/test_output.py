"""What a run prints besides results: the CPU-recipe note, progress bars with totals and sane units, no stray
DeepSpeed warning, no shard bar after a save, no DDP deprecation, no torchao import noise."""

import contextlib
import importlib.util
import io
import os
import re
import subprocess
import sys
import warnings

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

    from cramming.pretraining import cpu_recipe_note

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


def test_python_docs_first_use_prints_its_corpus_lines_alone_then_the_tokenizer_bar(tmp_path, monkeypatch):
    """On first use python-docs builds its corpus inside the tokenizer's first read. The tokenizer bar used to open
    before that: "building the python-docs corpus" printed on the bar's line, and the bar counted the build as reading
    time (760 characters in 50 s: an ETA of 280 hours). Now the bar opens once the corpus exists, out of its size."""
    from cramming.data import prepare
    from cramming.data.sources import PythonDocs

    cfg = data_config(tmp_path, tmp_path / "cache", source="python-docs", max_chars=30_000)
    corpus = PythonDocs(cfg, tmp_path / "cache").corpus
    bars = []

    class Recording(prepare.tqdm):
        def __init__(self, *args, **kwargs):
            bars.append({"desc": kwargs["desc"], "corpus_built": corpus.exists(), "updates": set()})
            super().__init__(*args, **kwargs)

        def update(self, n=1):
            bars[-1]["updates"].add((self.total, self.unit))
            return super().update(n)

    monkeypatch.setattr(prepare, "tqdm", Recording)
    both = io.StringIO()  # stdout and stderr in the order a console shows them
    with contextlib.redirect_stdout(both), contextlib.redirect_stderr(both):
        prepare.prepare_data(cfg)
    lines = re.split(r"[\r\n]", both.getvalue())
    for line in ("building the python-docs corpus", "python-docs corpus: "):
        assert [text for text in lines if line in text and not text.startswith(line)] == [], both.getvalue()[-2000:]
    assert any(text.startswith("python-docs corpus: ") and "documents" in text for text in lines)
    tokenizer_bar = next(bar for bar in bars if bar["desc"] == "training tokenizer")
    assert tokenizer_bar["corpus_built"]  # its clock starts after the build
    size = PythonDocs(cfg, tmp_path / "cache").size_hint()
    assert tokenizer_bar["updates"] == {(min(size, 30_000), "char")}  # the whole way out of the corpus's characters


def test_our_saves_draw_no_shard_bar_and_leave_the_users_switch_alone(tmp_path, capsys, monkeypatch):
    """transformers' "Writing model shards" bar printed after every run; it is off for our saves only."""
    from transformers.utils import logging as hf_logging

    from cramming.checkpoints import model_folder as checkpoint
    from cramming.checkpoints.model_folder import save_checkpoint
    from cramming.data.tokenizer import train_tokenizer
    from cramming.model import CrammedConfig
    from cramming.model.modeling_crammed import CrammedForMaskedLM

    monkeypatch.setattr(checkpoint, "write_card", lambda folder, summary, head=None: None)  # the card reads a whole run's summary

    model = CrammedForMaskedLM(CrammedConfig(vocab_size=100, hidden_size=16, num_layers=1, num_heads=2, ffn_size=32))
    tokenizer = train_tokenizer(["the quick brown fox jumps over the lazy dog"] * 20, "wordpiece", 100, 32)
    summary = {"name": "quiet"}
    was_on = hf_logging.is_progress_bar_enabled()
    try:
        hf_logging.enable_progress_bar()
        save_checkpoint(model, tokenizer, summary, tmp_path / "on")
        assert "Writing model shards" not in capsys.readouterr().err
        assert hf_logging.is_progress_bar_enabled()  # the user's bars: still on
        model.save_pretrained(tmp_path / "theirs")  # and still drawn in the user's own saves
        assert "Writing model shards" in capsys.readouterr().err
        hf_logging.disable_progress_bar()
        save_checkpoint(model, tokenizer, summary, tmp_path / "off")
        assert not hf_logging.is_progress_bar_enabled()  # a user who turned them off: still off
    finally:
        (hf_logging.enable_progress_bar if was_on else hf_logging.disable_progress_bar)()


def test_the_ddp_engine_wraps_without_a_deprecation_warning(tmp_path):
    """torch 2.13 deprecates broadcast_buffers (a FutureWarning on every rank); its successor keeps our choice: no
    buffer broadcast at each forward."""
    import torch
    import torch.distributed as dist

    from cramming.engines import ENGINES

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    try:
        model = torch.nn.Linear(4, 4)
        model.register_buffer("table", torch.ones(4))
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            wrapped = ENGINES["ddp"](rank=0, world=1).wrap(model, torch.device("cpu"))
        assert [str(w.message) for w in caught] == []
        assert not wrapped.broadcast_buffers  # (a property over forward_sync_buffers where that exists)
    finally:
        dist.destroy_process_group()


@pytest.mark.skipif(importlib.util.find_spec("torchao") is None, reason="torchao is not installed (the fp8 extra)")
def test_torchao_import_noise_is_quiet():
    """With torchao installed, transformers imports it with the first model: torchao logged that its optional C++
    kernels failed to load, and torch two pytree deprecations. Only those lines are dropped."""
    script = ("import logging, sys\nimport pretrain\nfrom cramming.model import CrammedConfig\n"
              "from cramming.model.modeling_crammed import CrammedForMaskedLM\n"
              "CrammedForMaskedLM(CrammedConfig(vocab_size=64, hidden_size=16, num_layers=1, num_heads=2, ffn_size=32))\n"
              "assert 'torchao' in sys.modules\nlogging.getLogger('torchao').warning('a real torchao warning')\n")
    result = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, check=False,
                            timeout=120)
    assert result.returncode == 0, result.stderr[-2000:]
    assert "a real torchao warning" in result.stderr
    for noise in ("Failed to load", "cutlass", "is now natively supported", "register_constant"):
        assert noise not in result.stdout + result.stderr, result.stderr[-2000:]
