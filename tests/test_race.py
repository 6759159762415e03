"""scripts/race.py: the statistics of a time-to-target race (checked against scipy and a case done by hand), the
rule for runs that missed the target, the bad-input contract, and one tiny real race."""

import json
import math
import subprocess
import sys

import pytest
from conftest import REPO, one_line_error
from scipy import stats

sys.path.insert(0, str(REPO / "scripts"))

import race


def test_the_statistics_are_scipys():
    a, b = [10.0, 11.5, 12.0, 13.2, 10.8], [8.0, 9.1, 8.7, 9.9, 8.4]
    result = race.compare(a, b)
    for name, times in (("a", a), ("b", b)):
        mean = sum(times) / len(times)
        low, high = stats.t.interval(0.95, len(times) - 1, loc=mean, scale=stats.sem(times))
        assert result[name]["mean_seconds"] == pytest.approx(mean)
        assert result[name]["ci95"] == pytest.approx([low, high])
        assert result[name]["reached"] == result[name]["runs"] == 5
    welch = stats.ttest_ind(a, b, equal_var=False, alternative="greater")
    assert result["p_value"] == pytest.approx(welch.pvalue) and result["t"] == pytest.approx(welch.statistic)
    assert welch.pvalue < 0.01 and result["verdict"] == "B faster (p < 0.01)"
    swapped = race.compare(b, a)  # A faster than B is not B faster
    assert swapped["p_value"] > 0.99 and swapped["verdict"].startswith("B not shown faster (p = ")


def test_a_case_done_by_hand():
    """A = [1, 3], B = [0, 2]: means 2 and 1, each standard error 1, so t = 1/sqrt(2) with Welch's df = 2, whose
    one-sided p is 1/2 - t / (2 sqrt(2 + t^2)) = 1/2 - 1/(2 sqrt(5)); the CI half-width is t_0.975(1) = tan(0.475 pi)."""
    result = race.compare([1.0, 3.0], [0.0, 2.0])
    assert result["t"] == pytest.approx(1 / math.sqrt(2))
    assert result["p_value"] == pytest.approx(0.5 - 1 / (2 * math.sqrt(5)))  # 0.2764
    half = math.tan(0.475 * math.pi)  # 12.706
    assert result["a"]["ci95_half_width"] == pytest.approx(half)
    assert result["a"]["ci95"] == pytest.approx([2 - half, 2 + half])
    assert result["verdict"] == "B not shown faster (p = 0.276)"


def test_runs_that_missed_the_target_are_counted_and_left_out():
    a, b = [10.0, 10.1, 9.9, None], [5.0, 5.1, 4.9, 5.05]
    result = race.compare(a, b)
    assert result["a"]["reached"] == 3 and result["a"]["runs"] == 4
    assert result["a"]["mean_seconds"] == pytest.approx(10.0)
    assert result["p_value"] == pytest.approx(stats.ttest_ind(a[:3], b, equal_var=False, alternative="greater").pvalue)
    assert result["verdict"] == "B faster (p < 0.01)"  # A's miss only makes A look faster
    missed = race.compare([10.0, 10.1, 9.9, 10.05], [5.0, 5.1, 4.9, None])  # B missed once: no claim
    assert missed["p_value"] < 0.01 and missed["verdict"] == "B not shown faster: 1 of its runs did not reach the target"
    few = race.compare([10.0, None, None], [5.0, 5.1, 4.9])
    assert few["p_value"] is None and few["verdict"].startswith("not tested")
    assert few["a"]["ci95"] is None and few["a"]["mean_seconds"] == 10.0


@pytest.mark.parametrize("args, fragments", [
    (["--b", "train.lr=2e-3", "train.target_loss=3"], ["--a"]),
    (["--a", "", "--b", "train.lr=2e-3", "--seeds", "1", "train.target_loss=3"], ["--seeds=1", "at least 2"]),
    (["--a", "", "--b", "train.lr=2e-3"], ["config A has no train.target_loss", "train.target_loss=3.5"]),
])
def test_bad_input_is_one_line_with_exit_2(args, fragments):
    result = subprocess.run([sys.executable, str(REPO / "scripts" / "race.py"), *args], capture_output=True,
                            text=True, cwd=REPO, check=False)
    one_line_error(result, *fragments)


@pytest.mark.slow
def test_a_tiny_real_race(tmp_path):
    """Two learning rates, two seeds each, to a loose target on the sanity text: every run reaches it, and
    race.json holds the times the runs' summaries report."""
    common = ["arch=crammed-bert-tiny", "impl=cpu", "train=cpu-smoke", "data=sanity", "budget=0.03",
              "train.validate_every_minutes=0.01", "train.target_loss=7.2"]
    done = subprocess.run([sys.executable, str(REPO / "scripts" / "race.py"), "--a", "train.lr=1e-3", "--b",
                           "train.lr=2e-3", "--seeds", "2", "--out", str(tmp_path), *common],
                          capture_output=True, text=True, cwd=REPO, timeout=900, check=False)
    assert done.returncode == 0, done.stderr[-3000:]
    record = json.loads((tmp_path / "race.json").read_text())
    for name in ("a", "b"):
        reported = [json.loads((tmp_path / name / f"seed-{s}" / "train_summary.json").read_text()) for s in (0, 1)]
        assert [r["seconds_to_target"] for r in reported] == record["seconds_to_target"][name]
        assert [r["config"]["seed"] for r in reported] == [0, 1] and record[name]["reached"] == 2
    assert record["p_value"] is not None and "verdict: " in done.stdout
