"""Blocks to fixed-shape arrays: the simulator's input.

`encode` resolves, once per block, every register dependency of the looped block:
for each register source of instruction c, the instruction that produced the value
in the same iteration (distance 0) or in the previous one (distance 1, loop-carried).
A partial write (`movb $1,%al`) keeps the rest of the old value, so a later full
read also depends on the writer before it, and so on back to a full write
(diffsim/sim/MODEL.md#register-dependencies). Dependencies are edges; each instruction
has at most D in, and each producer at most C out (its consumers, the same edges seen
from the other end, which the simulator uses to wake readers up).

CPUs with register files (`Renaming`, Zen 3) rename registers the way llvm-mca's
RegisterFile does, which changes the edges (`_rename_history`): an 8/16-bit GPR
write replaces the whole register's mapping and waits for the previous writer instead
(a write-after-write edge), and an eliminated register move creates an alias, so that
readers of its destination link to the current writer of its source.

`encode_block` gives one block's rows (a hashable `Encoding`), `assemble` pads many into
a batch: to a bucket length L (a few sizes, so that only a handful of programs compile)
with a `valid` mask. Shapes: B blocks, L instructions, D deps per instruction, C
consumers per instruction.
"""

from __future__ import annotations

import bisect
import collections
import dataclasses
import functools
import re
from typing import Callable, Mapping, Sequence

import numpy as np

from diffsim.isa import idioms
from diffsim.isa.heap import collector_paused
from diffsim.isa.ir import FLAGS, Block
from diffsim.isa.memory import bank_edges, commit_edges, memory_edges
from diffsim.isa.roles import FIXED_ROLE, READ_CLASSES, REG_KINDS, WRITE_ROLES

BUCKETS = (8, 16, 32, 64, 128, 256)
DEP_BUCKETS = (4, 8, 16, 32, 64)
# `dep_last` of an edge that holds from `dep_first` on.
ALWAYS = 1 << 20
# Writes per instruction that physical-register accounting sees (`vzeroall` has 16).
MAX_WRITES = 16
_MEM_ROLE, _MEM_CLASS = WRITE_ROLES.index("MEM"), READ_CLASSES.index("mem")
# Writes of a renamed load that are its own, not the loaded value (`_through_memory`).
_KEPT_ROLES = frozenset(WRITE_ROLES.index(r) for r in ("MEM", "RSP", "EFLAGS"))
GPR = {"RAX", "RBX", "RCX", "RDX", "RSI", "RDI", "RBP", "RSP"} | {f"R{i}" for i in range(8, 16)}


@dataclasses.dataclass(frozen=True)
class BlockBatch:
  """Encoded blocks (numpy or jax arrays; a pytree through `jax.tree_util`)."""

  opcode: np.ndarray  # [B, L] int32: index into the table's keys (0 on padding)
  valid: np.ndarray  # [B, L] bool
  length: np.ndarray  # [B] int32: instructions per block
  dep_src: np.ndarray  # [B, L, D] int32: producer's index in the block
  dep_dist: np.ndarray  # [B, L, D] int32: 0 same iteration, 1 previous iteration
  dep_role: np.ndarray  # [B, L, D] int32: producer's write role (WRITE_ROLES)
  dep_class: np.ndarray  # [B, L, D] int32: reader's read class (READ_CLASSES)
  dep_valid: np.ndarray  # [B, L, D] bool
  dep_waw: np.ndarray  # [B, L, D] int32: -1 for a read; else a false dependency of the
  #                      consumer's write with this role (WRITE_ROLES) on the producer's
  dep_first: np.ndarray  # [B, L, D] int32: first iteration of the consumer with this edge
  dep_last: np.ndarray  # [B, L, D] int32: first iteration without it again (ALWAYS: none)
  use_dst: np.ndarray  # [B, L, C] int32: consumer's index in the block
  use_dist: np.ndarray  # [B, L, C] int32: iterations from producer to consumer
  use_edge: np.ndarray  # [B, L, C] int32: the edge's slot d in the consumer's deps
  use_valid: np.ndarray  # [B, L, C] bool
  write_kind: np.ndarray  # [B, L, W] int32: register kind of each write (REG_KINDS), -1 none
  write_alloc: np.ndarray  # [B, L, W] bool: the write takes a physical register
  write_cost: np.ndarray  # [B, L, W] int32: physical registers a write of its register
  #                         takes in its file (1, or the file's cost: a YMM is 2 on Zen 1)
  eliminated: np.ndarray  # [B, L] bool: a register move eliminated at dispatch
  loads: np.ndarray  # [B, L] bool: the decoder's view (tables carry llvm-mca's)
  stores: np.ndarray  # [B, L] bool

  @property
  def shape(self) -> tuple[int, int]:
    return self.opcode.shape


def _tree_flatten(b):
  return [getattr(b, f.name) for f in dataclasses.fields(b)], None


def _tree_unflatten(_, leaves):
  return BlockBatch(*leaves)


try:  # Register as a pytree so batches cross jit/vmap boundaries.
  import jax

  jax.tree_util.register_pytree_node(BlockBatch, _tree_flatten, _tree_unflatten)
except ImportError:  # pragma: no cover
  pass


@functools.cache
def reg_kind(reg: str) -> str:
  """The register kind a register file renames (params.table.REG_KINDS)."""
  if reg == FLAGS:
    return "flags"
  if reg in GPR:
    return "gpr"
  if reg.startswith(("XMM", "YMM", "ZMM")):
    return "vec"
  if reg.startswith("MM"):
    return "mmx"
  if reg.startswith("K") and reg[1:].isdigit():
    return "mask"
  if reg.startswith("ST"):
    return "x87"
  return "other"


def _write_role(w) -> int:
  return _role_index(w.role, w.reg)


@functools.cache
def _role_index(role: str, reg: str) -> int:
  if role.startswith("op"):
    name = role if role in WRITE_ROLES else "other"
  else:
    name = reg if reg in WRITE_ROLES else "other"
  return WRITE_ROLES.index(name)


def _read_class(r) -> int:
  return _class_index(r.role)


@functools.cache
def _class_index(role: str) -> int:
  if role in READ_CLASSES:
    return READ_CLASSES.index(role)
  if role in ("base", "index"):
    return READ_CLASSES.index("addr")
  if role == "flags":
    return READ_CLASSES.index("flags")
  return READ_CLASSES.index("implicit")


def dependencies(block: Block) -> list[list[tuple[int, int, int, int]]]:
  """Per instruction: its deps as (producer, distance, write role, read class)."""
  instrs = block.instrs
  # Each instruction's first write of each register, and every register's writers.
  first: list[dict] = []
  writers: dict[str, list[int]] = {}
  for p, ins in enumerate(instrs):
    mine = {}
    for w in ins.writes:
      if w.reg not in mine:
        mine[w.reg] = w
        writers.setdefault(w.reg, []).append(p)
    first.append(mine)
  deps: list[list[tuple[int, int, int, int]]] = []
  for c, ins in enumerate(instrs):
    mine = []
    for r in ins.reads:
      # One edge per (read, writer): llvm-mca counts every register read as a user
      # of its writer (the issue priority), so two reads of one register are two.
      ps = writers.get(r.reg)
      if not ps:
        continue
      cls = _read_class(r)
      need = getattr(r, "width", 0)
      # Walk back through the looped block to the last writer (this iteration's
      # writers before c, then the previous iteration's from the end down to c itself),
      # and past partial writers to the full write whose value they merge into.
      k = bisect.bisect_left(ps, c)
      walk = [(p, 0) for p in reversed(ps[:k])] + [(p, 1) for p in reversed(ps[k:])]
      for p, dist in walk:
        w = first[p][r.reg]
        mine.append((p, dist, _write_role(w), cls))
        if not w.merge:
          break
        # A partial write that covers every bit the read needs ends the walk too:
        # after `movsd (%rcx),%xmm1` a read of %xmm1 waits only for the movsd.
        wrote = getattr(w, "width", 0)
        if need and wrote and wrote >= need:
          break
    deps.append(mine)
  return deps


@dataclasses.dataclass(frozen=True)
class Renaming:
  """What a CPU's register files do to dependencies (llvm-mca's RegisterFile).

  Attributes:
    kinds: register kinds (REG_KINDS) that some register file renames. A GPR is
      renamed as its 64-bit register, so an 8/16-bit write (which keeps the upper
      bits) takes no physical register and waits for the register's previous writer
      instead; XMM and YMM are renamed as themselves.
    move_elim: opcode keys whose instances are eliminated at dispatch. Elimination
      happens whenever the register file allows it; its per-cycle budget is not
      modelled, which is exact while the budget is at least the dispatch width (Zen
      3: 6 and 6), since every eliminated write costs a micro-op.
    costs: (register family "xmm" / "ymm" / "zmm", physical registers one write takes)
      where a file says other than 1 (llvm-mca's per-class RegisterCost).
    memory: each load also depends on the youngest older store whose bytes it reads
      (`diffsim.isa.memory`; the table's `memory_dependences`), through the store's
      MEM write role and the load's mem read class.
    load_banks: loads an L1 bank serves a cycle (`memory.bank_edges`; the table's
      `l1_bank_loads`), 0 for no limit.
    line_stores: consecutive stores to one line the L1 commits a cycle
      (`memory.commit_edges`; the table's `l1_line_stores`), 0 for no limit.
  """

  kinds: frozenset = frozenset()
  move_elim: frozenset = frozenset()
  costs: tuple[tuple[str, int], ...] = ()
  memory: bool = False  # loads depend on the stores they read from (`isa.memory`)
  memory_renaming: str = "operand"  # which of them skip memory (`isa.memory.RENAMING`)
  load_banks: int = 0  # loads a cycle per L1 bank (`isa.memory.bank_edges`); 0: no limit
  line_stores: int = 0  # stores a cycle to one L1 line (`isa.memory.commit_edges`); 0: no limit

  def cost(self, write) -> int:
    """Physical registers `write` (an ir.Write) takes in its file: a vector write by
    the width it defines (the decoder names every vector register by its ZMM)."""
    if not self.costs or reg_kind(write.reg) != "vec":
      return 1
    return dict(self.costs).get(_VEC_FAMILY.get(write.width, ""), 1)


_VEC_FAMILY = {128: "xmm", 256: "ymm", 512: "zmm"}


def renaming_for(table) -> Renaming | None:
  """The Renaming of a `params.table.Table`, or None when it has no register files."""
  kinds = frozenset(k for ks in table.layout.file_kinds for k in ks)
  memory = bool(getattr(table.layout, "memory_dependences", False))
  banks = int(getattr(table.layout, "l1_bank_loads", 0))
  line_stores = int(getattr(table.layout, "l1_line_stores", 0))
  if not kinds and not memory and not banks and not line_stores:
    return None
  # The tables mark a key `move_elim` when llvm-mca eliminated it alone, so any file
  # that eliminates moves at all will eliminate it.
  movers = np.any(np.asarray(table.params.move_elim_per_cycle) > 0)
  flags = np.asarray(table.structure.move_elim)
  keys = table.layout.keys
  elim = frozenset(keys[k] for k in np.flatnonzero(flags)) if movers else frozenset()
  costs = tuple(pair for pairs in table.layout.file_costs for pair in pairs)
  return Renaming(kinds=kinds, move_elim=elim, costs=costs, memory=memory,
                  memory_renaming=getattr(table.layout, "memory_renaming", "operand"),
                  load_banks=banks, line_stores=line_stores)


# An eliminated swap aliases both of its registers to the one llvm-mca reads first
# (RegisterFile::tryEliminateMoveOrSwap builds the second alias from the first): the
# second AT&T operand of XCHG*rr, the non-accumulator one of XCHG*ar (measured with
# llvm-mca 14 timelines). The operands are read off the text, which is llvm-mc's.
_XCHG_RR = re.compile(r"^XCHG(?:32|64)rr")
_GPR_NAME = re.compile(r"%(?P<r>[a-z0-9]+)")
_GPR64 = {"eax": "RAX", "ebx": "RBX", "ecx": "RCX", "edx": "RDX", "esi": "RSI", "edi": "RDI",
          "ebp": "RBP", "esp": "RSP"}


def _full_gpr(name: str) -> str:
  """RAX for `eax`, R9 for `r9d`: the register an AT&T GPR name folds into."""
  if name in _GPR64:
    return _GPR64[name]
  if name.startswith("r"):
    return re.sub(r"[dwb]$", "", name).upper()
  return name.upper()


def _vec_level(width: int) -> int:
  """0 for an XMM access, 1 for YMM, 2 for ZMM (llvm-mca renames each as itself)."""
  return 0 if width <= 128 else (1 if width <= 256 else 2)


def _move_pairs(ins, slot_of) -> list[tuple]:
  """(source slot, destination slot) of an eliminated move, in llvm-mca's order."""
  if len(ins.writes) == 1 and len(ins.reads) == 1:
    r, w = ins.reads[0], ins.writes[0]
    return [(slot_of(r.reg, r.width), slot_of(w.reg, w.width))]
  if len(ins.writes) == 2 and len(ins.reads) == 2:
    names = [_full_gpr(m.group("r")) for m in _GPR_NAME.finditer(ins.text)]
    if len(names) == 2:
      first = names[1] if _XCHG_RR.match(ins.opcode) else names[0]
      other = names[0] if first == names[1] else names[1]
      regs = {r.reg: r for r in ins.reads}
      if first in regs and other in regs:
        a, b = regs[first], regs[other]
        # Reads[0] -> Writes[1], then Reads[1] -> Writes[0].
        return [(slot_of(a.reg, a.width), slot_of(b.reg, b.width)),
                (slot_of(b.reg, b.width), slot_of(a.reg, a.width))]
  return []


def _rename_history(block: Block, renaming: Renaming, movable: Sequence[bool] | None = None):
  """Dependencies as llvm-mca's register files make them, and what each write costs.

  Follows RegisterFile::addRegisterRead/addRegisterWrite/tryEliminateMoveOrSwap of
  LLVM 14 over a few iterations of the looped block, until the edges repeat:
  - A register renamed by a file maps to its last (non-eliminated) writer. A GPR is
    one mapping (every write, at any width, replaces it); an XMM and a YMM register
    are two, and a write that clears the upper bits (VEX) sets both, a legacy-SSE
    write the XMM one only, so a YMM read then waits for both writers.
  - An 8/16-bit GPR write also waits for the writer it replaces (a write-after-write
    edge, `waw` = its own write role): it may issue once that writer has fewer
    cycles left than the partial write's own latency. It takes no physical register.
  - An eliminated move reads nothing and writes no mapping: it makes its
    destination an alias of its source (of the source's alias, if it has one). A
    reader of an aliased register links to the *current* writer of the alias
    target, which may be younger than the move (llvm-mca's behaviour). A swap
    aliases both registers to the one read first.
  - Registers outside every file map to their last writer, and to the writers before
    it while those only merged into it (`dependencies` without its width rule).

  Args:
    block: the block.
    renaming: the CPU's register files.
    movable: per instruction, whether its table key is in `renaming.move_elim`
      (default: its decoder key or opcode is).

  Returns:
    (history, alloc, eliminated): history[k][c] = the edges of instruction c in
    iteration k, [(producer, distance, write role, read class, waw)], waw = -1 for
    reads, up to the first iteration that repeats the one before; alloc[c][j]: write
    j takes a physical register; eliminated[c]: instruction c is an eliminated move.
  """
  n = len(block.instrs)
  if movable is None:
    movable = [ins.key in renaming.move_elim or ins.opcode in renaming.move_elim
               for ins in block.instrs]
  elim = list(movable)
  kinds = renaming.kinds

  def slot_of(reg, width):
    return _slot(reg, width, reg_kind(reg) == "vec" and "vec" in kinds)

  pairs = [_move_pairs(ins, slot_of) if e else [] for ins, e in zip(block.instrs, elim)]
  elim = [e and bool(p) for e, p in zip(elim, pairs)]
  # What each instruction reads and writes, worked out once for all iterations:
  # reads as (read class, slot, renamed); writes (the first per slot) as (operand j,
  # slot, write role, merge, merges into a renamed GPR, renamed, slots it maps).
  reads, writes = [], []
  for ins in block.instrs:
    reads.append([(_read_class(r), slot, reg_kind(r.reg) in kinds)
                  for r in ins.reads for slot in [slot_of(r.reg, r.width)]])
    mine, done = [], set()
    for j, w in enumerate(ins.writes):
      slot = slot_of(w.reg, w.width)
      if slot in done:
        continue  # a second write of one register: the mapping keeps the first
      done.add(slot)
      kind = reg_kind(w.reg)
      targets = _family(slot)
      if slot[1] >= 0 and not w.merge:  # clears the upper bits: the wider registers too
        targets = tuple((slot[0], lv) for lv in range(3))
      mine.append((j, slot, _write_role(w), w.merge, kind == "gpr" and w.merge, kind in kinds,
                   targets))
    writes.append(mine)

  mapping: dict = {}  # slot -> [(dynamic position, write role)]
  alias: dict = {}  # slot -> slot
  alloc = [[True] * len(ins.writes) for ins in block.instrs]
  history = []
  for it in range(8):
    deps_it = []
    for c, ins in enumerate(block.instrs):
      pos = it * n + c
      if elim[c]:
        for src, dst in pairs[c]:
          target = alias.get(src, src)
          for s in _family(dst):
            alias[s] = target
        deps_it.append([])
        alloc[c] = [False] * len(ins.writes)
        continue
      mine = []
      for cls, slot, renamed in reads[c]:  # one edge per (read, writer), as `dependencies`
        if renamed:
          found = [w for s in _family(alias.get(slot, slot)) for w in mapping.get(s, ())]
        else:
          found = mapping.get(slot, ())
        for ppos, role in dict.fromkeys(found):
          mine.append((ppos, role, cls, -1))
      for j, slot, role, merge, gpr_merge, renamed, targets in writes[c]:
        entry = [(pos, role)]
        if not renamed:
          mapping[slot] = (list(mapping.get(slot, ())) + entry) if merge else entry
          continue
        if gpr_merge:
          # Renamed as the 64-bit register without clearing it: a false dependency on
          # the mapping's writer (not on an alias), and no physical register.
          alloc[c][j] = False
          for ppos, prole in mapping.get(slot, ()):
            if ppos != pos:
              mine.append((ppos, prole, 0, role))
        for s in targets:
          mapping[s] = entry
          alias.pop(s, None)
      deps_it.append(mine)
    # Relative form: (producer, distance, role, class, waw).
    rel = [[(p % n, it - p // n, role, cls, waw) for p, role, cls, waw in ds]
           for ds in deps_it]
    history.append(rel)
    if len(history) >= 3 and history[-1] == history[-2]:
      break
  return history, alloc, elim


@functools.cache
def _slot(reg: str, width: int, by_level: bool) -> tuple[str, int]:
  """A register's mapping slot: a renamed vector register per width level (XMM, YMM,
  ZMM are three), anything else as itself (level -1)."""
  return (reg, _vec_level(width)) if by_level else (reg, -1)


@functools.cache
def _family(slot: tuple[str, int]) -> tuple:
  """The slot and its sub-registers (llvm-mca's MCSubRegIterator)."""
  if slot[1] < 0:
    return (slot,)
  return tuple((slot[0], lv) for lv in range(slot[1], -1, -1))


def _ranged_edges(history) -> list[list[tuple]]:
  """Per instruction, every edge of any iteration with the iterations it holds in.

  Args:
    history: `_rename_history`'s per-iteration edges; the last entry holds for every
      later iteration.

  Returns:
    [c] -> [(producer, distance, role, class, waw, first, last)]: the edge applies to
    the consumer's iterations first <= k < last (last = ALWAYS: from first on). An
    iteration before the edge's distance counts as having it (its producer does not
    exist anyway), so most edges hold from 0 on. An edge that comes and goes is listed
    once per run.
  """
  K = len(history) - 1
  out = []
  for c in range(len(history[-1])):
    lists = [h[c] for h in history]
    seen = dict.fromkeys(e for edges in lists for e in edges)
    if all(edges == [e for e in lists[-1] if e[1] <= k] for k, edges in enumerate(lists)):
      # The usual case: every iteration has the steady edges, but for those reaching
      # back past its start, so each holds from iteration 0 on.
      many = collections.Counter(lists[-1])
      out.append([(*e, 0, ALWAYS) for e in seen for _ in range(many[e])])
      continue
    counts = [collections.Counter(edges) for edges in lists]
    mine = []
    for e in seen:
      for j in range(max(x[e] for x in counts)):
        runs, start = [], None
        for k in range(K + 1):
          present = counts[k][e] > j or k < e[1]
          if present and start is None:
            start = k
          if not present and start is not None:
            runs.append((start, k))
            start = None
        if start is not None:
          runs.append((start, ALWAYS))
        # An edge of the distance-padded iterations only never applies.
        runs = [(a, b) for a, b in runs if b == ALWAYS or b > e[1]]
        mine += [(*e, a, b) for a, b in runs]
    # Edges that always hold first, in their steady order (the rest are rare).
    mine.sort(key=lambda x: (x[5] != 0 or x[6] != ALWAYS))
    out.append(mine)
  return out


_CONDITION = re.compile(r"^(?:set|cmov)(?P<cc>[a-z]+)$")


def table_key(ins, keys: Mapping[str, int]) -> str | None:
  """The key a table knows this instruction by, most specific first.

  Tables may refine a key by condition code (`SETCCr@a`: LLVM 14 folds the condition
  into an operand, and Intel models cost `seta`/`setbe` differently) or by the slow
  forms of LEA (`LEA64r@3op`, `LEA64r@scale`: Zen 3; `LEA64r@index`: any indexed
  address, `idioms.lea_keys`) or by a zero immediate
  (`SBB64ri8@imm0`: Haswell), and may lack a `@same` variant that a CPU does not
  special-case (then the plain opcode applies).
  """
  m = _CONDITION.match(ins.mnemonic)
  if m and "@" not in ins.key and f"{ins.key}@{m.group('cc')}" in keys:
    return f"{ins.key}@{m.group('cc')}"
  for lea in idioms.lea_keys(ins.opcode, ins.text):
    if ins.key + lea in keys:
      return ins.key + lea
  imm = idioms.imm_variant(ins.text)
  if imm and ins.key + imm in keys:
    return ins.key + imm
  if ins.key in keys:
    return ins.key
  if ins.opcode in keys:
    return ins.opcode
  return None


def key_lookup(keys: Mapping[str, int]) -> Callable:
  """`table_key(ins, keys)` as a function of `ins`, each answer remembered: a key
  depends only on the instruction's key, mnemonic and text, and blocks repeat few
  distinct instructions."""
  memo: dict[tuple[str, str, str], str | None] = {}

  def lookup(ins) -> str | None:
    what = (ins.key, ins.mnemonic, ins.text)
    if what not in memo:
      memo[what] = table_key(ins, keys)
    return memo[what]

  return lookup


def bucket_of(n: int, buckets: Sequence[int]) -> int:
  """The smallest of the ascending `buckets` that holds n (ValueError past the last)."""
  for b in buckets:
    if n <= b:
      return b
  raise ValueError(f"{n} exceeds the largest bucket {buckets[-1]}")


def bucket_length(n: int) -> int:
  """The padded length for a block of n instructions (ValueError past the largest)."""
  return bucket_of(n, BUCKETS)


def _scatter(rows: list[tuple], shape: tuple[int, ...], fields: dict, present: str | None = None):
  """Arrays of `shape` filled from `rows` = (index..., value per field...): each field
  (name -> (dtype, fill value)) in row order; `present` names a mask of the rows'
  positions."""
  k = len(shape)
  table = np.array(rows, np.int64).reshape(len(rows), k + len(fields))
  at = tuple(table[:, i] for i in range(k))
  out = {}
  for i, (name, (dtype, fill)) in enumerate(fields.items()):
    out[name] = np.full(shape, fill, dtype)
    out[name][at] = table[:, k + i]
  if present:
    out[present] = np.zeros(shape, bool)
    out[present][at] = True
  return out


@dataclasses.dataclass(frozen=True)
class Encoding:
  """One block as the simulator sees it, before padding: `encode_block`'s rows.

  Hashable and comparable: two blocks with equal encodings get equal cycles from the
  table they were encoded for, so a batch need simulate each encoding once (BHive's
  blocks often differ only in registers, immediates or displacements).
  """

  instrs: tuple  # (c, key index, loads, stores, eliminated) per instruction
  writes: tuple  # (c, j, register kind, physical registers, allocates)
  deps: tuple  # (c, d, producer, distance, role, class, waw, first, last)
  max_deps: int  # the most deps of one instruction (D must be at least this)
  max_uses: int  # the most consumers of one producer (C must be at least this)

  @property
  def length(self) -> int:
    return len(self.instrs)


def _through_memory(block: Block, deps: list[list[tuple]], renaming: str = "operand"
                    ) -> list[list[tuple]]:
  """`deps` with the dependences that run through memory (`memory_edges`), each in the
  load's mem read class (its read-advance there is minus the forwarding latency):
  - forwarded: the load waits for the store (its MEM write: a read-modify-write's
    result) and for what produced the store's register data, since a store's data
    may arrive after the store issued (its read-advance);
  - renamed (`memory._renamable` under the CPU's `renaming` policy): the loaded
    register's readers read the store's data producer directly, as after an
    eliminated move, and through any renamed load that produced it in turn (a store
    of an immediate, or of its own read-modify-write, leaves them none)."""
  explicit = READ_CLASSES.index("flags")  # classes below it: explicit register sources
  out = [list(d) for d in deps]
  source: dict[int, list[tuple]] = {}  # renamed load -> [(producer, distance, role)]
  for c, stores in enumerate(memory_edges(block, renaming)):
    for s, dist, renamed in stores:
      data = [(p, dist + dp, role, first, last) for p, dp, role, cls, waw, first, last
              in deps[s] if cls < explicit and waw == -1]
      if renamed:
        source.setdefault(c, []).extend(e[:3] for e in data)
        continue
      out[c].append((s, dist, _MEM_ROLE, _MEM_CLASS, -1, 0, ALWAYS))
      out[c] += [(p, d, role, _MEM_CLASS, -1, first, last) for p, d, role, first, last in data]

  def resolve(p, d, role, depth=0):
    if p not in source or role in _KEPT_ROLES:
      return [(p, d, role)]
    if depth == 4 or d > 4:  # a value renamed around the loop: no producer in flight
      return []
    return [r for q, dq, rq in source[p] for r in resolve(q, d + dq, rq, depth + 1)]

  if source:
    for x, edges in enumerate(out):
      new = []
      for e in edges:  # reads follow renamed loads; write-after-write edges stay
        new += ([(p, d, role, *e[3:]) for p, d, role in resolve(*e[:3])] if e[4] == -1
                else [e])
      out[x] = new
  return out


def encode_block(block: Block, keys: Mapping[str, int], renaming: Renaming | None = None,
                 key_of: Callable | None = None) -> Encoding:
  """`block`'s Encoding (`keys` and `renaming` as in `encode`; `key_of`: a
  `key_lookup(keys)` shared between calls).

  Raises:
    KeyError: an opcode key is not in `keys` (the message names the instruction).
    ValueError: the block is empty.
  """
  if not block.instrs:
    raise ValueError("the block is empty")
  key_of = key_of or key_lookup(keys)
  if renaming is None or not renaming.kinds:
    deps = [[(*e, -1, 0, ALWAYS) for e in ds] for ds in dependencies(block)]
    alloc = [[True] * len(ins.writes) for ins in block.instrs]
    elim = [False] * len(block.instrs)
  else:
    movable = [key_of(ins) in renaming.move_elim for ins in block.instrs]
    history, alloc, elim = _rename_history(block, renaming, movable)
    deps = _ranged_edges(history)
  if renaming is not None and renaming.memory:
    deps = _through_memory(block, deps, renaming.memory_renaming)
  # The L1's limits, as edges of fixed weight: (producer, distance, cycles) per instruction.
  for limit, edges_of in ((renaming and renaming.load_banks, bank_edges),
                          (renaming and renaming.line_stores, commit_edges)):
    if limit:
      deps = [d + [(p, dist, FIXED_ROLE + w, _MEM_CLASS, -1, 0, ALWAYS) for p, dist, w in fixed]
              for d, fixed in zip(deps, edges_of(block, limit))]
  instrs, writes, edges = [], [], []
  for c, ins in enumerate(block.instrs):
    key = key_of(ins)
    if key is None:
      raise KeyError(f"instruction {c} `{ins.text}` has opcode key {ins.key!r}, which the "
                     "parameter table does not know")
    instrs.append((c, keys[key], ins.loads, ins.stores, elim[c]))
    for j, w in enumerate(ins.writes[:MAX_WRITES]):
      writes.append((c, j, REG_KINDS.index(reg_kind(w.reg)),
                     renaming.cost(w) if renaming else 1, alloc[c][j]))
    edges += [(c, d, *edge) for d, edge in enumerate(deps[c])]
  uses = collections.Counter(e[2] for e in edges)
  return Encoding(tuple(instrs), tuple(writes), tuple(edges),
                  max((len(ds) for ds in deps), default=0), max(uses.values(), default=0))


@collector_paused()
def encode(blocks: Sequence[Block], keys: Mapping[str, int], *, length: int | None = None,
           max_deps: int | None = None, max_uses: int | None = None,
           renaming: Renaming | None = None) -> BlockBatch:
  """Encodes blocks into one padded batch.

  Args:
    blocks: decoded blocks.
    keys: opcode key -> index (a table's `Layout.index`); every key must be present.
    length: padded length L; default: the bucket of the longest block.
    max_deps, max_uses: D and C; default: the smallest dep bucket that fits.
    renaming: the table's register files (`renaming_for(table)`); None for a CPU
      without any (every register write merely maps, nothing is eliminated).

  Returns:
    A BlockBatch with leading dimension len(blocks).

  Raises:
    KeyError: an opcode key is not in `keys` (the message names block and key).
    ValueError: a block is empty or longer than L.
  """
  key_of = key_lookup(keys)
  encodings = []
  for b, blk in enumerate(blocks):
    try:
      encodings.append(encode_block(blk, keys, renaming, key_of))
    except KeyError as e:
      raise KeyError(f"block {b}: {e.args[0]}") from None
    except ValueError as e:
      raise ValueError(f"block {b}: {e}") from None
  return assemble(encodings, length=length, max_deps=max_deps, max_uses=max_uses)


@collector_paused()
def assemble(encodings: Sequence[Encoding], *, length: int | None = None,
             max_deps: int | None = None, max_uses: int | None = None) -> BlockBatch:
  """Pads encodings into one batch (`length`, `max_deps`, `max_uses` as in `encode`).

  Raises:
    ValueError: a block is longer than L, or has more deps or consumers than D or C.
  """
  B = len(encodings)
  L = length or bucket_length(max((e.length for e in encodings), default=1))
  # Few distinct shapes keep compilations few: C at least min(L, 32). D is the bucket of
  # the most deps: 4 for all but 2 of 11,959 distinct BHive encodings, and every dep slot
  # costs the cycle loop work (D = 8 took 1.13 s against 1.00 s for 4,096 short blocks:
  # `benchmarks/RESULTS.md`, Simulator speed).
  D = max_deps or bucket_of(max((e.max_deps for e in encodings), default=1),
                          DEP_BUCKETS + (128, 256))
  C = max_uses or max(min(L, 32), bucket_of(max((e.max_uses for e in encodings), default=1),
                                          DEP_BUCKETS + (128, 256)))
  # Rows of (indices..., values...) gathered in Python, written into the arrays at once.
  instr_rows, write_rows, dep_rows, use_rows = [], [], [], []
  for b, enc in enumerate(encodings):
    if enc.length > L:
      raise ValueError(f"block {b} has {enc.length} instructions, more than the padded "
                       f"length {L}")
    if enc.max_deps > D:
      raise ValueError(f"block {b}: an instruction has {enc.max_deps} deps, more than {D}")
    instr_rows += [(b, *row) for row in enc.instrs]
    write_rows += [(b, *row) for row in enc.writes]
    nuse = [0] * enc.length
    for c, d, p, dist, *rest in enc.deps:
      dep_rows.append((b, c, d, p, dist, *rest))
      if nuse[p] >= C:
        raise ValueError(f"block {b}: instruction {p} has more than {C} consumers")
      use_rows.append((b, p, nuse[p], c, dist, d))
      nuse[p] += 1
  out = dict(length=np.array([e.length for e in encodings], np.int32).reshape(B))
  out.update(_scatter(instr_rows, (B, L), dict(opcode=(np.int32, 0), loads=(bool, False),
                                               stores=(bool, False), eliminated=(bool, False)),
                      present="valid"))
  out.update(_scatter(write_rows, (B, L, MAX_WRITES),
                      dict(write_kind=(np.int32, -1), write_cost=(np.int32, 0),
                           write_alloc=(bool, False))))
  out.update(_scatter(dep_rows, (B, L, D), dict(
      dep_src=(np.int32, 0), dep_dist=(np.int32, 0), dep_role=(np.int32, 0),
      dep_class=(np.int32, 0), dep_waw=(np.int32, -1), dep_first=(np.int32, 0),
      dep_last=(np.int32, ALWAYS)), present="dep_valid"))
  out.update(_scatter(use_rows, (B, L, C), dict(
      use_dst=(np.int32, 0), use_dist=(np.int32, 0), use_edge=(np.int32, 0)),
      present="use_valid"))
  return BlockBatch(**out)
