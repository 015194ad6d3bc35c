"""Search spaces, lowering and validity rules, with the real decoder and tables."""

import numpy as np
import pytest

from diffsim.params.table import load_table
from diffsim.search.codegen import assembly, lower, lower_many
from diffsim.search.space import ISAS, TASKS, get_task
from diffsim.sim.blocks import block_error


@pytest.mark.parametrize("name", sorted(TASKS))
def test_every_config_lowers_or_has_a_reason(name):
  task = TASKS[name]
  table = load_table("haswell")
  ok = [c for c in task.configs if task.static_error(c) is None]
  blocks = lower_many(task, ok)
  for c, b in zip(ok, blocks):
    assert not isinstance(b, Exception), (c, b)
    err = block_error(table, b)
    # The only target-dependent failure is an ISA the table lacks (AVX-512 here).
    assert err is None or (c[0] == "avx512" and "not in the" in err), (c, err)
    if c[0] != "avx512":
      assert err is None
  bad = [c for c in task.configs if task.static_error(c) is not None]
  assert bad, "every task has configurations a compiler would refuse"
  for c in bad:
    with pytest.raises(ValueError, match="registers|divide"):
      assembly(task, c)


def test_batched_lowering_matches_parse_asm():
  task = TASKS["gemm"]
  ok = [c for c in task.configs if task.static_error(c) is None][::97]
  assert lower_many(task, ok) == [lower(task, c) for c in ok]


def test_register_rule():
  gemm = TASKS["gemm"]
  # 4 x 3 accumulators x 1 set + 4 A registers + 3 broadcasts = 19 > 16 for AVX2 ...
  c = ("avx2", 4, 3, 1, 1, "broadcast", "grouped")
  assert gemm.live_vector_registers(c) == 19
  assert "16" in gemm.static_error(c)
  # ... but fits AVX-512's 32 registers (4 x 16 lanes = 64 rows do not divide M=96, so
  # take 3 rows there).
  assert gemm.static_error(("avx512", 3, 3, 1, 1, "broadcast", "grouped")) is None
  assert "registers" in gemm.static_error(("avx512", 4, 8, 4, 2, "broadcast", "grouped"))


def test_divisibility_rules():
  gemm, dot = TASKS["gemm"], TASKS["dot"]
  assert "N=24" in gemm.static_error(("avx2", 1, 5, 1, 1, "loadop", "interleaved"))
  assert "M=96" in gemm.static_error(("avx512", 4, 1, 1, 1, "loadop", "interleaved"))
  assert "accumulator" in gemm.static_error(("avx2", 1, 1, 1, 2, "loadop", "interleaved"))
  assert "N=2400" in dot.static_error(("avx2", 8, 1, "loadop", "interleaved"))
  assert "accumulators" in dot.static_error(("avx2", 3, 2, "loadop", "interleaved"))


def test_useful_ops_and_features():
  gemm = TASKS["gemm"]
  c = ("avx2", 2, 3, 4, 1, "broadcast", "grouped")
  assert gemm.useful_ops(c) == 2 * 2 * ISAS["avx2"][1] * 3 * 4
  f = gemm.features
  assert f.shape[0] == gemm.size and f.dtype == np.float32 and np.isfinite(f).all()


def test_unknown_task():
  with pytest.raises(ValueError, match="unknown task"):
    get_task("fft")
