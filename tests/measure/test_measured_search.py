"""Search with real measurements (`diffsim search --measure`): the harness, no mocks.

Skipped where the harness cannot run (not x86-64 Linux, no C compiler). Timings come
from a shared machine, so the checks are on orders and wide ranges, not exact cycles.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from diffsim.cli import main
from diffsim.measure import MeasureError, runner_path
from diffsim.measure.cpu import cpu_identity
from diffsim.measure.search import MeasuredObjective, measure_space, table_for_cpu
from diffsim.search.space import TASKS, Knob


@pytest.fixture(scope="module", autouse=True)
def harness():
  try:
    runner_path()
  except MeasureError as e:
    pytest.skip(f"the measure harness cannot run here: {e}")


def _flags() -> set[str]:
  with open("/proc/cpuinfo") as f:
    for line in f:
      if line.startswith("flags"):
        return set(line.split(":", 1)[1].split())
  return set()


# dot with 4 configurations: one and four accumulators (one invalid: 4 accumulators
# cannot split an unroll of 1).
TINY = dataclasses.replace(
  TASKS["dot"], name="dot",
  knobs=(Knob("isa", ("avx2",)), Knob("unroll", (1, 4)), Knob("accumulators", (1, 4)),
         Knob("form", ("loadop",)), Knob("order", ("grouped",))))


def test_invalid_configurations_have_reasons_and_cost_nothing():
  task = TASKS["gemm"]
  obj = MeasuredObjective(task, isas=("sse", "avx2"))
  bad_isa = next(i for i, c in enumerate(task.configs)
                 if c[0] == "avx512" and task.static_error(c) is None)
  bad_regs = next(i for i, c in enumerate(task.configs) if task.static_error(c))
  out = obj([bad_isa, bad_regs])
  assert np.isnan(out).all() and obj.invalid == 2 and obj.seconds == 0.0
  assert "target lacks it" in obj.errors[bad_isa]


def test_an_fma_chain_measures_its_latency():
  if not {"avx2", "fma"} <= _flags():
    pytest.skip("no AVX2 and FMA on this CPU")
  task = TASKS["gemm"]
  obj = MeasuredObjective(task, isas=("sse", "avx2"))
  i = task.configs.index(task.default)  # one accumulator: a chain of dependent FMAs
  cost = float(obj([i])[0])
  cycles = cost * task.useful_ops(task.default)
  assert 3.5 < cycles < 5.5, cycles  # FMA latency 4 (Intel since Skylake, AMD) or 5 (Haswell)


def test_exhaustive_run_finds_the_independent_accumulators(tmp_path):
  if not {"avx2", "fma"} <= _flags():
    pytest.skip("no AVX2 and FMA on this CPU")
  space = measure_space(TINY, isas=("avx2",), path=tmp_path / "tiny.json")
  assert int(space.costs.valid.sum()) == 3
  assert "accumulators" in space.costs.errors[TINY.configs.index(("avx2", 1, 4, "loadop",
                                                                  "grouped"))]
  best = TINY.configs[int(np.nanargmin(space.costs.cost))]
  assert best == ("avx2", 4, 4, "loadop", "grouped")  # four chains in flight, not one
  chain = space.costs.cost[TINY.configs.index(("avx2", 1, 1, "loadop", "grouped"))]
  assert chain / space.costs.optimum > 2.0
  again = measure_space(TINY, isas=("avx2",), path=tmp_path / "tiny.json")  # cached
  np.testing.assert_array_equal(again.costs.cost, space.costs.cost)
  assert again.date == space.date


def test_table_for_this_cpu_is_shipped():
  from diffsim.params.table import load_table

  assert load_table(table_for_cpu(cpu_identity())).layout.keys


def test_search_measure_end_to_end(capsys, tmp_path, monkeypatch):
  monkeypatch.setenv("DIFFSIM_SEARCH_CACHE", str(tmp_path))
  rc = main(["search", "axpy", "--measure", "--target", "haswell", "--budget", "4",
             "--method", "random", "--seed", "1"])
  out = capsys.readouterr()
  assert rc == 0, out.err
  assert "measured:" in out.out and "config: isa=" in out.out and "CPU:" in out.out
  assert "reproduce: diffsim search axpy --target haswell --measure --budget 4" in out.out
  assert "no exhaustive measured run" in out.err
