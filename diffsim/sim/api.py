"""Public entry points on encoded batches: hard, swept, traced and soft runs.

One convention for all of them: `(table, batch_or_blocks, *, iterations=..., ...)`,
options keyword-only, the unit in the result's field names (`total`: llvm-mca's
Total Cycles for `iterations` iterations; `per_100`: steady-state cycles per 100
iterations), and a status code per block beside the cycles (`diffsim.sim.status`):
with `throw=True` (the default) a block that failed raises, with `throw=False` its
code comes back. `encode` turns decoded blocks into a batch for a table.

`simulate` is the jit boundary: it is compiled once per (table layout, bucket
shape) and vmapped over blocks; `simulate_sweep` adds a second vmap over a batch of
parameter tables. Both shard the block axis over every local device with
`shard_map`, so each device runs its own cycle loop without synchronising
(`diffsim.sim.kernels`); in a multi-process run (`diffsim.sim.hosts.initialize`) each
process first takes its share of the blocks, and every process gets all results. Decoded blocks end to end: `diffsim.sim.blocks`.
"""

from __future__ import annotations

from typing import NamedTuple, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax import lax
from jax.sharding import NamedSharding, PartitionSpec

from diffsim.isa import encode as isa_encode
from diffsim.isa.encode import BlockBatch, renaming_for
from diffsim.isa.ir import Block
from diffsim.params.table import Params, Table
from diffsim.sim import hosts, programs, soft, status
from diffsim.sim.dispatch import group_for
from diffsim.sim.kernels import (DEFAULT_MAX_CYCLES, finish, launch, mesh, pad_batch, program,
                                 record_jobs, sweep_jobs, trace_one, window_for)

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


def simulate(table: Table, batch: BlockBatch, *, iterations: int | np.ndarray = 100,
             fast_forward: bool = True, max_cycles: int = DEFAULT_MAX_CYCLES,
             slots: int | None = None, window: int | None = None,
             group: int | None = None, throw: bool = True) -> Cycles:
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
    group: instructions per dispatch pass (default `dispatch.group_for` the table's
      width, the least that serves it). A larger one gives the same cycles; callers
      that run tables of several widths pass their widest, so one program serves all.
    throw: raise `status.SimulationError` when a block fails; otherwise return its code.

  Returns:
    Cycles(total [B] int32, status [B] int32) as numpy arrays.

  >>> from diffsim import load_table, parse_asm
  >>> table = load_table("haswell")
  >>> batch = encode(table, [parse_asm("addq %rbx, %rax; imulq %rax, %rax")])
  >>> simulate(table, batch, iterations=100)
  Cycles(total=array([403], dtype=int32), status=array([0], dtype=int32))
  """
  B = batch.opcode.shape[0]
  its = np.broadcast_to(np.asarray(iterations, np.int32), (B,))
  shares = _shares(table, batch, its)  # one per process (`diffsim.sim.hosts`)
  mine = shares[hosts.index()]
  batch, its = share_rows(batch, its, mine, max(map(len, shares)))
  local = finish(launch(program(table, batch, its, fast_forward=fast_forward,
                                max_cycles=max_cycles, slots=slots, window=window,
                                group=group)))
  out = Cycles(*hosts.gather(tuple(x[:len(mine)] for x in local), shares, B))
  if throw:
    status.check(out.status, what="simulate")
  return out


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

  >>> import jax, jax.numpy as jnp
  >>> from diffsim import load_table, parse_asm
  >>> table = load_table("haswell")
  >>> params = jax.tree.map(lambda x: jnp.stack([x, x]), table.params)
  >>> params = params.replace(dispatch_width=jnp.array([4.0, 1.0]))  # two tables
  >>> batch = encode(table, [parse_asm("addq %rbx, %rax; addq %rcx, %rdx")])
  >>> simulate_sweep(table, batch, params=params).total
  array([[103],
         [203]], dtype=int32)
  """
  B = batch.opcode.shape[0]
  # Blocks are dealt to the processes (`diffsim.sim.hosts`), each crossing all tables.
  its = np.full(B, iterations, np.int32)
  shares = _shares(table, batch, its)
  mine = shares[hosts.index()]
  batch, its = share_rows(batch, its, mine, max(map(len, shares)))
  n_dev = len(jax.local_devices())
  # The flattened job axis (P x B) is sharded, so B is padded to the device count.
  batch_p, its = pad_batch(batch, its, n_dev)
  window = window_for(params.rob_size)
  params = jax.tree.map(np.asarray, params)  # on the host, as in `simulate`
  cycles, codes = programs.call(
      sweep_jobs, (params, table.structure, batch_p, its),
      dict(layout=table.layout, window=window, max_cycles=max_cycles, slots=slots,
           group=group_for(params.dispatch_width)))
  local = (np.asarray(cycles)[:, :len(mine)].T, np.asarray(codes)[:, :len(mine)].T)
  out = Cycles(*(x.T for x in hosts.gather(local, shares, B)))
  if throw:
    status.check(out.status, what="simulate_sweep")
  return out


def _shares(table: Table, batch: BlockBatch, iterations: np.ndarray) -> list[np.ndarray]:
  """Each process's rows: the most expensive first, dealt in turn (`hosts.deal`; one
  process: all rows, in order)."""
  B = batch.opcode.shape[0]
  if hosts.count() == 1:
    return [np.arange(B)]
  from diffsim.sim.blocks import batch_costs

  return hosts.deal(B, cost=batch_costs(table, batch) * np.asarray(iterations))


def share_rows(batch: BlockBatch, iterations: np.ndarray, rows: np.ndarray, size: int):
  """(batch, iterations) of `rows` (a process's share), on the host, padded to `size`
  rows with zero-iteration copies (which finish at once), so that every process runs
  the same shapes, hence one compiled program."""
  rows = np.asarray(rows, np.int64)
  if size == len(rows) == batch.opcode.shape[0] and np.array_equal(rows, np.arange(size)):
    return jax.tree.map(np.asarray, batch), np.asarray(iterations, np.int32)  # no copy
  take, real = padded(rows, size)
  its = np.where(real, np.asarray(iterations, np.int32)[take], 0).astype(np.int32)
  return jax.tree.map(lambda x: np.asarray(x)[take], batch), its


def padded(rows: np.ndarray, size: int) -> tuple[np.ndarray, np.ndarray]:
  """`rows` padded to `size` with copies of its first row (row 0 if empty), and which
  of them are real: the one way a process's share of rows gets a common shape."""
  rows = np.asarray(rows, np.int64)
  take = np.concatenate([rows, np.full(size - len(rows), rows[0] if len(rows) else 0)])
  return take, np.arange(size) < len(rows)


def timeline(table: Table, block: Block, iterations: int = 10):
  """Per-instruction cycles of one block, for comparison with llvm-mca's timeline.

  Returns:
    (total cycles, [iterations, len(block), 3] int array of the dispatch, issue and
    retire cycle of every dynamic instruction).
  """
  batch = encode(table, [block])
  n = len(block.instrs)
  cycles, code, trace = trace_one(table.params, table.structure, batch, jnp.int32(iterations),
                               layout=table.layout,
                               window=window_for(np.asarray(table.params.rob_size)),
                               trace=n * iterations,
                               group=group_for(table.params.dispatch_width))
  status.check(np.asarray(code)[None], what="timeline")
  return int(cycles), np.asarray(trace)[:, :3].reshape(iterations, n, 3)


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
  batch_p, its_p = pad_batch(jax.tree.map(np.asarray, batch), its, len(jax.local_devices()))
  params = jax.device_put(lax.stop_gradient(params), NamedSharding(mesh(), PartitionSpec()))
  out = record_jobs(params, table.structure, batch_p, its_p, layout=table.layout, window=window,
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
