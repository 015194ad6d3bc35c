"""Starting tables built from public hardware facts, for CPUs LLVM 14 has no model of.

A fit can only move the numbers of the structure it starts from: with znver3's three
load pipes and one store per cycle, no amount of fitting finds Zen 5's four loads and
two stores. `zen5_facts` takes llvm-mca's znver3 table and changes what AMD's Zen 5
documents say differs (the widths, the units, a few instructions' costs; sources in
`zen5-facts.md` beside this file, cited by tag). It is a prior for the fit, never a
substitute: the measurements decide every number afterwards (`diffsim.fit.exact`).

Starts are named like shipped tables (`load_table("zen5-facts")`).
"""

from __future__ import annotations

import copy
import re
from typing import Callable

from diffsim.isa.idioms import LEA_INDEX, LEA_OPCODES, LEA_SCALE

# Instructions whose Zen 5 latency and throughput the facts give (ILX), by opcode prefix:
# (latency, resource group, cycles).
_ZEN5_ALU_COSTS = {
    ("BSF", "BSR", "TZCNT"): (1, "Zn3ALU12", 1),  # L 1, T 0.33
    ("LZCNT", "POPCNT"): (1, "Zn3ALU0123", 1),  # L 1, T 0.19
}
_LOADED = ("Zn3LSU", "Zn3Load", "Zn3AGU012")
# Cycles a load that takes a forwarded store's data waits beyond the data's producer,
# on top of its own latency: `movq (%r12),%rdi; movq %rdi,(%rbx)` measures 7 cycles an
# iteration in the project's Zen 5 measurements (zen5-measured.csv), the load's 5 plus 2.
_ZEN5_FORWARDING = 2


def zen5_facts(znver3: dict) -> dict:
  """Zen 5 from znver3 (llvm-mca's JSON form) and `zen5-facts.md`:
  - dispatch and retire 8 wide, ROB 448, 240 integer registers, store queue 104 (SOG);
  - 6 ALUs, 3 of them multiply, 3 shift (HC, SOG): two more ALUs, a 3-unit multiply
    group, a third shift unit;
  - 4 AGUs and 4 load pipes, at most 2 stores per cycle (HC, ILX): a fourth AGU, LSU
    and load unit, stores that hold a store unit one cycle instead of two, and a
    second FP store pipe (HC: 2 store / FP-to-int pipes);
  - the stack engine: push, pop, call and ret update rsp without a 1-cycle chain (ILX);
  - BSF/BSR/TZCNT/LZCNT/POPCNT 1 cycle, CMOV and the accumulator forms of ALU
    operations on any ALU for one cycle (ILX);
  - a store's data does not hold its address back (separate micro-ops): read-advance 5
    on the data of plain stores;
  - memory dependences (`diffsim.isa.memory`: the measurement harness makes which
    accesses alias decidable): forwarded stores cost a load 2 cycles more, renamed
    ones (same address written the same way, push/pop pairs) nothing.
  Names keep znver3's (`Zn3ALU0123` now has 6 members), so tables stay comparable.
  """
  d = copy.deepcopy(znver3)
  d["cpu"] = "zen5-facts"
  d["source"] = "znver3 (llvm-mca 14) changed by the public Zen 5 facts (diffsim.params.starts)"
  g = d["global"]
  g.update(dispatch_width=8, rob_size=448, retire_width=8, store_queue=104,
           memory_dependences=True)
  for f in g.get("register_files", []):
    if "gpr" in f.get("classes", ()):
      f["size"] = 240
  units = [r for r in d["resources"] if "members" not in r]
  groups = [r for r in d["resources"] if "members" in r]
  units += [{"name": n, "units": 1, "buffer": -1} for n in ("Zn3AGU3", "Zn3ALU4", "Zn3ALU5")]
  for u in units:
    if u["name"] in ("Zn3LSU", "Zn3Load"):
      u["units"] = 4
    if u["name"] == "Zn3FPSt":  # two store / FP-to-int pipes (HC)
      u["units"] = 2
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
    _stack_engine_and_store_data(key, op)
    if op.get("may_load"):  # a forwarded store's data reaches the load 2 cycles late
      op.setdefault("read_advance", {})["mem"] = -_ZEN5_FORWARDING
    if res:
      op["resources"] = res
    op.pop("kept", None)
  return d


def _stack_engine_and_store_data(key: str, op: dict) -> None:
  """What every current x86 core does and llvm-mca's models lack, on one opcode:
  - a stack engine: push, pop, call and ret update rsp at rename, with no 1-cycle chain
    through the ALUs (Zen 5: PUSH T 0.5, POP T 0.25, ILX; Intel since the Pentium M);
  - a store's address and data are separate micro-ops, so its data can arrive after it
    issues (Zen 5: a PUSH+POP pair L 0.56, ILX): read-advance 5 on a plain store's
    explicit data sources."""
  base = key.split("@")[0]
  if base.startswith(("PUSH", "POP", "CALL", "RET")) and not base.startswith("POPCNT"):
    op.setdefault("write_latency", {})["RSP"] = 0
  if op.get("may_store") and not op.get("may_load"):
    op.setdefault("read_advance", {})["op"] = 5


def graniterapids_facts(skylake: dict) -> dict:
  """Granite Rapids (Redwood Cove P-cores) from skylake (llvm-mca 14 has no newer Intel
  model) and what `diffsim measure --validate` measured on the Xeon 6 whose blocks the
  project's measured data holds, with Golden Cove's public widths:
  - 5 integer ALUs (4 independent adds 0.80 cycles): a port 10 in every ALU group;
  - 2 stores per cycle (4 stores 1.98 cycles): store data on ports 4 and 9, store
    addresses on 7 and 8 as well as 2 and 3;
  - 6-wide rename and a 512-entry ROB (Golden Cove, Intel's Architecture Day 2021);
  - the stack engine and separate store data (`_stack_engine_and_store_data`);
  - integer division as measured (`_GNR_DIVIDE`), where skylake's takes 76-102 cycles;
  - memory dependences with Intel's memory renaming (`memory.RENAMING`, "address"),
    forwarded loads waiting no longer than the load itself (`movq %rax,8(%rbx,%rcx);
    movq 8(%rbx,%rcx),%rax` 5.0 cycles an iteration, a load's latency);
  - a 64-bit LEA of base + displacement at rename (`leaq 8(%rdi),%rdi` 0.16 cycles an
    iteration, 6 a cycle), an indexed one on an ALU (1.0), a scaled one in 2 cycles
    (`leaq (%rdi,%rcx,4),%rdi` 2.0): `LEA64r@index` and `@scale` keys;
  - 3 load ports (Golden Cove's 2, 3 and 11): 6 loads from one cache line take 2.0
    cycles, while one 4-byte L1 bank serves at most 2 loads a cycle (one load of a
    fixed address 0.50, two 64 bytes apart 1.00: `memory.bank_edges`);
  - stores committed in order, two a cycle to one 64-byte line and one a cycle
    otherwise (two stores 8 bytes apart 1.00 cycles an iteration, 64 apart 2.00:
    `memory.commit_edges`).
  """
  d = copy.deepcopy(skylake)
  d["cpu"] = "graniterapids-facts"
  d["source"] = ("skylake (llvm-mca 14) changed by measured Xeon 6 rates and Golden Cove's "
                 "widths (diffsim.params.starts)")
  d["global"].update(dispatch_width=6, rob_size=512, memory_dependences=True,
                     memory_renaming="address", l1_bank_loads=2, l1_line_stores=2)
  units = [r for r in d["resources"] if "members" not in r]
  groups = [r for r in d["resources"] if "members" in r]
  added = ("SKLPort8", "SKLPort9", "SKLPort10", "SKLPort11")
  units += [{"name": n, "units": 1, "buffer": -1} for n in added]
  for gr in groups:
    m = gr["members"]
    if "SKLPort6" in m:
      m.append("SKLPort10")
    if "SKLPort7" in m:
      m.append("SKLPort8")
    if "SKLPort2" in m:
      m.append("SKLPort11")
    if gr["name"] == "SKLPortAny":
      m += [n for n in added if n not in m]
  groups.append({"name": "SKLPort49", "members": ["SKLPort4", "SKLPort9"], "buffer": -1})
  d["resources"] = units + groups
  for key in [k for k in d["opcodes"] if k in LEA_OPCODES]:  # indexed LEAs on an ALU
    d["opcodes"][key + LEA_INDEX] = copy.deepcopy(d["opcodes"][key])
    d["opcodes"][key + LEA_SCALE] = dict(copy.deepcopy(d["opcodes"][key]), latency=2)
  d["opcodes"]["LEA64r"].update(latency=0, resources=[])  # base + displacement: at rename
  for key, op in d["opcodes"].items():
    res = [["SKLPort49", c] if r == "SKLPort4" else [r, c] for r, c in op.get("resources", [])]
    if res:
      op["resources"] = res
    _stack_engine_and_store_data(key, op)
    _divide(key, op)
    op.pop("kept", None)
  return d


# Integer division on the Xeon 6, measured with `diffsim measure`: 8-32 bits latency 12
# (`cltd; idivl %ecx` 12.0 cycles an iteration), one every 6 cycles (`movl %edi,%eax;
# cltd; idivl %esi` 6.0); 64 bits 15 and 10 (`cqto; idivq %rcx` 15.0; `movq %rdi,%rax;
# xorl %edx,%edx; divq %rsi` 10.0). Golden Cove's 4 micro-ops (uops.info).
_GNR_DIVIDE = {8: (12, 6), 16: (12, 6), 32: (12, 6), 64: (15, 10)}
_LOAD_LATENCY = 5


def _divide(key: str, op: dict) -> None:
  """Integer DIV/IDIV of `key` (register and memory forms) at `_GNR_DIVIDE`'s (latency,
  cycles of skylake's divider) for its width, plus one port-0 micro-op and a load's."""
  m = re.fullmatch(r"I?DIV(8|16|32|64)(r|m)", key.split("@")[0])
  if not m:
    return
  latency, cycles = _GNR_DIVIDE[int(m.group(1))]
  loaded = m.group(2) == "m"
  op.update(uops=4 + loaded, latency=latency + (_LOAD_LATENCY if loaded else 0),
            resources=[["SKLDivider", cycles], ["SKLPort0", 1]]
            + ([["SKLPort23", 1]] if loaded else []))
  for normalised in ("write_latency", "kept", "touched", "buffers"):
    op.pop(normalised, None)


# name -> (the llvm-mca table it starts from, the change)
STARTS: dict[str, tuple[str, Callable[[dict], dict]]] = {
    "zen5-facts": ("znver3", zen5_facts),
    "graniterapids-facts": ("skylake", graniterapids_facts),
}
