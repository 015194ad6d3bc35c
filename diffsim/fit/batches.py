"""Measured blocks as fixed-shape minibatches for fitting.

Each minibatch holds blocks of one length bucket, padded to the batch size with
zero-weight copies, so one compiled program serves every minibatch of a bucket.
Every block runs for as many iterations as fit `dynamic` dynamic instructions
(an even number, at least 2): short blocks run long enough for a steady state, long
ones stay cheap. Within a bucket blocks are sorted by expected cost before they are
cut into minibatches, so that the blocks of a minibatch finish together.
"""

from __future__ import annotations

import dataclasses

import jax
import numpy as np

from diffsim.isa.decode import decode_blocks
from diffsim.isa.encode import BUCKETS, BlockBatch
from diffsim.params.table import Table
from diffsim.sim.api import encode, padded
from diffsim.sim.blocks import block_error, cost_estimates


def dynamic_for(length: int) -> int:
  """Dynamic instructions traced per block of a bucket (the trace rows, T)."""
  return max(256, 2 * length)


@dataclasses.dataclass(frozen=True)
class Minibatch:
  """B blocks of one bucket. `rows`: positions in the source dataset (-1: padding)."""

  length: int
  batch: BlockBatch
  iterations: np.ndarray  # [B] int32
  y: np.ndarray  # [B] float32 measured cycles per 100 iterations
  weight: np.ndarray  # [B] float32: 1 for real blocks, 0 for padding
  rows: np.ndarray  # [B] int64


def minibatches(table: Table, hexes, y, batch_size: int) -> tuple[list[Minibatch], dict]:
  """Decodes, checks and encodes labelled blocks.

  Returns:
    (minibatches, skipped): `skipped` maps a dataset position to why the block
    cannot be simulated with `table` (decode failure, unknown opcode, too long).
  """
  blocks = decode_blocks(list(hexes))
  skipped, by_len = {}, {}
  supported = np.asarray(table.structure.supported)
  for i, b in enumerate(blocks):
    err = block_error(table, b, supported)
    if err is None and not (np.isfinite(y[i]) and y[i] > 0):
      err = "no positive label"
    if err:
      skipped[i] = err
      continue
    L = next(x for x in BUCKETS if len(b.instrs) <= x)
    by_len.setdefault(L, []).append(i)
  out = []
  for L, ids in sorted(by_len.items()):
    cost = cost_estimates(table, [blocks[i] for i in ids])
    ids = [ids[k] for k in np.argsort(cost, kind="stable")]
    T = dynamic_for(L)
    for s in range(0, len(ids), batch_size):
      part = ids[s:s + batch_size]
      pad = batch_size - len(part)
      rows = np.array(part + [part[0]] * pad, np.int64)
      batch = encode(table, [blocks[i] for i in rows], length=L)
      n = np.array([len(blocks[i].instrs) for i in rows])
      its = np.maximum(2, (T // n) // 2 * 2).astype(np.int32)
      weight = np.r_[np.ones(len(part)), np.zeros(pad)].astype(np.float32)
      out.append(Minibatch(L, batch, its, np.asarray(y, np.float32)[rows], weight,
                           np.where(weight > 0, rows, -1)))
  return out, skipped


def share(mb: Minibatch, parts: int, index: int) -> tuple[Minibatch, np.ndarray]:
  """Part `index` of `parts` of a minibatch, for data-parallel steps: its rows dealt in
  turn (a minibatch is sorted by cost, so every part gets the same mix), padded with
  zero-weight copies to ceil(B / parts) rows, so that every part has one shape.

  Returns:
    (the part, its rows' positions in `mb`: [ceil(B / parts)] int, -1 for padding).
  """
  B = len(mb.weight)
  take, real = padded(np.arange(index, B, parts), -(-B // parts))
  pos = np.where(real, take, -1)
  sub = Minibatch(mb.length, jax.tree.map(lambda x: np.asarray(x)[take], mb.batch),
                  mb.iterations[take], mb.y[take], np.where(real, mb.weight[take], 0.0)
                  .astype(np.float32), np.where(real, mb.rows[take], -1))
  return sub, pos
