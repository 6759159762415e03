"""impl.microbatch_size=auto: candidates divide the batch, the search keeps the largest that fits with headroom (at
most 90 % of the GPU's memory) and takes a failed launch for running out of room, the answer is cached, and on CPU
auto is a fixed size (memory is not the limit there)."""

import contextlib
import json
from types import SimpleNamespace

import pytest
import torch
from conftest import REPO
from hydra import compose, initialize_config_dir

from cramming.model import CrammedConfig, CrammedForMaskedLM
from cramming.pretraining import pretrain
from cramming.train import microbatch
from cramming.train.microbatch import CPU_MICROBATCH, auto_microbatch, candidates, largest_fitting, probe_peak
from cramming.validation import load_config


def config_for(*overrides):
    base = ["arch=crammed-bert-tiny", "arch.num_layers=1", "arch.hidden_size=64", "arch.num_heads=2",
            "arch.ffn_size=128", "impl=cpu", "train=cpu-smoke", "train.validation_sequences=16", "data=sanity",
            "data.vocab_size=256", "data.seq_length=32", "data.max_chars=60000", "data.validation_fraction=0.1"]
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        return load_config(compose(config_name="pretrain", overrides=base + list(overrides)))


def test_candidates_divide_the_batch_and_respect_the_block():
    assert candidates(8192, 1)[-3:] == [2048, 4096, 8192] and len(candidates(8192, 1)) == 14
    assert candidates(48, 4) == [4, 8, 12, 16, 24, 48]


def test_largest_fitting_stops_at_the_first_failure():
    fits_to_20 = lambda m: 0 if m <= 20 else None
    assert largest_fitting([4, 8, 16, 32, 64], fits_to_20, capacity=100) == 16
    assert largest_fitting([4, 8], lambda m: None, capacity=100) == 4
    assert largest_fitting([4, 8], lambda m: 0, capacity=100) == 8


def test_largest_fitting_keeps_headroom():
    """A size that fits with 95 % of memory in use is refused: later steps would run out."""
    probed = []

    def peak(m):  # 12 bytes a sequence on a 100-byte GPU: 8 take 96 % and fit, but only 4 (48 %) keep the room
        probed.append(m)
        return 12 * m

    assert largest_fitting([1, 2, 4, 8, 16], peak, capacity=100) == 4
    assert probed == [1, 2, 4, 8]  # the search stops at the first size over the line
    assert largest_fitting([1, 2, 4, 8], lambda m: 11 * m, capacity=100) == 8  # 88 %: kept


class Failing(torch.nn.Module):
    """A model whose forward raises `error` from `from_size` sequences on: a launch too large for the device."""

    def __init__(self, error, from_size):
        super().__init__()
        self.weight, self.error, self.from_size = torch.nn.Parameter(torch.ones(())), error, from_size

    def forward(self, input_ids, labels):
        if input_ids.shape[0] >= self.from_size:
            raise self.error
        return SimpleNamespace(loss=self.weight * input_ids.float().mean())


@pytest.mark.parametrize("error", [torch.cuda.OutOfMemoryError("CUDA out of memory"),
                                   RuntimeError("CUDA error: invalid argument"),
                                   RuntimeError("CUDA error: unspecified launch failure"),
                                   RuntimeError("CUDA error: too many resources requested for launch"),
                                   pytest.param("triton", id="triton-OutOfResources")])
def test_a_failed_launch_counts_as_out_of_room(error):
    if error == "triton":
        errors = pytest.importorskip("triton.runtime.errors")
        error = errors.OutOfResources(300000, 232448, "shared memory")
    peak = probe_peak(Failing(error, from_size=8), 97, 16, contextlib.nullcontext, ballast_numel=10)
    assert peak(4) == 0 and peak(8) is None
    assert largest_fitting([2, 4, 8, 16], peak, capacity=100) == 4


@pytest.mark.parametrize("error", [ValueError("a bug"), RuntimeError("mat1 and mat2 shapes cannot be multiplied")])
def test_other_errors_are_not_taken_for_running_out_of_room(error):
    with pytest.raises(type(error), match=str(error)):
        probe_peak(Failing(error, from_size=8), 97, 16, contextlib.nullcontext, ballast_numel=10)(8)


def test_probe_runs_forward_backward_and_leaves_model_and_rng_alone():
    model = CrammedForMaskedLM(CrammedConfig(vocab_size=97, hidden_size=32, num_layers=1, num_heads=4, ffn_size=64))
    before = {k: v.clone() for k, v in model.state_dict().items()}
    state = torch.get_rng_state()
    assert probe_peak(model, 97, 16, contextlib.nullcontext, ballast_numel=10)(4) == 0
    assert torch.equal(torch.get_rng_state(), state)
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert all(p.grad is None for p in model.parameters())


def test_auto_on_a_gpu_keeps_headroom_and_caches_the_answer(tmp_path, monkeypatch):
    """The CUDA path with the GPU faked: 1 GiB a sequence on a 9.5 GiB card gives 8 (84 %), not 9 (95 %)."""
    probed = []

    def fake_probe(model, vocab_size, seq_len, autocast, ballast_numel):
        return lambda m: probed.append(m) or m * 2**30

    monkeypatch.setattr(microbatch, "probe_peak", fake_probe)
    monkeypatch.setattr(microbatch, "gpu_bytes", lambda device: 19 * 2**29)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Fake GPU")
    runtime = SimpleNamespace(device=torch.device("cuda", 0), precision="bf16", autocast=lambda: contextlib.nullcontext)
    config = config_for("impl.microbatch_size=auto", "train.batch_size=72")
    model = CrammedForMaskedLM(CrammedConfig(vocab_size=97, hidden_size=32, num_layers=1, num_heads=4, ffn_size=64))
    assert auto_microbatch(model, config, 97, 32, 1, runtime, tmp_path) == 8
    assert probed == [1, 2, 3, 4, 6, 8, 9]
    assert list(json.loads((tmp_path / "microbatch.json").read_text()).values()) == [8]
    assert auto_microbatch(model, config, 97, 32, 1, runtime, tmp_path) == 8 and len(probed) == 7  # from the cache


def test_auto_on_cpu(tmp_path, capsys):
    summary = pretrain(config_for("impl.microbatch_size=auto", "train.batch_size=64", "train.max_steps=2"), tmp_path)
    assert f"microbatch: {min(CPU_MICROBATCH, 64)} sequences (impl.microbatch_size=auto)" in capsys.readouterr().out
    assert summary["steps"] == 2
