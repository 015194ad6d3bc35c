"""What the program model sees of each instruction, from the Block IR alone.

PerfVec describes an instruction by 51 features and lets an LSTM read the 255
instructions before it. A basic block in a loop has its own context: the block itself,
one iteration earlier. So a block of n instructions becomes a sequence of 2n steps (the
block twice); the model reads all of it and sums the representations of the second
copy only, whose every instruction has seen a whole iteration before it, loop-carried
producers included.

Per step: an opcode id (the table-independent opcode key, from a fixed vocabulary of
the BHive corpus's keys; 0 = unknown) and `NUM_FEATURES` numbers: operand counts,
memory facts, idiom flags, the vector width, and the register dependency distances
(1/d for a producer d instructions back in the looped block, 0 for none).
"""

from __future__ import annotations

import dataclasses
import functools
import json
from pathlib import Path
from typing import Sequence

import numpy as np

from diffsim.isa.ir import FLAGS, Block, Instr

_KEYS_FILE = Path(__file__).parent.parent / "params" / "corpus_keys.json"
MAX_SOURCES = 4  # register sources with their own distance feature
SEQ_BUCKETS = (16, 32, 64, 128, 256, 512)  # sequence lengths (2n) that compile
FEATURE_NAMES = (
  "reads", "writes", "loads", "stores", "stack", "zero_idiom", "dep_breaking", "lock", "rep",
  "mem_operands", "mem_bytes", "vector_bits", "flags_read", "flags_written",
  *(f"src{j}_dist" for j in range(MAX_SOURCES)), "addr_dist", "flags_dist", "carried",
  "block_length",
)
NUM_FEATURES = len(FEATURE_NAMES)


@functools.lru_cache(maxsize=1)
def vocabulary() -> tuple[str, ...]:
  """Opcode keys with an embedding: index 0 is unknown, then the corpus's keys (sorted),
  each also with the `@same` variant under which idioms are keyed."""
  keys = json.loads(_KEYS_FILE.read_text())
  base = sorted({k.split("@", 1)[0] for k in keys})
  return ("<unknown>", *sorted(set(base) | {f"{k}@same" for k in keys if "@" in k}))


@functools.lru_cache(maxsize=1)
def _index() -> dict[str, int]:
  return {k: i for i, k in enumerate(vocabulary())}


def opcode_id(key: str) -> int:
  """The key's vocabulary index; a `@same` key falls back on its plain opcode, and an
  unknown opcode on 0."""
  idx = _index()
  return idx.get(key, idx.get(key.split("@", 1)[0], 0))


def _register_width(ins: Instr) -> int:
  return max([r.width for r in ins.reads] + [w.width for w in ins.writes] + [0])


def _distance(block: Block, i: int, reg: str) -> int:
  """Instructions back from i to the last writer of `reg` in the looped block (0: none)."""
  n = len(block.instrs)
  for d in range(1, n + 1):
    j = (i - d) % n
    if any(w.reg == reg for w in block.instrs[j].writes):
      return d
  return 0


def instruction_features(block: Block) -> np.ndarray:
  """[n, NUM_FEATURES] float32 for one block's instructions."""
  n = len(block.instrs)
  out = np.zeros((n, NUM_FEATURES), np.float32)
  inv = lambda d: 1.0 / d if d else 0.0  # noqa: E731
  for i, ins in enumerate(block.instrs):
    sources = [r for r in ins.reads if r.role not in ("base", "index", "flags")]
    address = [r for r in ins.reads if r.role in ("base", "index")]
    src_d = [_distance(block, i, r.reg) for r in sources[:MAX_SOURCES]]
    addr_d = [_distance(block, i, r.reg) for r in address]
    flags_d = _distance(block, i, FLAGS) if ins.flags_read else 0
    all_d = src_d + addr_d + [flags_d]
    carried = any(d > i for d in all_d if d)
    src_d += [0] * (MAX_SOURCES - len(src_d))
    out[i] = [
      len(ins.reads) / 4, len(ins.writes) / 4, ins.loads, ins.stores, ins.stack,
      ins.zero_idiom, ins.dep_breaking, ins.lock, ins.rep, len(ins.mem),
      max([m.size for m in ins.mem] + [0]) / 64, _register_width(ins) / 512,
      bool(ins.flags_read), bool(ins.flags_written), *[inv(d) for d in src_d],
      inv(min([d for d in addr_d if d], default=0)), inv(flags_d), carried,
      np.log1p(n) / np.log1p(256),
    ]
  return out


@dataclasses.dataclass(frozen=True)
class Sequences:
  """Blocks as padded looped sequences (numpy; a pytree through jax.tree_util).

  S is the sequence bucket (at least twice the longest block).
  """

  opcode: np.ndarray  # [B, S] int32: vocabulary ids (0 on padding)
  features: np.ndarray  # [B, S, NUM_FEATURES] float32
  valid: np.ndarray  # [B, S] bool: a real step (either copy)
  counted: np.ndarray  # [B, S] bool: a step of the second copy (summed into the vector)


def _flatten(s):
  return [s.opcode, s.features, s.valid, s.counted], None


def _unflatten(_, leaves):
  return Sequences(*leaves)


try:
  import jax

  jax.tree_util.register_pytree_node(Sequences, _flatten, _unflatten)
except ImportError:  # pragma: no cover
  pass


def seq_bucket(n: int) -> int:
  """The sequence length a block of n instructions is padded to."""
  for s in SEQ_BUCKETS:
    if 2 * n <= s:
      return s
  raise ValueError(f"block has {n} instructions; PerfVec takes at most {SEQ_BUCKETS[-1] // 2}")


def encode_sequences(blocks: Sequence[Block], length: int | None = None) -> Sequences:
  """Blocks as looped sequences, padded to `length` (default: the bucket of the longest).

  Raises:
    ValueError: an empty block, or one too long for `length` (named by position).
  """
  for b, block in enumerate(blocks):
    if not block.instrs:
      raise ValueError(f"block {b} ({block.hex[:32]}) is empty")
  S = length or seq_bucket(max(len(b.instrs) for b in blocks))
  B = len(blocks)
  opcode = np.zeros((B, S), np.int32)
  feats = np.zeros((B, S, NUM_FEATURES), np.float32)
  valid = np.zeros((B, S), bool)
  counted = np.zeros((B, S), bool)
  for b, block in enumerate(blocks):
    n = len(block.instrs)
    if 2 * n > S:
      raise ValueError(f"block {b} has {n} instructions; sequences of {S} hold at most {S // 2}")
    ids = np.array([opcode_id(i.key) for i in block.instrs], np.int32)
    f = instruction_features(block)
    opcode[b, :2 * n] = np.tile(ids, 2)
    feats[b, :2 * n] = np.tile(f, (2, 1))
    valid[b, :2 * n] = True
    counted[b, n:2 * n] = True
  return Sequences(opcode, feats, valid, counted)
