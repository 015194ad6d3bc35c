"""Robust statistics of timed rounds and passes: noise on a shared core only ever adds
time, so estimates lean on the fastest values that repeat, not on means or minima."""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np


def lowest_cluster(values: np.ndarray, k: int = 5, width: float = 0.015) -> float:
  """The lowest v with at least k values in [v, v (1 + width)]; inf when there is none.

  >>> lowest_cluster(np.array([0.4, 2.0, 2.01, 2.0, 2.02, 2.0, 3.1, 3.3]))
  2.0
  """
  return lowest_cluster_sorted(np.sort(values[np.isfinite(values)]), k, width)


def lowest_cluster_sorted(x: np.ndarray, k: int = 5, width: float = 0.015) -> float:
  """`lowest_cluster` of finite values already sorted. It looks at the lowest values
  first, in growing groups, since the cluster is almost always among them."""
  start, step = 0, 64
  while start < len(x):
    low = x[start:start + step]
    ends = np.searchsorted(x, low * (1 + width), side="right")
    dense = np.flatnonzero(ends - np.arange(start, start + len(low)) >= k)
    if len(dense):
      return float(low[dense[0]])
    start, step = start + step, 2 * step
  return math.inf


def spread(values: Sequence[float]) -> float:
  """(max - min) / median; inf for fewer than two values."""
  if len(values) < 2:
    return math.inf
  med = float(np.median(values))
  return float(max(values) - min(values)) / med if med > 0 else math.inf


def snippet_estimates(times: np.ndarray, canary_rows: np.ndarray, quantum: int
                      ) -> tuple[list[float], list[float], int]:
  """Each snippet's ticks from every round's, leaving out rounds a canary says were slow.

  Rounds in which a canary ran slower than its best in the pass by more than 1% (and a
  TSC step) were disturbed, most often by another thread on the same core, and are
  left out. Among the rest, each snippet's estimate is the mean of the rounds within
  one TSC step of its minimum: undisturbed rounds read the duration rounded down or up
  to a step, depending on the uniform phase of the start, so their mean is unbiased
  below the step, where a minimum would not be.

  Args:
    times: [S, R] float64 ticks of S snippets in R rounds.
    canary_rows: [C, R] the canaries' rows of `times`.
    quantum: the TSC step, in ticks.

  Returns:
    (per-snippet estimates [S], per-snippet share of rounds near the minimum [S],
    rounds kept as quiet).
  """
  quiet = np.all(canary_rows <= canary_rows.min(axis=1, keepdims=True) * 1.01 + quantum, axis=0)
  if quiet.sum() < 2:  # busy throughout: the pass's judge will say so
    quiet = np.ones_like(quiet)
  est, near = [], []
  for row in times:
    v = row[quiet]
    est.append(float(v[v <= v.min() + quantum].mean()))
    near.append(float(np.mean(row <= v.min() * 1.01 + quantum)))
  return est, near, int(quiet.sum())
