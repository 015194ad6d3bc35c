"""Robust statistics of timed rounds and passes: noise on a shared core only ever adds
time, so estimates lean on the fastest values that repeat, not on means or minima."""

from __future__ import annotations

import dataclasses
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


@dataclasses.dataclass(frozen=True)
class Consensus:
  """What a block's passes agree on: the value, how many passes agree, how tightly.

  Attributes:
    value: the median of the agreeing passes (of all passes when none agree).
    agreeing: passes in the agreeing cluster (1 when no two agree).
    spread: (max - min) / median over the agreeing passes (0 for a single pass).
    below: passes faster than the cluster. Noise only slows a pass down, but a busy
      spell can slow several passes alike, into a cluster of its own; a faster pass
      says the cluster may be such a one.
  """

  value: float
  agreeing: int
  spread: float
  below: int = 0

  def converged(self, k: int) -> bool:
    """k passes agree, and k more for every pass faster than them."""
    return self.agreeing >= k * (1 + self.below)


def consensus(values: Sequence[float], k: int, width: float) -> Consensus | None:
  """The lowest cluster of at least k passes within `width` of each other, or None.

  Noise on a shared core only ever slows a pass, so the fastest values that repeat are
  the block's own; every pass within `width` of the cluster's lowest joins it. Not
  the minimum: a pass can read low once (a clock change in mid-pass), but not k times.

  >>> c = consensus([130.0, 100.4, 100.0, 117.0, 100.2], k=3, width=0.01)
  >>> c.value, c.agreeing, round(c.spread, 4), c.below
  (100.2, 3, 0.004, 0)
  >>> consensus([100.0, 104.0, 110.0], k=2, width=0.01) is None
  True
  """
  x = np.sort(np.asarray(values, np.float64))
  x = x[np.isfinite(x)]
  v = lowest_cluster_sorted(x, max(k, 1), width)
  if not math.isfinite(v):
    return None
  members = x[(x >= v) & (x <= v * (1 + width))]
  return Consensus(float(np.median(members)), len(members),
                   spread(members) if len(members) > 1 else 0.0, int(np.sum(x < v)))


def best_consensus(values: Sequence[float], k: int, width: float) -> Consensus:
  """The most trusted (`confidence`) of the lowest clusters of k passes down to 2, the
  fastest among equals; else the median of all with `agreeing` 1. A block's value.

  A slow cluster of three loses to a faster pair below it: the three were more likely
  slowed alike by one busy spell than the pair sped up alike.

  >>> best_consensus([50.5, 50.7, 88.8, 88.9, 88.8], k=3, width=0.01).value
  50.6
  """
  best = None
  for n in range(max(k, 2), 1, -1):
    c = consensus(values, n, width)
    if c is not None and (best is None or confidence(c, k, width) > confidence(best, k, width)
                          or (confidence(c, k, width) == confidence(best, k, width)
                              and c.value < best.value)):
      best = c
  if best is not None:
    return best
  return Consensus(float(np.median(values)) if len(values) else math.nan, 1 if len(values) else 0,
                   spread(values) if len(values) > 1 else 0.0)


def confidence(c: Consensus, k: int, width: float) -> float:
  """How far a block's value can be trusted, from 0 to 1.

  The product of the share of the k agreeing passes convergence asks for that it has
  (beyond the first: one pass alone agrees with nothing); how tight they are, 1 -
  (spread / 2 width)^2, so near 1 for the 0.1-0.3% of a quiet core, 3/4 at `width`
  and 0 at twice it; and agreeing / (agreeing + k below), for passes faster than them
  (k times: that many more agreeing passes outweigh one faster pass, as in
  `Consensus.converged`).

  >>> confidence(Consensus(1.0, 3, 0.002), k=3, width=0.01)
  0.99
  >>> confidence(Consensus(1.0, 2, 0.0), 3, 0.01), confidence(Consensus(1.0, 3, 0.0, 1), 3, 0.01)
  (0.5, 0.5)
  >>> confidence(Consensus(1.0, 1, 0.0), k=3, width=0.01)
  0.0
  """
  if c.agreeing < 2 or not math.isfinite(c.spread):
    return 0.0
  share = min(1.0, (c.agreeing - 1) / max(k - 1, 1))
  tight = min(max(1.0 - (c.spread / (2 * width)) ** 2, 0.0), 1.0)
  return round(share * tight * c.agreeing / (c.agreeing + k * c.below), 4)
