"""Metrics against hand-computed values, degenerate inputs, and the GLUE averages."""

import math

import pytest

from cramming.eval.glue_metrics import (
    HARMONIC_FLOOR,
    accuracy,
    compute_metrics,
    f1,
    glue_average,
    matthews,
    pearson,
    spearman,
)
from cramming.eval.results import markdown_table

# 8 binary examples; confusion matrix counted by hand (positive class 1):
#   truth 1, pred 1: TP = 3     truth 1, pred 0: FN = 1
#   truth 0, pred 1: FP = 1     truth 0, pred 0: TN = 3
REFS = [1, 1, 1, 1, 0, 0, 0, 0]
PREDS = [1, 1, 1, 0, 1, 0, 0, 0]


def test_binary_metrics_by_hand():
    assert accuracy(PREDS, REFS) == 6 / 8
    # F1 = 2TP / (2TP + FP + FN) = 6 / (6 + 1 + 1)
    assert f1(PREDS, REFS) == pytest.approx(6 / 8)
    # MCC = (TP*TN - FP*FN) / sqrt((TP+FP)(TP+FN)(TN+FP)(TN+FN)) = (9 - 1) / sqrt(4*4*4*4) = 8 / 16
    assert matthews(PREDS, REFS) == pytest.approx(0.5)


def test_asymmetric_confusion_by_hand():
    refs = [1, 1, 0, 0, 0, 0]
    preds = [1, 0, 1, 1, 0, 0]  # TP=1, FN=1, FP=2, TN=2
    assert f1(preds, refs) == pytest.approx(2 / (2 + 2 + 1))  # 2*1 / (2*1 + 2 + 1) = 0.4
    # (1*2 - 2*1) / sqrt(3*2*4*3) = 0 / sqrt(72)
    assert matthews(preds, refs) == pytest.approx(0.0)
    preds = [0, 1, 1, 0, 0, 0]  # TP=1, FN=1, FP=1, TN=3
    # (1*3 - 1*1) / sqrt((TP+FP)(TP+FN)(TN+FP)(TN+FN)) = 2 / sqrt(2*2*4*4) = 2 / 8
    assert matthews(preds, refs) == pytest.approx(0.25)
    assert f1(preds, refs) == pytest.approx(2 / (2 + 1 + 1))
    assert matthews([1 - p for p in preds], refs) == pytest.approx(-0.25)  # flipped predictions flip the sign


def test_multiclass_matthews_perfect_and_inverse():
    assert matthews([0, 1, 2, 2], [0, 1, 2, 2]) == pytest.approx(1.0)
    assert matthews([1, 0], [0, 1]) == pytest.approx(-1.0)


def test_correlations_by_hand():
    x, y = [1, 2, 3], [2, 4, 5]
    # deviations: x -> (-1, 0, 1), y -> (-5/3, 1/3, 4/3); cov sum = 5/3 + 0 + 4/3 = 3
    # |x| = sqrt(2), |y| = sqrt(25/9 + 1/9 + 16/9) = sqrt(42/9); r = 3 / sqrt(2 * 42/9) = 9 / sqrt(84)
    assert pearson(x, y) == pytest.approx(9 / math.sqrt(84))
    assert spearman(x, y) == pytest.approx(1.0)  # same order
    # ranks of [10, 20, 20, 30] = (1, 2.5, 2.5, 4) vs (1, 2, 3, 4): deviations (-1.5, 0, 0, 1.5) and (-1.5, -.5, .5, 1.5)
    # cov sum = 2.25 + 2.25 = 4.5; norms sqrt(4.5) and sqrt(5) -> 4.5 / sqrt(22.5)
    assert spearman([10, 20, 20, 30], [1, 2, 3, 4]) == pytest.approx(4.5 / math.sqrt(22.5))
    assert pearson([3, 2, 1], [1, 2, 3]) == pytest.approx(-1.0)


def test_degenerate_inputs_do_not_crash():
    constant = [1, 1, 1, 1]
    assert matthews(constant, [0, 1, 0, 1]) == 0.0  # one predicted class: undefined -> 0
    assert matthews([0, 1, 0, 1], [1, 1, 1, 1]) == 0.0
    assert pearson([2.0, 2.0, 2.0], [1.0, 2.0, 3.0]) == 0.0  # nan -> 0
    assert spearman([1.0, 2.0, 3.0], [4.0, 4.0, 4.0]) == 0.0
    assert f1([0, 0, 0], [0, 0, 0]) == 0.0  # no positives anywhere
    assert f1([0, 0], [1, 1]) == 0.0
    assert accuracy([3], [3]) == 1.0
    with pytest.raises(ValueError, match="2 predictions for 3 references"):
        accuracy([1, 0], [1, 0, 1])
    with pytest.raises(ValueError, match="no predictions"):
        accuracy([], [])


def test_compute_metrics_in_percent():
    scores = compute_metrics(["accuracy", "f1", "matthews"], PREDS, REFS)
    assert scores == pytest.approx({"accuracy": 75.0, "f1": 75.0, "matthews": 50.0})
    assert compute_metrics(["pearson", "spearman"], [1.0, 2.0, 3.0], [1.5, 2.5, 3.5]) == pytest.approx({"pearson": 100.0, "spearman": 100.0})
    with pytest.raises(ValueError, match="unknown metric"):
        compute_metrics(["bleu"], PREDS, REFS)


SCORES = {"cola": 40.0, "sst2": 90.0, "mrpc": 80.0, "qqp": 80.0, "stsb": 80.0,
          "mnli-m": 70.0, "mnli-mm": 80.0, "qnli": 80.0, "rte": 60.0, "wnli": 10.0}


def test_glue_average_counts_both_mnli_and_excludes_wnli():
    result = glue_average(SCORES)
    assert result["tasks_counted"] == ["cola", "sst2", "mrpc", "qqp", "stsb", "mnli-m", "mnli-mm", "qnli", "rte"]
    # (40 + 90 + 80 + 80 + 80 + 70 + 80 + 80 + 60) / 9 = 660 / 9
    assert result["average"] == pytest.approx(660 / 9)
    # 9 / (1/40 + 1/90 + 5/80 + 1/70 + 1/60)
    assert result["harmonic_mean"] == pytest.approx(9 / (1 / 40 + 1 / 90 + 5 / 80 + 1 / 70 + 1 / 60))
    with_wnli = glue_average(SCORES, include_wnli=True)
    assert with_wnli["tasks_counted"][-1] == "wnli" and with_wnli["average"] == pytest.approx(670 / 10)


def test_harmonic_mean_floor_and_partial_scores():
    result = glue_average({"cola": -5.0, "sst2": 80.0})
    assert result["average"] == pytest.approx(37.5)
    # cola is clipped up to the floor: 2 / (1/floor + 1/80)
    assert result["harmonic_mean"] == pytest.approx(2 / (1 / HARMONIC_FLOOR + 1 / 80))
    assert glue_average({"wnli": 50.0})["tasks_counted"] == [] and math.isnan(glue_average({})["average"])
    with pytest.raises(ValueError, match="unknown GLUE score key.*mnli"):
        glue_average({"mnli": 80.0})


def test_seed_statistics_report_the_median_of_the_seeds():
    from cramming.eval.results import seed_statistics

    stats = seed_statistics([70.0, 50.0, 60.0, 90.0])
    assert stats["median"] == 65.0 and (stats["min"], stats["max"]) == (50.0, 90.0)
    assert stats["std"] == pytest.approx(math.sqrt(((70 - 67.5) ** 2 + 17.5 ** 2 + 7.5 ** 2 + 22.5 ** 2) / 3))
    assert stats["values"] == [70.0, 50.0, 60.0, 90.0] and seed_statistics([42.0])["std"] == 0.0


def test_the_table_shows_the_average_once_in_its_own_last_column():
    """markdown_table: the GLUE columns some row has, in the paper's order, then custom tasks by name, then `avg`
    from each row's average; the average is never a task column of its own, and a missing score is a dash."""
    table = markdown_table({"pretrained": {"rte": 60.0, "cola": 40.24, "mine": 70.0, "average": 56.76},
                            "random-init": {"rte": 50.0, "average": 50.0}})
    assert table.splitlines() == ["| model | CoLA | RTE | mine | avg |", "|---|---|---|---|---|",
                                  "| pretrained | 40.2 | 60.0 | 70.0 | 56.8 |", "| random-init | – | 50.0 | – | 50.0 |"]
