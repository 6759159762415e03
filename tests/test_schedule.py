"""LR schedules, the batch ramp and the budget clock."""

import numpy as np
import pytest

from cramming.train.schedule import SCHEDULES, batch_size_at
from cramming.train.trainer import Budget


def test_budget_triangle_shape():
    f = SCHEDULES["budget-triangle"]
    assert f(0.0) == pytest.approx(0.25)
    assert f(0.375) == pytest.approx(0.625)
    assert f(0.75) == pytest.approx(1.0)
    assert f(0.875) == pytest.approx(0.5)
    assert f(1.0) == pytest.approx(0.0)
    xs = np.linspace(0, 1, 101)
    ys = np.array([f(x) for x in xs])
    assert (np.diff(ys[xs <= 0.75]) > 0).all() and (np.diff(ys[xs >= 0.75]) < 0).all()


def test_budget_cosine_and_constant():
    f = SCHEDULES["budget-cosine"]
    assert f(0.0) == 0.0 and f(0.1) == pytest.approx(1.0) and f(1.0) == pytest.approx(0.0)
    assert f(0.55) == pytest.approx(0.5)
    assert all(SCHEDULES["constant"](x) == 1.0 for x in (0, 0.5, 1))


def test_every_schedule_stays_in_range():
    for name, f in SCHEDULES.items():
        values = [f(x) for x in np.linspace(0, 1, 57)]
        assert all(0.0 <= v <= 1.0 for v in values), name


def test_batch_ramp():
    sizes = [batch_size_at(x, 8192, 128, 0.6) for x in np.linspace(0, 1, 201)]
    assert sizes[0] == 128 and sizes[-1] == 8192
    assert all(s % 128 == 0 for s in sizes)
    assert all(b >= a for a, b in zip(sizes, sizes[1:]))
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
