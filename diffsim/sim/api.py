"""Public entry points: simulate encoded batches, or decoded blocks end to end.

One convention for all of them: `(table, batch_or_blocks, *, iterations=..., ...)`,
options keyword-only, the unit in the result's field names (`total`: llvm-mca's
Total Cycles for `iterations` iterations; `per_100`: steady-state cycles per 100
iterations), and a status code per block beside the cycles (`diffsim.sim.status`):
with `throw=True` (the default) a block that failed raises, with `throw=False` its
code comes back. `encode` turns decoded blocks into a batch for a table.

`simulate` is the jit boundary: it is compiled once per (table layout, bucket
shape) and vmapped over blocks; `simulate_sweep` adds a second vmap over a batch of
parameter tables. Both shard the block axis over every local device with
`shard_map`, so each device runs its own cycle loop without synchronising.
`simulate_blocks` is the convenience layer used by the CLI: it buckets blocks by
length, orders them by expected cost so that batches finish together, and reports a
per-block error instead of failing the whole run; `simulate_chunks` does the same for
blocks that arrive in chunks, starting jobs while later chunks are still produced.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Iterable, NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import Mesh, NamedSharding, PartitionSpec

from diffsim.isa import encode as isa_encode
from diffsim.isa.encode import (BUCKETS, BlockBatch, Encoding, assemble, bucket_length,
                                encode_block, key_lookup, renaming_for, table_key)
from diffsim.isa.heap import collector_paused
from diffsim.isa.ir import Block
from diffsim.params.table import Params, Table
from diffsim.sim import programs, soft, status
from diffsim.sim.dispatch import group_for
from diffsim.sim.facts import gather
from diffsim.sim.issue import POS_BITS
from diffsim.sim.pipeline import integer_globals, run_block, run_queue
from diffsim.sim.state import MAX_GROUP

DEFAULT_MAX_CYCLES = 1 << 20
MAX_WINDOW = 1 << POS_BITS
# Soft mode replays every event of the run in sequence (3 per dynamic instruction), so
# its cost grows with the iterations: 16 is enough for a steady state over the second
# half of the run; the hard paths fast-forward, and take llvm-mca's 100.
SOFT_ITERATIONS = 16


class Cycles(NamedTuple):
  """Hard-mode results per block (`simulate`, `simulate_sweep`)."""

  total: np.ndarray  # [..., B] int32: Total Cycles for `iterations` iterations (llvm-mca's)
  status: np.ndarray  # [..., B] int32: `diffsim.sim.status` codes (OK = 0)


class SoftCycles(NamedTuple):
  """Soft-mode results per block (`simulate_soft`), differentiable in the parameters."""

  total: jax.Array  # [B] float: Total Cycles for `iterations` iterations
  per_100: jax.Array  # [B] float: steady-state cycles per 100 iterations (second half)
  status: jax.Array  # [B] int32: `diffsim.sim.status` codes of the hard runs replayed


class Schedules(NamedTuple):
  """Hard runs that keep their schedule (`record_schedules`)."""

  total: jax.Array  # [B] int32: Total Cycles
  status: jax.Array  # [B] int32: `diffsim.sim.status` codes
  traces: jax.Array  # [B, T, C] int32: the first T dynamic instructions (`state.trace`)


def encode(table: Table, blocks: Sequence[Block], *, length: int | None = None) -> BlockBatch:
  """Decoded blocks as the simulator's input for `table`.

  The table decides more than the opcode indices: its register files (renaming, move
  elimination) and its memory model change the dependence edges, so a batch is only
  right for the table it was encoded for (`diffsim.isa.encode.encode` with the
  table's settings).

  Args:
    table: the CPU table.
    blocks: decoded blocks (`diffsim.decode_blocks`, `diffsim.parse_asm`).
    length: padded length L; default: the bucket of the longest block.

  Returns:
    A BlockBatch [B, L].

  >>> from diffsim import load_table, parse_asm
  >>> encode(load_table("znver3"), [parse_asm("addq %rbx, %rax")]).opcode.shape
  (1, 8)
  """
  return isa_encode.encode(blocks, table.layout.index, length=length,
                           renaming=renaming_for(table))


def rob_entries(rob_size) -> int:
  """ROB entries as the hard simulator has them: rounded, as every integer parameter
  (`integer_globals`), and the largest over a batch of tables."""
  return int(np.max(np.round(np.asarray(rob_size))))


def window_for(rob_size) -> int:
  """Ring size for in-flight instructions: the ROB's entries, rounded up to a multiple
  of 32.

  Every instruction in flight holds at least one ROB entry, so this many slots always
  suffice; the window's width sets the cost of every per-cycle pass over it.
  """
  return _check_window(max(32, -(-rob_entries(rob_size) // 32) * 32))


def _check_window(window: int) -> int:
  if window > MAX_WINDOW:
    raise ValueError(f"a window of {window} slots exceeds the simulator's {MAX_WINDOW} (the "
                     f"ROB size is too large: issue priority keys hold a slot's position)")
  return window


def _mesh() -> Mesh:
  return Mesh(np.array(jax.local_devices()), ("blocks",))


def _run_one(params, structure, layout, window, max_cycles, fast_forward, block, iterations,
             trace=0, group=MAX_GROUP):
  """One block through `run_block` (the table gathered onto it first)."""
  facts = gather(params, structure, layout, block)
  members = jnp.asarray(layout.group_members, jnp.int32)
  return run_block(facts, params, members, iterations, window=window, max_cycles=max_cycles,
                   fast_forward=fast_forward, trace=trace, group=group)


def _sharded_queue(facts, limits, iterations, members, *, window, max_cycles, fast_forward,
                   slots, group):
  """`run_queue` on every local device, each with its share of the jobs."""
  spec = PartitionSpec("blocks")

  @functools.partial(jax.shard_map, mesh=_mesh(), in_specs=(spec, spec, spec),
                     out_specs=(spec, spec), check_vma=False)
  def sharded(facts, limits, iterations):
    return run_queue(facts, limits, members, iterations, slots=slots, window=window,
                     max_cycles=max_cycles, fast_forward=fast_forward, group=group)

  return sharded(facts, limits, iterations)


@functools.partial(jax.jit, static_argnames=("layout", "window", "max_cycles", "fast_forward",
                                             "slots", "group"))
def _simulate(params, structure, batch, iterations, *, layout, window, max_cycles,
              fast_forward, slots, group):
  facts = jax.vmap(lambda b: gather(params, structure, layout, b))(batch)
  limits = jax.tree.map(lambda x: jnp.broadcast_to(x, iterations.shape + x.shape),
                        integer_globals(params))
  return _sharded_queue(facts, limits, iterations, jnp.asarray(layout.group_members, jnp.int32),
                        window=window, max_cycles=max_cycles, fast_forward=fast_forward,
                        slots=slots, group=group)


def _pad_batch(batch: BlockBatch, iterations, multiple: int):
  """Pads the block axis to a multiple of the device count (copies of block 0)."""
  B = batch.opcode.shape[0]
  extra = (-B) % multiple
  if not extra:
    return batch, iterations
  pad = lambda x: np.concatenate([x, np.repeat(x[:1], extra, axis=0)])  # noqa: E731
  return jax.tree.map(pad, batch), pad(iterations)


def simulate(table: Table, batch: BlockBatch, *, iterations: int | np.ndarray = 100,
             fast_forward: bool = True, max_cycles: int = DEFAULT_MAX_CYCLES,
             slots: int | None = None, window: int | None = None,
             throw: bool = True) -> Cycles:
  """Total Cycles of each block, llvm-mca's convention, in hard (exact) mode.

  Args:
    table: the CPU table (`diffsim.load_table`).
    batch: encoded blocks, [B, L] (`encode`).
    iterations: scalar or [B] int: how often each block is repeated.
    fast_forward: jump over exactly repeating iterations (same result, faster).
    max_cycles: static cycle budget; blocks that exceed it get `status.CYCLE_BUDGET`.
    slots: blocks simulated side by side per device; finished slots take the next
      block, so a batch costs the sum of its blocks' cycles, not B x the slowest
      (default `pipeline.slots_for` the bucket length).
    window: ring slots for in-flight instructions (default `window_for` the ROB
      size). A wider ring gives the same cycles at a higher cost: it measures what
      the per-cycle passes over the window cost (`benchmarks/simulate_speed.py`).
    throw: raise `status.SimulationError` when a block fails; otherwise return its code.

  Returns:
    Cycles(total [B] int32, status [B] int32) as numpy arrays.

  >>> from diffsim import load_table, parse_asm
  >>> table = load_table("haswell")
  >>> batch = encode(table, [parse_asm("addq %rbx, %rax; imulq %rax, %rax")])
  >>> simulate(table, batch, iterations=100)
  Cycles(total=array([403], dtype=int32), status=array([0], dtype=int32))
  """
  out = Cycles(*_finish(_run(_program(table, batch, iterations, fast_forward=fast_forward,
                                      max_cycles=max_cycles, slots=slots, window=window))))
  if throw:
    status.check(out.status, what="simulate")
  return out


def _run(program):
  """Launches a `_program` and returns at once: JAX runs it asynchronously, so the host
  can prepare the next batch meanwhile. `_finish` waits for the result: (cycles,
  status, rows) as it takes them."""
  args, static, rows = program
  cycles, codes = programs.call(_simulate, args, static)
  return cycles, codes, rows


def _program(table: Table, batch: BlockBatch, iterations, *, fast_forward: bool = True,
             max_cycles: int = DEFAULT_MAX_CYCLES, slots: int | None = None,
             window: int | None = None):
  """`simulate`'s program call, not yet made: (arguments, static arguments, the order
  that puts its output rows back in the batch's)."""
  rob = rob_entries(table.params.rob_size)
  if window is None:
    window = window_for(rob)
  elif window < rob:
    raise ValueError(f"window {window} is smaller than the ROB ({rob} entries)")
  else:
    _check_window(window)  # window_for checks its own
  B = batch.opcode.shape[0]
  its = np.broadcast_to(np.asarray(iterations, np.int32), (B,)).copy()
  n_dev = len(jax.local_devices())
  batch_p, its_p = _pad_batch(jax.tree.map(np.asarray, batch), its, n_dev)
  # Rows are dealt to the devices in turn rather than in contiguous shares, so that a
  # batch sorted by cost, or padded at its end, gives every device the same mix.
  deal = _deal(len(its_p), n_dev)
  batch_p, its_p = jax.tree.map(lambda x: x[deal], (batch_p, its_p))
  # On the host, so that a table left on one device (a fit's output) is not refused by
  # the program sharded over all of them.
  params = jax.tree.map(np.asarray, table.params)
  return ((params, table.structure, batch_p, its_p),
          dict(layout=table.layout, window=window, max_cycles=max_cycles,
               fast_forward=fast_forward, slots=slots,
               group=group_for(table.params.dispatch_width)), np.argsort(deal)[:B])


def _deal(n: int, n_dev: int) -> np.ndarray:
  """[n] row order that gives device d (a contiguous share of the sharded axis) rows d,
  d + n_dev, d + 2 n_dev, ... (n a multiple of n_dev)."""
  return np.arange(n).reshape(-1, n_dev).T.reshape(-1)


def _finish(launched):
  """(cycles [B], status [B]) as numpy arrays, once the launched program is done."""
  cycles, codes, rows = launched
  return np.asarray(cycles)[rows], np.asarray(codes)[rows]


@functools.partial(jax.jit, static_argnames=("layout", "window", "max_cycles", "slots", "group"))
def _sweep(params, structure, batch, iterations, *, layout, window, max_cycles, slots, group):
  """Every (table, block) pair as one job of the queue: [P, B] cycles and status."""
  P, B = params.dispatch_width.shape[0], iterations.shape[0]
  facts = jax.vmap(lambda p: jax.vmap(lambda b: gather(p, structure, layout, b))(batch))(params)
  limits = jax.vmap(integer_globals)(params)
  limits = jax.tree.map(lambda x: jnp.broadcast_to(x[:, None], (P, B) + x.shape[1:]), limits)
  # Pairs dealt to the devices in turn, as `simulate` deals rows: contiguous shares would
  # give each device whole tables, whose costs differ.
  deal = _deal(P * B, len(jax.local_devices()))
  flat = lambda x: x.reshape((P * B,) + x.shape[2:])[deal]  # noqa: E731
  cycles, codes = _sharded_queue(
      jax.tree.map(flat, facts), jax.tree.map(flat, limits), jnp.tile(iterations, P)[deal],
      jnp.asarray(layout.group_members, jnp.int32), window=window, max_cycles=max_cycles,
      fast_forward=True, slots=slots, group=group)
  back = np.argsort(deal)
  return cycles[back].reshape(P, B), codes[back].reshape(P, B)


def simulate_sweep(table: Table, batch: BlockBatch, *, params: Params, iterations: int = 100,
                   max_cycles: int = DEFAULT_MAX_CYCLES, slots: int | None = None,
                   throw: bool = True) -> Cycles:
  """Total Cycles of every (parameter set, block) pair: [P, B].

  `params` has a leading axis P over parameter sets, all with `table`'s structure
  and layout (`diffsim.params.sample.sample_params`); each set is simulated against
  every block. The P x B pairs share one queue of `slots` simulation slots per
  device, so the sweep costs the sum of the pairs' cycles, as `simulate` does for
  blocks. Options as in `simulate`.

  Returns:
    Cycles(total [P, B] int32, status [P, B] int32) as numpy arrays.
  """
  B = batch.opcode.shape[0]
  n_dev = len(jax.local_devices())
  # The flattened job axis (P x B) is sharded, so B is padded to the device count.
  batch_p, its = _pad_batch(jax.tree.map(np.asarray, batch), np.full(B, iterations, np.int32),
                            n_dev)
  window = window_for(params.rob_size)
  params = jax.tree.map(np.asarray, params)  # on the host, as in `simulate`
  cycles, codes = programs.call(
      _sweep, (params, table.structure, batch_p, its),
      dict(layout=table.layout, window=window, max_cycles=max_cycles, slots=slots,
           group=group_for(params.dispatch_width)))
  out = Cycles(np.asarray(cycles)[:, :B], np.asarray(codes)[:, :B])
  if throw:
    status.check(out.status, what="simulate_sweep")
  return out


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
                    batch_size: int | None = None, progress: bool = False) -> list[Prediction]:
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

  Returns:
    One Prediction per input, in input order; cycles are per 100 iterations. A block
    that fails is an error in its row, never an exception: its Prediction has no
    cycles, and `status` holds the simulator's code when the block ran.

  >>> from diffsim import load_table, parse_asm
  >>> simulate_blocks(load_table("haswell"), [parse_asm("imulq %rax, %rax")])
  [Prediction(cycles=303.0, error=None, status=0)]
  """
  return simulate_chunks(table, [blocks], iterations=iterations, throughput=throughput,
                         max_cycles=max_cycles, batch_size=batch_size, progress=progress)


def simulate_chunks(table: Table, chunks: Iterable[Sequence[Block | Exception]], *,
                    iterations: int = 100, throughput: str = "total",
                    max_cycles: int = DEFAULT_MAX_CYCLES, batch_size: int | None = None,
                    progress: bool = False, total: int | None = None) -> list[Prediction]:
  """`simulate_blocks` of the blocks of `chunks` in order, as they arrive (from a decoder
  that yields them chunk by chunk): a job starts as soon as its bucket holds a full
  job's blocks, so the devices simulate while later chunks are still being produced.

  A full job takes its bucket's most expensive waiting blocks, and what is left at the
  end goes out most expensive first too, so that each job's queue ends with short
  blocks (`cost_estimates`). A block whose encoding an earlier block already has is
  not simulated again: it takes that block's result (BHive's blocks often differ only
  in registers, immediates or displacements). `total`: the number of blocks to come,
  if known, for the progress bar.
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
  previous = None  # the job on the devices, collected when the next one launches

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
      (ids, program), ahead = ahead, prepare(k + 1)
      started = ids, _run(program)
      _collect(previous, out, copies, iterations, throughput, bar)
      previous = started

  for chunk in chunks:
    first = len(out)
    new, n, keys = [], [], []  # blocks with an encoding not seen before
    with collector_paused():  # encodings are many small tuples
      for b in chunk:
        i = len(out)
        encoding = _encoded(table, b, supported, renaming, key_of)
        if isinstance(encoding, str):
          out.append(Prediction(None, encoding))
          bar.update(1)  # a row with an error is done
          continue
        out.append(None)
        if carrier.setdefault(encoding, i) != i:
          copies.setdefault(carrier[encoding], []).append(i)
          continue
        encodings[i] = encoding
        waiting.setdefault(bucket_length(encoding.length), []).append(i)
        new.append(i)
        n.append(encoding.length)
        keys += [row[1] for row in encoding.instrs]
    cost = np.concatenate([cost, np.zeros(len(out) - first)])
    cost[new] = _costs(table, np.array(n, int), np.array(keys, int))
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
  _collect(previous, out, copies, iterations, throughput, bar)
  bar.close()
  return out  # type: ignore[return-value]


def _encoded(table: Table, block: Block | Exception, supported, renaming, key_of):
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
  """One job's `_program`, its blocks padded to `L`; its program starts loading
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
  program = _program(table, batch, np.concatenate([its, np.zeros(size - len(its), int)]),
                     max_cycles=max_cycles)
  programs.prefetch(_simulate, *program[:2])
  return program


def _padded(rows: int) -> int:
  """A job's rows padded to a power of two (with zero-iteration copies, which finish at
  once), so that few batch shapes, hence few compilations, ever occur."""
  return max(8, 1 << (rows - 1).bit_length())


@collector_paused()
def _collect(started, out, copies: dict, iterations: int, throughput: str, bar) -> None:
  """Waits for a launched job and writes its rows, and those of their `copies` (and
  counts them on `bar`)."""
  if started is None:
    return
  ids, launched = started
  cyc, codes = _finish(launched)
  m = len(ids)
  if throughput == "total":
    vals, codes = cyc[:m] * (100.0 / iterations), codes[:m]
  else:
    vals = 100.0 * (cyc[m:2 * m] - cyc[:m]) / iterations
    codes = codes[:m] | codes[m:2 * m]
  done = 0
  for i, v, code in zip(ids, vals, codes.tolist()):
    result = (Prediction(None, status.message(code), code) if code else Prediction(float(v)))
    for j in (i, *copies.get(i, ())):
      out[j] = result
      done += 1
  bar.update(done)


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


@functools.partial(jax.jit, static_argnames=("layout", "window", "trace", "group"))
def _timeline(params, structure, batch, iterations, *, layout, window, trace, group):
  block = jax.tree.map(lambda x: x[0], batch)
  return _run_one(params, structure, layout, window, DEFAULT_MAX_CYCLES, False, block,
                  iterations, trace, group)


def timeline(table: Table, block: Block, iterations: int = 10):
  """Per-instruction cycles of one block, for comparison with llvm-mca's timeline.

  Returns:
    (total cycles, [iterations, len(block), 3] int array of the dispatch, issue and
    retire cycle of every dynamic instruction).
  """
  batch = encode(table, [block])
  n = len(block.instrs)
  cycles, code, trace = _timeline(table.params, table.structure, batch, jnp.int32(iterations),
                               layout=table.layout,
                               window=window_for(np.asarray(table.params.rob_size)),
                               trace=n * iterations,
                               group=group_for(table.params.dispatch_width))
  status.check(np.asarray(code)[None], what="timeline")
  return int(cycles), np.asarray(trace)[:, :3].reshape(iterations, n, 3)


@functools.partial(jax.jit, static_argnames=("layout", "window", "dynamic", "max_cycles"))
def _record(params, structure, batch, iterations, *, layout, window, dynamic, max_cycles):
  members = jnp.asarray(layout.group_members, jnp.int32)
  spec = PartitionSpec("blocks")

  @functools.partial(jax.shard_map, mesh=_mesh(), in_specs=(PartitionSpec(), spec, spec),
                     out_specs=(spec, spec, spec), check_vma=False)
  def sharded(params, batch, iterations):
    def one(block, its):
      facts = gather(params, structure, layout, block)
      return run_block(facts, params, members, its, window=window, max_cycles=max_cycles,
                       fast_forward=False, trace=dynamic)
    return jax.vmap(one)(batch, iterations)

  return sharded(params, batch, iterations)


def record_schedules(table: Table, batch: BlockBatch, *, params: Params | None = None,
                     iterations: int | np.ndarray = SOFT_ITERATIONS, dynamic: int | None = None,
                     window: int | None = None,
                     max_cycles: int = DEFAULT_MAX_CYCLES) -> Schedules:
  """Hard runs that keep their schedule, for soft mode to replay.

  Args:
    table: the CPU table (its structure and layout; its parameters by default).
    batch: encoded blocks [B, L] (`encode`).
    params: the parameters to run, rounded as in `simulate` (default the table's);
      tables of one layout and window share one compiled program.
    iterations: scalar or [B] int.
    dynamic: trace rows T, the first dynamic instructions of each block (default
      L x the most iterations: every one); a block that runs more gets
      `status.TRACE_LENGTH`, since its replay would be truncated.
    window: ring slots (default `window_for` the table's ROB).
    max_cycles: static cycle budget, as in `simulate`.

  Returns:
    Schedules(total [B], status [B], traces [B, T, C]). No exception: the caller
    decides what a failed block means (`simulate_soft` and `fit` raise by default).
  """
  params = table.params if params is None else params
  B, L = batch.opcode.shape
  its = np.broadcast_to(np.asarray(iterations, np.int32), (B,))
  dynamic = L * int(its.max(initial=1)) if dynamic is None else dynamic
  window = window_for(np.asarray(table.params.rob_size)) if window is None else window
  # Blocks are sharded over the local devices: B padded to their count.
  batch_p, its_p = _pad_batch(jax.tree.map(np.asarray, batch), its, len(jax.local_devices()))
  params = jax.device_put(lax.stop_gradient(params), NamedSharding(_mesh(), PartitionSpec()))
  out = _record(params, table.structure, batch_p, its_p, layout=table.layout, window=window,
                dynamic=dynamic, max_cycles=max_cycles)
  return Schedules(*(x[:B] for x in out))


def simulate_soft(table: Table, batch: BlockBatch, *, params: Params | None = None,
                  iterations: int = SOFT_ITERATIONS, tau: float = 0.5,
                  straight_through: bool = False, max_cycles: int = DEFAULT_MAX_CYCLES,
                  throw: bool = True) -> SoftCycles:
  """Differentiable throughputs: the hard simulator's schedule replayed with float
  parameters.

  The hard simulator runs the blocks with `params` rounded (default the table's) and
  keeps each schedule; soft mode (`diffsim.sim.soft`) replays it with `params` as
  floats, so the result is differentiable in `params`. At tau = 0 both `total` and
  `per_100` equal the hard simulator's.

  Args:
    table: the CPU table.
    batch: encoded blocks [B, L] (`encode`).
    params: the parameters to differentiate (default the table's).
    iterations: iterations simulated (default 16, not 100: the replay visits every
      event in sequence, so its cost grows with them); `per_100` is measured over
      the second half.
    tau: temperature of the relaxed max, in cycles (0: exact).
    straight_through: exact max forward, tempered gradient backward.
    max_cycles: static cycle budget of the hard runs, as in `simulate`.
    throw: raise `status.SimulationError` when a hard run failed (its schedule would
      be replayed truncated or meaningless); otherwise return the codes.

  Returns:
    SoftCycles(total [B], per_100 [B], status [B]).

  >>> import jax
  >>> from diffsim import load_table, parse_asm
  >>> table = load_table("haswell")
  >>> batch = encode(table, [parse_asm("addq %rbx, %rax; imulq %rax, %rax")])
  >>> per_100 = lambda p: simulate_soft(table, batch, params=p, tau=0.0).per_100.sum()
  >>> grad = jax.grad(per_100)(table.params)
  >>> float(grad.latency[table.layout.index["IMUL64rr"], 0])
  100.0
  """
  params = jax.tree.map(jnp.asarray, table.params if params is None else params)
  recorded = record_schedules(table, batch, params=params, iterations=iterations,
                              max_cycles=max_cycles)
  if throw:
    status.check(recorded.status, what="simulate_soft")
  traces = jax.device_put(recorded.traces, jax.local_devices()[0])

  def one(block, trace):
    return soft.block_throughputs(params, table.structure, table.layout, block, trace,
                                  iterations, tau, straight_through)[:2]
  total, per_100 = jax.vmap(one)(batch, traces)
  return SoftCycles(total, per_100, recorded.status)
