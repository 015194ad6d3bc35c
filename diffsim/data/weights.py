"""Fit weights from what the harness says of each row: its `confidence`, else its
`spread`. A row the harness cannot vouch for (its passes disagreed: a busy core) should
weigh less in a fit than one whose passes agreed, not as much."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

# Rows whose passes agree within this spread count fully when only `spread` is known:
# on a busy Ice Lake VM such rows agreed across runs to a median of 0.2%.
SPREAD_OK = 0.05


def confidence_weights(data: Any, n: int | None = None) -> np.ndarray:
  """Per-row fit weights in [0, 1] from a measured CSV's extra columns.

  Args:
    data: a loaded `Dataset` (its `extra` is used), or its `extra` dict (column name ->
      values, as `diffsim.data.load_csv` gives them).
    n: the number of rows; needed only for a dict with neither column.

  Returns:
    float64 [n]: a row's `confidence` where the file has that column and the row a
    value (`diffsim measure` writes it: 1 when enough passes agree tightly, towards 0
    when they do not); otherwise from its `spread`: 1 up to 5%, then (0.05 / spread)^2
    (0.25 at 10%); 1 where neither is known (a file of other labels, a blank cell).

  >>> confidence_weights({"spread": (0.01, 0.1, float("nan")),
  ...                     "confidence": (0.98, float("nan"), float("nan"))})
  array([0.98, 0.25, 1.  ])
  >>> confidence_weights({}, n=2)
  array([1., 1.])
  """
  extra: Mapping[str, Sequence] = data.extra if hasattr(data, "extra") else data
  size = n if n is not None else len(data) if hasattr(data, "extra") else None
  cols = [c for c in ("confidence", "spread") if c in extra]
  if size is None:
    if not cols:
      raise ValueError("confidence_weights: give n for a dataset without confidence or spread")
    size = len(extra[cols[0]])
  w = np.ones(size, np.float64)
  if "spread" in extra:
    s = _floats(extra["spread"], size)
    known = np.isfinite(s)
    w[known] = np.minimum(1.0, (SPREAD_OK / np.maximum(s[known], 1e-12)) ** 2)
  if "confidence" in extra:
    c = _floats(extra["confidence"], size)
    known = np.isfinite(c)
    w[known] = np.clip(c[known], 0.0, 1.0)
  return w


def _floats(values: Sequence, size: int) -> np.ndarray:
  """A column as floats, NaN where a cell is blank or not a number."""
  if len(values) != size:
    raise ValueError(f"confidence_weights: a column has {len(values)} rows, expected {size}")
  out = np.full(size, math.nan)
  for k, v in enumerate(values):
    try:
      out[k] = float(v)
    except (TypeError, ValueError):
      pass
  return out
