"""Starting tables built from public hardware facts, for CPUs LLVM 14 has no model of.

A fit can only move the numbers of the structure it starts from: with znver3's three
load pipes and one store per cycle, no amount of fitting finds Zen 5's four loads and
two stores. `zen5_facts` takes llvm-mca's znver3 table and changes what AMD's Zen 5
documents say differs (the widths, the units, a few instructions' costs; sources in
`docs/zen5-facts.md`, cited by tag). It is a prior for the fit, never a substitute:
the measurements decide every number afterwards (`diffsim.fit.exact`).

Starts are named like shipped tables (`load_table("zen5-facts")`).
"""

from __future__ import annotations

import copy
import re
from typing import Callable

# Instructions whose Zen 5 latency and throughput the facts give (ILX), by opcode prefix:
# (latency, resource group, cycles).
_ZEN5_ALU_COSTS = {
    ("BSF", "BSR", "TZCNT"): (1, "Zn3ALU12", 1),  # L 1, T 0.33
    ("LZCNT", "POPCNT"): (1, "Zn3ALU0123", 1),  # L 1, T 0.19
}
_LOADED = ("Zn3LSU", "Zn3Load", "Zn3AGU012")


def zen5_facts(znver3: dict) -> dict:
  """Zen 5 from znver3 (llvm-mca's JSON form) and `docs/zen5-facts.md`:
  - dispatch and retire 8 wide, ROB 448, 240 integer registers, store queue 104 (SOG);
  - 6 ALUs, 3 of them multiply, 3 shift (HC, SOG): two more ALUs, a 3-unit multiply
    group, a third shift unit;
  - 4 AGUs and 4 load pipes, at most 2 stores per cycle (HC, ILX): a fourth AGU, LSU
    and load unit, and stores that hold a store unit one cycle instead of two;
  - the stack engine: push, pop, call and ret update rsp without a 1-cycle chain (ILX);
  - BSF/BSR/TZCNT/LZCNT/POPCNT 1 cycle, CMOV and the accumulator forms of ALU
    operations on any ALU for one cycle (ILX);
  - a store's data does not hold its address back (separate micro-ops): read-advance 5
    on the data of plain stores.
  Names keep znver3's (`Zn3ALU0123` now has 6 members), so tables stay comparable.
  """
  d = copy.deepcopy(znver3)
  d["cpu"] = "zen5-facts"
  d["source"] = "znver3 (llvm-mca 14) changed by the public Zen 5 facts (diffsim.params.starts)"
  g = d["global"]
  g.update(dispatch_width=8, rob_size=448, retire_width=8, store_queue=104)
  for f in g.get("register_files", []):
    if "gpr" in f.get("classes", ()):
      f["size"] = 240
  units = [r for r in d["resources"] if "members" not in r]
  groups = [r for r in d["resources"] if "members" in r]
  units += [{"name": n, "units": 1, "buffer": -1} for n in ("Zn3AGU3", "Zn3ALU4", "Zn3ALU5")]
  for u in units:
    if u["name"] in ("Zn3LSU", "Zn3Load"):
      u["units"] = 4
  extra = {"Zn3AGU012": ["Zn3AGU3"], "Zn3ALU0123": ["Zn3ALU4", "Zn3ALU5"],
           "Zn3ALU12": ["Zn3ALU5"], "Zn3Int": ["Zn3AGU3", "Zn3ALU4", "Zn3ALU5"]}
  for gr in groups:
    gr["members"] = gr["members"] + extra.get(gr["name"], [])
  groups.append({"name": "Zn5ALUMul", "members": ["Zn3ALU1", "Zn3ALU2", "Zn3ALU4"],
                 "buffer": -1})
  d["resources"] = units + groups
  for key, op in d["opcodes"].items():
    res = [list(r) for r in op.get("resources", [])]
    if op.get("may_store"):  # two stores per cycle: one cycle of a store unit each
      res = [[r, max(1, c // 2)] if r in ("Zn3Store", "Zn3LSU") else [r, c] for r, c in res]
    res = [["Zn5ALUMul", c] if r == "Zn3ALU1" else [r, c] for r, c in res]  # 3 multipliers
    base = key.split("@")[0]
    for prefixes, (lat, group, cycles) in _ZEN5_ALU_COSTS.items():
      if base.startswith(prefixes):
        loaded = [r for r in res if r[0] in _LOADED]
        op["uops"] = 1
        op["latency"] = lat + (4 if loaded else 0)
        res = [[group, cycles]] + loaded
    if base.startswith("CMOV") and base.endswith("rr"):
      res = [["Zn3ALU0123", 1]]
    if re.fullmatch(r"(ADD|SUB|AND|OR|XOR)(8i8|16i16|32i32|64i32)", base):
      res = [["Zn3ALU0123", 1]]  # znver3 holds an ALU 4 cycles; ADD T 0.19 (ILX)
    if op.get("may_store") and not op.get("may_load"):
      # A store's address and data are separate micro-ops: its data can arrive after
      # it issues (a PUSH+POP pair L 0.56, ILX), as a read-advance of the data source.
      op.setdefault("read_advance", {})["op"] = 5
    if base.startswith(("PUSH", "POP", "CALL", "RET")) and not base.startswith("POPCNT"):
      op.setdefault("write_latency", {})["RSP"] = 0
    if res:
      op["resources"] = res
    op.pop("kept", None)
  return d


# name -> (the llvm-mca table it starts from, the change)
STARTS: dict[str, tuple[str, Callable[[dict], dict]]] = {"zen5-facts": ("znver3", zen5_facts)}
