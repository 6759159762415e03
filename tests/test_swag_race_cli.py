"""`python eval.py eval=swag` and `eval=race` end to end on tiny files in the original layouts (written here), with
a two-step MLM checkpoint and once with a causal one; bad data: one `error:` line, exit 2, no results, no CSV row."""

import json
import os
from unittest import mock

import conftest
import pytest
from conftest import last_line_path, one_line_error
from test_swag_race import race_article, swag_row, write_race, write_swag

pytestmark = pytest.mark.slow
FAST = ["impl=cpu", "eval.recipe.epochs=1", "eval.recipe.batch_size=4", "eval.recipe.max_length=64"]


def run_eval(preset, checkpoint, data, tmp_path, *overrides):
    """eval.py on `data`, with the user's SWAG_DIR and RACE_DIR out of sight."""
    with mock.patch.dict(os.environ):
        for name in ("SWAG_DIR", "RACE_DIR"):
            os.environ.pop(name, None)
        return conftest.run_eval(f"eval={preset}", f"checkpoint={checkpoint}", f"eval.data_dir={data}", *FAST,
                                 *overrides, tmp_path=tmp_path, in_process=True)


def finished(result, key: str, n_dev: int):
    """results.json's pretrained model, checked: the key's accuracy is a count of right picks over n_dev."""
    assert result.returncode == 0, result.stderr[-3000:]
    model = json.loads(last_line_path(result, "results: ").read_text())["models"]["pretrained"]
    accuracy = model["scores"][key]
    assert 0 <= accuracy <= 100 and round(accuracy * n_dev / 100, 6).is_integer()
    return model


def test_swag_end_to_end(smoke_checkpoint, tmp_path):
    data = write_swag(tmp_path / "swag", [swag_row(i, i % 4) for i in range(12)], [swag_row(i, 3) for i in range(8)])
    result = run_eval("swag", smoke_checkpoint, data, tmp_path)
    model = finished(result, "swag", 8)
    run = model["tasks"]["swag"]["runs"][0]
    assert run["final"] == {"dev": {"accuracy": model["scores"]["swag"]}}
    assert run["curve"][0]["train_examples"] == 12 and model["tasks"]["swag"]["recipe"]["lr"] == 2e-5  # the preset
    assert "| model | SWAG | avg |" in result.stdout  # the CSV row: test_eval_kinds_cli, as for every benchmark


def test_race_end_to_end_per_level(smoke_checkpoint, tmp_path):
    """Unequal levels (3 high articles, 2 middle, 4 questions each): the overall accuracy is the count-weighted
    mean of the two levels'."""
    data = write_race(tmp_path / "race")
    (data / "dev" / "high" / "3.txt").write_text(json.dumps(race_article(3, answers="DCBA")))
    result = run_eval("race", smoke_checkpoint, data, tmp_path, "eval.recipe.max_length=512")
    assert "eval.recipe.max_length=512 is cut to 128" in result.stdout  # scaled-sinusoidal: a 128-row table
    model = finished(result, "race", 20)
    final = model["tasks"]["race"]["runs"][0]["final"]
    assert set(final) == {"dev", "race-high", "race-middle"}
    high, middle = final["race-high"]["accuracy"], final["race-middle"]["accuracy"]
    assert final["dev"]["accuracy"] == pytest.approx((12 * high + 8 * middle) / 20)
    assert model["scores"] == {"race": final["dev"]["accuracy"], "race-high": high, "race-middle": middle}
    assert "| model | RACE | RACE-h | RACE-m | avg |" in result.stdout


def test_a_causal_checkpoint_answers_multiple_choice(causal_checkpoint, tmp_path):
    assert json.loads((causal_checkpoint / "config.json").read_text())["objective"] == "clm"
    data = write_race(tmp_path / "race", articles=1)
    result = run_eval("race", causal_checkpoint, data, tmp_path, "eval.tasks=[race-middle]",
                      "eval.recipe.max_length=2048")
    finished(result, "race-middle", 4)
    assert "is cut to" not in result.stdout  # rotary positions: no table, so no limit (arch.max_seq_length is 1024)


def test_bad_data_is_one_line_and_exit_2(smoke_checkpoint, tmp_path):
    bad = swag_row(1, 1, endings=["a", "b", "c", ""])
    data = write_swag(tmp_path / "swag", [swag_row(0, 0), bad])
    one_line_error(run_eval("swag", smoke_checkpoint, data, tmp_path), "train.csv line 3",
                   "ending3 empty")
    data = write_race(tmp_path / "race")
    (data / "train" / "middle" / "2.txt").write_text('{"article": "a",\n "questions": [}')
    one_line_error(run_eval("race", smoke_checkpoint, data, tmp_path),
                   "middle/2.txt line 2: not valid JSON")
    offline = run_eval("swag", smoke_checkpoint, "null", tmp_path)
    one_line_error(offline, "swag: the hub dataset 'allenai/swag' is unreachable", "eval.data_dir=")
    assert not (tmp_path / "eval" / "results.json").exists() and not (tmp_path / "results.csv").exists()
