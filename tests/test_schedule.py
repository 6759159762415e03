"""LR schedules, the batch ramp and the budget clock."""

import itertools

import numpy as np
import pytest

from cramming.train.schedule import SCHEDULES, WARMUP_FLOOR, batch_size_at, schedule_problem
from cramming.train.trainer import Budget

BUDGET = ("budget-triangle", "budget-cosine", "budget-linear", "budget-wsd", "constant")


def test_budget_triangle_shape():
    f = SCHEDULES["budget-triangle"]
    for warmup, cooldown in ((0.1, 0.2), (0.0, 0.0), (0.5, 0.4)):  # its shape ignores both
        assert f(0.0, warmup, cooldown) == pytest.approx(0.25)
        assert f(0.375, warmup, cooldown) == pytest.approx(0.625)
        assert f(0.75, warmup, cooldown) == pytest.approx(1.0)
        assert f(0.875, warmup, cooldown) == pytest.approx(0.5)
        assert f(1.0, warmup, cooldown) == pytest.approx(0.0)
    xs = np.linspace(0, 1, 101)
    ys = np.array([f(x, 0.1, 0.2) for x in xs])
    assert (np.diff(ys[xs <= 0.75]) > 0).all() and (np.diff(ys[xs >= 0.75]) < 0).all()


def test_warmup_is_linear_from_a_floor():
    # The first step sees progress 0: it gets WARMUP_FLOOR of the peak rather than nothing.
    for name in ("budget-cosine", "budget-linear", "budget-wsd", "constant"):
        f = SCHEDULES[name]
        assert f(0.0, 0.1, 0.2) == WARMUP_FLOOR == 0.01, name
        assert f(0.0005, 0.1, 0.2) == WARMUP_FLOOR, name
        assert f(0.05, 0.1, 0.2) == pytest.approx(0.5), name
        assert f(0.1, 0.1, 0.2) == pytest.approx(1.0), name  # peak where the warm-up ends
        assert f(0.0, 0.0, 0.2) == 1.0, name  # warmup=0: peak from the first step


def test_budget_cosine_and_linear():
    f = SCHEDULES["budget-cosine"]
    assert f(0.55, 0.1, 0.2) == pytest.approx(0.5) and f(1.0, 0.1, 0.2) == pytest.approx(0.0)
    assert f(0.5, 0.0, 0.0) == pytest.approx(0.5) and f(0.0, 0.0, 0.0) == 1.0
    g = SCHEDULES["budget-linear"]
    assert g(0.55, 0.1, 0.2) == pytest.approx(0.5) and g(0.775, 0.1, 0.2) == pytest.approx(0.25)
    assert g(1.0, 0.1, 0.2) == pytest.approx(0.0) and g(0.25, 0.0, 0.0) == pytest.approx(0.75)
    xs = np.linspace(0.1, 1, 50)
    for h in (f, g):  # non-increasing after the warm-up
        assert (np.diff([h(x, 0.1, 0.2) for x in xs]) <= 0).all()


def test_budget_wsd():
    f = SCHEDULES["budget-wsd"]
    assert f(0.1, 0.1, 0.2) == 1.0 and f(0.5, 0.1, 0.2) == 1.0
    assert f(0.8, 0.1, 0.2) == pytest.approx(1.0)  # the cool-down starts at 1 - cooldown
    assert f(0.9, 0.1, 0.2) == pytest.approx(0.5) and f(1.0, 0.1, 0.2) == pytest.approx(0.0)
    assert f(0.95, 0.0, 0.5) == pytest.approx(0.1)
    assert f(1.0, 0.1, 0.0) == 1.0  # no cool-down: the plateau runs to the end
    assert f(0.5, 0.5, 0.5) == pytest.approx(1.0) and f(0.75, 0.5, 0.5) == pytest.approx(0.5)


def test_constant_keeps_the_peak():
    f = SCHEDULES["constant"]
    assert all(f(x, 0.1, 0.2) == 1.0 for x in (0.1, 0.5, 0.99, 1.0))
    assert all(f(x, 0.0, 0.0) == 1.0 for x in (0.0, 0.5, 1.0))


def test_every_schedule_stays_in_range():
    for name, f in SCHEDULES.items():
        for warmup, cooldown in ((0.1, 0.2), (0.0, 0.0), (0.3, 0.7), (0.9, 0.05)):
            values = [f(x, warmup, cooldown) for x in np.linspace(0, 1, 57)]
            assert all(0.0 <= v <= 1.0 for v in values), (name, warmup, cooldown)
            if name not in ("constant", "step-constant") and not name.endswith("wsd"):
                assert values[-1] == pytest.approx(0.0), name


def test_step_twins():
    for name in BUDGET:
        twin = "step-" + name.removeprefix("budget-")
        assert SCHEDULES[twin].by_steps and not SCHEDULES[name].by_steps
        for x in np.linspace(0, 1, 23):
            assert SCHEDULES[twin](x, 0.1, 0.2) == SCHEDULES[name](x, 0.1, 0.2)
    assert sorted(SCHEDULES) == sorted(BUDGET + ("step-triangle", "step-cosine", "step-linear", "step-wsd",
                                                 "step-constant"))


def test_schedule_problem():
    assert schedule_problem("budget-wsd", 0.1, 0.2, None) is None
    assert schedule_problem("step-cosine", 0.0, 0.0, 1000) is None
    assert schedule_problem("budget-triangle", 0.1, 0.2, None) is None
    assert schedule_problem("step-cosine", 0.1, 0.2, None) == (
        "train.schedule=step-cosine needs train.max_steps (it runs on step / max_steps), or use a budget-* schedule")
    assert "train.warmup=1.0 is invalid" in schedule_problem("budget-cosine", 1.0, 0.2, None)
    assert "train.warmup=-0.1 is invalid" in schedule_problem("budget-cosine", -0.1, 0.2, None)
    assert "train.cooldown=1.5 is invalid" in schedule_problem("budget-wsd", 0.1, 1.5, None)
    assert "train.warmup + train.cooldown = 1.1" in schedule_problem("step-wsd", 0.5, 0.6, 10)
    assert schedule_problem("budget-cosine", 0.5, 0.6, None) is None  # cooldown only matters to wsd
    assert "choose one of" in schedule_problem("cosine", 0.1, 0.2, None)


def test_batch_ramp():
    sizes = [batch_size_at(x, 8192, 128, 0.6) for x in np.linspace(0, 1, 201)]
    assert sizes[0] == 128 and sizes[-1] == 8192
    assert all(s % 128 == 0 for s in sizes)
    assert all(b >= a for a, b in itertools.pairwise(sizes))
    assert batch_size_at(0.6, 8192, 128, 0.6) == 8192
    assert batch_size_at(0.3, 8192, 128, 0.6) == pytest.approx(128 + (8192 - 128) / 2, abs=128)
    assert batch_size_at(0.0, 8192, 128, 0.0) == 8192  # no ramp


def test_budget_fraction_time_and_steps():
    b = Budget(seconds=100)
    assert b.fraction(50, 10) == 0.5 and b.fraction(150, 10) == 1.0
    b = Budget(seconds=100, max_steps=20)
    assert b.fraction(10, 10) == 0.5  # steps ahead of time
    assert b.fraction(60, 10) == 0.6  # time ahead of steps
    assert b.fraction(1, 20) == 1.0
