"""The roofline: the table read against each configuration, checked against the
simulator's own costs and against what each variant changes."""

import numpy as np
import pytest
from scipy.stats import kendalltau

from diffsim.params.table import load_table
from diffsim.search.cpus import load_cpu
from diffsim.search.evaluate import enumerate_costs
from diffsim.search.roofline import NORM, roofline
from diffsim.search.space import TASKS


@pytest.fixture(scope="module")
def dot():
  return TASKS["dot"]


def _index(task, **knobs):
  return next(i for i, c in enumerate(task.configs)
              if all(task.as_dict(c)[k] == v for k, v in knobs.items()))


def test_invalid_configurations_have_no_roofline(dot):
  r = roofline(dot, load_table("haswell"))
  static = np.array([dot.static_error(c) is not None for c in dot.configs])
  # A table without AVX-512 lacks every avx512 configuration's instructions.
  avx512 = np.array([dot.as_dict(c)["isa"] == "avx512" for c in dot.configs])
  assert np.isinf(r[static | avx512]).all() and np.isfinite(r[~static & ~avx512]).all()


@pytest.fixture(scope="module")
def haswell_dot(dot, tmp_path_factory):
  """The simulated cost of every dot configuration on haswell."""
  with pytest.MonkeyPatch.context() as mp:
    mp.setenv("DIFFSIM_SEARCH_CACHE", str(tmp_path_factory.mktemp("enum")))
    return enumerate_costs(load_table("haswell"), dot).cost


def test_roofline_ranks_configurations_as_the_simulator_does(dot, haswell_dot):
  cost = haswell_dot
  r = roofline(dot, load_table("haswell"))
  ok = np.isfinite(cost) & np.isfinite(r)
  assert ok.sum() > 50
  assert kendalltau(r[ok], cost[ok])[0] > 0.6
  # Its favourite is within 5% of the simulated optimum.
  assert cost[np.argmin(r)] <= 1.05 * np.nanmin(cost)


def test_the_largest_bound_is_a_lower_bound_on_the_simulated_cost(dot, haswell_dot):
  strict = roofline(dot, load_table("haswell"), norm=np.inf)
  ok = np.isfinite(haswell_dot) & np.isfinite(strict)
  # Within 1%: the simulated cost is a steady state read over finitely many iterations.
  assert (strict[ok] <= 1.01 * haswell_dot[ok]).all()
  # The norm that combines the four bounds only raises it, by at most 4 ** (1 / NORM).
  r = roofline(dot, load_table("haswell"))
  assert (r[ok] >= strict[ok]).all() and (r[ok] <= 4 ** (1 / NORM) * strict[ok] * 1.0001).all()


def test_each_variant_moves_the_bound_it_should(dot):
  base = roofline(dot, load_table("haswell"))
  # One accumulator: the FMA chain binds, so doubling FP latency doubles the roofline.
  chain = _index(dot, isa="avx2", accumulators=1, unroll=1, form="load")
  lat2 = roofline(dot, load_cpu("haswell/fma-lat2x"))
  assert lat2[chain] == pytest.approx(2 * base[chain], rel=0.05)
  # Dispatch two wide: a wide unrolled body becomes front-end bound and slower.
  wide = _index(dot, isa="avx2", accumulators=4, unroll=4, form="load")
  assert roofline(dot, load_cpu("haswell/narrow"))[wide] > 1.3 * base[wide]
  # No 256-bit datapath: AVX2 configurations get slower, SSE ones do not.
  split = roofline(dot, load_cpu("haswell/split256"))
  sse = _index(dot, isa="sse", accumulators=4, unroll=4)
  assert split[wide] > 1.3 * base[wide] and split[sse] == pytest.approx(base[sse])
