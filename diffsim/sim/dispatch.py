"""Dispatch stage: in-order dispatch into the reorder buffer and schedulers.

Up to the dispatch width of micro-ops per cycle, in program order; the first
instruction that cannot go stops dispatch for the cycle (pipeline-model.md 4.4).
An instruction with more micro-ops than the width takes whole cycles and carries the
rest over. Dispatch takes ROB, scheduler, load/store-queue entries and physical
registers, and links each register read to its producer: a read of an issued
producer knows its ready cycle now, a read of an unissued one waits to be woken.
Zero-latency instructions without resources whose operands are ready issue at once.

Whether the next instruction may go depends only on a few counters, so the cycle's
dispatch group is decided by a short loop over those counters alone, and the group
is then written into the window in one vectorised pass (the window is never carried
through a per-instruction loop). Groups longer than `GROUP` instructions (zero-uop
instructions can make them) take further passes.
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax

from diffsim.sim.facts import BIG, Facts
from diffsim.sim.state import (DISPATCH, HEAD, ISSUE, LOAD, LOAD_BARRIER, ORDER, OTHER, ROB,
                               STORE, STORE_BARRIER, WHY, WIDTH, State)

GROUP = 8  # instructions decided and written per pass

_COUNTERS = ("next", "carry", "rob_used", "rs_used", "lq_used", "sq_used", "prf_used")


def blockers(counters, slots, facts: Facts, g):
  """WIDTH/ROB/OTHER bits of what keeps the next instruction from dispatching now."""
  width = g["dispatch_width"]
  c = jnp.mod(counters["next"], facts.n)
  need = jnp.minimum(facts.uops[c], width)
  narrow = (slots <= 0) | (need > slots) | (facts.begin_group[c] & (slots != width))
  rob = g["rob_size"] - counters["rob_used"] < facts.rob_cost[c]
  cap = g["prf_size"]
  other = jnp.any((cap > 0) & (counters["prf_used"] + facts.prf_need[c] > cap))
  other |= jnp.any(facts.buffers[c] & (counters["rs_used"] >= g["buffer_size"]))
  other |= (g["load_queue"] > 0) & facts.may_load[c] & (counters["lq_used"] >= g["load_queue"])
  other |= (g["store_queue"] > 0) & facts.may_store[c] & (counters["sq_used"] >= g["store_queue"])
  return WIDTH * narrow + ROB * rob + OTHER * other


def _decide(counters, slots, total, facts: Facts, g):
  """Up to GROUP instructions in order while they may go: (counters, slots, count, go)."""
  width = g["dispatch_width"]

  def one(_, carry):
    k, slots, go = carry[0], carry[1], carry[2]
    counters = carry[3]
    go &= (counters["next"] < total) & (blockers(counters, slots, facts, g) == 0)
    c = jnp.mod(counters["next"], facts.n)
    uops = facts.uops[c]
    wide = uops > width
    new_slots = jnp.where(wide | facts.end_group[c], 0, slots - uops)
    add = lambda x, y: x + jnp.where(go, y, 0).astype(x.dtype)  # noqa: E731
    counters = dict(
        next=add(counters["next"], 1),
        carry=jnp.where(go & wide, uops - width, counters["carry"]),
        rob_used=add(counters["rob_used"], facts.rob_cost[c]),
        rs_used=add(counters["rs_used"], facts.buffers[c]),
        lq_used=add(counters["lq_used"], facts.may_load[c]),
        sq_used=add(counters["sq_used"], facts.may_store[c]),
        prf_used=add(counters["prf_used"], facts.prf_cost[c]))
    return k + go.astype(jnp.int32), jnp.where(go, new_slots, slots), go, counters

  count, slots, _, counters = lax.fori_loop(
      0, GROUP, one, (jnp.zeros((), jnp.int32), slots, jnp.ones((), bool), counters))
  go = (count == GROUP) & (counters["next"] < total) & (
      blockers(counters, slots, facts, g) == 0)
  return counters, slots, count, go


def _zero_latency_now(state: State, facts: Facts, first, count):
  """[GROUP] bool: which of the group's instructions issue at dispatch.

  A zero-latency instruction without resources issues at once when its operands are
  ready, which may depend on an earlier member of the same group doing so.
  """
  W = state.issue_t.shape[0]
  t = state.t

  def one(k, now):
    i = first + k
    c = jnp.mod(i, facts.n)
    p = i - facts.dep_off[c]
    it = i // facts.n
    counts = (facts.dep_on[c] & (p >= state.head) & (it >= facts.dep_first[c])
              & (it < facts.dep_last[c]))
    mine = p >= first  # producer dispatched in this group
    issued = jnp.where(mine, now[jnp.clip(p - first, 0, GROUP - 1)],
                       state.issue_t[jnp.mod(p, W)] < BIG)
    at = jnp.where(mine, t, state.issue_t[jnp.mod(p, W)]) + facts.dep_w[c]
    ok = ~jnp.any(counts & ~issued) & (jnp.max(jnp.where(counts & issued, at, 0)) <= t)
    return now.at[k].set(facts.zero_latency[c] & ok & (k < count))

  return lax.fori_loop(0, GROUP, one, jnp.zeros(GROUP, bool))


def _write(state: State, facts: Facts, first, count) -> State:
  """Writes the group's `count` instructions (dynamic first...) into the window."""
  W = state.issue_t.shape[0]
  t = state.t
  now = _zero_latency_now(state, facts, first, count)
  k = jnp.arange(GROUP, dtype=jnp.int32)
  i = first + k  # [GROUP]
  on = k < count
  c = jnp.mod(i, facts.n)
  slot = jnp.where(on, jnp.mod(i, W), W)  # W: dropped
  # Read links, by the edges that hold in this iteration (`encode`: an alias may reach
  # back into an iteration the first one lacks). An edge that does not hold but whose
  # producer has not issued yet still counts as pending, since that producer's issue
  # wakes every consumer of the edge (issue.py). Retired producers impose nothing.
  p = i[:, None] - facts.dep_off[c]  # [GROUP, D]
  it = (i // facts.n)[:, None]
  holds = (it >= facts.dep_first[c]) & (it < facts.dep_last[c])
  live = on[:, None] & facts.dep_on[c] & (p >= state.head)
  mine = p >= first
  p_slot = jnp.mod(p, W)
  issued = jnp.where(mine, now[jnp.clip(p - first, 0, GROUP - 1)],
                     state.issue_t[p_slot] < BIG)
  at = jnp.where(mine, t, state.issue_t[p_slot])
  operands = jnp.max(jnp.where(live & holds & issued, at + facts.dep_w[c], 0), axis=-1)
  waits = live & holds & ~issued
  users = state.users.at[slot].set(0, mode="drop")
  users = users.at[jnp.where(waits, p_slot, W).reshape(-1)].add(1, mode="drop")
  flags = (LOAD * facts.may_load[c] + STORE * facts.may_store[c]
           + LOAD_BARRIER * facts.load_barrier[c] + STORE_BARRIER * facts.store_barrier[c])
  order = state.issued + jnp.cumsum(now) - 1
  state = state.replace(
      issue_t=state.issue_t.at[slot].set(jnp.where(now, t, BIG), mode="drop"),
      issued=state.issued + jnp.sum(now).astype(jnp.int32),
      ready_t=state.ready_t.at[slot].set(jnp.maximum(operands, t + 1), mode="drop"),
      pending=state.pending.at[slot].set(jnp.sum(waits, axis=-1).astype(jnp.int32),
                                         mode="drop"),
      users=users,
      latency=state.latency.at[slot].set(facts.max_latency[c], mode="drop"),
      flags=state.flags.at[slot].set(flags.astype(jnp.int32), mode="drop"),
      rob_cost=state.rob_cost.at[slot].set(facts.rob_cost[c], mode="drop"),
      prf_cost=state.prf_cost.at[slot].set(facts.prf_cost[c], mode="drop"))
  if state.trace.shape[0]:  # static: only when a trace was asked for
    T = state.trace.shape[0]
    rows = jnp.where(on, i, T)
    why = jnp.where(k == 0, state.why, 0)
    cols = jnp.array([DISPATCH, ISSUE, ORDER, HEAD, WHY])
    vals = jnp.stack([jnp.full(GROUP, t), jnp.where(now, t, -1), jnp.where(now, order, -1),
                      jnp.full(GROUP, state.head), why], axis=-1)
    state = state.replace(trace=state.trace.at[rows[:, None], cols[None, :]].set(
        vals, mode="drop"))
  return state


def dispatch(state: State, facts: Facts, g) -> State:
  """Dispatches this cycle's instructions. `g`: integer globals (see pipeline.py)."""
  width = g["dispatch_width"]
  slots = jnp.where(state.carry > 0, jnp.maximum(0, width - state.carry), width)
  state = state.replace(
      carry=jnp.where(state.carry > 0, state.carry - (width - slots), state.carry))

  def group(carry):
    state, slots, _ = carry
    counters = {name: getattr(state, name) for name in _COUNTERS}
    first = state.next
    counters, slots, count, go = _decide(counters, slots, state.total, facts, g)
    state = _write(state, facts, first, count)
    state = state.replace(**counters, why=jnp.where(count > 0, 0, state.why))
    return state, slots, go

  state, slots, go = group((state, slots, True))
  state, slots, _ = lax.while_loop(lambda c: c[2], group, (state, slots, go))
  counters = {name: getattr(state, name) for name in _COUNTERS}
  return state.replace(why=jnp.where(state.next < state.total,
                                     blockers(counters, slots, facts, g), 0))
