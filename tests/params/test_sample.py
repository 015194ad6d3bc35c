"""Sampled tables: reproducible, integral, within their ranges (that a sweep runs them
exactly as alone is tests/sim/test_simulate.py's `test_sweep_equals_one_table_at_a_time`)."""

from __future__ import annotations

import jax
import numpy as np
import pytest

from diffsim.params.sample import sample_params
from diffsim.params.table import load_table


@pytest.fixture(scope="module")
def haswell():
  return load_table("haswell")


def test_same_seed_same_tables_and_prefix_stable(haswell):
  a = sample_params(haswell, 3, seed=7)
  b = sample_params(haswell, 5, seed=7)
  c = sample_params(haswell, 3, seed=8)
  for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)):
    np.testing.assert_array_equal(x, y[:3])
  assert not np.array_equal(a.latency, c.latency)


def test_values_integral_and_within_documented_ranges(haswell):
  p = sample_params(haswell, 16, seed=0)
  base = haswell.params
  for leaf in jax.tree.leaves(p):
    assert np.array_equal(leaf, np.round(leaf))
  lat0 = np.asarray(base.latency)
  assert np.all((p.latency > 0) == (lat0 > 0)[None])  # used stays used, 0 stays 0
  rc0 = np.asarray(base.res_cycles)
  assert np.all((p.res_cycles > 0) == (rc0 > 0)[None])
  assert np.all(np.abs(p.uops - np.asarray(base.uops)[None]) <= 1)
  assert set(np.unique(p.dispatch_width)) <= {2, 3, 4, 5, 6, 8}
  assert np.all((p.rob_size >= 0.5 * base.rob_size - 1) & (p.rob_size <= 2 * base.rob_size + 1))
  np.testing.assert_array_equal(p.read_advance, np.broadcast_to(base.read_advance,
                                                                p.read_advance.shape))
  # The tables really differ from the base and from each other.
  assert len(np.unique(p.rob_size)) > 4
  assert np.mean(p.latency[0] != lat0) > 0.2


def test_bad_arguments_are_named(haswell):
  with pytest.raises(ValueError, match="n must be"):
    sample_params(haswell, 0, seed=0)
  with pytest.raises(ValueError, match="scale"):
    sample_params(haswell, 2, seed=0, scale=0)
