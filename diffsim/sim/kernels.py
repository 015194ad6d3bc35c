"""The simulator's compiled programs and their launch.

A job queue of blocks per device (`run_queue` under `shard_map`, the block axis dealt
over every local device), the same for every (table, block) pair of a sweep, one
block with its trace (timelines), and hard runs that keep their schedule for soft
mode. `program` prepares a queue's call on the host, `launch` starts it without
waiting (JAX runs it asynchronously) and `finish` collects it, so that callers can
prepare the next batch while the devices run.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, PartitionSpec

from diffsim.isa.encode import BlockBatch
from diffsim.params.table import Table
from diffsim.sim import programs
from diffsim.sim.dispatch import group_for
from diffsim.sim.facts import gather
from diffsim.sim.issue import POS_BITS
from diffsim.sim.pipeline import integer_globals, run_block, run_queue
from diffsim.sim.state import MAX_GROUP

DEFAULT_MAX_CYCLES = 1 << 20
MAX_WINDOW = 1 << POS_BITS


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
  return check_window(max(32, -(-rob_entries(rob_size) // 32) * 32))


def check_window(window: int) -> int:
  if window > MAX_WINDOW:
    raise ValueError(f"a window of {window} slots exceeds the simulator's {MAX_WINDOW} (the "
                     f"ROB size is too large: issue priority keys hold a slot's position)")
  return window


def mesh() -> Mesh:
  return Mesh(np.array(jax.local_devices()), ("blocks",))


def run_one(params, structure, layout, window, max_cycles, fast_forward, block, iterations,
             trace=0, group=MAX_GROUP):
  """One block through `run_block` (the table gathered onto it first)."""
  facts = gather(params, structure, layout, block)
  members = jnp.asarray(layout.group_members, jnp.int32)
  return run_block(facts, params, members, iterations, window=window, max_cycles=max_cycles,
                   fast_forward=fast_forward, trace=trace, group=group)


def sharded_queue(facts, limits, iterations, members, *, window, max_cycles, fast_forward,
                   slots, group):
  """`run_queue` on every local device, each with its share of the jobs."""
  spec = PartitionSpec("blocks")

  @functools.partial(jax.shard_map, mesh=mesh(), in_specs=(spec, spec, spec),
                     out_specs=(spec, spec), check_vma=False)
  def sharded(facts, limits, iterations):
    return run_queue(facts, limits, members, iterations, slots=slots, window=window,
                     max_cycles=max_cycles, fast_forward=fast_forward, group=group)

  return sharded(facts, limits, iterations)


@functools.partial(jax.jit, static_argnames=("layout", "window", "max_cycles", "fast_forward",
                                             "slots", "group"))
def simulate_jobs(params, structure, batch, iterations, *, layout, window, max_cycles,
              fast_forward, slots, group):
  facts = jax.vmap(lambda b: gather(params, structure, layout, b))(batch)
  limits = jax.tree.map(lambda x: jnp.broadcast_to(x, iterations.shape + x.shape),
                        integer_globals(params))
  return sharded_queue(facts, limits, iterations, jnp.asarray(layout.group_members, jnp.int32),
                        window=window, max_cycles=max_cycles, fast_forward=fast_forward,
                        slots=slots, group=group)


def pad_batch(batch: BlockBatch, iterations, multiple: int):
  """Pads the block axis to a multiple of the device count (copies of block 0)."""
  B = batch.opcode.shape[0]
  extra = (-B) % multiple
  if not extra:
    return batch, iterations
  pad = lambda x: np.concatenate([x, np.repeat(x[:1], extra, axis=0)])  # noqa: E731
  return jax.tree.map(pad, batch), pad(iterations)


def program(table: Table, batch: BlockBatch, iterations, *, fast_forward: bool = True,
             max_cycles: int = DEFAULT_MAX_CYCLES, slots: int | None = None,
             window: int | None = None, group: int | None = None):
  """`simulate`'s program call, not yet made: (arguments, static arguments, the order
  that puts its output rows back in the batch's)."""
  rob = rob_entries(table.params.rob_size)
  if window is None:
    window = window_for(rob)
  elif window < rob:
    raise ValueError(f"window {window} is smaller than the ROB ({rob} entries)")
  else:
    check_window(window)  # window_for checks its own
  least = group_for(table.params.dispatch_width)
  if group is None:
    group = least
  elif not least <= group <= MAX_GROUP:
    raise ValueError(f"a dispatch pass of {group} instructions cannot serve dispatch width "
                     f"{least} (it must be {least} to {MAX_GROUP})")
  B = batch.opcode.shape[0]
  its = np.broadcast_to(np.asarray(iterations, np.int32), (B,)).copy()
  n_dev = len(jax.local_devices())
  batch_p, its_p = pad_batch(jax.tree.map(np.asarray, batch), its, n_dev)
  # Rows are dealt to the devices in turn rather than in contiguous shares, so that a
  # batch sorted by cost, or padded at its end, gives every device the same mix.
  deal = dealt(len(its_p), n_dev)
  batch_p, its_p = jax.tree.map(lambda x: x[deal], (batch_p, its_p))
  # On the host, so that a table left on one device (a fit's output) is not refused by
  # the program sharded over all of them.
  params = jax.tree.map(np.asarray, table.params)
  return ((params, table.structure, batch_p, its_p),
          dict(layout=table.layout, window=window, max_cycles=max_cycles,
               fast_forward=fast_forward, slots=slots, group=group), np.argsort(deal)[:B])


def launch(call):
  """Launches a `program` and returns at once: JAX runs it asynchronously, so the host
  can prepare the next batch meanwhile. `finish` waits for the result: (cycles,
  status, rows) as it takes them."""
  args, static, rows = call
  cycles, codes = programs.call(simulate_jobs, args, static)
  return cycles, codes, rows


def dealt(n: int, n_dev: int) -> np.ndarray:
  """[n] row order that gives device d (a contiguous share of the sharded axis) rows d,
  d + n_dev, d + 2 n_dev, ... (n a multiple of n_dev)."""
  return np.arange(n).reshape(-1, n_dev).T.reshape(-1)


def finish(launched):
  """(cycles [B], status [B]) as numpy arrays, once the launched program is done."""
  cycles, codes, rows = launched
  return np.asarray(cycles)[rows], np.asarray(codes)[rows]


@functools.partial(jax.jit, static_argnames=("layout", "window", "max_cycles", "slots", "group"))
def sweep_jobs(params, structure, batch, iterations, *, layout, window, max_cycles, slots, group):
  """Every (table, block) pair as one job of the queue: [P, B] cycles and status."""
  P, B = params.dispatch_width.shape[0], iterations.shape[0]
  facts = jax.vmap(lambda p: jax.vmap(lambda b: gather(p, structure, layout, b))(batch))(params)
  limits = jax.vmap(integer_globals)(params)
  limits = jax.tree.map(lambda x: jnp.broadcast_to(x[:, None], (P, B) + x.shape[1:]), limits)
  # Pairs dealt to the devices in turn, as `simulate` deals rows: contiguous shares would
  # give each device whole tables, whose costs differ.
  deal = dealt(P * B, len(jax.local_devices()))
  flat = lambda x: x.reshape((P * B,) + x.shape[2:])[deal]  # noqa: E731
  cycles, codes = sharded_queue(
      jax.tree.map(flat, facts), jax.tree.map(flat, limits), jnp.tile(iterations, P)[deal],
      jnp.asarray(layout.group_members, jnp.int32), window=window, max_cycles=max_cycles,
      fast_forward=True, slots=slots, group=group)
  back = np.argsort(deal)
  return cycles[back].reshape(P, B), codes[back].reshape(P, B)


@functools.partial(jax.jit, static_argnames=("layout", "window", "trace", "group"))
def trace_one(params, structure, batch, iterations, *, layout, window, trace, group):
  block = jax.tree.map(lambda x: x[0], batch)
  return run_one(params, structure, layout, window, DEFAULT_MAX_CYCLES, False, block,
                  iterations, trace, group)


@functools.partial(jax.jit, static_argnames=("layout", "window", "dynamic", "max_cycles"))
def record_jobs(params, structure, batch, iterations, *, layout, window, dynamic, max_cycles):
  members = jnp.asarray(layout.group_members, jnp.int32)
  spec = PartitionSpec("blocks")

  @functools.partial(jax.shard_map, mesh=mesh(), in_specs=(PartitionSpec(), spec, spec),
                     out_specs=(spec, spec, spec), check_vma=False)
  def sharded(params, batch, iterations):
    def one(block, its):
      facts = gather(params, structure, layout, block)
      return run_block(facts, params, members, its, window=window, max_cycles=max_cycles,
                       fast_forward=False, trace=dynamic)
    return jax.vmap(one)(batch, iterations)

  return sharded(params, batch, iterations)
