"""torchrun with DDP and FSDP2 on CPU (gloo): the same global batch gives the same steps as one process, only
rank 0 writes, a stop signal to one rank stops all of them at the same step, and FSDP2 resumes bit for bit."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
from conftest import REPO, run_pretrain
from safetensors.torch import load_file
from test_resume import config_for, logged_steps

from cramming.engines import ENGINES, quiet_hydra_on_other_ranks
from cramming.errors import UserError
from cramming.impl import resolve
from cramming.train.microbatch import microbatch_size


def Distributed(name: str, rank: int, world: int):
    return ENGINES[name](rank=rank, world=world)


def check_distributed(config, runtime, engine) -> None:
    """What pretrain() asks the engine before any work: its own problem, then what it refuses of the others."""
    from cramming.errors import refuse
    from cramming.validation.across import engine_problem

    engine.check(config, runtime, microbatch_size(config))
    refuse(engine_problem(config, engine, runtime))

TINY = ["arch=crammed-bert-tiny", "arch.num_layers=1", "arch.hidden_size=64", "arch.num_heads=2",
        "arch.ffn_size=128", "impl=cpu", "train=cpu-smoke", "train.validation_sequences=16", "data=sanity",
        "data.vocab_size=256", "data.seq_length=32", "data.max_chars=60000", "data.validation_fraction=0.1",
        "train.schedule=step-triangle", "train.batch_size=16", "impl.microbatch_size=4",
        "train.checkpoint_every_minutes=null"]


def torchrun(*overrides: str, cwd: Path = REPO) -> subprocess.Popen:
    args = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
            str(REPO / "pretrain.py"), *overrides]
    return subprocess.Popen(args, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def records(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


def test_ddp_matches_one_process_with_the_same_global_batch(tmp_path):
    steps = ["train.max_steps=4", "train.batch_ramp=0"]
    ddp = torchrun(*TINY, *steps, "impl.distributed=ddp", "name=ddp", cwd=tmp_path)  # Hydra's default folders
    one = run_pretrain(*TINY, *steps, run_dir=tmp_path / "one", in_process=True)
    assert one.returncode == 0, one.stderr[-3000:]
    out, err = ddp.communicate(timeout=300)
    assert ddp.returncode == 0, err[-3000:]
    assert "ddp on 2 processes" in out and out.count("untrained validation loss") == 1  # rank 0 alone prints
    assert out.count("data: ") == 1, out

    runs = [p for p in (tmp_path / "outputs").rglob("*") if (p / ".hydra").is_dir()]
    assert len(runs) == 1, runs  # one run folder, with Hydra's files, from rank 0 only
    (run,) = runs
    assert sorted(p.name for p in (run / "checkpoint").glob("*.safetensors")) == ["model.safetensors"]
    # 4 microbatches per step: one process accumulates all 4; each of 2 ranks takes 2 (the same rows and masks)
    got, want = records(run), records(tmp_path / "one")
    assert [r["step"] for r in got] == [r["step"] for r in want]
    for a, b in zip(got, want):
        for key in ("loss", "grad_norm", "val_loss"):
            if key in b:
                assert a[key] == pytest.approx(b[key], rel=1e-5, abs=1e-6), (key, a["step"])
        assert a.get("tokens") == b.get("tokens") and a.get("batch_size") == b.get("batch_size")
    summary = json.loads((run / "train_summary.json").read_text())
    assert summary["distributed"] == {"engine": "ddp", "world_size": 2}


def test_ddp_trains_with_token_dropping(tmp_path):
    """Token dropping under DDP: each training forward all-reduces the importance update (model/token_dropping.py)
    inside DDP's forward, with no buffer broadcast; the run finishes and rank 0's buffer holds the losses. (That
    the ranks' update equals one process's over the whole microbatch is test_token_dropping_ddp's.)"""
    run = [*TINY, "arch.num_layers=3", "arch.token_dropping.keep=0.5", "train.max_steps=2", "train.batch_ramp=0"]
    ddp = torchrun(*run, "impl.distributed=ddp", f"hydra.run.dir={tmp_path}")
    out, err = ddp.communicate(timeout=300)
    assert ddp.returncode == 0, err[-3000:]
    loss = load_file(tmp_path / "checkpoint" / "model.safetensors")["token_importance.loss"]
    assert (loss < loss.max()).sum() > 20


def stop_one_rank(proc: subprocess.Popen, run_dir: Path, at_step: int) -> None:
    """SIGTERM to one worker only (the newest child of torchrun): the ranks must agree to stop together. The
    workers are found first, so the signal leaves as soon as the step is logged."""
    deadline, children = time.time() + 240, []
    while len(children) < 2 and proc.poll() is None and time.time() < deadline:
        children = subprocess.run(["pgrep", "-P", str(proc.pid)], capture_output=True, text=True).stdout.split()
        time.sleep(0.05)
    assert len(children) == 2, f"torchrun's workers: {children}"
    while at_step not in logged_steps(run_dir) and proc.poll() is None and time.time() < deadline:
        time.sleep(0.01)
    os.kill(int(children[-1]), signal.SIGTERM)


def test_fsdp2_stops_on_one_ranks_signal_and_resumes_exactly(tmp_path):
    exact = [*TINY, "impl.distributed=fsdp2", "train.max_steps=24", "train.batch_ramp=0.5"]
    whole = torchrun(*exact, f"hydra.run.dir={tmp_path / 'whole'}")
    stopped = torchrun(*exact, f"hydra.run.dir={tmp_path / 'stopped'}")
    stop_one_rank(stopped, tmp_path / "stopped", at_step=3)
    _, err = stopped.communicate(timeout=240)
    assert stopped.returncode != 0 and err.count("stopped: stopped by") == 2, err[-3000:]  # both ranks stop
    (saved,) = list((tmp_path / "stopped" / "checkpoints").glob("step-*"))
    assert 3 <= int(saved.name.split("-")[1]) < 24
    assert (saved / "sharded").is_dir() and (saved / "rng-0.pt").is_file() and (saved / "rng-1.pt").is_file()
    _, err = whole.communicate(timeout=240)
    assert whole.returncode == 0, err[-3000:]

    resumed = torchrun(*exact, f"hydra.run.dir={tmp_path / 'stopped'}")
    out, err = resumed.communicate(timeout=240)
    assert resumed.returncode == 0, err[-3000:]
    assert "resuming from" in out
    want = load_file(tmp_path / "whole" / "checkpoint" / "model.safetensors")
    got = load_file(tmp_path / "stopped" / "checkpoint" / "model.safetensors")
    assert want.keys() == got.keys() and all(torch.equal(got[k], want[k]) for k in want)
    assert logged_steps(tmp_path / "stopped") == list(range(1, 25))


def test_what_the_engines_cannot_do_is_refused_before_any_work():
    config = config_for(*TINY, "train.max_steps=4")
    runtime = resolve(config.impl, config.arch)
    fsdp = Distributed("fsdp2", rank=0, world=2)
    check_distributed(config, runtime, fsdp)  # 16 = 4 x 2 x 2
    with pytest.raises(UserError, match="multiple of impl.microbatch_size x world size = 4 x 8"):
        check_distributed(config, runtime, Distributed("ddp", rank=0, world=8))
    with pytest.raises(UserError, match="must be a multiple of the world size 3"):
        check_distributed(config, runtime, Distributed("ddp", rank=0, world=3))
    with pytest.raises(UserError, match="auto cannot probe a sharded model"):
        check_distributed(config_for(*TINY, "train.max_steps=4", "impl.microbatch_size=auto"), runtime, fsdp)
    with pytest.raises(UserError, match="muon cannot run under impl.distributed=fsdp2"):  # when the config loads
        config_for(*TINY, "train.max_steps=4", "train.optim.name=muon", "impl.distributed=fsdp2")


def test_outside_torchrun_a_distributed_engine_is_one_clear_error(tmp_path, monkeypatch):
    for key in ("RANK", "WORLD_SIZE", "TORCHELASTIC_RUN_ID"):
        monkeypatch.delenv(key, raising=False)
    command = [sys.executable, str(REPO / "pretrain.py"), *TINY, "train.max_steps=4"]
    result = subprocess.run([*command, "impl.distributed=fsdp2", f"hydra.run.dir={tmp_path}"], cwd=REPO,
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines()[-1].startswith("error: impl.distributed=fsdp2 needs torchrun")
    # and a Hydra multirun under torchrun (as torchrun's environment says) stops before Hydra starts
    multirun = subprocess.run([*command[:2], "-m", *command[2:], f"hydra.sweep.dir={tmp_path}/sweep"], cwd=REPO,
                              env={**os.environ, "RANK": "0", "WORLD_SIZE": "2"}, capture_output=True, text=True,
                              timeout=120)
    assert multirun.returncode == 2 and not (tmp_path / "sweep").exists()
    assert multirun.stderr.strip().splitlines() == [
        "error: a Hydra multirun (-m) cannot run under torchrun; launch torchrun once per job (docs/distributed.md)"]


def test_other_ranks_get_no_hydra_files(monkeypatch):
    argv = ["pretrain.py", "-m", "a=1", "b=2"]
    monkeypatch.setenv("RANK", "0")
    assert quiet_hydra_on_other_ranks(argv) == argv
    monkeypatch.setenv("RANK", "1")
    quiet = quiet_hydra_on_other_ranks(argv)
    assert quiet[:2] == ["pretrain.py", "-m"] and quiet[-2:] == ["a=1", "b=2"]
    assert {"hydra.output_subdir=null", "hydra/job_logging=disabled", "hydra.run.dir=."} <= set(quiet)


def test_the_memory_plan_in_the_docs_is_what_the_script_prints():
    result = subprocess.run([sys.executable, "scripts/memory_plan.py", "--gpu-gib", "80", "--gpus", "8"],
                            cwd=REPO, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    rows = [line for line in result.stdout.splitlines() if line.startswith("| ")]
    assert len(rows) == 7 and rows[1].startswith("| crammed-bert | 120 M | ")
    docs = (REPO / "docs" / "distributed.md").read_text()
    assert all(row in docs for row in rows), "docs/distributed.md is out of date: rerun scripts/memory_plan.py"


def test_the_ddp_wrapper_is_gone_before_the_process_group(tmp_path, monkeypatch):
    """A DDP wrapper that outlives its process group ends the run in a hang, now and then: its reducer then holds
    gloo's last reference, whose destructor joins gloo's worker threads with the GIL held while a worker waits for
    the GIL to free the last collective's tensors (seen in CI; torchrun/close's docstring). So when pretraining
    leaves the group, no DistributedDataParallel may be alive, even in a reference cycle. One rank, in process."""
    import gc
    import socket

    import torch.distributed as dist
    from torch.nn.parallel import DistributedDataParallel

    from cramming import pretraining

    with socket.socket() as probe:  # a free port for this one-rank group's store
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    for key, value in {"RANK": "0", "WORLD_SIZE": "1", "LOCAL_RANK": "0", "MASTER_ADDR": "127.0.0.1",
                       "MASTER_PORT": str(port)}.items():
        monkeypatch.setenv(key, value)
    alive_at_destroy = []
    destroy = dist.destroy_process_group

    def watched(*args, **kwargs):
        alive_at_destroy.append(sum(isinstance(o, DistributedDataParallel) for o in gc.get_objects()))
        return destroy(*args, **kwargs)

    monkeypatch.setattr(dist, "destroy_process_group", watched)
    summary = pretraining.pretrain(config_for(*TINY, "train.max_steps=2", "impl.distributed=ddp"), tmp_path)
    assert summary["distributed"]["world_size"] == 1 and summary["steps"] == 2
    assert alive_at_destroy == [0] and not dist.is_initialized()
