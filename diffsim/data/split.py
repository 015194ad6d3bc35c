"""Deterministic train / validation / test splits by block.

Each block's part is decided by a hash of its hex and the seed alone, not by its
position or by the other blocks in the file. So a block keeps its part when the dataset
grows, shrinks or is reordered, and two datasets that share blocks (Zen 5 measurements
and llvm-mca labels, say) split them the same way, so nothing tested in one was trained
on in the other. The price: part sizes match the fractions only approximately (binomial
noise, about sqrt(N) blocks), not exactly.
"""

from __future__ import annotations

import hashlib
from typing import Sequence

import numpy as np

from diffsim.data.bhive import Dataset

PARTS = ("train", "val", "test")


def _unit(hex_: str, seed: int) -> float:
  """A uniform number in [0, 1) from the block and the seed (stable across runs)."""
  digest = hashlib.blake2b(f"{seed}:{hex_}".encode(), digest_size=8).digest()
  return int.from_bytes(digest, "big") / 2.0**64


def split_ids(
  hexes: Sequence[str], *, seed: int = 0, fractions=(0.8, 0.1, 0.1)
) -> np.ndarray:
  """Which part each block falls in: 0 train, 1 validation, 2 test.

  Args:
    hexes: block hexes (lower case, as `load_csv` gives them).
    seed: the split's seed; name it when reporting results.
    fractions: shares of train, validation and test; non-negative, summing to 1.

  Returns:
    [N] int8 part ids.

  >>> split_ids(["01c8", "01c8"]).tolist()  # the same block always lands together
  [0, 0]
  """
  f = np.asarray(fractions, dtype=np.float64)
  if f.shape != (3,) or (f < 0).any() or abs(f.sum() - 1.0) > 1e-9:
    raise ValueError(f"fractions must be 3 non-negative numbers summing to 1, got {fractions}")
  edges = np.cumsum(f)[:2]
  u = np.array([_unit(h, seed) for h in hexes], dtype=np.float64)
  return np.searchsorted(edges, u, side="right").astype(np.int8)


def split(
  ds: Dataset, *, seed: int = 0, fractions=(0.8, 0.1, 0.1)
) -> tuple[Dataset, Dataset, Dataset]:
  """Splits a dataset by block into train, validation and test.

  Args:
    ds: the dataset (deduplicated, or a block's copies all land in one part anyway).
    seed: the split's seed.
    fractions: shares of train, validation and test.

  Returns:
    (train, val, test), each in the original order.

  >>> from diffsim.data import load_csv, shipped
  >>> [len(part) for part in split(load_csv(shipped("zen5-small.csv")), seed=0)]
  [2382, 298, 320]
  """
  ids = split_ids(ds.hex, seed=seed, fractions=fractions)
  return tuple(ds.take(np.flatnonzero(ids == k)) for k in range(3))  # type: ignore[return-value]
