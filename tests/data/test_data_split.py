"""split(): deterministic, disjoint, by block, stable as the dataset grows."""

from __future__ import annotations

import numpy as np
import pytest

from diffsim.data import Dataset, split, split_ids


def make(hexes):
  return Dataset(hex=tuple(hexes), y=np.arange(len(hexes), dtype=np.float64),
                 line=tuple(range(1, len(hexes) + 1)))


HEXES = [f"{i:06x}" for i in range(3000)]


def test_deterministic_and_disjoint():
  a = split(make(HEXES), seed=3)
  b = split(make(HEXES), seed=3)
  assert [p.hex for p in a] == [p.hex for p in b]
  sets = [set(p.hex) for p in a]
  assert not (sets[0] & sets[1] or sets[0] & sets[2] or sets[1] & sets[2])
  assert set().union(*sets) == set(HEXES)
  sizes = [len(p) for p in a]
  # Hash-based: binomial noise around 80/10/10 (5 sigma is about 110 / 80 blocks).
  assert abs(sizes[0] - 2400) < 110 and abs(sizes[1] - 300) < 80
  # Each part keeps the original order and labels.
  for p in a:
    assert list(p.y) == sorted(p.y) and all(HEXES[int(v)] == h for v, h in zip(p.y, p.hex))


def test_stable_as_the_dataset_grows():
  small = split_ids(HEXES[:1000], seed=0)
  big = split_ids(HEXES[::-1], seed=0)[::-1]
  np.testing.assert_array_equal(small, big[:1000])


def test_seed_and_fractions():
  assert (split_ids(HEXES, seed=0) != split_ids(HEXES, seed=1)).any()
  ids = split_ids(HEXES, fractions=(1.0, 0.0, 0.0))
  assert (ids == 0).all() and ids.dtype == np.int8
  assert (split_ids(HEXES, fractions=(0, 0, 1)) == 2).all()
  with pytest.raises(ValueError):
    split_ids(HEXES, fractions=(0.5, 0.5, 0.5))
  with pytest.raises(ValueError):
    split_ids(HEXES, fractions=(0.9, 0.1))
