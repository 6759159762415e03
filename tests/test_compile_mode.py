"""impl.compile_mode: the mode reaches torch.compile from a real run, and a contradiction is refused in one line
before any data is read (exit 2 from the command line; each contradiction: the table in tests/test_refusals.py)."""

from pathlib import Path

import pytest
import torch
from conftest import one_line_error, run_pretrain
from hydra import compose, initialize_config_dir

from cramming.errors import UserError
from cramming.impl import COMPILE_MODES, compile_note
from cramming.model.pretrained import CrammedPreTrainedModel
from cramming.pretraining import pretrain
from cramming.validation import load_config

CONF = Path(__file__).resolve().parents[1] / "conf"
TINY = ["arch=crammed-bert-tiny", "arch.num_layers=1", "arch.hidden_size=64", "arch.num_heads=2",
        "arch.ffn_size=128", "impl=cpu", "train=cpu-smoke", "train.batch_size=16", "train.max_steps=2",
        "train.validation_sequences=16", "data=sanity", "data.vocab_size=256", "data.seq_length=32",
        "data.max_chars=60000", "data.validation_fraction=0.1", "train.checkpoint_every_minutes=null"]


def config_for(*overrides):
    with initialize_config_dir(config_dir=str(CONF), version_base="1.3"):
        return load_config(compose(config_name="pretrain", overrides=TINY + list(overrides)))


def test_torch_lists_which_modes_record_cuda_graphs():
    """The registry reads the CUDA-graph flag from torch's own mode table, not from a list of ours."""
    assert {name for name, mode in COMPILE_MODES.items() if mode.cuda_graphs} == {"reduce-overhead", "max-autotune"}
    assert COMPILE_MODES["default"].torch_mode is None


@pytest.mark.parametrize("mode, expected", [("default", None), ("max-autotune-no-cudagraphs",
                                                                  "max-autotune-no-cudagraphs")])
def test_the_mode_reaches_torch_compile(tmp_path, monkeypatch, mode, expected):
    seen = []

    def recording_compile(model, **kwargs):
        if isinstance(model, CrammedPreTrainedModel):  # the run's model, not a helper function compiled elsewhere
            seen.append(kwargs)
            return model  # eager: what is observed is the call, not inductor's work
        return real_compile(model, **kwargs)

    real_compile = torch.compile

    monkeypatch.setattr(torch, "compile", recording_compile)
    summary = pretrain(config_for("impl.compile=true", f"impl.compile_mode={mode}"), tmp_path)
    assert summary["steps"] == 2
    assert seen == [{"mode": expected}]


def test_cuda_graphs_on_an_auto_device_without_cuda_are_refused_before_any_data(tmp_path, monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    config = config_for("impl.device=auto", "impl.compile=true", "impl.compile_mode=reduce-overhead",
                        f"data.cache_dir={tmp_path / 'cache'}")
    with pytest.raises(UserError, match="need a CUDA device \\(device is cpu\\)"):
        pretrain(config, tmp_path / "run")
    assert not (tmp_path / "cache").exists()


def test_cuda_graphs_with_a_sequence_curriculum_get_a_note():
    config = config_for("impl.compile_mode=reduce-overhead", "impl.device=cuda", "impl.compile=true",
                        "train.seq_schedule=[[0.5,32],[0.5,64]]", "train.batch_size=32", "impl.microbatch_size=16")
    assert "train.seq_schedule has 2 lengths" in compile_note(config)
    assert compile_note(config_for("impl.compile_mode=max-autotune-no-cudagraphs", "impl.compile=true",
                                   "train.seq_schedule=[[0.5,32],[0.5,64]]", "train.batch_size=32",
                                   "impl.microbatch_size=16")) is None


def test_the_command_line_refusal_is_one_line_with_exit_2(tmp_path):
    result = run_pretrain(*TINY, "impl.compile_mode=reduce-overhead", run_dir=tmp_path, in_process=True)
    one_line_error(result, "impl.compile_mode='reduce-overhead'", "impl.compile=false compiles nothing")
