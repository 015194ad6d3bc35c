"""The simulator's carry: one block's machine state at the start of a cycle.

In-flight instructions live in a ring of W slots: dynamic instruction i (i-th in
program order over all iterations) sits in slot i % W from dispatch until it retires.
At most ROB-size instructions are in flight, so W >= ROB size suffices. Slots of
instructions not in flight hold stale values and are masked by `inflight`.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from diffsim.sim.facts import BIG

MAX_GROUP = 8  # instructions dispatch decides and writes per pass, at most

# Bits of State.flags.
LOAD, STORE, LOAD_BARRIER, STORE_BARRIER, ORDERED_STORE = 1, 2, 4, 8, 16
# Bits of State.why: what held the next instruction back at its last dispatch try.
WIDTH, ROB, OTHER = 1, 2, 4

# Columns of State.trace, one row per dynamic instruction: what a timeline shows, and
# the schedule's decisions that the soft mode (`soft.py`) differentiates through.
DISPATCH, ISSUE, RETIRE = 0, 1, 2  # cycles (-1 until they happen)
ORDER = 3  # issue sequence number over the whole run (orders issues within a cycle)
HEAD = 4  # oldest unretired instruction when it dispatched
WHY = 5  # `why` bits of its last failed dispatch try (0: it went at its first try)
PREV = 6  # per resource use j: PREV + 2j = the unit's previous user (dynamic index,
#           -1 none), PREV + 2j + 1 = the resource column that user held it through


def trace_columns(uses: int) -> int:
  return PREV + 2 * uses


@struct.dataclass
class State:
  """W window slots, U units, G groups, R resources, F register files."""

  t: jax.Array  # [] int32: current cycle
  head: jax.Array  # [] int32: oldest dynamic instruction not retired
  next: jax.Array  # [] int32: next dynamic instruction to dispatch
  total: jax.Array  # [] int32: dynamic instructions to run (length x iterations)
  last_retire: jax.Array  # [] int32: cycle of the latest retirement
  carry: jax.Array  # [] int32: micro-ops of a wide instruction still dispatching
  rob_used: jax.Array  # [] int32
  rs_used: jax.Array  # [R] int32: scheduler entries held per buffered resource
  lq_used: jax.Array  # [] int32
  sq_used: jax.Array  # [] int32
  prf_used: jax.Array  # [F] int32
  busy_until: jax.Array  # [U] int32: first cycle each unit is free again
  reserved_until: jax.Array  # [G] int32: first cycle each group is no longer reserved
  seq: jax.Array  # [G] int32: round-robin: units still to pick before wrapping
  skip: jax.Array  # [G] int32: round-robin: units taken out of turn
  issue_t: jax.Array  # [W] int32: issue cycle, BIG until issued
  ready_t: jax.Array  # [W] int32: cycle all register operands are ready (known ones)
  pending: jax.Array  # [W] int32: producers not yet issued
  users: jax.Array  # [W] int32: dispatched reads waiting on this instruction
  index: jax.Array  # [W] int32: the instruction's static index (dynamic index mod n,
  #                   stored so that the issue rounds never divide over the window)
  latency: jax.Array  # [W] int32: the instruction's MaxLatency (copied at dispatch, so
  #                     per-cycle code never gathers static facts onto the window)
  flags: jax.Array  # [W] int32: MEM_* bits of the instruction
  rob_cost: jax.Array  # [W] int32: ROB entries it holds
  prf_cost: jax.Array  # [W, F] int32: physical registers it holds
  issued: jax.Array  # [] int32: instructions issued so far (to detect idle cycles)
  why: jax.Array  # [] int32: WIDTH/ROB/OTHER: why the next instruction did not dispatch
  last_user: jax.Array  # [U] int32: dynamic index of each unit's latest user (-1 none)
  last_col: jax.Array  # [U] int32: the resource column it used the unit through
  trace: jax.Array  # [T, trace_columns] int32: the first T dynamic instructions
  # A cycle's issue stage may span several steps of the loop (`pipeline.step`); between
  # them these hold where it stands.
  more: jax.Array  # [] bool: the cycle's issue rounds are not finished
  tried: jax.Array  # [W] bool: scanned this cycle without issuing (see issue.py)
  mark_head: jax.Array  # [] int32: head when the cycle began (before retiring)
  mark_issued: jax.Array  # [] int32: `issued` when the cycle began
  # Static: instructions dispatch decides and writes per pass (`dispatch.group_for`).
  group: int = struct.field(pytree_node=False, default=MAX_GROUP)


def init(total, num_units: int, group_members, num_resources: int, num_files: int,
         window: int, trace: int = 0, uses: int = 0, group: int = MAX_GROUP) -> State:
  """The empty machine at cycle 0 (`group`: see `dispatch.group_for`)."""
  z = jnp.zeros((), jnp.int32)
  members = jnp.asarray(group_members, jnp.int32)
  return State(
      t=z, head=z, next=z, total=jnp.asarray(total, jnp.int32), last_retire=z, carry=z,
      rob_used=z, rs_used=jnp.zeros(num_resources, jnp.int32), lq_used=z, sq_used=z,
      prf_used=jnp.zeros(num_files, jnp.int32),
      busy_until=jnp.zeros(num_units, jnp.int32),
      reserved_until=jnp.zeros(members.shape[0], jnp.int32),
      seq=members, skip=jnp.zeros_like(members),
      issue_t=jnp.full(window, BIG, jnp.int32), ready_t=jnp.zeros(window, jnp.int32),
      pending=jnp.zeros(window, jnp.int32), users=jnp.zeros(window, jnp.int32),
      index=jnp.zeros(window, jnp.int32), latency=jnp.zeros(window, jnp.int32),
      flags=jnp.zeros(window, jnp.int32),
      rob_cost=jnp.zeros(window, jnp.int32),
      prf_cost=jnp.zeros((window, num_files), jnp.int32),
      issued=z, why=z,
      last_user=jnp.full(num_units, -1, jnp.int32), last_col=jnp.zeros(num_units, jnp.int32),
      trace=jnp.full((trace, trace_columns(uses)), -1, jnp.int32),
      more=jnp.zeros((), bool), tried=jnp.zeros(window, bool), mark_head=z, mark_issued=z,
      group=group)


def slot_dyn(state: State) -> jax.Array:
  """[W] int32: the dynamic index each slot holds (meaningful where in flight)."""
  W = state.issue_t.shape[0]
  s = jnp.arange(W, dtype=jnp.int32)
  return state.head + jnp.mod(s - state.head, W)


def inflight(state: State) -> jax.Array:
  """[W] bool: the slot holds a dispatched, not yet retired instruction."""
  return slot_dyn(state) < state.next
