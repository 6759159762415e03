"""Never losing a run: checkpoints are whole or ignored, a stopped run resumes bit for bit, and non-finite
losses are skipped, halt the run, or roll it back, as train.nonfinite says."""

import itertools
import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from dataclasses import asdict
from pathlib import Path

import pytest
import torch
from conftest import REPO
from hydra import compose, initialize_config_dir
from safetensors.torch import load_file

from cramming import pretraining
from cramming import run as run_module
from cramming.checkpoints.model_folder import is_complete
from cramming.checkpoints.step_folder import complete_checkpoints
from cramming.errors import RunStopped, UserError, exit_on_user_error
from cramming.train.checkpointing import Checkpointer, find_resume
from cramming.train.state import TrainState
from cramming.validation import load_config

TINY = ["arch=crammed-bert-tiny", "arch.num_layers=1", "arch.hidden_size=64", "arch.num_heads=2",
        "arch.ffn_size=128", "impl=cpu", "train=cpu-smoke", "train.validation_sequences=16", "data=sanity",
        "data.vocab_size=256", "data.seq_length=32", "data.max_chars=60000", "data.validation_fraction=0.1"]
# Steps depend on the step count only (a step-* schedule), so two runs take the same steps whatever the clock.
EXACT = TINY + ["train.schedule=step-triangle", "train.max_steps=20", "train.batch_size=64",
                "impl.microbatch_size=8", "train.batch_ramp=0.5", "train.checkpoint_every_minutes=null"]


def config_for(*overrides):
    with initialize_config_dir(config_dir=str(REPO / "conf"), version_base="1.3"):
        return load_config(compose(config_name="pretrain", overrides=list(overrides)))


def final_weights(run_dir: Path) -> dict:
    return load_file(run_dir / "checkpoint" / "model.safetensors")


def logged_steps(run_dir: Path) -> list[int]:
    path = run_dir / "metrics.jsonl"
    if not path.is_file():
        return []
    return [json.loads(line)["step"] for line in path.read_text().splitlines() if '"loss"' in line]


def launch(run_dir: Path) -> subprocess.Popen:
    args = [sys.executable, str(REPO / "pretrain.py"), *EXACT, f"hydra.run.dir={run_dir}"]
    return subprocess.Popen(args, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def test_sigterm_then_resume_is_bitwise_identical_to_an_uninterrupted_run(tmp_path):
    # Stop points: inside the batch ramp (its first 10 steps), and at its end; each signal lands while the trainer
    # is inside a step's 2-8 microbatches of gradient accumulation, and is honoured at the step's end. The runs
    # go side by side (each waits for its own stop point) to keep the suite short; the last stop leaves 10 steps
    # before the run ends, so a test process slow to see it on a loaded machine still signals a training run.
    stops = (2, 6, 10)
    whole = launch(tmp_path / "whole")
    runs = {stop: launch(tmp_path / f"stopped{stop}") for stop in stops}
    pending, deadline = set(stops), time.time() + 900  # generous: a loaded shared machine, four runs at once
    while pending and time.time() < deadline:
        for stop in list(pending):
            if stop in logged_steps(tmp_path / f"stopped{stop}") or runs[stop].poll() is not None:
                runs[stop].send_signal(signal.SIGTERM)
                pending.discard(stop)
        time.sleep(0.02)
    for stop, proc in runs.items():
        out, err = proc.communicate(timeout=900)
        assert proc.returncode == 75, err[-3000:]
        assert "stopped: stopped by SIGTERM" in err and "run the same command again to resume" in err
        saved = complete_checkpoints(tmp_path / f"stopped{stop}")
        assert len(saved) == 1 and stop <= int(saved[0].name.split("-")[1]) < 20
    _, err = whole.communicate(timeout=900)
    assert whole.returncode == 0, err[-3000:]
    want = final_weights(tmp_path / "whole")

    resumed = {stop: launch(tmp_path / f"stopped{stop}") for stop in stops}
    for stop, proc in resumed.items():
        out, err = proc.communicate(timeout=900)
        assert proc.returncode == 0, err[-3000:]
        assert "resuming from" in out
        run_dir = tmp_path / f"stopped{stop}"
        got = final_weights(run_dir)
        assert all(torch.equal(got[k], want[k]) for k in want), f"weights differ after stopping at {stop}"
        assert logged_steps(run_dir) == list(range(1, 21))  # one continuous log, no step twice
        summary = json.loads((run_dir / "train_summary.json").read_text())
        assert summary["steps"] == 20 and summary["resumed_from"].startswith(str(run_dir))


def test_sigkill_while_writing_leaves_the_previous_checkpoint(tmp_path):
    script = textwrap.dedent(f"""
        import time, torch
        from cramming.train.checkpointing import Checkpointer
        from cramming.train.state import TrainState
        model = torch.nn.Linear(4, 4)
        opt = torch.optim.AdamW(model.parameters())
        scaler = torch.amp.GradScaler("cpu", enabled=False)
        ckpt = Checkpointer({str(tmp_path)!r}, None, 2, {{"seed": 0}})
        ckpt.save(model, opt, scaler, TrainState(step=1))
        real_save = torch.save
        def slow_save(obj, path):
            real_save(obj, path)
            print("writing", flush=True)
            time.sleep(60)  # killed here: state.pt written, marker not yet
        torch.save = slow_save
        ckpt.save(model, opt, scaler, TrainState(step=2))
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], cwd=REPO, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "writing"
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    assert (tmp_path / "checkpoints" / "step-00000002.tmp" / "state.pt").is_file()
    found = complete_checkpoints(tmp_path)
    assert [p.name for p in found] == ["step-00000001"]
    # the next save cleans the leftover
    ckpt = Checkpointer(tmp_path, None, 2, {})
    model = torch.nn.Linear(4, 4)
    ckpt.save(model, torch.optim.AdamW(model.parameters()), torch.amp.GradScaler("cpu", enabled=False),
              TrainState(step=3))
    assert sorted(p.name for p in (tmp_path / "checkpoints").iterdir()) == ["step-00000001", "step-00000003"]


def test_a_checkpoint_never_holds_non_finite_weights(tmp_path):
    model = torch.nn.Linear(4, 4)
    with torch.no_grad():
        model.weight[0, 0] = float("nan")
    ckpt = Checkpointer(tmp_path, None, 2, {})
    assert ckpt.save(model, torch.optim.AdamW(model.parameters()), torch.amp.GradScaler("cpu", enabled=False),
                     TrainState(step=1)) is None
    assert complete_checkpoints(tmp_path) == []


def test_a_checkpoint_is_due_every_checkpoint_every_minutes(tmp_path, monkeypatch):
    """train.checkpoint_every_minutes is in minutes: with 2, a checkpoint is not due 119 s after the last save and
    is due at 120 s; a save starts the interval again; null never checkpoints on a timer."""
    now = [1000.0]
    monkeypatch.setattr(time, "perf_counter", lambda: now[0])
    ckpt = Checkpointer(tmp_path, 2, 1, {})
    now[0] += 119.0
    assert not ckpt.due()
    now[0] += 1.0
    assert ckpt.due()
    model = torch.nn.Linear(4, 4)
    ckpt.save(model, torch.optim.AdamW(model.parameters()), torch.amp.GradScaler("cpu", enabled=False),
              TrainState(step=1))
    assert not ckpt.due()
    now[0] += 119.0
    assert not ckpt.due()
    now[0] += 1.0
    assert ckpt.due()
    now[0] += 10**6
    assert not Checkpointer(tmp_path, None, 1, {}).due()


def test_keep_checkpoints_and_resume_choices(tmp_path):
    model = torch.nn.Linear(4, 4)
    opt = torch.optim.AdamW(model.parameters())
    config = config_for(*TINY)
    ckpt = Checkpointer(tmp_path / "run", None, 2, json.loads(json.dumps(asdict(config))))
    for step in (1, 2, 3):
        ckpt.save(model, opt, torch.amp.GradScaler("cpu", enabled=False), TrainState(step=step))
    assert [p.name for p in complete_checkpoints(tmp_path / "run")] == ["step-00000002", "step-00000003"]
    assert find_resume("never", tmp_path / "run", config) is None
    assert find_resume("auto", tmp_path / "run", config).name == "step-00000003"
    # a new launch of the same name (Hydra: a new folder) finds the unfinished sibling
    (tmp_path / "relaunch").mkdir()
    assert find_resume("auto", tmp_path / "relaunch", config).name == "step-00000003"
    # ... unless its config differs
    assert find_resume("auto", tmp_path / "relaunch", config_for(*TINY, "train.lr=0.5")) is None
    # ... or its name (a custom hydra.run.dir puts runs of any name side by side)
    assert find_resume("auto", tmp_path / "relaunch", config_for(*TINY, "name=another")) is None
    assert find_resume("auto", tmp_path / "run", config_for(*TINY, "name=another")) is None
    path = tmp_path / "run" / "checkpoints" / "step-00000002"
    assert find_resume(str(path), tmp_path / "relaunch", config) == path
    with pytest.raises(UserError, match=r"train.resume=\S+nowhere: no such folder"):
        find_resume(str(tmp_path / "nowhere"), tmp_path / "relaunch", config)
    with pytest.raises(UserError, match="not a complete checkpoint"):
        find_resume(str(tmp_path / "relaunch"), tmp_path / "relaunch", config)


def test_auto_resume_takes_the_most_recent_unfinished_sibling(tmp_path):
    """train.resume=auto from a new launch folder: of several unfinished sibling runs of the same name and config,
    the one touched last is resumed (its checkpoint is the newest), never an older, stale one."""
    model = torch.nn.Linear(4, 4)
    opt = torch.optim.AdamW(model.parameters())
    config = config_for(*TINY)
    saved_config = json.loads(json.dumps(asdict(config)))
    for run, steps in (("older", (1, 2)), ("newer", (1, 2, 3, 4, 5))):
        ckpt = Checkpointer(tmp_path / run, None, 2, saved_config)
        for step in steps:
            ckpt.save(model, opt, torch.amp.GradScaler("cpu", enabled=False), TrainState(step=step))
    now = time.time()
    os.utime(tmp_path / "older", (now - 3600, now - 3600))
    os.utime(tmp_path / "newer", (now - 60, now - 60))
    (tmp_path / "relaunch").mkdir()
    newest = (tmp_path / "newer" / "checkpoints" / "step-00000005").resolve()
    assert find_resume("auto", tmp_path / "relaunch", config) == newest
    # the other way round in time: the run touched last wins, whatever its step count
    os.utime(tmp_path / "older", (now, now))
    older = (tmp_path / "older" / "checkpoints" / "step-00000002").resolve()
    assert find_resume("auto", tmp_path / "relaunch", config) == older


@pytest.fixture
def poison(monkeypatch):
    """Make the training loss NaN on the given forward calls (counted over training microbatches only)."""
    calls = set()
    original = run_module.build_model

    def build(*args, **kwargs):
        model = original(*args, **kwargs)
        forward, count = model.forward, itertools.count(1)

        def poisoned(*a, **k):
            out = forward(*a, **k)
            if model.training and next(count) in calls:
                out.loss = out.loss * float("nan")
            return out

        model.forward = poisoned
        return model

    monkeypatch.setattr(run_module, "build_model", build)
    return calls


def records(run_dir: Path) -> list[dict]:
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


NAN_RUN = TINY + ["train.max_steps=6", "train.batch_size=16", "impl.microbatch_size=16", "train.batch_ramp=0",
                  "train.schedule=step-constant", "train.warmup=0"]


def test_nonfinite_skip(poison, tmp_path):
    poison.add(3)
    summary = pretraining.pretrain(config_for(*NAN_RUN, "train.nonfinite=skip"), tmp_path)
    assert summary["steps"] == 6 and summary["skipped_steps"] == 1
    assert [r["step"] for r in records(tmp_path) if r.get("event") == "skip"] == [2]
    poison.update(range(1, 100))
    with pytest.raises(RunStopped, match=r"3 steps in a row skipped") as stop:
        pretraining.pretrain(config_for(*NAN_RUN, "train.nonfinite=skip", "train.skip.max_in_row=3",
                                        "train.resume=never"), tmp_path / "again")
    assert stop.value.exit_code == 3


def test_nonfinite_halt(poison, tmp_path):
    poison.add(4)
    with pytest.raises(RunStopped, match=r"non-finite loss before step 4 \(train.nonfinite=halt\)") as stop:
        pretraining.pretrain(config_for(*NAN_RUN, "train.nonfinite=halt"), tmp_path)
    assert stop.value.exit_code == 3
    assert not (tmp_path / "checkpoint").exists()


def test_nonfinite_rollback(poison, tmp_path):
    poison.add(3)
    summary = pretraining.pretrain(config_for(*NAN_RUN, "train.nonfinite=rollback", "train.lr=0.001"), tmp_path)
    assert summary["rollbacks"] == 1 and summary["steps"] == 6
    log = records(tmp_path)
    event = next(r for r in log if r.get("event") == "rollback")
    assert event["lr_scale"] == 0.5 and event["checkpoint"].endswith("step-00000000")
    lrs = [r["lr"] for r in log if "lr" in r]
    assert lrs[:2] == [pytest.approx(1e-3)] * 2 and all(lr == pytest.approx(5e-4) for lr in lrs[2:])


def test_each_rollback_lowers_the_learning_rate_again(poison, tmp_path):
    """train.nonfinite=rollback: every rollback multiplies the learning rate by train.rollback.lr_factor once more
    (0.5, then 0.25 of the peak), so a run that keeps diverging keeps backing off instead of retrying one rate."""
    poison.update({3, 5})
    summary = pretraining.pretrain(config_for(*NAN_RUN, "train.nonfinite=rollback", "train.lr=0.001"), tmp_path)
    assert summary["rollbacks"] == 2
    log = records(tmp_path)
    assert [r["lr_scale"] for r in log if r.get("event") == "rollback"] == [0.5, 0.25]
    assert [r["lr"] for r in log if "lr" in r][-1] == pytest.approx(2.5e-4)


@pytest.fixture
def sigterm_at(monkeypatch):
    """Send this process SIGTERM during the given training forward call, as a scheduler would."""
    at = []
    original = run_module.build_model

    def build(*args, **kwargs):
        model = original(*args, **kwargs)
        forward, count = model.forward, itertools.count(1)

        def signalled(*a, **k):
            if model.training and next(count) in at:
                os.kill(os.getpid(), signal.SIGTERM)
            return forward(*a, **k)

        model.forward = signalled
        return model

    monkeypatch.setattr(run_module, "build_model", build)
    return at


def test_a_stop_signal_checkpoints_and_exits_75(sigterm_at, tmp_path, capsys):
    """The signal lands inside step 3: the step finishes, step 3 is checkpointed, the entry point exits 75 with one
    `stopped:` line naming the checkpoint."""
    sigterm_at.append(3)
    with pytest.raises(SystemExit) as exit_:
        exit_on_user_error(pretraining.pretrain)(config_for(*NAN_RUN, "train.checkpoint_every_minutes=null"), tmp_path)
    assert exit_.value.code == 75
    saved = complete_checkpoints(tmp_path)
    assert [p.name for p in saved] == ["step-00000003"]
    assert torch.load(saved[0] / "state.pt", weights_only=False)["state"]["step"] == 3
    line = capsys.readouterr().err.strip().splitlines()[-1]
    assert line == (f"stopped: stopped by SIGTERM at step 3; checkpoint {saved[0]}; run the same command again to "
                    "resume (train.resume=auto)")
    assert not (tmp_path / "checkpoint").exists()  # no final checkpoint: the run is not finished


def test_a_stop_signal_after_the_last_step_lets_the_run_finish(tmp_path, monkeypatch, capsys):
    """SIGTERM during the final validation (the budget spent): the run finishes, writes its whole checkpoint and
    train_summary.json and returns (exit 0), saying so; the signal's default handler never kills the last save."""
    measured, original = itertools.count(1), pretraining.heldout_metrics
    handler = signal.getsignal(signal.SIGTERM)

    def measure(*args, **kwargs):
        if next(measured) == 2:  # the first is the loss before step 1; the second, the final validation
            os.kill(os.getpid(), signal.SIGTERM)
        return original(*args, **kwargs)

    monkeypatch.setattr(pretraining, "heldout_metrics", measure)
    summary = pretraining.pretrain(config_for(*NAN_RUN, "train.checkpoint_every_minutes=null"), tmp_path)
    assert summary["stopped_by"] == "SIGTERM" and summary["steps"] == 6
    assert is_complete(tmp_path / "checkpoint") and (tmp_path / "train_summary.json").is_file()
    out = capsys.readouterr().out
    assert "SIGTERM received: the budget is spent: finishing the run's final validation and checkpoint first" in out
    assert out.strip().endswith("SIGTERM came after the last step: the run finished and its checkpoint is whole")
    assert signal.getsignal(signal.SIGTERM) == handler


def test_a_torn_last_metrics_line_does_not_block_resuming(tmp_path):
    """A run killed mid-write leaves half a line: resuming drops it and keeps the whole lines up to the checkpoint."""
    run = tmp_path / "run"
    (run / "checkpoints" / "step-00000002").mkdir(parents=True)
    lines = [json.dumps({"step": s, "loss": 5.0 - s}) for s in (1, 2, 3)]
    (run / "metrics.jsonl").write_text("\n".join(lines) + '\n{"step": 4, "lo')
    pretraining.carry_metrics(run / "checkpoints" / "step-00000002", run, 2)
    assert (run / "metrics.jsonl").read_text() == "\n".join(lines[:2]) + "\n"
    # from another launch's folder, the same
    pretraining.carry_metrics(run / "checkpoints" / "step-00000002", tmp_path / "relaunch", 2)
    assert (tmp_path / "relaunch" / "metrics.jsonl").read_text() == "\n".join(lines[:2]) + "\n"
    # a broken line in the middle is not a torn write: one line naming the file and the line
    (run / "metrics.jsonl").write_text(lines[0] + "\n{oops\n" + lines[1] + "\n")
    with pytest.raises(UserError, match=r"metrics.jsonl: line 2 of 3 is not a metrics record"):
        pretraining.carry_metrics(run / "checkpoints" / "step-00000002", run, 2)


def whole_and_resumed(run: list[str], sigterm_at, tmp_path, stop_at: int = 2) -> tuple[dict, dict]:
    """The summaries of `run` uninterrupted (tmp_path/whole) and stopped by SIGTERM at step stop_at then resumed
    (tmp_path/stopped)."""
    whole = pretraining.pretrain(config_for(*run), tmp_path / "whole")
    sigterm_at.append(stop_at)
    with pytest.raises(RunStopped):
        pretraining.pretrain(config_for(*run), tmp_path / "stopped")
    sigterm_at.clear()
    resumed = pretraining.pretrain(config_for(*run), tmp_path / "stopped")
    assert resumed["resumed_from"].endswith(f"step-{stop_at:08d}")
    return whole, resumed


@pytest.mark.parametrize("averaging", [["train.averaging=ema", "train.ema.decay=0.7"],
                                       ["train.averaging=lawa", "train.lawa.k=5", "train.lawa.every_fraction=0.3"]])
def test_resuming_gives_the_same_averaged_weights_bitwise(sigterm_at, tmp_path, averaging):
    """Stopped at step 2 of 6 and resumed: the averaging state comes back exactly, so the averaged checkpoint is
    the uninterrupted run's, bit for bit (LAWA's snapshots are steps 2, 4 and 6: one before the stop, and
    step 3 takes none only if the resumed run knows step 2 took one)."""
    kind = averaging[0].split("=")[1]
    whole, resumed = whole_and_resumed([*NAN_RUN, "train.checkpoint_every_minutes=null", *averaging], sigterm_at,
                                       tmp_path)
    for folder in (f"final-{kind}", "checkpoint"):
        want, got = (load_file(tmp_path / run_dir / folder / "model.safetensors") for run_dir in ("whole", "stopped"))
        assert all(torch.equal(got[k], want[k]) for k in want), f"{folder} differs after resuming"
    assert resumed["averaging"] == {**whole["averaging"], "checkpoint": resumed["averaging"]["checkpoint"]}
    if kind == "lawa":
        assert whole["averaging"]["snapshot_steps"] == [2, 4, 6]
