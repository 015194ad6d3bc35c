"""Execute stage: out-of-order issue to ports and resource groups.

Each cycle, after retirement, instructions whose operands are ready, whose memory
ordering allows it and whose resources are free issue one at a time, best priority
first, until none can (pipeline-model.md 4.2-4.3). Priority is (age - users, age):
an older instruction, or one that more dispatched readers wait on, goes first.
A group picks one free member unit round-robin from its highest unit down; every
unit that becomes busy moves the round-robin state of every group containing it.
Units and groups are bitmasks over units, so availability is a few integer ops.

Memory ordering (llvm-mca's default -noalias=true): a store waits until every older
load and store has issued; loads are never ordered.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from diffsim.sim.facts import BIG, Facts
from diffsim.sim.state import State, inflight, slot_dyn


def free_mask(state: State) -> jax.Array:
  """[] int32: bitmask of units free at this cycle."""
  U = state.busy_until.shape[0]
  bits = 1 << jnp.arange(U, dtype=jnp.int32)
  return jnp.sum(jnp.where(state.busy_until <= state.t, bits, 0)).astype(jnp.int32)


def available(state: State, facts: Facts, members: jax.Array) -> jax.Array:
  """[L] bool: each static instruction's resources could be taken now."""
  free = free_mask(state)
  ok = (facts.unit_mask & ~free) == 0
  free_members = lax.population_count(free & members[facts.grp])  # [L, Q]
  group_ok = ~facts.grp_on | facts.grp_reserved | (free_members >= facts.grp_need)
  ok &= jnp.all(group_ok, axis=-1)
  reserved_now = state.reserved_until > state.t  # [G]
  ok &= ~jnp.any(facts.blocked_by & reserved_now[None, :], axis=-1)
  return ok


def notify(seq, skip, members, unit_bit, on):
  """Round-robin bookkeeping when a unit becomes busy, for every group holding it."""
  holds = on & ((members & unit_bit) != 0)
  above = unit_bit > seq  # the unit is above every unit still in the sequence
  skip = jnp.where(holds & above, skip | unit_bit, skip)
  taken = holds & ~above
  seq = jnp.where(taken, seq & ~unit_bit, seq)
  wrap = taken & (seq == 0)
  seq = jnp.where(wrap, members & ~skip, seq)
  skip = jnp.where(wrap, 0, skip)
  return seq, skip


def choose(seq_g, skip_g, members_g, free):
  """One unit of a group: the highest free unit still in its round-robin turn."""
  avail = free & members_g
  cand = avail & seq_g
  reset = cand == 0
  seq_g = jnp.where(reset, members_g & ~skip_g, seq_g)
  skip_g = jnp.where(reset, 0, skip_g)
  cand = avail & seq_g
  seq_g = jnp.where(cand == 0, members_g, seq_g)
  cand = avail & seq_g
  unit = 31 - lax.clz(jnp.maximum(cand, 1))
  bit = (1 << unit).astype(jnp.int32)
  seq_g = seq_g & ((bit << 1) - 1)  # units above the pick wait for the next turn
  return unit, bit, seq_g, skip_g


def allocate(state: State, facts: Facts, members: jax.Array, slot, c, dyn) -> State:
  """Issues dynamic instruction `dyn` (static `c`, window `slot`) at this cycle."""
  t = state.t
  U = state.busy_until.shape[0]
  busy, seq, skip = state.busy_until, state.seq, state.skip
  ucyc = facts.unit_cycles[c]
  busy = jnp.where(ucyc > 0, t + ucyc, busy)
  for u in range(U):  # direct units, in bit order
    seq, skip = notify(seq, skip, members, jnp.int32(1 << u), ucyc[u] > 0)
  reserved_until = state.reserved_until
  bits = 1 << jnp.arange(U, dtype=jnp.int32)
  for q in range(facts.grp.shape[-1]):
    g, cyc, on = facts.grp[c, q], facts.grp_cycles[c, q], facts.grp_on[c, q]
    res = facts.grp_reserved[c, q]
    reserved_until = reserved_until.at[g].set(
        jnp.where(on & res, t + cyc, reserved_until[g]))
    free = jnp.sum(jnp.where(busy <= t, bits, 0)).astype(jnp.int32)
    unit, bit, seq_g, skip_g = choose(seq[g], skip[g], members[g], free)
    pick = on & ~res
    seq = seq.at[g].set(jnp.where(pick, seq_g, seq[g]))
    skip = skip.at[g].set(jnp.where(pick, skip_g, skip[g]))
    busy = busy.at[unit].set(jnp.where(pick, t + cyc, busy[unit]))
    seq, skip = notify(seq, skip, members, bit, pick)
  # Wake the dispatched readers of this instruction's writes.
  W = state.issue_t.shape[0]
  q_dyn = dyn + facts.use_off[c]
  woke = facts.use_on[c] & (q_dyn < state.next)
  q_slot = jnp.where(woke, jnp.mod(q_dyn, W), W)  # W: dropped
  ready_t = state.ready_t.at[q_slot].max(t + facts.use_w[c], mode="drop")
  pending = state.pending.at[q_slot].add(-1, mode="drop")
  return state.replace(
      busy_until=busy, seq=seq, skip=skip, reserved_until=reserved_until,
      rs_used=state.rs_used - facts.buffers[c].astype(jnp.int32),
      issue_t=state.issue_t.at[slot].set(t), ready_t=ready_t, pending=pending)


def issue(state: State, facts: Facts, members: jax.Array) -> State:
  """The issue loop of one cycle."""
  W = state.issue_t.shape[0]

  def one(carry):
    state, _ = carry
    dyn = slot_dyn(state)
    static = jnp.mod(dyn, facts.n)
    waiting = (inflight(state) & (state.issue_t >= BIG) & (state.pending == 0)
               & (state.ready_t <= state.t))
    is_mem = facts.may_load[static] | facts.may_store[static]
    unissued_mem = inflight(state) & (state.issue_t >= BIG) & is_mem
    oldest_mem = jnp.min(jnp.where(unissued_mem, dyn, BIG))
    mem_ok = ~facts.may_store[static] | (oldest_mem >= dyn)
    cand = waiting & mem_ok & available(state, facts, members)[static]
    pos = dyn - state.head
    key = jnp.where(cand, (pos - state.users + 8192) * 1024 + pos, jnp.iinfo(jnp.int32).max)
    slot = jnp.argmin(key).astype(jnp.int32)
    found = jnp.any(cand)
    new = allocate(state, facts, members, slot, static[slot], dyn[slot])
    state = jax.tree.map(lambda a, b: jnp.where(found, a, b), new, state)
    return state, found

  state, _ = lax.while_loop(lambda c: c[1], one, (state, jnp.ones((), bool)))
  del W
  return state
