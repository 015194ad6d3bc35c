"""Accuracy metrics for throughput predictions, as used across diffsim.

MAPE = mean(|pred - y| / y); Kendall's tau between pred and y (scipy's tau-b, which
handles ties); the share of blocks within a relative error. All of them skip pairs
where the prediction or the label is missing (NaN or infinite) and report how many pairs
were used. Units do not matter as long as pred and y share them.
"""

from __future__ import annotations

import math

import numpy as np


def _pairs(pred, y) -> tuple[np.ndarray, np.ndarray]:
  """The finite (pred, y) pairs; labels must be positive, as relative errors need."""
  p = np.asarray(pred, dtype=np.float64).reshape(-1)
  t = np.asarray(y, dtype=np.float64).reshape(-1)
  if p.shape != t.shape:
    raise ValueError(f"pred has {p.size} values but y has {t.size}")
  ok = np.isfinite(p) & np.isfinite(t)
  p, t = p[ok], t[ok]
  if (t <= 0).any():
    raise ValueError("labels must be positive for relative errors")
  return p, t


def mape(pred, y) -> float:
  """Mean absolute percentage error as a fraction (0.05 = 5%); NaN if no pairs.

  >>> mape([110.0, 90.0, float("nan")], [100.0, 100.0, 100.0])
  0.1
  """
  p, t = _pairs(pred, y)
  return float(np.mean(np.abs(p - t) / t)) if p.size else math.nan


def kendall_tau(pred, y) -> float:
  """Kendall's tau-b between predictions and labels; NaN with fewer than 2 pairs.

  >>> kendall_tau([1.0, 2.0, 3.0], [10.0, 20.0, 30.0])
  1.0
  """
  p, t = _pairs(pred, y)
  # Tau is undefined for a constant sequence; scipy would also warn.
  if p.size < 2 or np.all(p == p[0]) or np.all(t == t[0]):
    return math.nan
  import scipy.stats  # here: it takes most of a second to import, which `simulate` skips

  return float(scipy.stats.kendalltau(p, t).statistic)


def within(pred, y, frac: float) -> float:
  """The share of pairs with |pred - y| / y <= frac; NaN if no pairs.

  >>> within([101.0, 104.0], [100.0, 100.0], 0.01)
  0.5
  """
  p, t = _pairs(pred, y)
  # A tiny slack so that an error of exactly `frac` counts despite rounding.
  return float(np.mean(np.abs(p - t) / t <= frac + 1e-12)) if p.size else math.nan


def summary(pred, y) -> dict:
  """All metrics at once.

  Returns:
    dict(mape, kendall_tau, within_1pct, within_5pct, n), n = pairs used.

  >>> s = summary([100.0, 210.0], [100.0, 200.0])
  >>> s["mape"], s["kendall_tau"], s["n"]
  (0.025, 1.0, 2)
  """
  p, t = _pairs(pred, y)
  return dict(
    mape=mape(p, t),
    kendall_tau=kendall_tau(p, t),
    within_1pct=within(p, t, 0.01),
    within_5pct=within(p, t, 0.05),
    n=int(p.size),
  )
