"""One block through the whole pipeline: the cycle loop.

A cycle is a straight list of stage calls in llvm-mca's order: retire, issue (the
execute stage's release/complete/wake-up are implicit in the cycle numbers it
compares), then dispatch (diffsim/sim/MODEL.md#one-cycle); `step` runs it one issue round at a
time. `run_block` repeats it until every instruction of every iteration has retired.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax

from diffsim.sim import dispatch as dispatch_stage
from diffsim.sim import issue as issue_stage
from diffsim.sim import period, status
from diffsim.sim import retire as retire_stage
from diffsim.sim.facts import BIG, Facts
from diffsim.sim.state import MAX_GROUP, State, inflight, init


def integer_globals(params) -> dict:
  """The global parameters, rounded as llvm-mca's integer tables are."""
  r = lambda x: jnp.round(jnp.asarray(x)).astype(jnp.int32)  # noqa: E731
  return dict(dispatch_width=r(params.dispatch_width), rob_size=r(params.rob_size),
              retire_width=r(params.retire_width), buffer_size=r(params.buffer_size),
              load_queue=r(params.load_queue), store_queue=r(params.store_queue),
              prf_size=r(params.prf_size))


def step(state: State, facts: Facts, members, g):
  """One step of the loop: retirement when a cycle begins, one issue round, and, once
  no further round is due, dispatch and the clock's advance. Returns (state, done):
  `done` when the cycle ended; otherwise the next step continues it.

  llvm-mca repeats issue rounds until none can issue. Most cycles need one or two
  (1.6 on average), but under `vmap` a loop runs as long as its slowest lane, and
  among 64 blocks one nearly always needs three or four. One round per step lets every
  block take only the rounds it needs.
  """
  start = ~state.more
  state = state.replace(mark_head=jnp.where(start, state.head, state.mark_head),
                        mark_issued=jnp.where(start, state.issued, state.mark_issued),
                        tried=state.tried & ~start, more=jnp.ones((), bool))
  state = retire_stage.retire(state, facts, g["retire_width"], on=start)
  state = issue_stage.issue_round(state, facts, members)
  done = ~state.more
  state = dispatch_stage.dispatch(state, facts, g, on=done)
  return state.replace(t=state.t + done.astype(jnp.int32)), done


def next_event(state: State) -> jax.Array:
  """[] int32: the first cycle >= state.t at which anything can change.

  After a cycle in which nothing retired, issued or dispatched, the machine only
  waits for time thresholds: an instruction executing (then retiring a cycle later),
  operands becoming ready, a unit or reserved group freeing up. Every stage compares
  the cycle against exactly these, so the cycles in between are idle and skipping
  them is exact.
  """
  t = state.t
  live = inflight(state)
  issued = live & (state.issue_t < BIG)
  executed_at = state.issue_t + state.latency
  # One reduction per kind of time: concatenated, they would be written out first.
  first = lambda x: jnp.min(jnp.where(x >= t, x, BIG))  # noqa: E731
  return functools.reduce(jnp.minimum, [
      first(jnp.where(issued, executed_at, BIG)), first(jnp.where(issued, executed_at + 1, BIG)),
      first(jnp.where(live & ~issued & (state.pending == 0), state.ready_t, BIG)),
      first(state.busy_until), first(state.reserved_until)])


def advance(state: State, memory, facts: Facts, members, g, fast_forward: bool):
  """One cycle, then skip idle cycles and fast-forward repeating iterations."""
  state, look = stride(state, memory, facts, members, g)
  if fast_forward:
    memory, jump = period.observe(state, memory, look, facts.n, facts.horizon,
                                  facts.rr_groups)
    state = period.leap(state, jump)
  return state, memory


def stride(state: State, memory, facts: Facts, members, g):
  """One step and, when it ends a cycle, the idle cycles after it; also whether to take
  a fingerprint now (only at a cycle's end)."""
  before, carry = state.next, state.carry  # dispatch alone changes them, at a cycle's end
  state, done = step(state, facts, members, g)
  # Idle: nothing retired, issued or dispatched, and no wide instruction dispatching.
  idle = (done & (state.head == state.mark_head) & (state.next == before)
          & (state.issued == state.mark_issued) & (carry == 0) & (state.carry == 0))
  state = state.replace(t=jnp.where(idle, jnp.maximum(state.t, next_event(state)), state.t))
  return state, done & period.crossed(state, before, facts.n, memory, facts.settle)


def running(state: State, max_cycles: int):
  """[] bool: the block still has instructions in flight or to dispatch."""
  return (state.head < state.total) & (state.t < max_cycles)


def finished(state: State, rob_size, window: int) -> jax.Array:
  """[] int32 status code of a stopped run: CYCLE_BUDGET when instructions were left,
  WINDOW when the ROB (`rob_size`, rounded) holds more than the window's slots."""
  code = jnp.where(state.head < state.total, status.CYCLE_BUDGET, status.OK)
  return (code | jnp.where(rob_size > window, status.WINDOW, status.OK)).astype(jnp.int32)


def run_block(facts: Facts, params, members, iterations, *, window: int, max_cycles: int,
              fast_forward: bool = True, trace: int = 0, group: int = MAX_GROUP):
  """Total cycles for `iterations` iterations of one block (llvm-mca's Total Cycles).

  Returns:
    (cycles [] int32, status [] int32), and with `trace` the [trace, columns] trace:
    status (`diffsim.sim.status`) is CYCLE_BUDGET when the block did not finish within
    `max_cycles` cycles (the cycle count is then meaningless), WINDOW when the ROB
    outgrew `window`, and TRACE_LENGTH when it ran more dynamic instructions than the
    trace's rows.
  """
  g = integer_globals(params)
  U = facts.unit_cycles.shape[-1]
  state = init(facts.n * iterations, U, members, params.buffer_size.shape[0],
               params.prf_size.shape[0], window, trace,
               facts.dunit.shape[-1] + facts.grp.shape[-1], group)

  state, _ = lax.while_loop(
      lambda c: running(c[0], max_cycles),
      lambda c: advance(*c, facts, members, g, fast_forward), (state, period.init_memory()))
  code = finished(state, g["rob_size"], window)
  if trace:
    code |= jnp.where(state.total > trace, status.TRACE_LENGTH, status.OK).astype(jnp.int32)
    return state.last_retire + 1, code, state.trace
  return state.last_retire + 1, code


OBSERVED = 16  # slots fingerprinted per step at most (of the 64 default)


def observe_some(state: State, memory, look, facts: Facts):
  """`period.observe` of the slots that `look`, at most `OBSERVED` of them, on those
  slots alone: about ten of 64 slots cross an iteration boundary in a step, and a
  fingerprint costs a pass over the whole window. A slot left out this step only
  records no fingerprint at this boundary (detection may come an iteration later).

  Returns (memory, jump) for all slots, as `period.observe` under `vmap`.
  """
  S = look.shape[0]
  lanes = jnp.nonzero(look, size=min(OBSERVED, S), fill_value=S)[0]
  at = jnp.minimum(lanes, S - 1)
  sub = lambda tree: jax.tree.map(lambda x: x[at], tree)  # noqa: E731
  new, jump = jax.vmap(period.observe)(sub(state), sub(memory), lanes < S, facts.n[at],
                                       facts.horizon[at], facts.rr_groups[at])
  put = lambda full, part: full.at[lanes].set(part, mode="drop")  # noqa: E731
  return (jax.tree.map(put, memory, new),
          tuple(put(jnp.zeros(S, jnp.int32), x.astype(jnp.int32)) for x in jump))


def leap_each(state: State, jump):
  """`period.leap` of each slot that jumps, one slot at a time: a step has at most a
  few (a block jumps once), and shifting every slot's window to move one costs a
  pass over all of them."""
  periods, dt, di = jump

  def one(carry):
    state, todo = carry
    i = jnp.argmax(todo)
    lane = period.shift(jax.tree.map(lambda x: x[i], state), periods[i], dt[i], di[i])
    state = jax.tree.map(lambda x, y: x.at[i].set(y), state, lane)
    return state, todo.at[i].set(False)

  return lax.while_loop(lambda c: jnp.any(c[1]), one, (state, periods > 0))[0]


def slots_for(length: int) -> int:
  """Blocks simulated side by side per device, for blocks padded to `length`.

  Each slot carries its block's facts ([length, ...] arrays), and once those of all
  slots outgrow the caches a step slows down more than the extra slots gain. Measured
  on the 20,000 command blocks (benchmarks/RESULTS.md, Simulator speed), same
  process: up to 32 instructions 64 slots are as good as any; beyond, the buckets of 64,
  128 and 256 instructions take 0.84 / 0.48 / 0.75 s at 8 / 4 / 4 slots against 1.45-2.0
  / 1.0-1.1 / 1.4 s at 64 (32 for the 33 longest blocks).
  """
  return 64 if length <= 32 else max(4, 512 // length)


def run_queue(all_facts: Facts, all_limits: dict, members, iterations, *, slots: int | None,
              window: int, max_cycles: int, fast_forward: bool = True,
              refill_every: int = 8, group: int = MAX_GROUP):
  """Total cycles of many blocks through a fixed number of simulation slots.

  Cycle counts are heavy-tailed (median about 130, p99 about 4,000 at 100
  iterations), so a plain vmap over a batch runs every block as long as the slowest.
  Here `slots` blocks run side by side; every `refill_every` cycles each finished slot
  records its result and takes the next waiting block, so the cost follows the sum of
  the blocks' cycles rather than the batch maximum. Each block's simulation is
  exactly `run_block`'s.

  Args:
    all_facts: Facts of every block, leading axis N.
    all_limits: `integer_globals` of each block's table, leading axis N: a sweep
      queues (table, block) pairs, each slot with its own widths and buffer sizes.
    iterations: [N] int32.
    slots: slots per device (None: `slots_for` the blocks' padded length).
    group: instructions per dispatch pass (`dispatch.group_for` the tables).

  Returns:
    (cycles [N] int32, status [N] int32), as `run_block`'s.
  """
  N = iterations.shape[0]
  S = min(slots_for(all_facts.uops.shape[-1]) if slots is None else slots, N)

  def start(i):
    """Facts, limits and a fresh state for block i (clamped; inactive slots are
    masked)."""
    i = jnp.minimum(i, N - 1)
    facts, g = jax.tree.map(lambda x: x[i], (all_facts, all_limits))
    state = init(facts.n * iterations[i], facts.unit_cycles.shape[-1], members,
                 g["buffer_size"].shape[0], g["prf_size"].shape[0], window, group=group)
    return (facts, g), state, period.init_memory()

  def cycles_of(facts_g, state, memory):
    """One step of every slot. Fingerprints and jumps run on the slots that need them
    only (a vmapped branch would cost every slot every step). A finished slot may keep
    stepping: it has nothing left to retire, issue or dispatch."""
    facts, g = facts_g
    state, look = jax.vmap(lambda f, g, s, m: stride(s, m, f, members, g))(
        facts, g, state, memory)
    if not fast_forward:
      return state, memory
    look &= jax.vmap(lambda s: running(s, max_cycles))(state)
    memory, jump = lax.cond(jnp.any(look), lambda: observe_some(state, memory, look, facts),
                            lambda: (memory, (jnp.zeros(look.shape, jnp.int32),) * 3))
    return leap_each(state, jump), memory

  slot_block = jnp.arange(S, dtype=jnp.int32)
  facts, state, memory = jax.vmap(start)(slot_block)
  cycles = jnp.zeros(N, jnp.int32)
  codes = jnp.zeros(N, jnp.int32)

  def outer(carry):
    facts, state, memory, slot_block, next_block, cycles, codes = carry

    def inner(_, sm):
      return cycles_of(facts, *sm)

    state, memory = lax.fori_loop(0, refill_every, inner, (state, memory))
    active = slot_block < N
    done = active & ~jax.vmap(lambda s: running(s, max_cycles))(state)
    target = jnp.where(done, slot_block, N)
    cycles = cycles.at[target].set(state.last_retire + 1, mode="drop")
    code = jax.vmap(lambda s, r: finished(s, r, window))(state, facts[1]["rob_size"])
    codes = codes.at[target].set(code, mode="drop")
    # Finished slots take the next blocks in order.
    new_block = next_block + jnp.cumsum(done.astype(jnp.int32)) - 1
    next_block = next_block + jnp.sum(done).astype(jnp.int32)
    slot_block = jnp.where(done, jnp.where(new_block < N, new_block, N), slot_block)
    f2, s2, m2 = jax.vmap(start)(slot_block)
    pick = lambda new, old: jax.tree.map(  # noqa: E731
        lambda x, y: jnp.where(done.reshape((-1,) + (1,) * (x.ndim - 1)), x, y), new, old)
    return (pick(f2, facts), pick(s2, state), pick(m2, memory), slot_block, next_block,
            cycles, codes)

  def more(carry):
    return jnp.any(carry[3] < N)

  carry = (facts, state, memory, slot_block, jnp.int32(S), cycles, codes)
  carry = lax.while_loop(more, outer, carry)
  return carry[5], carry[6]
