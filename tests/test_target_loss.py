"""train.target_loss: the first periodic validation at or below the target ends the run cleanly, and the summary
reports the budget clock at that validation; off (null) and out of reach, the run goes on to its budget."""

import json

import pytest
from conftest import one_line_error, run_pretrain
from test_trainer import Recorder, run

from cramming.config import DataConfig, TrainConfig
from cramming.data.prepare import prepare_data
from cramming.train.heldout import PeriodicHeldout, target_summary
from cramming.train.trainer import Budget


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """test_trainer's tiny sanity corpus."""
    return prepare_data(DataConfig(source="sanity", vocab_size=256, seq_length=32, max_chars=200_000,
                                   validation_fraction=0.05, cache_dir=str(tmp_path_factory.mktemp("cache"))))


class Clocks(Recorder):
    """Also writes down the agreed budget clock at each between-steps moment (after the validation's)."""

    def __init__(self):
        super().__init__()
        self.clocks = {}

    def on_between(self, trainer, state):
        super().on_between(trainer, state)
        self.clocks[state.step] = state.elapsed


def race(data, losses, target, max_steps=10):
    """A run validating after every step (from step 2) with a fake measurement returning `losses` in turn."""
    measured = iter(losses)
    validation = PeriodicHeldout(1e-9, lambda: {"val_loss": next(measured)}, target)
    recorder = Clocks()
    cfg = TrainConfig(batch_size=8, batch_ramp=0.0, max_steps=max_steps)
    result, records = run(data, Budget(seconds=3600, max_steps=max_steps), cfg, validation=validation,
                          hooks=[recorder])
    return result, records, validation, recorder


def test_the_first_validation_at_or_below_the_target_ends_the_run(data):
    result, records, validation, recorder = race(data, [3.0, 2.5, 2.0, 1.5, 1.0], target=2.0)
    events = [r for r in records if r.get("event") == "validation"]
    assert [e["val_loss"] for e in events] == [3.0, 2.5, 2.0]  # validated at steps 2, 3, 4; 2.0 <= 2.0 ends it
    assert result["steps"] == 4 and events[-1]["step"] == 4
    assert recorder.moments[-5:] == ["step 4", "pause", "resume", "between", "end"]  # no step after it
    summary = target_summary(validation)
    assert summary == {"target_loss": 2.0, "reached_target": True, "seconds_to_target": recorder.clocks[4]}
    assert summary["seconds_to_target"] == pytest.approx(events[-1]["elapsed_s"], abs=1e-6)


def test_out_of_reach_or_off_the_run_goes_on_to_its_end(data):
    result, _, validation, _ = race(data, [3.0] * 10, target=2.0, max_steps=4)
    assert result["steps"] == 4  # train.max_steps ends it, as without a target
    assert target_summary(validation) == {"target_loss": 2.0, "reached_target": False, "seconds_to_target": None}
    result, _, validation, _ = race(data, [1.0] * 10, target=None, max_steps=4)
    assert result["steps"] == 4 and validation.reached_at is None
    assert target_summary(None) == {"target_loss": None, "reached_target": False, "seconds_to_target": None}


@pytest.mark.slow
def test_a_tiny_pretrain_with_a_loose_target_ends_early(tmp_path):
    """The tiny model starts near 7.34 on the sanity text and passes 7.2 within about six steps, long before the
    0.03 h budget; the run ends there, the final validation still runs, and the summary says when."""
    result = run_pretrain("arch=crammed-bert-tiny", "impl=cpu", "train=cpu-smoke", "data=sanity", "name=race",
                          "budget=0.03", "train.validate_every_minutes=0.01", "train.target_loss=7.2",
                          run_dir=tmp_path, in_process=True)
    assert result.returncode == 0, result.stderr[-3000:]
    assert "target reached: validation loss" in result.stdout
    summary = json.loads((tmp_path / "checkpoint" / "train_summary.json").read_text())
    assert summary["reached_target"] is True and summary["target_loss"] == 7.2
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    events = [r for r in records if r.get("event") == "validation"]
    assert events[-1]["val_loss"] <= 7.2 and all(e["val_loss"] > 7.2 for e in events[:-1])
    assert summary["seconds_to_target"] == pytest.approx(events[-1]["elapsed_s"], abs=1e-5)
    assert summary["seconds_to_target"] < 0.03 * 3600 / 2 and summary["steps"] == events[-1]["step"]
    assert "val_loss" in records[-1] and records[-1]["step"] == summary["steps"]  # the final validation still ran


@pytest.mark.slow
def test_a_target_without_periodic_validation_is_refused_in_one_line(tmp_path):
    result = run_pretrain("arch=crammed-bert-tiny", "impl=cpu", "train=cpu-smoke", "data=sanity",
                          "train.target_loss=3.0", "train.max_steps=1", run_dir=tmp_path, in_process=True)
    one_line_error(result, "train.target_loss=3.0", "train.validate_every_minutes")
