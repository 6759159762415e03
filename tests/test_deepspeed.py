"""impl.distributed=deepspeed on CPU (gloo): ZeRO-2 over two processes takes the steps one process takes, a bf16
ZeRO-2 run with clipping and a batch ramp stops on one rank's signal and resumes bit for bit, train.nonfinite
acts on what DeepSpeed reports, and what DeepSpeed cannot do is one line before any work."""

import importlib.util
import json
import socket
import sys
import types

import pytest
import torch
from conftest import run_pretrain
from test_distributed import TINY, Distributed, check_distributed, records, stop_one_rank, torchrun
from test_resume import config_for, final_weights, logged_steps, poison  # noqa: F401  (a fixture)

from cramming import pretraining
from cramming.checkpoints.step_folder import MARKER
from cramming.engines import Torchrun, setup
from cramming.engines import deepspeed as deepspeed_engine
from cramming.errors import RunStopped, UserError
from cramming.impl import resolve
from cramming.train.checkpointing import load_weights

needs_deepspeed = pytest.mark.skipif(importlib.util.find_spec("deepspeed") is None,
                                     reason="DeepSpeed is not installed (pip install -e '.[deepspeed]')")
ENGINE = ["impl.distributed=deepspeed"]


@needs_deepspeed
def test_zero2_on_two_processes_matches_one_process(tmp_path):
    steps = ["train.max_steps=4", "train.batch_ramp=0", "train.grad_clip=0.5"]
    zero = torchrun(*TINY, *steps, *ENGINE, "impl.deepspeed.zero_stage=2", f"hydra.run.dir={tmp_path / 'zero'}")
    one = run_pretrain(*TINY, *steps, run_dir=tmp_path / "one", in_process=True)
    assert one.returncode == 0, one.stderr[-3000:]
    out, err = zero.communicate(timeout=300)
    assert zero.returncode == 0, err[-3000:]
    assert "deepspeed on 2 processes" in out and out.count("built successfully") <= 1  # rank 0 alone prints
    got, want = records(tmp_path / "zero"), records(tmp_path / "one")
    assert [r["step"] for r in got] == [r["step"] for r in want]
    for a, b in zip(got, want):
        for key in ("loss", "grad_norm", "val_loss"):
            if key in b:  # DeepSpeed's clipped norm is ours: the same gradients, the same clipping
                assert a[key] == pytest.approx(b[key], rel=1e-5, abs=1e-6), (key, a["step"])
    summary = json.loads((tmp_path / "zero" / "train_summary.json").read_text())
    assert summary["distributed"] == {"engine": "deepspeed", "world_size": 2}
    weights, reference = final_weights(tmp_path / "zero"), final_weights(tmp_path / "one")
    assert all(torch.allclose(weights[k], reference[k], atol=1e-5) for k in reference)


@needs_deepspeed
def test_bf16_zero2_stops_on_one_ranks_signal_and_resumes_exactly(tmp_path):
    exact = [*TINY, *ENGINE, "impl.deepspeed.zero_stage=2", "impl.precision=bf16", "train.grad_clip=0.5",
             "train.max_steps=24", "train.batch_ramp=0.5"]
    whole = torchrun(*exact, f"hydra.run.dir={tmp_path / 'whole'}")
    stopped = torchrun(*exact, f"hydra.run.dir={tmp_path / 'stopped'}")
    stop_one_rank(stopped, tmp_path / "stopped", at_step=3)
    _, err = stopped.communicate(timeout=240)
    assert stopped.returncode != 0 and err.count("stopped: stopped by") == 2, err[-3000:]
    (saved,) = list((tmp_path / "stopped" / "checkpoints").glob("step-*"))
    shards = sorted(p.name for p in (saved / "deepspeed").iterdir())
    assert shards == ["bf16_zero_pp_rank_0_mp_rank_00_optim_states.pt",
                      "bf16_zero_pp_rank_1_mp_rank_00_optim_states.pt", "mp_rank_00_model_states.pt"]
    _, err = whole.communicate(timeout=240)
    assert whole.returncode == 0, err[-3000:]

    resumed = torchrun(*exact, f"hydra.run.dir={tmp_path / 'stopped'}")
    out, err = resumed.communicate(timeout=240)
    assert resumed.returncode == 0 and "resuming from" in out, err[-3000:]
    want, got = final_weights(tmp_path / "whole"), final_weights(tmp_path / "stopped")
    assert want.keys() == got.keys() and all(torch.equal(got[k], want[k]) for k in want)
    assert all(v.dtype == torch.float32 for v in got.values())  # the fp32 master weights, not the bf16 copy
    assert logged_steps(tmp_path / "stopped") == list(range(1, 25))


def free_port() -> str:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return str(probe.getsockname()[1])


# A port of this process's own: pytest-xdist's workers may each run some of these tests at the same time.
TORCHRUN_ENV = {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": free_port()}


@pytest.fixture(scope="module")
def process_group():
    """DeepSpeed keeps its groups for the life of the process, so the in-process runs share one process group,
    closed when this module's tests are done."""
    with pytest.MonkeyPatch.context() as patch:
        for key, value in TORCHRUN_ENV.items():
            patch.setenv(key, value)
        torch.distributed.init_process_group("gloo")
    yield
    torch.distributed.destroy_process_group()


@pytest.fixture
def one_process(process_group, monkeypatch):
    """This pytest process as rank 0 of a torchrun world of one, so DeepSpeed runs in process."""
    for key, value in TORCHRUN_ENV.items():
        monkeypatch.setenv(key, value)
    monkeypatch.setattr(Torchrun, "close", lambda self: None)  # the group outlives each run


NAN_RUN = [*TINY, *ENGINE, "train.max_steps=6", "train.batch_size=16", "impl.microbatch_size=16",
           "train.batch_ramp=0", "train.schedule=step-constant", "train.warmup=0"]


@needs_deepspeed
def test_nonfinite_skip_and_rollback_act_on_what_deepspeed_reports(one_process, poison, tmp_path):  # noqa: F811
    poison.add(3)  # ZeRO finds the NaN gradients and skips the update; the loop counts a skip
    summary = pretraining.pretrain(config_for(*NAN_RUN, "train.nonfinite=skip"), tmp_path / "skip")
    assert summary["steps"] == 6 and summary["skipped_steps"] == 1
    assert [r["step"] for r in records(tmp_path / "skip") if r.get("event") == "skip"] == [2]
    weights = final_weights(tmp_path / "skip")
    assert all(torch.isfinite(w).all() for w in weights.values())

    poison.clear()
    poison.add(4)  # rollback: the engine reloads its own checkpoint and the learning rate halves
    summary = pretraining.pretrain(config_for(*NAN_RUN, "train.nonfinite=rollback", "impl.deepspeed.zero_stage=0",
                                              "train.checkpoint_every_minutes=null"), tmp_path / "rollback")
    assert summary["steps"] == 6 and summary["rollbacks"] == 1
    events = [r for r in records(tmp_path / "rollback") if r.get("event") == "rollback"]
    assert len(events) == 1 and events[0]["lr_scale"] == 0.5

    poison.add(1)
    with pytest.raises(RunStopped, match=r"non-finite loss before step 1 \(train.nonfinite=halt\)"):
        pretraining.pretrain(config_for(*NAN_RUN, "train.nonfinite=halt", "train.resume=never"), tmp_path / "halt")


@needs_deepspeed
def test_onebit_adam_runs_its_warm_up_through_our_loop(one_process, monkeypatch, tmp_path):
    """1-bit Adam's first freeze_step steps are plain Adam with a full all-reduce; only the compressed phase needs
    NCCL and cupy, which a CPU lacks. With a stand-in for that backend (failing if the compressed phase were
    reached) the warm-up runs here: DeepSpeed builds 1-bit Adam over our groups and follows our schedule."""
    if not deepspeed_engine.has_onebit_adam():
        pytest.skip("this DeepSpeed has no 1-bit Adam (removed in 0.19.7)")

    class NcclStandIn:
        def __init__(self, mpu=None):
            self.size = torch.distributed.get_world_size()

        def compressed_allreduce(self, *args, **kwargs):
            raise AssertionError("the compressed phase needs NCCL")

    monkeypatch.setitem(sys.modules, "deepspeed.runtime.comm.nccl", types.SimpleNamespace(NcclBackend=NcclStandIn))
    monkeypatch.setattr(deepspeed_engine, "problem", lambda *args: None)  # it refuses CPUs, rightly
    built = {}
    initialize = deepspeed_engine.initialize
    monkeypatch.setattr(deepspeed_engine, "initialize", lambda *args: built.setdefault("it", initialize(*args)))
    config = config_for(*TINY, *ENGINE, "impl.deepspeed.zero_stage=0", "impl.deepspeed.onebit_adam=true",
                        "impl.deepspeed.freeze_step=100", "train.max_steps=6", "train.nonfinite=halt")
    summary = pretraining.pretrain(config, tmp_path)
    _, optimizer = built["it"]
    assert type(optimizer).__name__ == "OnebitAdam" and summary["steps"] == 6
    assert summary["val_loss"] < summary["untrained_val_loss"]
    decay, no_decay = optimizer.param_groups  # ours: weight decay on matrices only, each with its peak
    assert (decay["weight_decay"], no_decay["weight_decay"]) == (config.train.weight_decay, 0.0)
    lrs = [r["lr"] for r in records(tmp_path) if "lr" in r]
    assert decay["lr"] == pytest.approx(lrs[-1]) and len(set(lrs)) == 6  # the step-triangle schedule, step by step


def test_a_zero_checkpoint_resumes_on_its_own_world_size_only(tmp_path):
    """One optimizer partition per rank: another world size is refused in one line, before DeepSpeed loads."""
    saved = tmp_path / "step-00000007"
    (saved / deepspeed_engine.FOLDER).mkdir(parents=True)
    torch.save({"state": {}, "scaler": {}}, saved / "state.pt")
    (saved / MARKER).write_text(json.dumps({"step": 7, "world": 2}))
    with pytest.raises(UserError, match="resume it on 2 processes, not 1"):
        load_weights(saved, torch.nn.Linear(2, 2), None, None, Distributed("deepspeed", rank=0, world=1))
    with pytest.raises(UserError, match="written with impl.distributed=deepspeed and must be resumed the same way"):
        load_weights(saved, torch.nn.Linear(2, 2), None, None, Distributed("ddp", rank=0, world=2))


def test_what_deepspeed_cannot_do_is_refused_before_any_work(monkeypatch):
    config = config_for(*TINY, "train.max_steps=4", *ENGINE)
    runtime = resolve(config.impl, config.arch)
    ds = Distributed("deepspeed", rank=0, world=2)
    refused = {
        "impl.microbatch_size=auto cannot be used": ["impl.microbatch_size=auto"],
        "muon cannot run under ZeRO": ["train.optim.name=muon"],
        "train.nonfinite=skip needs DeepSpeed to check": ["impl.deepspeed.zero_stage=0"],
    }
    for message, overrides in refused.items():
        with pytest.raises(UserError, match=message):
            check_distributed(config_for(*TINY, "train.max_steps=4", *ENGINE, *overrides), runtime, ds)
    check_distributed(config_for(*TINY, "train.max_steps=4", *ENGINE, "impl.deepspeed.zero_stage=0",
                                 "train.nonfinite=halt", "train.optim.name=muon"), runtime, ds)
    # 1-bit Adam: not with ZeRO, not with another optimizer, and only on CUDA GPUs
    for overrides, message in [([], "does not combine with ZeRO; set impl.deepspeed.zero_stage=0"),
                               (["impl.deepspeed.zero_stage=0", "train.optim.name=lion"], "leave train.optim"),
                               (["impl.distributed=ddp", "impl.deepspeed.zero_stage=0"], "set impl.distributed=deepspeed")]:
        with pytest.raises(UserError, match=message):
            config_for(*TINY, "train.max_steps=4", *ENGINE, "impl.deepspeed.onebit_adam=true", *overrides)
    with pytest.raises(UserError, match="impl.deepspeed.zero_stage=3 is invalid"):
        config_for(*TINY, "train.max_steps=4", *ENGINE, "impl.deepspeed.zero_stage=3")
    onebit = config_for(*TINY, "train.max_steps=4", *ENGINE, "impl.deepspeed.onebit_adam=true",
                        "impl.deepspeed.zero_stage=0", "train.nonfinite=halt")
    if importlib.util.find_spec("deepspeed") is not None:
        monkeypatch.setattr(deepspeed_engine, "has_onebit_adam", lambda: True)
        with pytest.raises(UserError, match="onebit_adam needs CUDA GPUs"):
            check_distributed(onebit, runtime, ds)
        monkeypatch.setattr(deepspeed_engine, "has_onebit_adam", lambda: False)
        with pytest.raises(UserError, match=r"no longer has 1-bit Adam \(removed in 0.19.7\)"):
            check_distributed(onebit, runtime, ds)


def test_our_config_becomes_deepspeeds():
    """The keys DeepSpeed reads: batch arithmetic, its own gradient clipping, ZeRO stage, bf16 with its
    gradient check, and 1-bit Adam with our AdamW hyperparameters."""
    config = config_for(*TINY, "train.max_steps=4", *ENGINE, "train.batch_size=32", "impl.microbatch_size=4", "train.grad_clip=0.7",
                        "impl.deepspeed.zero_stage=0", "impl.deepspeed.onebit_adam=true",
                        "impl.deepspeed.freeze_step=50", "impl.precision=bf16")
    settings = deepspeed_engine.engine_config(config, resolve(config.impl, config.arch), microbatch=4, world=2)
    assert settings["train_batch_size"] == 32 and settings["gradient_accumulation_steps"] == 4
    assert settings["train_micro_batch_size_per_gpu"] == 4 and settings["gradient_clipping"] == 0.7
    assert settings["zero_optimization"] == {"stage": 0}
    assert settings["bf16"] == {"enabled": True, "check_grad_overflow": True} and "fp16" not in settings
    params = settings["optimizer"]["params"]
    assert settings["optimizer"]["type"] == "OneBitAdam" and params["freeze_step"] == 50
    assert (params["lr"], params["betas"], params["weight_decay"]) == (
        config.train.lr, list(config.train.betas), config.train.weight_decay)
    fp16 = config_for(*TINY, "train.max_steps=4", *ENGINE, "impl.precision=fp16", "train.grad_clip=null")
    settings = deepspeed_engine.engine_config(fp16, resolve(fp16.impl, fp16.arch), microbatch=4, world=1)
    assert settings["fp16"] == {"enabled": True} and settings["gradient_clipping"] == 0.0
    assert "optimizer" not in settings and settings["zero_optimization"] == {"stage": 1}
    preset = config_for(*TINY, "impl=deepspeed", "train.max_steps=4")  # impl=gpu with DeepSpeed as the engine
    assert (preset.impl.distributed, preset.impl.device, preset.impl.precision) == ("deepspeed", "cuda", "bf16")
    assert preset.impl.deepspeed.zero_stage == 1 and not preset.impl.deepspeed.onebit_adam


def test_without_deepspeed_installed_the_run_says_how_to_get_it(monkeypatch):
    monkeypatch.setitem(sys.modules, "deepspeed", None)  # `import deepspeed` fails, as if not installed
    for key, value in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0"}.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(UserError) as error:
        setup("deepspeed", "cpu")
    assert str(error.value) == ("impl.distributed=deepspeed needs DeepSpeed, which is not installed: "
                                "pip install 'cramming[deepspeed]'")
