"""Structure probes: they assemble, their verdicts recover known tables' structure from
the simulator's own cycles, and `apply` writes verdicts that the simulator gives back.

The simulator runs the probes on llvm-mca's tables (steady-state cycles per 100
iterations), so a verdict that misreads a probe fails here, without measuring. One
slow test measures the probes on the machine at hand.
"""

from __future__ import annotations

import platform
import shutil
import sys

import pytest

import diffsim
from diffsim.calibrate import probes as P
from diffsim.params.table import from_json, load_json

ALL_FLAGS = {"avx", "avx2", "fma", "avx512f"}
# Measured with `diffsim measure` on an AMD EPYC, AuthenticAMD family 25 model 17
# stepping 1 (Zen 4), a VM: cycles per iteration.
ZEN4 = {"dispatch.zero": 1.019, "dispatch.mix": 1.051, "alu.add": 2.996, "alu.addi": 2.999,
        "mul.units": 11.982, "mul.lat": 3.001, "load.units": 4.004, "load.lat": 3.999,
        "load.same": 4.001, "store.line": 3.999, "store.lines": 8.001, "fma.units@xmm": 7.504,
        "fma.lat@xmm": 3.997, "fadd.units@xmm": 6.000, "fadd.lat@xmm": 2.998,
        "fmul.units@xmm": 5.998, "fmul.lat@xmm": 2.999, "shuf.units@xmm": 4.002,
        "shuf.lat@xmm": 1.002, "fma.units@ymm": 7.494, "fma.lat@ymm": 3.999,
        "fadd.units@ymm": 5.982, "fadd.lat@ymm": 2.999, "fmul.units@ymm": 5.990,
        "fmul.lat@ymm": 3.002, "shuf.units@ymm": 3.978, "shuf.lat@ymm": 1.000,
        "fma.units@zmm": 14.991, "fma.lat@zmm": 3.993, "fadd.units@zmm": 11.998,
        "fadd.lat@zmm": 3.000, "fmul.units@zmm": 11.992, "fmul.lat@zmm": 2.998,
        "shuf.units@zmm": 8.000, "shuf.lat@zmm": 1.128, "stack.block": 4.004,
        "stack.pairs": 3.998, "move.elim": 0.331, "move.elim32": 0.334, "zero.xor": 1.000,
        "zero.vxor": 0.500, "forward.index": 6.007, "forward.base": 6.878,
        "forward.same": 0.994, "div.lat@32": 9.504, "div.lat@64": 9.615, "div.thr@32": 6.002,
        "div.thr@64": 6.997}
# Probes whose cycles are no structure `apply` writes: the stack probes' rate (push and
# pop micro-ops, with the stack engine either way), and renamed store/load pairs (Zen 4
# runs one a cycle, the simulator's at the dispatch rate; `forward.base` forwards on
# Zen 4 ~0.9 cycles slower than an indexed load, which no table field tells apart), the
# vxor chain's vmulpd rate (no probe sets it).
NOT_WRITTEN = {"stack.block", "stack.pairs", "forward.base", "forward.same", "zero.vxor"}


def _simulate(doc: dict) -> dict[str, float | None]:
  """Each probe's steady-state cycles per iteration on a table, None where it fails."""
  from diffsim.cli.predict import sim_predict

  ps = P.probes(ALL_FLAGS)
  blocks = diffsim.decode_blocks(P.probe_hexes(ps))
  res = sim_predict(from_json(doc), blocks, 100, "steady", False)
  return {p.name: None if c is None else c / 100 for p, (c, _) in zip(ps, res)}


class _Simulated(dict):
  """Each table's probe cycles, simulated on first use (a compile each)."""

  def __missing__(self, cpu: str) -> dict:
    self[cpu] = _simulate(load_json(cpu))
    return self[cpu]


@pytest.fixture(scope="module")
def simulated() -> dict[str, dict]:
  return _Simulated()


def _values(vs) -> dict:
  return {v.field: v.value for v in vs}


def test_probes_assemble_and_decode():
  ps = P.probes(ALL_FLAGS)
  assert len({p.name for p in ps}) == len(ps)
  hexes = P.probe_hexes(ps)
  blocks = diffsim.decode_blocks(hexes)
  for p, b in zip(ps, blocks):
    assert isinstance(b, diffsim.Block), (p.name, b)
    assert len(b.instrs) >= p.per or p.per == 1, p.name
  names = {p.name for p in P.probes(set())}
  assert not any(n.startswith(("fma", "fadd", "fmul", "shuf")) for n in names)
  assert "fma.units@zmm" not in {p.name for p in P.probes({"avx", "fma"})}
  assert "fma.units@ymm" in {p.name for p in P.probes({"avx", "fma"})}


def test_verdicts_recover_znver3(simulated):
  v = _values(P.verdicts(simulated["znver3"]))
  assert v["dispatch_width"] == 6
  assert v["alu_units"] == 4
  assert v["load_units"] == 3 and v["l1_bank_loads"] == 0
  assert v["mul_units"] == 1 and v["mul_latency"] == 3
  assert v["fma_latency@ymm"] == 4 and v["fadd_latency@ymm"] == 3
  assert v["fadd_units@ymm"] == 2 and v["split@ymm"] is False
  assert v["move_elimination"] is True and v["zero_idiom"] is True
  assert v["stack_engine"] is False and v["memory_dependences"] is False
  assert v["div_latency@64"] == 17 and v["div_cycles@64"] == 17  # Zn3ALU0 for 17 cycles
  assert "fma_units@zmm" not in v  # llvm-mca's tables hold no AVX-512 keys


@pytest.mark.slow
def test_verdicts_recover_skylake(simulated):
  v = _values(P.verdicts(simulated["skylake"]))
  assert v["dispatch_width"] == 6
  assert v["alu_units"] == 4
  assert v["load_units"] == 2 and v["store_units"] == 1
  assert v["fma_units@ymm"] == 2 and v["fadd_latency@ymm"] == 4 and v["shuf_units@ymm"] == 1
  assert v["move_elimination"] is False and v["stack_engine"] is False


@pytest.mark.slow
def test_verdicts_recover_graniterapids(simulated):
  """The starts' Xeon 6 facts: 5 ALUs, the L1 rules, memory renaming by address."""
  v = _values(P.verdicts(simulated["graniterapids"]))
  assert v["alu_units"] == 5
  assert v["store_units"] == 2 and v["l1_line_stores"] == 2
  assert v["l1_bank_loads"] == 2
  assert v["stack_engine"] is True
  assert v["memory_dependences"] is True and v["renaming_by_address"] is True


def test_verdicts_on_zen4_measurements():
  """What the measured Zen 4 shows (public figures: 6-wide dispatch, 4 ALUs, 3 loads
  and 2 stores a cycle, 2 FMA pipes of latency 4, 512-bit ops in two halves)."""
  vs = P.verdicts(ZEN4)
  v = _values(vs)
  assert v["dispatch_width"] == 6 and v["alu_units"] == 4
  assert v["load_units"] == 3 and v["load_latency"] == 4 and v["store_units"] == 2
  assert v["fma_units@ymm"] == 2 and v["fma_latency@ymm"] == 4
  assert v["split@zmm"] is True and v["split@ymm"] is False
  assert v["stack_engine"] and v["move_elimination"] and v["zero_idiom"]
  assert v["memory_dependences"] and v["memory_renaming"] and not v["renaming_by_address"]
  assert v["forward_latency"] == 6
  report = P.probe_report(vs)
  assert "dispatch_width" in report and "alu.add 2.996" in report
  assert P.verdicts({}) == []
  assert _values(P.verdicts({"alu.add": None, "alu.addi": 3.0}))["alu_units"] == 4


def _round_trip(measured: dict, base: str) -> tuple[dict, list[str], dict]:
  vs = P.verdicts(measured)
  doc, log = P.apply(load_json(base), vs)
  return doc, log, _simulate(doc)


@pytest.mark.parametrize("source,base", [
    ("zen4", "skylake"),
    pytest.param("graniterapids", "znver3", marks=pytest.mark.slow)])
def test_apply_round_trip(simulated, source, base):
  """The probes on the applied table give back what the verdicts came from, across
  resource names (Zen 4 into Skylake's ports; the Xeon 6 facts into Zen 3's pipes)."""
  measured = ZEN4 if source == "zen4" else simulated[source]
  base_doc = load_json(base)
  doc, log, got = _round_trip(measured, base)
  assert base_doc == load_json(base)  # a copy: the input is untouched
  assert log and all(isinstance(x, str) for x in log)
  bad = {k: (want, got.get(k)) for k, want in measured.items()
         if want is not None and k not in NOT_WRITTEN
         and (got.get(k) is None or abs(got[k] - want) > 0.1 * want + 0.1)}
  assert not bad, bad
  same = _values(P.verdicts(got))
  for field, value in _values(P.verdicts(measured)).items():
    if isinstance(value, bool):
      assert same[field] == value, field


def test_apply_generic_growth(tmp_path):
  """Growth joins the buffered groups around a group; names follow `<group>+<j>`."""
  doc, log = P.apply(load_json("znver3"), [P.Verdict("alu_units", 6, {})])
  res = {r["name"]: r for r in doc["resources"]}
  assert len(res["Zn3ALU0123"]["members"]) == 6
  assert "Zn3ALU0123+0" in res["Zn3Int"]["members"]
  assert "Zn3ALU0123+0" not in res["Zn3ALU03"]["members"]
  assert any("4 -> 6 units" in x for x in log)
  from diffsim.params.table import write_json

  write_json(doc, tmp_path / "grown.json")  # loads by path and simulates
  table = diffsim.load_table(str(tmp_path / "grown.json"))
  alu = [p for p in P.probes(set()) if p.name == "alu.add"]
  blocks = diffsim.decode_blocks(P.probe_hexes(alu))
  cycles = diffsim.simulate(table, diffsim.encode(table, blocks))
  assert int(cycles.status[0]) == 0
  doc, _ = P.apply(load_json("skylake"), [P.Verdict("alu_units", 3, {})])
  assert len({r["name"]: r for r in doc["resources"]}["SKLPort0156"]["members"]) == 3


@pytest.mark.slow
@pytest.mark.skipif(sys.platform != "linux" or platform.machine() not in ("x86_64", "AMD64")
                    or not (shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")),
                    reason="measuring needs x86-64 Linux and a C compiler")
def test_measure_probes_here():
  from diffsim.measure import MeasureConfig, measure_hexes

  ps = P.probes()
  results, _ = measure_hexes(P.probe_hexes(ps), MeasureConfig.quick())
  measured = {p.name: None if r.cycles is None else r.cycles / 100 for p, r in zip(ps, results)}
  assert sum(x is not None for x in measured.values()) >= len(ps) - 2
  v = _values(P.verdicts(measured))
  assert 2 <= v["dispatch_width"] <= 12 and 1 <= v["alu_units"] <= 8
  assert v["load_units"] >= 1 and v["store_units"] >= 1
  assert v["zero_idiom"] is True  # every x86-64 core since 2006
