"""The fit recipe behind every measured table: blocks and anchors, weighed, judged exactly.

One code path makes the shipped measured tables (`benchmarks/fit_zen5.py`), a user's
`diffsim fit --anchors` and `diffsim calibrate`: the exact per-opcode search
(`diffsim.fit.exact.refine`) on measured blocks, with single instructions measured
alone beside them (anchors, `diffsim.fit.anchors`) weighted above a block, every row
weighted by how far its measurement can be trusted, and the round kept that scores
best on validation blocks.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from diffsim.fit.exact import MOVES, Refined, refine
from diffsim.params.table import Table


@dataclasses.dataclass(frozen=True)
class Rows:
  """Decoded measured rows: blocks, cycles per 100 iterations, and each row's weight."""

  blocks: list
  y: np.ndarray
  weights: np.ndarray

  def __len__(self) -> int:
    return len(self.blocks)

  @classmethod
  def of(cls, blocks: Sequence, y, weights=None) -> Rows:
    """The rows that can be fitted: decoded, with a positive finite value and weight.

    >>> from diffsim.isa import parse_asm
    >>> r = Rows.of([parse_asm("addq %rbx, %rax"), ValueError("bad")], [100.0, 50.0])
    >>> len(r), r.weights.tolist()
    (1, [1.0])
    """
    y = np.asarray(y, np.float64)
    w = np.ones(len(y)) if weights is None else np.asarray(weights, np.float64)
    ok = [i for i, b in enumerate(blocks) if not isinstance(b, Exception)
          and np.isfinite(y[i]) and y[i] > 0 and np.isfinite(w[i]) and w[i] > 0]
    return cls([blocks[i] for i in ok], y[ok], w[ok])

  def __add__(self, other: Rows) -> Rows:
    return Rows(self.blocks + other.blocks, np.concatenate([self.y, other.y]),
                np.concatenate([self.weights, other.weights]))


def fit_measured(start: Table, train: Rows, *, anchors: Rows | None = None,
                 anchor_weight: float = 4.0, val: Rows | None = None, rounds: int = 3,
                 cap: int = 48, state_dir: str | Path | None = None,
                 deadline: float | None = None, log=print) -> Refined:
  """The exact search from `start` on the training blocks and the anchors.

  Args:
    start: the table whose structure the search keeps (units, groups, mechanisms).
    train: measured blocks, each weighted by its measurement's confidence.
    anchors: single instructions measured alone; their weights are multiplied by
      `anchor_weight`, so each counts that many blocks and judges every opcode it runs
      (`refine`'s rule for rows weighted above 1).
    val: blocks that choose the round (their weights are not used: validation MAPE is
      the reported metric).
    rounds, cap: `refine`'s rounds and judging blocks per opcode.
    state_dir: where the search saves its state; the same call resumes from it.
    deadline: a `time.time()` after which no new move kind starts.
  """
  rows = train
  if anchors is not None and len(anchors):
    # An anchor counts above a block even where its own confidence is low, so that it
    # keeps judging its opcode: a floor just above 1.
    w = np.maximum(anchors.weights * anchor_weight, 1.0 + 1e-6)
    rows = train + Rows(anchors.blocks, anchors.y, w)
  log(f"fit: {len(train)} blocks" + (f" and {len(anchors)} anchors (weight "
                                      f"{anchor_weight:g})" if anchors is not None else "")
      + (f", {len(val)} validation blocks" if val is not None else ""))
  return refine(start, rows.blocks, rows.y, MOVES, rounds=rounds, cap=cap,
                val=(val.blocks, val.y) if val is not None and len(val) else None,
                state_dir=state_dir, weights=rows.weights, deadline=deadline, log=log)
