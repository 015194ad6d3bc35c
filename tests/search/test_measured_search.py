"""Search with real measurements (`diffsim search --measure`): the harness, no mocks.

The tests that measure are skipped where the harness cannot run (not x86-64 Linux, no C
compiler). Timings come from a shared machine, so the checks are on orders and wide
ranges, not exact cycles. Which table guides the search is checked on recorded CPU
identities, whatever the machine.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from diffsim.cli import main
from diffsim.measure import MeasureConfig, MeasureError, measure_hexes, runner_path
from diffsim.measure.cpu import cpu_identity
from diffsim.params.table import load_table
from diffsim.search.codegen import lower_many
from diffsim.search.measured import MeasuredObjective, cpu_key, measure_space, table_for_cpu
from diffsim.search.space import TASKS, Knob


@pytest.fixture(scope="module")
def harness():
  try:
    runner_path()
  except MeasureError as e:
    pytest.skip(f"the measure harness cannot run here: {e}")


def _cpu(vendor: str, family: int, model: int) -> dict:
  return {"vendor": vendor, "family": family, "model": model, "stepping": 1}


# (what cpu_identity reports, the table that should guide the search): cores with a
# fitted table, cores nearest an llvm-mca model, and the fallbacks.
CPUS = {
  "zen4 (this kind of VM: EPYC 9004)": (_cpu("AuthenticAMD", 25, 17), "zen4"),
  "zen4 desktop (Raphael)": (_cpu("AuthenticAMD", 25, 97), "zen4"),
  "zen3 (Milan): family 25's llvm-mca model": (_cpu("AuthenticAMD", 25, 1), "znver3"),
  "zen5 (Turin)": (_cpu("AuthenticAMD", 26, 2), "zen5"),
  "zen5 desktop (Granite Ridge)": (_cpu("AuthenticAMD", 26, 68), "zen5"),
  "granite rapids": (_cpu("GenuineIntel", 6, 173), "graniterapids"),
  "xeon 6 VM, model masked": (_cpu("GenuineIntel", 6, 167), "graniterapids"),
  "ice lake server": (_cpu("GenuineIntel", 6, 106), "icelake-client"),
  "ice lake client": (_cpu("GenuineIntel", 6, 126), "icelake-client"),
  "zen2, no fitted table: the vendor's": (_cpu("AuthenticAMD", 23, 49), "znver3"),
  "intel outside family 6: the vendor's": (_cpu("GenuineIntel", 15, 6), "skylake"),
  "unknown vendor": (_cpu("HygonGenuine", 24, 0), "skylake"),
  "nothing known": ({}, "skylake"),
}


@pytest.mark.parametrize("name", sorted(CPUS))
def test_a_cpu_gets_its_closest_shipped_table(name):
  identity, want = CPUS[name]
  assert table_for_cpu(identity) == want


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


def test_an_fma_chain_measures_its_latency(harness):
  if not {"avx2", "fma"} <= _flags():
    pytest.skip("no AVX2 and FMA on this CPU")
  task = TASKS["gemm"]
  obj = MeasuredObjective(task, isas=("sse", "avx2"))
  i = task.configs.index(task.default)  # one accumulator: a chain of dependent FMAs
  cost = float(obj([i])[0])
  cycles = cost * task.useful_ops(task.default)
  assert 3.5 < cycles < 5.5, cycles  # FMA latency 4 (Intel since Skylake, AMD) or 5 (Haswell)


def test_exhaustive_run_finds_the_independent_accumulators(tmp_path, harness):
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


def test_every_table_picked_is_shipped_and_this_cpu_gets_one():
  for name in {want for _, want in CPUS.values()} | {table_for_cpu(cpu_identity())}:
    assert load_table(name).layout.keys, name


def test_cpu_keys_name_the_model_and_are_file_names():
  assert cpu_key(_cpu("GenuineIntel", 6, 167)) == "GenuineIntel-6-167-1"
  assert cpu_key({"vendor": "A B/C", "family": 25}) == "A_B_C-25-None-None"


@pytest.mark.slow  # measures three loops twice
def test_the_objective_returns_what_the_harness_measures_per_flop(harness):
  # Three dot loops of FMA chains, 1, 3 and 6 FMAs deep (about 4, 12 and 24 cycles an
  # iteration), asked for out of index order in one call: each cost must be the
  # harness's own cycles for that configuration's lowered bytes, over 100 iterations
  # and the iteration's flops. A mixed-up index is off by 2x or more in cycles, a
  # missing divisor by 6x or 100x; repeated timings of a chain agree far closer.
  if not {"avx2", "fma"} <= _flags():
    pytest.skip("no AVX2 and FMA on this CPU")
  task = TASKS["dot"]
  configs = [("avx2", 6, 1, "loadop", "grouped"), task.default,
             ("avx2", 6, 2, "loadop", "grouped")]
  ids = [task.configs.index(c) for c in configs]
  assert ids != sorted(ids)
  obj = MeasuredObjective(task, isas=("sse", "avx2"))
  deep, one, two_chains = got = obj(ids)
  direct, _ = measure_hexes([b.hex for b in lower_many(task, configs)], MeasureConfig.quick())
  for i, c, cost, r in zip(ids, configs, got, direct):
    assert r.cycles is not None, r.error
    assert np.isclose(cost, obj.cycles[i] / 100 / task.useful_ops(c))
    assert 0.8 < obj.cycles[i] / r.cycles < 1.25, (c, obj.cycles[i], r.cycles)
  # One FMA chain: the FMA's latency (3.5 to 5.5 cycles) for 16 flops, however deep;
  # two chains halve the cost per flop.
  assert 3.5 / 16 < one < 5.5 / 16, got
  assert 0.8 < deep / one < 1.25 and 1.6 < deep / two_chains < 2.5, got
  assert obj.seconds > 0 and obj.invalid == 0


def test_search_measure_end_to_end(capsys, tmp_path, monkeypatch, harness):
  monkeypatch.setenv("DIFFSIM_SEARCH_CACHE", str(tmp_path))
  rc = main(["search", "axpy", "--measure", "--target", "haswell", "--budget", "4",
             "--method", "random", "--seed", "1"])
  out = capsys.readouterr()
  assert rc == 0, out.err
  assert "measured:" in out.out and "config: isa=" in out.out and "CPU:" in out.out
  assert "reproduce: diffsim search axpy --target haswell --measure --budget 4" in out.out
  assert "no exhaustive measured run" in out.err
