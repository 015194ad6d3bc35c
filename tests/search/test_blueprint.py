"""The Blueprint on shipped tables."""

import numpy as np

from diffsim.params.sample import sample_params, table_at
from diffsim.params.table import load_table
from diffsim.search.blueprint import NAMES, blueprint, supported_isas


def _named(table):
  return dict(zip(NAMES, blueprint(table)))


def test_shape_and_known_values():
  hsw = load_table("haswell")
  b = blueprint(hsw)
  assert b.shape == (len(NAMES),) and b.dtype == np.float32 and np.isfinite(b).all()
  n = _named(hsw)
  # Haswell: FMA latency 5 on 2 ports (llvm-mca's HWPort01), dispatch width 4, ROB 192.
  assert n["fma256.latency"] * 8 == 5
  assert n["fma256.ports"] * 8 == 2
  assert n["dispatch_width"] * 8 == 4
  assert np.isclose(n["log_rob"] * 9, np.log2(192))
  assert supported_isas(hsw) == ("sse", "avx2")
  assert n["has_avx512"] == 0 and n["vector_registers"] * 32 == 16


def test_blueprints_tell_cpus_apart():
  hsw, zn3 = load_table("haswell"), load_table("znver3")
  assert not np.allclose(blueprint(hsw), blueprint(zn3))
  # A sampled table with another dispatch width has another blueprint.
  stacked = sample_params(hsw, 4, seed=3)
  bps = [blueprint(table_at(hsw, stacked, i)) for i in range(4)]
  assert len({b.tobytes() for b in bps}) == 4
