"""Weights & Biases logging (`train.wandb`, the `wandb` extra): offline, a tiny pretrain leaves a W&B run under
`<run>/wandb` holding the run config and every scalar of metrics.jsonl; online is the same wiring with another
mode (checked against a stand-in, no network); the checks of the config; the run's name in a sweep."""

import importlib.machinery
import importlib.util
import json
import subprocess
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from test_options import config_for

from cramming.errors import UserError
from cramming.pretraining import pretrain
from cramming.train.metrics import MetricsLog, wandb_names


def wandb_records(path: Path) -> list[dict]:
    """The records of a run-*.wandb file, read by wandb's own reader (`wandb leet inspect --json`, wandb >= 0.29):
    one JSON object a record, `type` naming it. The file's format is W&B's private one; the Python reader that
    used to read it (wandb.sdk.internal.datastore) is gone."""
    result = subprocess.run([sys.executable, "-m", "wandb", "leet", "inspect", "--json", str(path)],
                            check=False, capture_output=True, text=True, timeout=120)
    if result.returncode != 0 and "No such command" in result.stderr:
        pytest.skip("the installed wandb has no `wandb leet inspect` to read its run file: pip install 'wandb>=0.29'")
    assert result.returncode == 0, result.stderr[-2000:]
    return [json.loads(line) for line in result.stdout.splitlines()]


def test_offline_run_logs_the_config_and_every_scalar(tmp_path, capsys):
    if importlib.util.find_spec("wandb") is None:
        pytest.skip("wandb is not installed: pip install -e '.[wandb]'")
    import wandb

    config = config_for("train.wandb=offline", "train.wandb_project=cramming-test", "name=wb-smoke")
    try:
        pretrain(config, tmp_path)
        assert wandb.run is None  # finished on close
    finally:
        wandb.teardown()  # stop wandb's service process now rather than at the session's exit
    runs = list((tmp_path / "wandb").glob("offline-run-*/run-*.wandb"))
    assert len(runs) == 1
    assert f"wandb: offline run wb-smoke ({runs[0].parent}; upload with: wandb sync" in capsys.readouterr().out
    records = wandb_records(runs[0])
    run = next(r["run"] for r in records if r["type"] == "run")
    assert (run["display_name"], run["project"]) == ("wb-smoke", "cramming-test")
    logged_config = run["config"]["update"]
    assert logged_config["train"]["wandb"] == "offline" and logged_config["arch"]["hidden_size"] == 64
    history = [r["history"]["item"] for r in records if r["type"] == "history"]
    expected = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert len(history) == len(expected) == 4  # 3 steps and the final validation
    for logged, line in zip(history, expected):
        assert {k: v for k, v in logged.items() if not k.startswith("_")} == pytest.approx(line)


class FakeWandb:
    """Stands in for the wandb package (installed or not): records what MetricsLog asks of it."""

    __spec__ = importlib.machinery.ModuleSpec("wandb", None)  # what the config's check finds

    def __init__(self, fail: Exception | None = None):
        self.fail, self.calls = fail, []

    def Settings(self, **kwargs):
        return kwargs

    def init(self, **kwargs):
        if self.fail:
            raise self.fail
        self.calls.append(("init", kwargs))
        outer = self

        class Run:
            dir = str(Path(kwargs["dir"]) / "wandb" / "run-1" / "files")
            url = "https://wandb.example/run-1"

            def define_metric(self, *args, **kw):
                outer.calls.append(("define_metric", args, kw))

            def log(self, data):
                outer.calls.append(("log", data))

            def finish(self):
                outer.calls.append(("finish",))

        return Run()


def test_online_mode_is_the_same_wiring(tmp_path, monkeypatch, capsys):
    fake = FakeWandb()
    monkeypatch.setitem(sys.modules, "wandb", fake)
    config = config_for("train.wandb=online", "name=wb-online")
    log = MetricsLog.for_run(tmp_path, config)
    log.log({"step": 1, "loss": 2.5, "lr": 1e-3})
    log.log({"step": 1, "event": "skip", "reason": "non-finite loss", "skipped": 1})
    log.close()
    (_, init), *rest = fake.calls
    assert init["mode"] == "online" and init["project"] == "cramming" and init["dir"] == str(tmp_path)
    assert init["name"] == "wb-online" and init["group"] is None and init["config"]["train"]["wandb"] == "online"
    assert init["settings"] == {"silent": True, "console": "off"}
    assert ("log", {"step": 1, "loss": 2.5, "lr": 1e-3}) in rest and ("log", {"step": 1, "skipped": 1}) in rest
    assert rest[-1] == ("finish",)
    assert "wandb: online run wb-online (https://wandb.example/run-1)" in capsys.readouterr().out
    monkeypatch.setitem(sys.modules, "wandb", FakeWandb(fail=RuntimeError("api_key not configured (no-tty)")))
    with pytest.raises(UserError, match=r"train.wandb=online: W&B did not start \(api_key not configured"):
        MetricsLog.for_run(tmp_path, config)


def test_the_config_is_checked(monkeypatch):
    with pytest.raises(UserError, match=r"train.wandb='maybe' is not a valid option; choose one of: off, offline"):
        config_for("train.wandb=maybe")
    real = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == "wandb" else real(name, *a))
    with pytest.raises(UserError, match=r"train.wandb='offline' is invalid: needs the wandb package: pip install "
                                        r"'cramming\[wandb\]'"):
        config_for("train.wandb=offline")
    assert config_for().train.wandb == "off"  # off needs nothing


def test_sweep_jobs_are_named_by_their_folder(monkeypatch):
    from hydra.core.hydra_config import HydraConfig
    from hydra.types import RunMode

    assert wandb_names("lr", Path("outputs/lr/2026-01-01_00-00-00")) == ("lr", None)
    sweep = SimpleNamespace(mode=RunMode.MULTIRUN, sweep=SimpleNamespace(dir="multirun/lr/2026-01-01_00-00-00"))
    monkeypatch.setattr(HydraConfig, "initialized", staticmethod(lambda: True))
    monkeypatch.setattr(HydraConfig, "get", staticmethod(lambda: sweep))
    assert wandb_names("lr", Path("multirun/lr/2026-01-01_00-00-00/1_train.lr=0.002")) == (
        "lr/1_train.lr=0.002", "lr/2026-01-01_00-00-00")
