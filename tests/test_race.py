"""python -m cramming.race: the time verdict (a one-sided Mann-Whitney U test with missed runs censored above every
reached one), modded-nanogpt's loss verdict (ttest_1samp, alternative="less"), reach counts, the bad-input contract,
the documented command, and one tiny real race."""

import json
import math
import re
import shlex
import subprocess
import sys
from itertools import combinations

import pytest
from conftest import REPO, one_line_error
from scipy import stats

from cramming import race

BUDGET = 108.0  # budget=0.03 hours: where a run that never reached the target stopped


def exact_u(a, b):
    """scipy's one-sided U test over every split of the runs, misses as the budget itself (>= every reached run)."""
    censored = ([BUDGET if t is None else t for t in times] for times in (a, b))
    return stats.mannwhitneyu(*censored, alternative="greater", method=stats.PermutationMethod(n_resamples=10**5))


def test_five_of_five_reached_beats_two_of_five_whose_misses_count():
    """B reaches the target in 5 of 5 runs, each faster than A's 2 reached runs; A's 3 misses count as times >= the
    budget, so B is faster than A in all 25 pairs: p = 1/C(10, 5) = 1/252. Dropping A's misses, as the old Welch
    test did, leaves 2 runs against 5, whose best p is 1/C(7, 2) = 1/21: not faster."""
    a, b = [40.0, 52.0, None, None, None], [20.0, 22.5, 25.0, 21.0, 30.0]
    result = race.compare(a, b)
    assert (result["a"]["reached"], result["a"]["runs"], result["b"]["reached"], result["b"]["runs"]) == (2, 5, 5, 5)
    test = result["time_test"]
    assert test["U"] == 25 and test["p_value"] == pytest.approx(1 / 252) and test["p_method"] == "exact permutation"
    assert test["p_value"] == pytest.approx(exact_u(a, b).pvalue) and test["U"] == exact_u(a, b).statistic
    assert result["verdict"] == "B faster (p < 0.01)"
    dropped = stats.mannwhitneyu(a[:2], b, alternative="greater", method="exact")
    assert dropped.pvalue == pytest.approx(1 / 21) and dropped.pvalue > race.ALPHA


@pytest.mark.parametrize("fast", list(combinations([5.0, 15.0, 25.0, 35.0, 45.0, 55.0, 0.5], 2)))
def test_two_of_five_is_never_faster_than_five_of_five(fast):
    """B's 2 reached runs anywhere among A's 5 (even both faster than all of A's): its 3 misses lose to all of A's
    runs, so U <= 10 of 25 pairs and p >= 0.5."""
    a, b = [10.0, 20.0, 30.0, 40.0, 50.0], [*fast, None, None, None]
    result = race.compare(a, b)
    assert result["b"]["reached"] == 2 and result["a"]["reached"] == 5
    assert result["time_test"]["U"] <= 10 and result["time_test"]["p_value"] > 0.5
    assert result["time_test"]["p_value"] == pytest.approx(exact_u(a, b).pvalue)
    assert result["verdict"].startswith("B not shown faster (p = ")


def test_cases_done_by_hand():
    """A = [3, miss], B = [1, 2]: A slower in all 4 pairs, and 1 of the C(4, 2) = 6 splits is that extreme: p = 1/6.
    A = [miss, miss], B = [1, miss]: U = 2 + 2 halves = 3; the splits put the 1 in A (U = 1) or in B (U = 3), each
    half the time: p = 1/2 (the tied misses are ranked as ties, not dropped)."""
    result = race.compare([3.0, None], [1.0, 2.0])
    assert result["time_test"]["U"] == 4 and result["time_test"]["p_value"] == pytest.approx(1 / 6)
    assert result["verdict"] == ("B not shown faster (p = 0.167); with 2 and 2 runs this test cannot go below "
                                 "p = 0.167: run --seeds 5 or more")
    tied = race.compare([None, None], [1.0, None])
    assert tied["time_test"]["U"] == 3 and tied["time_test"]["p_value"] == pytest.approx(0.5)
    nothing = race.compare([None, None], [None, None])
    assert nothing["time_test"] is None and nothing["verdict"] == "not tested: no run of either config reached the target"
    assert [race.smallest_p(n, n) for n in (3, 4, 5)] == pytest.approx([1 / 20, 1 / 70, 1 / 252])
    assert race.seeds_needed(0.01) == 5 and race.seeds_needed(0.05) == 4


def test_reach_counts_and_the_mean_time_of_the_reached_runs():
    a, b = [10.0, 11.5, 12.0, 13.2, 10.8], [8.0, 9.1, 8.7, None, 8.4]
    result = race.compare(a, b)
    for name, times in (("a", a), ("b", b[:3] + b[4:])):
        mean = sum(times) / len(times)
        low, high = stats.t.interval(0.95, len(times) - 1, loc=mean, scale=stats.sem(times))
        assert result[name]["mean_seconds"] == pytest.approx(mean) and result[name]["ci95"] == pytest.approx([low, high])
    assert (result["a"]["reached"], result["b"]["reached"], result["b"]["runs"]) == (5, 4, 5)
    few = race.compare([10.0, None, None], [5.0, 5.1, 4.9])
    assert few["a"]["ci95"] is None and few["a"]["mean_seconds"] == 10.0 and few["a"]["reached"] == 1


@pytest.mark.filterwarnings("ignore:Precision loss occurred:RuntimeWarning")  # the last case: losses all equal
def test_the_loss_verdict_is_ttest_1samp_less():
    """modded-nanogpt's rule per recipe, on fixed losses; and by hand: [1, 3] against 4 is t = (2 - 4) / 1 = -2 with
    1 degree of freedom, p = P(T_1 < -2) = 1/2 - arctan(2)/pi."""
    under, over = [7.10, 7.15, 7.12, 7.18, 7.11], [7.19, 7.25, 7.30, 7.10, 7.22]
    for losses, verdict in ((under, "mean final loss <= 7.2 (p < 0.01)"), (over, "mean final loss not shown <= 7.2")):
        result = race.loss_test(losses, 7.2)
        scipys = stats.ttest_1samp(losses, 7.2, alternative="less")
        assert result["t"] == pytest.approx(scipys.statistic) and result["p_value"] == pytest.approx(scipys.pvalue)
        assert result["verdict"].startswith(verdict) and result["mean_val_loss"] == pytest.approx(sum(losses) / 5)
    assert race.loss_test(under, 7.2)["p_value"] < 0.01 < race.loss_test(over, 7.2)["p_value"]
    hand = race.loss_test([1.0, 3.0], 4.0)
    assert hand["t"] == pytest.approx(-2) and hand["p_value"] == pytest.approx(0.5 - math.atan(2) / math.pi)
    assert hand["verdict"] == "mean final loss not shown <= 4 (p = 0.148)"
    assert race.loss_test([7.2, 7.2], 7.2)["verdict"].startswith("mean final loss not shown")  # nan p: no claim


def fake_runs(monkeypatch, times, losses):
    """run_one without pretraining: A's then B's summaries, in the order the race asks for them."""
    queue = [{"target_loss": 7.2, "seconds_to_target": t, "val_loss": v}
             for name in ("a", "b") for t, v in zip(times[name], losses[name], strict=True)]
    monkeypatch.setattr(race, "run_one", lambda overrides, run_dir: queue.pop(0))


def test_the_race_reports_reach_counts_both_verdicts_and_an_absolute_path(monkeypatch, tmp_path, capsys):
    times = {"a": [40.0, 52.0, None, None, None], "b": [20.0, 22.5, 25.0, 21.0, 30.0]}
    losses = {"a": [7.19, 7.18, 7.4, 7.5, 7.45], "b": [7.10, 7.15, 7.12, 7.18, 7.11]}
    fake_runs(monkeypatch, times, losses)
    monkeypatch.chdir(tmp_path)
    race.main(["--a", "train.lr=1e-3", "--b", "train.lr=2e-3", "--out", "lr", "train.target_loss=7.2"])
    lines = capsys.readouterr().out.strip().splitlines()
    assert lines[-1] == f"results: {tmp_path / 'lr' / 'race.json'}"
    record = json.loads((tmp_path / "lr" / "race.json").read_text())
    assert record["seconds_to_target"] == times and record["final_val_loss"] == losses
    assert (record["a"]["reached"], record["b"]["reached"]) == (2, 5) and record["verdict"] == "B faster (p < 0.01)"
    for name in ("a", "b"):
        assert record["loss"][name]["p_value"] == pytest.approx(
            stats.ttest_1samp(losses[name], 7.2, alternative="less").pvalue)
    text = "\n".join(lines)
    assert re.search(r"^A\s+2/5 ", text, re.MULTILINE) and re.search(r"^B\s+5/5 ", text, re.MULTILINE)
    assert "time test: one-sided Mann-Whitney U" in text and "verdict, time to target: B faster (p < 0.01)" in text
    assert ("verdict, modded-nanogpt's rule (mean final loss <= target at p < 0.01, one-sample one-sided t-test): "
            "A: mean final loss not shown <= 7.2 (p = ") in text and "B: mean final loss <= 7.2 (p < 0.01)" in text


def test_too_few_seeds_for_the_time_verdict_are_said_up_front(capsys):
    race.parse(["--a", "", "--b", "train.lr=2e-3", "--seeds", "3", "train.target_loss=3"])
    assert "note: with --seeds 3 the time test's smallest possible p is 0.05" in capsys.readouterr().err
    race.parse(["--a", "", "--b", "train.lr=2e-3", "train.target_loss=3"])  # the default, 5: no note
    assert capsys.readouterr().err == ""


def test_the_documented_command_is_accepted_as_written():
    doc = (REPO / "docs" / "pretraining.md").read_text()
    command = re.search(r"^ {4}(python -m cramming\.race .*?)\n\n", doc, re.MULTILINE | re.DOTALL).group(1)
    words = shlex.split(command.replace("\\\n", " "))
    args = race.parse(words[3:])
    assert words[:3] == ["python", "-m", "cramming.race"] and args.seeds == 5 and "train.target_loss=7.2" in args.common


@pytest.mark.parametrize("args, fragments", [
    (["--b", "train.lr=2e-3", "train.target_loss=3"], ["--a", "python -m cramming.race --help"]),
    (["--a", "", "--b", "train.lr=2e-3", "--seeds", "1", "train.target_loss=3"], ["--seeds=1", "at least 2"]),
    (["--a", "", "--b", "train.lr=2e-3"], ["config A has no train.target_loss", "train.target_loss=3.5"]),
])
def test_bad_input_is_one_line_with_exit_2(args, fragments):
    result = subprocess.run([sys.executable, "-m", "cramming.race", *args], capture_output=True, text=True, cwd=REPO,
                            check=False)
    one_line_error(result, *fragments)


@pytest.mark.slow
def test_a_tiny_real_race(tmp_path):
    """Two learning rates, two seeds each, to a loose target on the sanity text, from another directory: every run
    reaches it, race.json holds the times and losses the runs' summaries report, and its path is printed whole."""
    common = ["arch=crammed-bert-tiny", "impl=cpu", "train=cpu-smoke", "data=sanity", "budget=0.03",
              "train.validate_every_minutes=0.01", "train.target_loss=7.2"]
    done = subprocess.run([sys.executable, "-m", "cramming.race", "--a", "train.lr=1e-3", "--b", "train.lr=2e-3",
                           "--seeds", "2", "--out", "race", *common],
                          capture_output=True, text=True, cwd=tmp_path, timeout=900, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.strip().splitlines()[-1] == f"results: {tmp_path / 'race' / 'race.json'}"
    record = json.loads((tmp_path / "race" / "race.json").read_text())
    for name in ("a", "b"):
        reported = [json.loads((tmp_path / "race" / name / f"seed-{s}" / "train_summary.json").read_text())
                    for s in (0, 1)]
        assert [r["seconds_to_target"] for r in reported] == record["seconds_to_target"][name]
        assert [r["val_loss"] for r in reported] == record["final_val_loss"][name]
        assert [r["config"]["seed"] for r in reported] == [0, 1] and record[name]["reached"] == 2
        assert record["loss"][name]["p_value"] is not None
    assert record["time_test"]["p_value"] is not None and "verdict, time to target: " in done.stdout
    assert "note: with --seeds 2" in done.stderr
