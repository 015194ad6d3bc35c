"""Tests of diffsim.params.export: writing tables back to JSON, growing resources."""

import dataclasses
import json

import numpy as np
import pytest

from diffsim.data import load_csv, shipped
from diffsim.isa import decode_blocks
from diffsim.params.export import grow, grow_table, to_json
from diffsim.params.table import from_json, load_json, load_table
from diffsim.sim import simulate_blocks

# Six independent `add reg, 1` (rax rbx rcx rdx rsi rdi): only the ALUs limit them.
SIX_ADDS = "4883c0014883c3014883c1014883c2014883c6014883c701"


def _arrays_equal(a, b):
  """Names of the fields of two pytrees (Params or Structure) that differ."""
  out = []
  for f in dataclasses.fields(a):
    x, y = np.asarray(getattr(a, f.name)), np.asarray(getattr(b, f.name))
    if x.shape != y.shape or x.dtype != y.dtype or not np.array_equal(x, y):
      out.append(f.name)
  return out


@pytest.mark.parametrize("cpu", ["haswell", "skylake", "znver3"])
def test_round_trip_is_exact(cpu):
  t = load_table(cpu)
  doc = json.loads(json.dumps(to_json(t)))  # plain JSON types only
  u = from_json(doc)
  assert not _arrays_equal(t.params, u.params)
  assert not _arrays_equal(t.structure, u.structure)
  assert u.layout == t.layout
  assert (u.layout.keys, u.layout.units, u.layout.groups, u.layout.group_members) == (
      t.layout.keys, t.layout.units, t.layout.groups, t.layout.group_members)
  assert doc["cpu"] == cpu and doc["global"]["register_files"] == load_json(cpu)["global"][
      "register_files"]


def test_round_trip_simulates_the_same():
  t = load_table("znver3")
  ds = load_csv(shipped("mca-small.csv"))
  # Blocks of one length bucket: one compilation, shared by both tables.
  blocks = [b for b in decode_blocks(list(ds.hex[:100]))
            if not isinstance(b, Exception) and len(b.instrs) <= 8][:50]
  u = from_json(to_json(t))
  a, b = simulate_blocks(t, blocks), simulate_blocks(u, blocks)
  assert sum(p.cycles is not None for p in a) >= 40
  assert a == b


def test_to_json_rounds_fitted_numbers():
  t = load_table("znver3")
  p = t.params
  fitted = p.replace(
      uops=p.uops * 0 + 0.2, latency=p.latency + 0.4, read_advance=p.read_advance - 0.3,
      res_cycles=np.where(p.res_cycles > 0, 0.3, 0.0).astype(np.float32),
      dispatch_width=np.float32(5.6), rob_size=np.float32(200.4),
      prf_size=p.prf_size + 10.2)
  doc = to_json(t, fitted, cpu="zen5", source="test")
  assert doc["cpu"] == "zen5" and doc["source"] == "test"
  assert doc["global"]["dispatch_width"] == 6 and doc["global"]["rob_size"] == 200
  assert [f["size"] for f in doc["global"]["register_files"]] == [170, 202]
  u = from_json(doc)
  assert np.all(u.params.uops == 1)
  np.testing.assert_array_equal(u.params.latency, np.rint(p.latency + 0.4))
  np.testing.assert_array_equal(u.params.read_advance, np.rint(p.read_advance - 0.3))
  np.testing.assert_array_equal(u.params.res_cycles, (p.res_cycles > 0).astype(np.float32))
  assert not _arrays_equal(t.structure, u.structure)
  assert u.layout == dataclasses.replace(t.layout, cpu="zen5")


def test_grow_group_adds_members():
  t = load_table("znver3")
  g, q = grow_table(t, None, "Zn3ALU0123", 2)
  assert len(g.layout.units) == len(t.layout.units) + 2
  assert {"Zn3ALU0123+1", "Zn3ALU0123+2"} <= set(g.layout.units)
  mask = g.layout.group_members[g.layout.groups.index("Zn3ALU0123")]
  assert mask.bit_count() == 6
  # Other groups keep their members; opcodes keep their cycles by name.
  for name in ("Zn3Int", "Zn3ALU03"):
    old = t.layout.group_members[t.layout.groups.index(name)]
    new = g.layout.group_members[g.layout.groups.index(name)]
    assert [t.layout.units[b] for b in range(32) if old >> b & 1] == [
        g.layout.units[b] for b in range(32) if new >> b & 1]
  assert q is g.params
  old_names = list(t.layout.units) + list(t.layout.groups)
  new_names = list(g.layout.units) + list(g.layout.groups)
  for r, n in enumerate(new_names):
    if n in old_names:
      np.testing.assert_array_equal(q.res_cycles[:, r], t.params.res_cycles[:, old_names.index(n)])
      assert q.buffer_size[r] == t.params.buffer_size[old_names.index(n)]
    else:
      assert not np.any(q.res_cycles[:, r])


def test_grow_kind_adds_units():
  t = load_table("znver3")
  g, _ = grow_table(t, None, "Zn3Load", 1)
  assert [u for u in g.layout.units if u.startswith("Zn3Load#")] == [
      f"Zn3Load#{i}" for i in range(4)]
  mask = g.layout.group_members[g.layout.groups.index("Zn3Load")]
  assert mask.bit_count() == 4
  doc = grow(load_json("znver3"), "Zn3Load", 1)
  assert next(r for r in doc["resources"] if r["name"] == "Zn3Load")["units"] == 4
  assert next(r for r in load_json("znver3")["resources"] if r["name"] == "Zn3Load")[
      "units"] == 3


def test_grow_keeps_fitted_floats():
  t = load_table("znver3")
  p = t.params.replace(latency=t.params.latency + 0.25, res_cycles=t.params.res_cycles * 1.5)
  g, q = grow_table(t, p, "Zn3ALU0123", 1)
  np.testing.assert_array_equal(q.latency, p.latency)
  col = (list(g.layout.units) + list(g.layout.groups)).index("Zn3ALU0123")
  old = list(t.layout.groups).index("Zn3ALU0123") + len(t.layout.units)
  np.testing.assert_array_equal(q.res_cycles[:, col], p.res_cycles[:, old])


def test_grow_limits():
  doc = load_json("znver3")  # 23 units
  grow(doc, "Zn3ALU0123", 8)
  with pytest.raises(ValueError, match="Zn3ALU0123"):
    grow(doc, "Zn3ALU0123", 9)
  with pytest.raises(ValueError, match="Zn3LSU"):
    grow(doc, "Zn3LSU", 20)
  with pytest.raises(ValueError, match="NoSuchPort"):
    grow(doc, "NoSuchPort", 1)


def test_more_alus_run_six_adds_faster():
  t = load_table("znver3")
  g, _ = grow_table(t, None, "Zn3ALU0123", 2)
  blocks = decode_blocks([SIX_ADDS])
  assert [i.key for i in blocks[0].instrs] == ["ADD64ri8"] * 6
  before = simulate_blocks(t, blocks, throughput="steady")[0].cycles
  after = simulate_blocks(g, blocks, throughput="steady")[0].cycles
  assert before == pytest.approx(150, abs=1)  # 6 adds on 4 ALUs
  assert after < before
  assert after == pytest.approx(100, abs=1)  # 6 ALUs; dispatch width 6
