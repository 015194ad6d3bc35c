"""Decoded blocks end to end: per-block errors, buckets, jobs ordered by cost.

`simulate_blocks` is what the CLI uses: it buckets blocks by length, orders them by
expected cost so that each job's queue finishes together, simulates each distinct
encoding once, and reports a per-block error instead of failing the whole run;
`simulate_chunks` does the same for blocks that arrive in chunks, starting jobs while
later chunks are still produced.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
from pathlib import Path
from typing import Iterable, Sequence

import jax
import numpy as np

from diffsim.isa.encode import (BUCKETS, Encoding, assemble, bucket_length, encode_block,
                                key_lookup, renaming_for, table_key)
from diffsim.isa.heap import collector_paused
from diffsim.isa.ir import Block
from diffsim.params.table import Table
from diffsim.sim import hosts, programs, status
from diffsim.sim.kernels import DEFAULT_MAX_CYCLES, finish, launch, program, simulate_jobs


@dataclasses.dataclass(frozen=True)
class Prediction:
  """One block's result: cycles for 100 iterations, or why there is none (`status`: the
  simulator's code when it ran the block and it failed; `error` says it in words)."""

  cycles: float | None
  error: str | None = None
  status: int = status.OK


def cost_estimates(table: Table, blocks: Sequence[Block]) -> np.ndarray:
  """[B] rough cost guesses, used only to order blocks by cost: the larger of a block's
  micro-ops over the dispatch width and half its longest latency, times its length."""
  keys = _key_indices(table, blocks)
  for b, (block, k) in enumerate(zip(blocks, keys)):
    if k is None:
      raise KeyError(f"block {b}: {block_error(table, block)}")
  return _costs(table, np.array([len(k) for k in keys], int),
                np.array([i for k in keys for i in k], int))


def _costs(table: Table, n: np.ndarray, keys: np.ndarray) -> np.ndarray:
  """`cost_estimates` of blocks of n [B] instructions whose key indices, block after
  block, are `keys`."""
  if not len(n):
    return np.zeros(0)
  starts = np.cumsum(n) - n
  uops = np.add.reduceat(np.asarray(table.params.uops)[keys], starts)
  latency = np.asarray(table.params.latency)
  slowest = np.maximum.reduceat(latency.reshape(latency.shape[0], -1).max(axis=1)[keys], starts)
  per_iteration = np.maximum(uops / float(table.params.dispatch_width), slowest / 2.0)
  return np.maximum(per_iteration, 0.25) * n


def batch_costs(table: Table, batch) -> np.ndarray:
  """`cost_estimates` of the blocks of an encoded batch [B]."""
  valid = np.asarray(batch.valid)
  return _costs(table, valid.sum(axis=1), np.asarray(batch.opcode)[valid])


@collector_paused()
def _key_indices(table: Table, blocks: Sequence[Block | Exception]) -> list[list[int] | None]:
  """Each block's table key indices (None: a decode failure, an empty block, or a key
  the table lacks)."""
  idx = table.layout.index
  lookup = key_lookup(idx)
  out: list[list[int] | None] = []
  for b in blocks:
    keys = None if isinstance(b, Exception) else [lookup(ins) for ins in b.instrs]
    out.append([idx[k] for k in keys] if keys and None not in keys else None)
  return out


def block_error(table: Table, block: Block | Exception, supported=None) -> str | None:
  """Why the simulator cannot run `block` with `table` (None: it can)."""
  if isinstance(block, Exception):
    return f"decode: {block}"
  if not block.instrs:
    return "empty block"
  if len(block.instrs) > BUCKETS[-1]:
    return (f"block has {len(block.instrs)} instructions; the largest supported length is "
            f"{BUCKETS[-1]}")
  idx = table.layout.index
  supported = np.asarray(table.structure.supported) if supported is None else supported
  for j, ins in enumerate(block.instrs):
    key = table_key(ins, idx)
    if key is None or not supported[idx[key]]:
      return (f"instruction {j} `{ins.text}`: opcode {ins.key} is not in the "
              f"{table.layout.cpu} table")
  return None


def job_size(length: int) -> int:
  """Blocks per job for blocks padded to `length`: 4,096 up to 32 instructions, then as
  many instructions' worth (a job's facts are gathered at once).

  Each job's queue drains at its end, slots idling beside its slowest blocks; on the
  20,000 command blocks, jobs of 4,096 made the whole command 0.92x as long as jobs of
  1,024 (`benchmarks/RESULTS.md`, Simulator speed).
  """
  return min(4096, 4096 * 32 // length)


def simulate_blocks(table: Table, blocks: Sequence[Block | Exception], *, iterations: int = 100,
                    throughput: str = "total", max_cycles: int = DEFAULT_MAX_CYCLES,
                    batch_size: int | None = None, progress: bool = False,
                    checkpoint: str | Path | None = None) -> list[Prediction]:
  """Simulates decoded blocks; each result or error lands at its block's position.

  Args:
    table: the CPU table.
    blocks: decoded blocks; an Exception in place of a block (a decode failure) is
      passed through as that row's error.
    iterations: N.
    throughput: "total" (llvm-mca's Total Cycles for N iterations, scaled to 100) or
      "steady" (100 * (cycles(2N) - cycles(N)) / N: BHive's steady-state definition).
    max_cycles: static cycle budget of each run, as in `simulate`.
    batch_size: blocks per compiled call (default `job_size` the bucket length).
    checkpoint: a folder where each job's results are saved as it completes
      (`Checkpoint`); a rerun into it simulates only what is not there yet, with any
      number of processes.

  Returns:
    One Prediction per input, in input order; cycles are per 100 iterations. A block
    that fails is an error in its row, never an exception: its Prediction has no
    cycles, and `status` holds the simulator's code when the block ran.

  >>> from diffsim import load_table, parse_asm
  >>> simulate_blocks(load_table("haswell"), [parse_asm("imulq %rax, %rax")])
  [Prediction(cycles=303.0, error=None, status=0)]
  """
  return simulate_chunks(table, [blocks], iterations=iterations, throughput=throughput,
                         max_cycles=max_cycles, batch_size=batch_size, progress=progress,
                         checkpoint=checkpoint)


def simulate_chunks(table: Table, chunks: Iterable[Sequence[Block | Exception]], *,
                    iterations: int = 100, throughput: str = "total",
                    max_cycles: int = DEFAULT_MAX_CYCLES, batch_size: int | None = None,
                    progress: bool = False, total: int | None = None,
                    checkpoint: str | Path | None = None) -> list[Prediction]:
  """`simulate_blocks` of the blocks of `chunks` in order, as they arrive (from a decoder
  that yields them chunk by chunk): a job starts as soon as its bucket holds a full
  job's blocks, so the devices simulate while later chunks are still being produced.

  A full job takes its bucket's most expensive waiting blocks, and what is left at the
  end goes out most expensive first too, so that each job's queue ends with short
  blocks (`cost_estimates`). A block whose encoding an earlier block already has is
  not simulated again: it takes that block's result (BHive's blocks often differ only
  in registers, immediates or displacements). `total`: the number of blocks to come,
  if known, for the progress bar. `checkpoint`: as in `simulate_blocks`.
  """
  if throughput not in ("total", "steady"):
    raise ValueError(f"throughput must be 'total' or 'steady', not {throughput!r}")
  out: list[Prediction | None] = []  # per block so far
  supported = np.asarray(table.structure.supported)
  renaming, key_of = renaming_for(table), key_lookup(table.layout.index)
  encodings: dict[int, Encoding] = {}  # block -> its encoding, until its job is prepared
  carrier: dict[Encoding, int] = {}  # encoding -> the block simulated for it
  copies: dict[int, list[int]] = {}  # block simulated -> later blocks with its encoding
  waiting: dict[int, list[int]] = {}  # bucket length -> blocks not yet in a job
  cost = np.zeros(0)  # per block, `cost_estimates`
  bar = _progress(progress, total)
  saved = Checkpoint(checkpoint, table, iterations, throughput, max_cycles) \
      if checkpoint is not None else None
  previous = None  # the job on the devices, collected when the next one launches
  # Across processes (`diffsim.sim.hosts`): every process sees every block, and deals
  # each chunk's new encodings of a bucket, most expensive first, in turn.
  n_proc, me = hosts.count(), hosts.index()
  shares: list[list[int]] = [[] for _ in range(n_proc)]  # blocks each process simulates
  turn: dict[int, int] = {}  # bucket length -> encodings dealt so far

  def deal(new: list[int]) -> list[int]:
    """This process's blocks of `new`, in input order (all of them in one process)."""
    if n_proc == 1:
      return new
    owner = {}
    for L in sorted({bucket_length(encodings[i].length) for i in new}):
      ids = [i for i in new if bucket_length(encodings[i].length) == L]
      for k, share in enumerate(hosts.deal(len(ids), n_proc, cost[ids])):
        for j in share:
          owner[ids[j]] = (turn.get(L, 0) + k) % n_proc
      turn[L] = turn.get(L, 0) + len(ids)
    for i in new:
      shares[owner[i]].append(i)
      if owner[i] != me:
        del encodings[i]  # another process simulates it
        if saved is not None:
          del saved.keys[i]
    return [i for i in new if owner[i] == me]

  def take(L: int, ids: list[int], size: int) -> tuple[int, list[int]]:
    """A job of the `size` most expensive of `ids` (removed from it)."""
    order = np.argsort(-cost[ids], kind="stable")
    job = [ids[k] for k in order[:size]]
    ids[:] = [ids[k] for k in order[size:]]
    return L, job

  def run(jobs: list[tuple[int, list[int]]]) -> None:
    """Runs jobs that are ready now, in order. Each launch collects the job before it,
    and each job is encoded, and its program's loading started, one job ahead of its
    launch: the host prepares while the devices simulate."""
    nonlocal previous

    def prepare(k: int):
      if k == len(jobs):
        return None
      L, ids = jobs[k]
      return ids, _prepare_job(table, [encodings.pop(i) for i in ids], L, iterations,
                               throughput, max_cycles)

    ahead = prepare(0)
    for k in range(len(jobs)):
      (ids, call), ahead = ahead, prepare(k + 1)
      started = ids, launch(call)
      _collect(previous, out, copies, iterations, throughput, bar, saved)
      previous = started

  for chunk in chunks:
    first = len(out)
    new, n, keys = [], [], []  # blocks with an encoding not seen before
    with collector_paused():  # encodings are many small tuples
      for b in chunk:
        i = len(out)
        encoding = block_encoding(table, b, supported, renaming, key_of)
        if isinstance(encoding, str):
          out.append(Prediction(None, encoding))
          bar.update(1)  # a row with an error is done
          continue
        if saved is not None and (done := saved.result(encoding)) is not None:
          out.append(done)  # simulated by an earlier run
          bar.update(1)
          continue
        out.append(None)
        if carrier.setdefault(encoding, i) != i:
          copies.setdefault(carrier[encoding], []).append(i)
          continue
        encodings[i] = encoding
        if saved is not None:
          saved.keys[i] = saved.key(encoding)
        new.append(i)
        n.append(encoding.length)
        keys += [row[1] for row in encoding.instrs]
    cost = np.concatenate([cost, np.zeros(len(out) - first)])
    cost[new] = _costs(table, np.array(n, int), np.array(keys, int))
    for i in deal(new):
      waiting.setdefault(bucket_length(encodings[i].length), []).append(i)
    full = []
    for L, ids in sorted(waiting.items()):
      size = batch_size or job_size(L)
      while len(ids) >= size:
        full.append(take(L, ids, size))
    run(full)
  rest = []
  lengths = sorted(L for L, ids in waiting.items() if ids)
  for L, up in zip(lengths, lengths[1:]):
    # What is left of a bucket joins the next one's last job (padded to the longer
    # length) where that job keeps its size: one program and one queue drain fewer.
    if _padded(len(waiting[up]) + len(waiting[L])) == _padded(len(waiting[up])):
      waiting[up] += waiting.pop(L)
  for L, ids in sorted(waiting.items()):
    size = batch_size or job_size(L)
    while ids:
      rest.append(take(L, ids, size))
  run(rest)
  _collect(previous, out, copies, iterations, throughput, bar, saved)
  if n_proc > 1:
    _gather(out, shares, copies, bar)
  # A copy that arrived after its block's job was collected takes its result now.
  late = [(i, j) for i, js in copies.items() for j in js if out[j] is None]
  for i, j in late:
    out[j] = out[i]
  bar.update(len(late))
  bar.close()
  return out  # type: ignore[return-value]


def _gather(out: list, shares: list[list[int]], copies: dict, bar) -> None:
  """Every process's results written into `out` (each process holds its own share's,
  and the copies of those)."""
  mine = shares[hosts.index()]
  vals = np.array([np.nan if out[i].cycles is None else out[i].cycles for i in mine],
                  np.float64)
  codes = np.array([out[i].status for i in mine], np.int32)
  rows = [np.asarray(s, np.int64) for s in shares]
  n = max([len(out)] + [int(s.max()) + 1 for s in rows if len(s)])
  vals, codes = hosts.gather((vals, codes), rows, n)
  done = 0
  for p, share in enumerate(shares):
    if p == hosts.index():
      continue
    for i in share:
      code = int(codes[i])
      result = Prediction(None, status.message(code), code) if code else \
          Prediction(float(vals[i]))
      for j in (i, *copies.get(i, ())):
        out[j] = result
        done += 1
  bar.update(done)


def block_encoding(table: Table, block: Block | Exception, supported, renaming, key_of):
  """`block`'s Encoding, or why the simulator cannot run it (`block_error`)."""
  if isinstance(block, Exception) or not block.instrs or len(block.instrs) > BUCKETS[-1]:
    return block_error(table, block, supported)
  try:
    encoding = encode_block(block, table.layout.index, renaming, key_of)
  except KeyError:  # an opcode key the table lacks
    return block_error(table, block, supported)
  except ValueError as e:
    return f"encode: {e}"
  if not supported[[row[1] for row in encoding.instrs]].all():
    return block_error(table, block, supported)
  return encoding


def _prepare_job(table: Table, encodings: Sequence[Encoding], L: int, iterations: int,
                 throughput: str, max_cycles: int):
  """One job's `program`, its blocks padded to `L`; its program starts loading
  (`programs.prefetch`)."""
  batch = assemble(encodings, length=L)
  m = len(encodings)
  if throughput == "total":
    its = np.full(m, iterations)
  else:  # the same blocks twice: N and 2N iterations
    batch = jax.tree.map(lambda x: np.concatenate([x, x]), batch)
    its = np.concatenate([np.full(m, iterations), np.full(m, 2 * iterations)])
  size = _padded(len(its))
  batch = jax.tree.map(lambda x: np.concatenate([x, np.repeat(x[:1], size - len(its), 0)]),
                       batch)
  call = program(table, batch, np.concatenate([its, np.zeros(size - len(its), int)]),
                 max_cycles=max_cycles)
  programs.prefetch(simulate_jobs, *call[:2])
  return call


def _padded(rows: int) -> int:
  """A job's rows padded to a power of two (with zero-iteration copies, which finish at
  once), so that few batch shapes, hence few compilations, ever occur."""
  return max(8, 1 << (rows - 1).bit_length())


@collector_paused()
def _collect(started, out, copies: dict, iterations: int, throughput: str, bar,
             saved: Checkpoint | None = None) -> None:
  """Waits for a launched job and writes its rows, and those of their `copies` (and
  counts them on `bar`, and saves them in `saved`)."""
  if started is None:
    return
  ids, launched = started
  cyc, codes = finish(launched)
  m = len(ids)
  if throughput == "total":
    vals, codes = cyc[:m] * (100.0 / iterations), codes[:m]
  else:
    vals = 100.0 * (cyc[m:2 * m] - cyc[:m]) / iterations
    codes = codes[:m] | codes[m:2 * m]
  if saved is not None:
    saved.save(ids, vals, codes)
  done = 0
  for i, v, code in zip(ids, vals, codes.tolist()):
    result = (Prediction(None, status.message(code), code) if code else Prediction(float(v)))
    for j in (i, *copies.get(i, ())):
      out[j] = result
      done += 1
  bar.update(done)


class Checkpoint:
  """Results saved job by job in a folder, keyed by the encoding simulated and by all
  that decides its cycles: the table's values, the iterations, the throughput kind, the
  cycle budget and the simulator's source. A rerun into the folder reads them back, so
  a killed run loses at most the jobs it had on its devices, and a finished one costs
  nothing to repeat. Files are written whole or not at all (a rename), so a process
  killed mid-write leaves none; processes of a multi-process run write their own and,
  sharing the folder, read all of them back.
  """

  def __init__(self, folder: str | Path, table: Table, iterations: int, throughput: str,
               max_cycles: int):
    self.dir = Path(folder)
    self.dir.mkdir(parents=True, exist_ok=True)
    h = hashlib.blake2b(digest_size=8)
    h.update(repr((iterations, throughput, max_cycles, table.layout.keys,
                   programs.source_digest(*programs.PROGRAM_SOURCES))).encode())
    for leaf in jax.tree.leaves((table.params, table.structure)):
      x = np.ascontiguousarray(leaf)
      h.update(str((x.dtype.str, x.shape)).encode() + x.tobytes())
    self.run = h.hexdigest()
    self.keys: dict[int, bytes] = {}  # block -> its encoding's key, until saved
    self.known: dict[bytes, tuple[float, int]] = {}
    for path in sorted(self.dir.glob(f"{self.run}-*.npz")):
      try:
        with np.load(path) as z:
          self.known.update(zip(z["keys"].tolist(), zip(z["vals"].tolist(),
                                                        z["codes"].tolist())))
      except (OSError, ValueError, KeyError, EOFError):
        continue  # damaged: those blocks are simulated again
    # Processes that see different files would deal different blocks: then none is
    # taken from the folder.
    if not hosts.same(hashlib.blake2b(b"".join(sorted(self.known))).digest()):
      self.known = {}
    self.written = 0

  @staticmethod
  def key(encoding: Encoding) -> bytes:
    return hashlib.blake2b(repr(encoding).encode(), digest_size=16).digest()

  def result(self, encoding: Encoding) -> Prediction | None:
    if not self.known:
      return None
    got = self.known.get(self.key(encoding))
    if got is None:
      return None
    v, code = got
    return Prediction(None, status.message(code), code) if code else Prediction(float(v))

  def save(self, ids: Sequence[int], vals: np.ndarray, codes: np.ndarray) -> None:
    keys = np.array([self.keys.pop(i) for i in ids], "S16")
    path = self.dir / f"{self.run}-{hosts.index()}-{os.getpid()}-{self.written}.npz"
    tmp = path.with_name(f".{path.stem}.tmp.npz")
    np.savez(tmp, keys=keys, vals=np.asarray(vals[:len(ids)], np.float64),
             codes=np.asarray(codes[:len(ids)], np.int32))
    tmp.replace(path)
    self.written += 1


def _progress(enabled: bool, total: int | None = None):
  if enabled:
    from tqdm.auto import tqdm

    return tqdm(total=total, unit="block", desc="simulate")

  class _Null:
    def update(self, n):
      pass

    def close(self):
      pass

  return _Null()
