"""Blocks to fixed-shape arrays: the simulator's input.

`encode` resolves, once per block, every register dependency of the looped block:
for each register source of instruction c, the instruction that produced the value
in the same iteration (distance 0) or in the previous one (distance 1, loop-carried).
A partial write (`movb $1,%al`) keeps the rest of the old value, so a later full
read also depends on the writer before it, and so on back to a full write
(pipeline-model.md 4.5). Dependencies are edges; each instruction has at most D in,
and each producer at most C out (its consumers, the same edges seen from the other
end, which the simulator uses to wake readers up).

Blocks are padded to a bucket length L (a few sizes, so that only a handful of
programs compile) with a `valid` mask. Shapes: B blocks, L instructions, D deps per
instruction, C consumers per instruction.
"""

from __future__ import annotations

import dataclasses
import re
from typing import Mapping, Sequence

import numpy as np

from diffsim.isa.ir import FLAGS, Block
from diffsim.params.table import READ_CLASSES, WRITE_ROLES

BUCKETS = (8, 16, 32, 64, 128, 256)
DEP_BUCKETS = (4, 8, 16, 32, 64)
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
  use_dst: np.ndarray  # [B, L, C] int32: consumer's index in the block
  use_dist: np.ndarray  # [B, L, C] int32: iterations from producer to consumer
  use_edge: np.ndarray  # [B, L, C] int32: the edge's slot d in the consumer's deps
  use_valid: np.ndarray  # [B, L, C] bool
  write_kind: np.ndarray  # [B, L, 8] int32: register kind of each write (REG_KINDS), -1 none
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
  if w.role.startswith("op"):
    role = w.role if w.role in WRITE_ROLES else "other"
  else:
    role = w.reg if w.reg in WRITE_ROLES else "other"
  return WRITE_ROLES.index(role)


def _read_class(r) -> int:
  if r.role in READ_CLASSES:
    return READ_CLASSES.index(r.role)
  if r.role in ("base", "index"):
    return READ_CLASSES.index("addr")
  if r.role == "flags":
    return READ_CLASSES.index("flags")
  return READ_CLASSES.index("implicit")


def dependencies(block: Block) -> list[list[tuple[int, int, int, int]]]:
  """Per instruction: its deps as (producer, distance, write role, read class)."""
  n = len(block.instrs)
  deps: list[list[tuple[int, int, int, int]]] = []
  for c, ins in enumerate(block.instrs):
    mine = []
    for r in ins.reads:
      cls = _read_class(r)
      # Walk back through the looped block to the last writer, and past partial
      # writers to the full write whose value they merge into.
      for m in range(1, n + 1):
        p = c - m
        prod = block.instrs[p % n]
        hit = [w for w in prod.writes if w.reg == r.reg]
        if not hit:
          continue
        w = hit[0]
        edge = (p % n, 1 if p < 0 else 0, _write_role(w), cls)
        if edge not in mine:
          mine.append(edge)
        if not w.merge:
          break
        # A partial write that covers every bit the read needs ends the walk too:
        # after `movsd (%rcx),%xmm1` a read of %xmm1 waits only for the movsd.
        need, wrote = getattr(r, "width", 0), getattr(w, "width", 0)
        if need and wrote and wrote >= need:
          break
    deps.append(mine)
  return deps


_CONDITION = re.compile(r"^(?:set|cmov)(?P<cc>[a-z]+)$")


def table_key(ins, keys: Mapping[str, int]) -> str | None:
  """The key a table knows this instruction by, most specific first.

  Tables may refine a key by condition code (`SETCCr@a`: LLVM 14 folds the condition
  into an operand, and Intel models cost `seta`/`setbe` differently) and may lack a
  `@same` variant that a CPU does not special-case (then the plain opcode applies).
  """
  m = _CONDITION.match(ins.mnemonic)
  if m and "@" not in ins.key and f"{ins.key}@{m.group('cc')}" in keys:
    return f"{ins.key}@{m.group('cc')}"
  if ins.key in keys:
    return ins.key
  if ins.opcode in keys:
    return ins.opcode
  return None


def _bucket(n: int, buckets: Sequence[int]) -> int:
  for b in buckets:
    if n <= b:
      return b
  raise ValueError(f"{n} exceeds the largest bucket {buckets[-1]}")


def bucket_length(n: int) -> int:
  """The padded length for a block of n instructions (ValueError past the largest)."""
  return _bucket(n, BUCKETS)


def encode(blocks: Sequence[Block], keys: Mapping[str, int], *, length: int | None = None,
           max_deps: int | None = None, max_uses: int | None = None) -> BlockBatch:
  """Encodes blocks into one padded batch.

  Args:
    blocks: decoded blocks.
    keys: opcode key -> index (a table's `Layout.index`); every key must be present.
    length: padded length L; default: the bucket of the longest block.
    max_deps, max_uses: D and C; default: the smallest dep bucket that fits.

  Returns:
    A BlockBatch with leading dimension len(blocks).

  Raises:
    KeyError: an opcode key is not in `keys` (the message names block and key).
    ValueError: a block is empty or longer than L.
  """
  B = len(blocks)
  for b, blk in enumerate(blocks):
    if not blk.instrs:
      raise ValueError(f"block {b} is empty")
  L = length or bucket_length(max((len(b) for b in blocks), default=1))
  all_deps = [dependencies(b) for b in blocks]
  uses_count = []
  for deps in all_deps:
    cnt = {}
    for ds in deps:
      for (p, *_rest) in ds:
        cnt[p] = cnt.get(p, 0) + 1
    uses_count.append(max(cnt.values(), default=0))
  # Few distinct shapes keep compilations few: D at least 8, C at least min(L, 32).
  D = max_deps or max(8, _bucket(max((len(d) for ds in all_deps for d in ds), default=1),
                                 DEP_BUCKETS + (128, 256)))
  C = max_uses or max(min(L, 32), _bucket(max(uses_count, default=1), DEP_BUCKETS + (128, 256)))
  from diffsim.params.table import REG_KINDS

  out = dict(
      opcode=np.zeros((B, L), np.int32), valid=np.zeros((B, L), bool),
      length=np.zeros(B, np.int32),
      dep_src=np.zeros((B, L, D), np.int32), dep_dist=np.zeros((B, L, D), np.int32),
      dep_role=np.zeros((B, L, D), np.int32), dep_class=np.zeros((B, L, D), np.int32),
      dep_valid=np.zeros((B, L, D), bool),
      use_dst=np.zeros((B, L, C), np.int32), use_dist=np.zeros((B, L, C), np.int32),
      use_edge=np.zeros((B, L, C), np.int32), use_valid=np.zeros((B, L, C), bool),
      write_kind=np.full((B, L, 8), -1, np.int32),
      loads=np.zeros((B, L), bool), stores=np.zeros((B, L), bool))
  for b, (blk, deps) in enumerate(zip(blocks, all_deps)):
    n = len(blk.instrs)
    if n > L:
      raise ValueError(f"block {b} has {n} instructions, more than the padded length {L}")
    out["length"][b] = n
    nuse = [0] * n
    for c, ins in enumerate(blk.instrs):
      key = table_key(ins, keys)
      if key is None:
        raise KeyError(f"block {b}: instruction {c} `{ins.text}` has opcode key {ins.key!r}, "
                       "which the parameter table does not know")
      out["opcode"][b, c] = keys[key]
      out["valid"][b, c] = True
      out["loads"][b, c] = ins.loads
      out["stores"][b, c] = ins.stores
      for j, w in enumerate(ins.writes[:8]):
        out["write_kind"][b, c, j] = REG_KINDS.index(reg_kind(w.reg))
      if len(deps[c]) > D:
        raise ValueError(f"block {b}: instruction {c} has {len(deps[c])} deps, more than {D}")
      for d, (p, dist, role, cls) in enumerate(deps[c]):
        out["dep_src"][b, c, d] = p
        out["dep_dist"][b, c, d] = dist
        out["dep_role"][b, c, d] = role
        out["dep_class"][b, c, d] = cls
        out["dep_valid"][b, c, d] = True
        u = nuse[p]
        if u >= C:
          raise ValueError(f"block {b}: instruction {p} has more than {C} consumers")
        out["use_dst"][b, p, u] = c
        out["use_dist"][b, p, u] = dist
        out["use_edge"][b, p, u] = d
        out["use_valid"][b, p, u] = True
        nuse[p] += 1
  return BlockBatch(**out)
