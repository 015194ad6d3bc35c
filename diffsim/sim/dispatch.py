"""Dispatch stage: in-order dispatch into the reorder buffer and schedulers.

Up to the dispatch width of micro-ops per cycle, in program order; the first
instruction that cannot go stops dispatch for the cycle (pipeline-model.md 4.4).
An instruction with more micro-ops than the width takes whole cycles and carries the
rest over. Dispatch takes ROB, scheduler, load/store-queue entries and physical
registers, and links each register read to its producer: a read of an issued
producer knows its ready cycle now, a read of an unissued one waits to be woken.
Zero-latency instructions without resources whose operands are ready issue at once.
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax

from diffsim.sim.facts import BIG, Facts
from diffsim.sim.state import (DISPATCH, HEAD, ISSUE, LOAD, LOAD_BARRIER, ORDER, OTHER, ROB,
                               STORE, STORE_BARRIER, WHY, WIDTH, State)


def dispatch(state: State, facts: Facts, g) -> State:
  """Dispatches this cycle's instructions. `g`: integer globals (see pipeline.py)."""
  W = state.issue_t.shape[0]
  t = state.t
  width = g["dispatch_width"]
  slots = jnp.where(state.carry > 0, jnp.maximum(0, width - state.carry), width)
  carry = jnp.where(state.carry > 0, state.carry - (width - slots), state.carry)
  state = state.replace(carry=carry)

  def blockers(state, slots):
    """WIDTH/ROB/OTHER bits of what keeps the next instruction from dispatching now."""
    c = jnp.mod(state.next, facts.n)
    need = jnp.minimum(facts.uops[c], width)
    narrow = (slots <= 0) | (need > slots) | (facts.begin_group[c] & (slots != width))
    rob = g["rob_size"] - state.rob_used < facts.rob_cost[c]
    cap = g["prf_size"]
    other = jnp.any((cap > 0) & (state.prf_used + facts.prf_need[c] > cap))
    other |= jnp.any(facts.buffers[c] & (state.rs_used >= g["buffer_size"]))
    other |= (g["load_queue"] > 0) & facts.may_load[c] & (state.lq_used >= g["load_queue"])
    other |= (g["store_queue"] > 0) & facts.may_store[c] & (state.sq_used >= g["store_queue"])
    return WIDTH * narrow + ROB * rob + OTHER * other

  def can_go(state, slots):
    return (state.next < state.total) & (blockers(state, slots) == 0)

  def one(carry):
    state, slots, _ = carry
    i = state.next
    c = jnp.mod(i, facts.n)
    uops = facts.uops[c]
    wide = uops > width
    slots = jnp.where(wide, 0, slots - uops)
    slots = jnp.where(facts.end_group[c], 0, slots)
    carry = jnp.where(wide, uops - width, state.carry)
    # Link reads to producers still in flight (retired producers impose nothing), by
    # the edges that hold in this iteration (`encode`: an alias may reach back into
    # an iteration the first one lacks). An edge that does not hold but whose
    # producer has not issued yet still counts as pending, since that producer's
    # issue wakes every consumer of the edge (issue.py).
    p = i - facts.dep_off[c]
    it = i // facts.n
    holds = (it >= facts.dep_first[c]) & (it < facts.dep_last[c])
    live = facts.dep_on[c] & (p >= state.head)
    p_slot = jnp.mod(p, W)
    issued = state.issue_t[p_slot] < BIG
    operands = jnp.max(jnp.where(live & holds & issued,
                                 state.issue_t[p_slot] + facts.dep_w[c], 0))
    waits = live & holds & ~issued
    pend = jnp.sum(waits).astype(jnp.int32)
    users = state.users.at[jnp.where(waits, p_slot, W)].add(1, mode="drop")
    slot = jnp.mod(i, W)
    now = facts.zero_latency[c] & (pend == 0) & (operands <= t)
    state = state.replace(
        next=i + 1, carry=carry,
        rob_used=state.rob_used + facts.rob_cost[c],
        rs_used=state.rs_used + facts.buffers[c].astype(jnp.int32),
        lq_used=state.lq_used + facts.may_load[c].astype(jnp.int32),
        sq_used=state.sq_used + facts.may_store[c].astype(jnp.int32),
        prf_used=state.prf_used + facts.prf_cost[c],
        issue_t=state.issue_t.at[slot].set(jnp.where(now, t, BIG)),
        issued=state.issued + now.astype(jnp.int32),
        ready_t=state.ready_t.at[slot].set(jnp.maximum(operands, t + 1)),
        pending=state.pending.at[slot].set(pend),
        users=users.at[slot].set(0),
        latency=state.latency.at[slot].set(facts.max_latency[c]),
        flags=state.flags.at[slot].set(
            LOAD * facts.may_load[c] + STORE * facts.may_store[c]
            + LOAD_BARRIER * facts.load_barrier[c] + STORE_BARRIER * facts.store_barrier[c]),
        rob_cost=state.rob_cost.at[slot].set(facts.rob_cost[c]),
        prf_cost=state.prf_cost.at[slot].set(facts.prf_cost[c]))
    if state.trace.shape[0]:  # static: only when a trace was asked for
      cols = jnp.array([DISPATCH, ISSUE, ORDER, HEAD, WHY])
      row = jnp.stack([t, jnp.where(now, t, -1), jnp.where(now, state.issued - 1, -1),
                       state.head, state.why])
      state = state.replace(trace=state.trace.at[i, cols].set(row, mode="drop"))
    return state.replace(why=jnp.zeros_like(state.why)), slots, can_go(state, slots)

  state, slots, _ = lax.while_loop(lambda c: c[2], one, (state, slots, can_go(state, slots)))
  return state.replace(why=jnp.where(state.next < state.total, blockers(state, slots), 0))
