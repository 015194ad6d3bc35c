"""Metrics against hand-computed values, NaN handling included."""

from __future__ import annotations

import math

import numpy as np
import pytest

from diffsim.data import kendall_tau, mape, summary, within

NAN = math.nan


def test_mape():
  # |110-100|/100 = 0.1, |150-200|/200 = 0.25, |50-50|/50 = 0 -> mean 0.35/3.
  assert mape([110, 150, 50], [100, 200, 50]) == pytest.approx(0.35 / 3, rel=1e-12, abs=0)
  assert mape([110, NAN, 1], [100, 5, NAN]) == pytest.approx(0.1, rel=1e-12, abs=0)
  assert math.isnan(mape([NAN], [1.0]))
  with pytest.raises(ValueError):
    mape([1.0, 2.0], [1.0])
  with pytest.raises(ValueError):
    mape([1.0], [0.0])


def test_kendall_tau():
  # Pairs of (1,2,3,4) vs (1,3,2,4): 5 concordant, 1 discordant -> (5-1)/6.
  assert kendall_tau([1, 2, 3, 4], [1, 3, 2, 4]) == pytest.approx(4 / 6, rel=1e-12, abs=0)
  assert kendall_tau([1, 2, 3], [3, 2, 1]) == pytest.approx(-1.0, rel=1e-12, abs=0)
  assert kendall_tau([1, 2, NAN, 3], [1, 2, 9, 3]) == pytest.approx(1.0, rel=1e-12, abs=0)
  assert math.isnan(kendall_tau([1.0], [1.0]))
  assert math.isnan(kendall_tau([1.0, 1.0], [1.0, 2.0]))


def test_within():
  pred, y = [100, 101, 104, 106, NAN], [100, 100, 100, 100, 100]
  assert within(pred, y, 0.01) == 0.5  # 100 and exactly-1% 101
  assert within(pred, y, 0.05) == 0.75


def test_summary():
  s = summary(np.array([100.0, 101.0, 110.0, NAN]), np.array([100.0, 100.0, 100.0, 100.0]))
  assert s["n"] == 3
  assert s["mape"] == pytest.approx(0.11 / 3, rel=1e-12, abs=0)
  assert s["within_1pct"] == pytest.approx(2 / 3, rel=1e-12, abs=0)
  assert s["within_5pct"] == pytest.approx(2 / 3, rel=1e-12, abs=0)
  assert math.isnan(s["kendall_tau"])  # the labels are constant
  assert set(s) == {"mape", "kendall_tau", "within_1pct", "within_5pct", "n"}
