"""The parameter pytree: a CPU's timing table in dense arrays.

A table has three parts (see docs in `SCHEMA.md` for the JSON form):
- `Params`: the numbers that are fitted or searched (float leaves only): per-opcode
  micro-ops, latency per write role, read-advance per read class, resource cycles;
  global widths and buffer sizes.
- `Structure`: discrete facts that follow from the resource model and do not change
  during a fit (which groups an opcode reserves or touches, which buffers it takes,
  load/store and idiom flags). Integer and bool arrays.
- `Layout`: static, hashable names and sizes (opcode keys, unit and group names,
  member masks). It sets every shape, so it is a static argument under `jit`.

Resource indices follow llvm-mca's bit order: units (ProcResource kinds, a kind with
N units expanded to N units) sorted by name with digit runs compared as numbers,
then groups in the same order. `res_cycles[k, r]` is the number of cycles opcode k
keeps resource r busy after llvm-mca's normalisation (diffsim/sim/MODEL.md#resource-lists): for a
unit, that unit; for a group, one member chosen at issue.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import json
import re
from pathlib import Path
from typing import Any, Mapping

import numpy as np
from flax import struct

from diffsim.isa.memory import RENAMING
from diffsim.isa.roles import READ_CLASSES, REG_KINDS, WRITE_ROLES  # noqa: F401 (re-exported)


# The format every table's JSON names (SCHEMA.md), and where the shipped tables live.
FORMAT = "diffsim-params/1"
TABLES_DIR = Path(__file__).parent / "tables"


def natural_key(name: str):
  """LLVM's StringRef::compare_numeric order, which TableGen sorts resources by: a
  longer digit run is larger, equal lengths compare as text (HWPort2 < HWPort10,
  HWPort15 < HWPort015). Total, so the order never depends on a set's iteration."""
  return [(len(t), t) if t.isdigit() else (0, t) for t in re.split(r"(\d+)", name)]


@struct.dataclass
class Params:
  """Fitted numbers. K opcodes, E write roles, A read classes, R resources, F files."""

  uops: Any  # [K] float: micro-ops
  latency: Any  # [K, E] float: cycles from issue until each write is available
  read_advance: Any  # [K, A] float: cycles a read may happen before its producer is done
  res_cycles: Any  # [K, R] float: cycles each resource is held (0 = unused)
  dispatch_width: Any  # [] float: micro-ops dispatched per cycle
  rob_size: Any  # [] float: reorder-buffer entries
  retire_width: Any  # [] float: instructions retired per cycle, 0 = unlimited
  buffer_size: Any  # [R] float: scheduler entries per buffered resource, 0 = none
  load_queue: Any  # [] float: LQ entries, 0 = unbounded
  store_queue: Any  # [] float: SQ entries, 0 = unbounded
  prf_size: Any  # [F] float: physical registers per register file, 0 = unbounded
  move_elim_per_cycle: Any  # [F] float: moves eliminated per cycle, 0 = none


@struct.dataclass
class Structure:
  """Discrete per-opcode facts (not fitted)."""

  res_need: Any  # [K, R] int32: free members a kept group needs (1 for units)
  reserved: Any  # [K, R] bool: the kept group is reserved whole for its cycles
  touched: Any  # [K, R] bool: groups dropped by normalisation but blocked when reserved
  buffers: Any  # [K, R] bool: the opcode takes one entry of this buffered resource
  may_load: Any  # [K] bool
  may_store: Any  # [K] bool
  load_barrier: Any  # [K] bool
  store_barrier: Any  # [K] bool
  ignores_reads: Any  # [K] bool: zero idiom or dependency-breaking: reads are dropped
  zero_idiom: Any  # [K] bool: allocates no physical register
  move_elim: Any  # [K] bool: candidate for move elimination
  begin_group: Any  # [K] bool
  end_group: Any  # [K] bool
  supported: Any  # [K] bool: the CPU model can simulate this opcode
  implied: Any  # [K] int32: bitmask of units that must be free at issue, unused (below)


@dataclasses.dataclass(frozen=True)
class Layout:
  """Static names and sizes of a table (hashable; a `jit` static argument)."""

  cpu: str
  keys: tuple[str, ...]
  units: tuple[str, ...]  # unit names; bit u of a mask is units[u]
  groups: tuple[str, ...]
  group_members: tuple[int, ...]  # [G] bitmask over units
  file_kinds: tuple[tuple[str, ...], ...]  # [F] register kinds each file renames
  # [F] (register family, physical registers one write takes) where not 1: Zen 1/2
  # rename a YMM register as two 128-bit halves (("ymm", 2),).
  file_costs: tuple[tuple[tuple[str, int], ...], ...] = ()
  unsupported: tuple[tuple[str, str], ...] = ()
  max_direct_units: int = 4  # most units one opcode uses directly (sets a loop length)
  max_kept_groups: int = 4  # most groups one opcode keeps after normalisation
  # Loads depend on the older stores whose bytes they read (`diffsim.isa.memory`); off
  # in llvm-mca's model, which never compares addresses.
  memory_dependences: bool = False
  memory_renaming: str = "operand"  # which loads skip memory (`diffsim.isa.memory.RENAMING`)
  # Loads one L1 bank serves a cycle (`diffsim.isa.memory.bank_edges`); 0: no limit,
  # as in llvm-mca.
  l1_bank_loads: int = 0
  # Consecutive stores to one 64-byte line the L1 commits a cycle, one a cycle to other
  # lines (`diffsim.isa.memory.commit_edges`); 0: no limit, as in llvm-mca.
  l1_line_stores: int = 0

  @property
  def num_resources(self) -> int:
    return len(self.units) + len(self.groups)

  @functools.cached_property
  def index(self) -> dict[str, int]:
    return {k: i for i, k in enumerate(self.keys)}

  def __hash__(self):
    return hash((self.cpu, len(self.keys), self.units, self.groups, self.group_members,
                 self.max_direct_units, self.max_kept_groups, self.memory_dependences,
                 self.memory_renaming, self.l1_bank_loads, self.l1_line_stores))


@dataclasses.dataclass(frozen=True)
class Table:
  """A complete CPU table: the three parts together."""

  params: Params
  structure: Structure
  layout: Layout
  source: Mapping[str, Any] = dataclasses.field(default_factory=dict, compare=False)


def expand_units(resources) -> tuple[list[str], dict[str, list[str]], list[dict]]:
  """Unit names in bit order, each resource's units, and the group entries."""
  kinds = [r for r in resources if "members" not in r]
  groups = [r for r in resources if "members" in r]
  units: list[str] = []
  of: dict[str, list[str]] = {}
  for r in sorted(kinds, key=lambda r: natural_key(r["name"])):
    n = int(r.get("units", 1))
    names = [r["name"]] if n == 1 else [f"{r['name']}#{i}" for i in range(n)]
    units += names
    of[r["name"]] = names
  for g in groups:
    of[g["name"]] = sorted({u for m in g["members"] for u in of[m]}, key=units.index)
  return units, of, sorted(groups, key=lambda g: natural_key(g["name"]))


def normalise(entries, members: Mapping[str, int], order: Mapping[str, int], groups: set):
  """llvm-mca's de-expansion of a resource list (diffsim/sim/MODEL.md#resource-lists).

  Args:
    entries: [(resource, cycles)] as written in the model (own cycles, groups named).
    members: resource -> bitmask of its units.
    order: resource -> its position in llvm-mca's bit order.
    groups: names of ProcResGroups (multi-unit kinds are not among them).

  Returns:
    kept: {resource: (cycles, need, reserved)}, touched: the groups dropped by the
    normalisation, expanded: every resource of the expanded list (buffer accounting).
  """
  # The compiled tables charge each listed resource's cycles to every group that
  # contains it as well; rebuild that expanded list first.
  expanded: dict[str, float] = {}
  for name, cycles in entries:
    expanded[name] = expanded.get(name, 0.0) + cycles
    for g in groups:
      if g != name and members[name] & members[g] == members[name]:
        expanded[g] = expanded.get(g, 0.0) + cycles

  def sort_key(n):  # llvm-mca sorts by (bits in the resource mask, mask)
    bits = bin(members[n]).count("1") + 1 if n in groups else 1
    return (bits, order[n])

  names = sorted(expanded, key=sort_key)
  cycles = dict(expanded)
  need = dict.fromkeys(names, 1)
  kept, touched = {}, set()
  for i, a in enumerate(names):
    if cycles[a] <= 0:
      if a in groups:
        touched.add(a)
      continue
    kept[a] = cycles[a]
    for b in names[i + 1:]:
      if members[a] & members[b] == members[a]:
        cycles[b] -= cycles[a]
        if b in groups:
          need[b] += 1
  out = {}
  for a, c in kept.items():
    size = bin(members[a]).count("1")
    reserved = a in groups and need[a] > size
    out[a] = (c, min(need[a], size) if a in groups else 1, reserved)
  return out, touched, set(expanded)


def implied_units(kept, group_kinds: Mapping[str, set], order: Mapping[str, int]) -> set:
  """Units llvm-mca 14 requires free when the instruction issues without taking them
  (its `ImplicitlyUsedProcResUnits`, set by `InstrBuilder`).

  A kept group whose other member units the instruction already takes directly
  decays into its last member. Once one has, llvm-mca 14 sweeps the kept groups again
  and, besides such decays, takes every member of a group none of whose members is
  used yet: Broadwell's memory-form divides (ports 0, 1, 5 directly, one of `BWPort0156`,
  one of `BWPort23`) therefore issue only when both load ports are free, though they
  take one (probed with llvm-mca's timeline; a load issued earlier in the cycle delays
  them by one, a store does not). Groups count their member kinds, as LLVM's masks do.
  """
  groups = sorted((n for n in kept if n in group_kinds),
                  key=lambda n: (len(group_kinds[n]), order[n]))
  used = {n for n in kept if n not in group_kinds}

  def sweep(untouched_too: bool) -> set:
    found = set()
    for g in groups:
      free = group_kinds[g] - used
      decays = free != group_kinds[g] and len(free) == 1
      if decays or (untouched_too and free == group_kinds[g]):
        used.update(free)
        found |= free
    return found

  implied = new = sweep(False)
  while new:  # after a decay, llvm-mca 14 sweeps again, taking untouched groups too
    new = sweep(True)
    implied = implied | new
  return implied


def _reg_kind(classes) -> tuple[str, ...]:
  return tuple(c for c in classes if c in REG_KINDS)


def _memory_renaming(g: Mapping[str, Any]) -> str:
  """The table's memory-renaming policy, checked against `RENAMING`."""
  policy = g.get("memory_renaming", "operand")
  if policy not in RENAMING:
    raise ValueError(f"global.memory_renaming {policy!r}: expected one of {', '.join(RENAMING)}")
  return policy


def from_json(doc: Mapping[str, Any], dtype=np.float32) -> Table:
  """Builds a Table from the JSON form (`SCHEMA.md`)."""
  resources = doc["resources"]
  units, of, groups = expand_units(resources)
  unit_bit = {u: i for i, u in enumerate(units)}
  members = {}
  order = {}
  for r in resources:
    members[r["name"]] = sum(1 << unit_bit[u] for u in of[r["name"]])
  # Multi-unit kinds behave as groups of their units.
  multi = [r["name"] for r in resources if "members" not in r and int(r.get("units", 1)) > 1]
  group_names = [g["name"] for g in groups]
  all_groups = sorted(set(group_names) | set(multi), key=natural_key)
  kinds = sorted([r["name"] for r in resources if "members" not in r and r["name"] not in multi],
                 key=natural_key)
  res_names = kinds + all_groups
  # Single-unit kinds map to their unit index; groups follow all units.
  col = {}
  for n in kinds:
    col[n] = unit_bit[n]
  for j, g in enumerate(all_groups):
    col[g] = len(units) + j
  for n in res_names:
    order[n] = col[n]
  # A normalised list (`"kept"`) may name one unit of a multi-unit kind ("Zn3Load#0").
  col.update((u, unit_bit[u]) for u in units if u not in col)
  bufsize = {r["name"]: int(r.get("buffer", -1)) for r in resources}

  keys = tuple(sorted(doc["opcodes"]))
  K, E, A, R = len(keys), len(WRITE_ROLES), len(READ_CLASSES), len(units) + len(all_groups)
  uops = np.zeros(K, dtype)
  lat = np.zeros((K, E), dtype)
  ra = np.zeros((K, A), dtype)
  cyc = np.zeros((K, R), dtype)
  need = np.ones((K, R), np.int32)
  reserved = np.zeros((K, R), bool)
  touched = np.zeros((K, R), bool)
  buffers = np.zeros((K, R), bool)
  implied = np.zeros(K, np.int32)
  group_kinds = {r["name"]: set(r["members"]) for r in resources if "members" in r}
  flags = {f: np.zeros(K, bool) for f in (
      "may_load", "may_store", "load_barrier", "store_barrier", "zero_idiom", "dep_breaking",
      "move_elim", "begin_group", "end_group")}
  supported = np.ones(K, bool)
  unsupported = dict(doc.get("unsupported", {}))
  for k, key in enumerate(keys):
    op = doc["opcodes"][key]
    if op.get("unsupported"):
      supported[k] = False
      unsupported.setdefault(key, str(op["unsupported"]))
    uops[k] = op.get("uops", 1)
    lat[k, :] = op.get("latency", 1)
    for role, value in op.get("write_latency", {}).items():
      role = "EFLAGS" if role in ("flags", "EFLAGS") else role
      lat[k, WRITE_ROLES.index(role if role in WRITE_ROLES else "other")] = value
    advance = op.get("read_advance", {})
    for cls, value in sorted(advance.items(), key=lambda kv: kv[0] != "op"):
      # "op" sets every explicit source; "opN" then overrides one of them.
      cols = [c for c in READ_CLASSES if c.startswith("op")] if cls == "op" else [cls]
      for c in cols:
        ra[k, READ_CLASSES.index(c if c in READ_CLASSES else "implicit")] = value
    if "kept" in op:
      # Already normalised (`export.to_json`): learned cycles live after normalisation.
      kept = {n: (float(c), int(nd), bool(rs)) for n, c, nd, rs in op["kept"]}
      touch, buffered = op.get("touched", ()), op.get("buffers", ())
    else:
      kept, touch, expanded = normalise(
          [(n, float(c)) for n, c in op.get("resources", [])], members, order, set(group_names))
      buffered = op.get("buffers", [n for n in expanded if bufsize.get(n, -1) > 0])
    for n, (c, nd, rs) in kept.items():
      cyc[k, col[n]] = c
      need[k, col[n]] = nd
      reserved[k, col[n]] = rs
    for n in touch:
      touched[k, col[n]] = True
    for n in implied_units(kept, group_kinds, order):
      if bin(members[n]).count("1") == 1:  # a multi-unit kind cannot be required whole
        implied[k] |= members[n]
    for n in buffered:
      buffers[k, col[n]] = True
    for f in flags:
      flags[f][k] = bool(op.get(f, False))
  g = doc["global"]
  files = g.get("register_files", [])
  params = Params(
      uops=uops, latency=lat, read_advance=ra, res_cycles=cyc,
      dispatch_width=np.asarray(g["dispatch_width"], dtype),
      rob_size=np.asarray(g["rob_size"], dtype),
      retire_width=np.asarray(g.get("retire_width", 0), dtype),
      buffer_size=np.asarray([max(bufsize.get(n, -1), 0) if n in bufsize else 0
                              for n in units + all_groups], dtype),
      load_queue=np.asarray(g.get("load_queue", 0), dtype),
      store_queue=np.asarray(g.get("store_queue", 0), dtype),
      prf_size=np.asarray([f.get("size", 0) for f in files], dtype).reshape(-1),
      move_elim_per_cycle=np.asarray([f.get("max_moves_per_cycle", 0) for f in files],
                                     dtype).reshape(-1),
  )
  structure = Structure(
      res_need=need, reserved=reserved, touched=touched, buffers=buffers,
      may_load=flags["may_load"], may_store=flags["may_store"],
      load_barrier=flags["load_barrier"], store_barrier=flags["store_barrier"],
      ignores_reads=flags["zero_idiom"] | flags["dep_breaking"],
      zero_idiom=flags["zero_idiom"], move_elim=flags["move_elim"],
      begin_group=flags["begin_group"], end_group=flags["end_group"], supported=supported,
      implied=implied)
  layout = Layout(
      cpu=doc.get("cpu", "custom"), keys=keys, units=tuple(units), groups=tuple(all_groups),
      group_members=tuple(members[gname] for gname in all_groups),
      file_kinds=tuple(_reg_kind(f.get("classes", ())) for f in files),
      file_costs=tuple(tuple(sorted((k, int(c)) for k, c in f.get("costs", {}).items()))
                       for f in files),
      unsupported=tuple(sorted(unsupported.items())),
      max_direct_units=max(1, int((cyc[:, :len(units)] > 0).sum(1).max(initial=0))),
      max_kept_groups=max(1, int((cyc[:, len(units):] > 0).sum(1).max(initial=0))),
      memory_dependences=bool(g.get("memory_dependences", False)),
      memory_renaming=_memory_renaming(g), l1_bank_loads=int(g.get("l1_bank_loads", 0)),
      l1_line_stores=int(g.get("l1_line_stores", 0)))
  # The resource model and globals as written, so that `export.to_json` can write
  # them back (the arrays keep only what the simulator needs).
  source = {"cpu": doc.get("cpu"), "source": doc.get("source"), "format": doc.get("format"),
            "global": copy.deepcopy(dict(g)), "resources": copy.deepcopy(list(resources))}
  return Table(params, structure, layout, source=source)


def available_tables() -> list[str]:
  """Names of the tables shipped with diffsim (`diffsim.params.load_table(name)`), and
  of the starting tables built from public facts (`diffsim.params.starts`).

  >>> {"haswell", "zen5", "zen4"} <= set(available_tables())
  True
  """
  from diffsim.params.starts import STARTS

  return sorted({p.stem for p in TABLES_DIR.glob("*.json")} | set(STARTS))


def load_json(cpu_or_path: str | Path) -> dict:
  """The JSON document of a shipped table name or a file path."""
  p = Path(cpu_or_path)
  if p.suffix == ".json" or p.exists():
    if not p.exists():
      raise FileNotFoundError(f"parameter file not found: {p}")
    return json.loads(p.read_text())
  shipped = TABLES_DIR / f"{cpu_or_path}.json"
  from diffsim.params.starts import STARTS

  if not shipped.exists() and str(cpu_or_path) in STARTS:
    base, change = STARTS[str(cpu_or_path)]
    return change(load_json(base))
  if not shipped.exists():
    raise ValueError(f"unknown CPU table {cpu_or_path!r}: shipped tables are "
                     f"{', '.join(available_tables())}; or pass a JSON file path")
  return json.loads(shipped.read_text())


def write_json(doc: Mapping[str, Any], path: str | Path) -> None:
  """Writes a table's JSON document with one line per opcode, so that diffs between
  two tables (a rebuild, a fit) stay readable."""
  head = {k: v for k, v in doc.items() if k != "opcodes"}
  items = sorted(doc["opcodes"].items())
  lines = ["{"] + [f"{json.dumps(k)}: {json.dumps(v)}," for k, v in head.items()]
  lines.append('"opcodes": {')
  lines += [f"{json.dumps(k)}: {json.dumps(v)}{',' if i + 1 < len(items) else ''}"
            for i, (k, v) in enumerate(items)]
  Path(path).write_text("\n".join(lines + ["}", "}"]) + "\n")


@functools.lru_cache(maxsize=16)
def load_table(cpu_or_path: str) -> Table:
  """Loads a shipped table by CPU name (`haswell`) or a JSON file by path.

  >>> table = load_table("zen5")
  >>> int(table.params.rob_size), int(table.params.dispatch_width)
  (448, 8)
  """
  return from_json(load_json(cpu_or_path))
