"""Dispatch stage: in-order dispatch into the reorder buffer and schedulers.

Up to the dispatch width of micro-ops per cycle, in program order; the first
instruction that cannot go stops dispatch for the cycle (diffsim/sim/MODEL.md#dispatch).
An instruction with more micro-ops than the width takes whole cycles and carries the
rest over. Dispatch takes ROB, scheduler, load/store-queue entries and physical
registers, and links each register read to its producer: a read of an issued
producer knows its ready cycle now, a read of an unissued one waits to be woken.
Zero-latency instructions without resources whose operands are ready issue at once.

Whether the next instruction may go depends only on a few counters, so the cycle's
dispatch group is decided by a short loop over those counters alone, and the group
is then written into the window in one vectorised pass (the window is never carried
through a per-instruction loop). A pass takes up to `State.group` instructions, the
dispatch width (`group_for`); a longer group (zero-uop instructions can make one) takes
further passes.
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np
from jax import lax

from diffsim.sim.facts import BIG, Facts
from diffsim.sim.state import (DISPATCH, HEAD, ISSUE, LOAD, LOAD_BARRIER, MAX_GROUP, ORDER,
                               ORDERED_STORE, OTHER, ROB, STORE, STORE_BARRIER, WHY, WIDTH,
                               State)


def group_for(dispatch_width) -> int:
  """Instructions per dispatch pass for a table (or a batch of tables): the widest
  rounded dispatch width, at most `MAX_GROUP`. A pass costs every step work in
  proportion to its size, whether or not the cycle dispatches, and more than the width
  can go only past zero-uop instructions (haswell, 4,096 short blocks: 0.75 s at 4
  against 0.81 s at 8, the same cycles: `benchmarks/RESULTS.md`, Simulator speed)."""
  return int(min(MAX_GROUP, max(1, np.max(np.round(np.asarray(dispatch_width))))))

_COUNTERS = ("next", "carry", "rob_used", "rs_used", "lq_used", "sq_used", "prf_used")
_ROW = ("uops", "begin_group", "end_group", "rob_cost", "prf_need", "prf_cost", "buffers",
        "may_load", "may_store")


def _rows(facts: Facts, c):
  """The facts dispatch needs about static instruction(s) c."""
  return {name: getattr(facts, name)[c] for name in _ROW}


def blockers(counters, slots, row, g):
  """WIDTH/ROB/OTHER bits of what keeps the next instruction (`row`) from dispatching."""
  width = g["dispatch_width"]
  need = jnp.minimum(row["uops"], width)
  narrow = (slots <= 0) | (need > slots) | (row["begin_group"] & (slots != width))
  rob = g["rob_size"] - counters["rob_used"] < row["rob_cost"]
  cap = g["prf_size"]
  other = jnp.any((cap > 0) & (counters["prf_used"] + row["prf_need"] > cap))
  other |= jnp.any(row["buffers"] & (counters["rs_used"] >= g["buffer_size"]))
  other |= (g["load_queue"] > 0) & row["may_load"] & (counters["lq_used"] >= g["load_queue"])
  other |= (g["store_queue"] > 0) & row["may_store"] & (counters["sq_used"] >= g["store_queue"])
  return WIDTH * narrow + ROB * rob + OTHER * other


def _decide(counters, slots, total, facts: Facts, g, group: int):
  """Up to `group` instructions in order while they may go: (counters, slots, count, go).

  The next `group` instructions' facts are gathered once and the loop is unrolled, so
  the whole decision fuses into a few kernels.
  """
  width = g["dispatch_width"]
  first = counters["next"]
  rows = _rows(facts, jnp.mod(first + jnp.arange(group + 1), facts.n))
  count, go = jnp.zeros((), jnp.int32), jnp.ones((), bool)

  def add(x, y, go):
    return x + jnp.where(go, y, 0).astype(x.dtype)

  for k in range(group):
    row = {name: v[k] for name, v in rows.items()}
    go &= (first + k < total) & (blockers(counters, slots, row, g) == 0)
    wide = row["uops"] > width
    new_slots = jnp.where(wide | row["end_group"], 0, slots - row["uops"])
    counters = dict(
        next=add(counters["next"], 1, go),
        carry=jnp.where(go & wide, row["uops"] - width, counters["carry"]),
        rob_used=add(counters["rob_used"], row["rob_cost"], go),
        rs_used=add(counters["rs_used"], row["buffers"], go),
        lq_used=add(counters["lq_used"], row["may_load"], go),
        sq_used=add(counters["sq_used"], row["may_store"], go),
        prf_used=add(counters["prf_used"], row["prf_cost"], go))
    count += go.astype(jnp.int32)
    slots = jnp.where(go, new_slots, slots)
  row = {name: v[group] for name, v in rows.items()}
  go &= (first + group < total) & (blockers(counters, slots, row, g) == 0)
  return counters, slots, count, go


def _links(state: State, facts: Facts, first, count):
  """The read links of the group's instructions (dynamic first + k, k < count).

  Edges count where they hold in this iteration (`encode`: an alias may reach back
  into an iteration the first one lacks); an edge that does not hold but whose
  producer has not issued yet still counts as pending, since that producer's issue
  wakes every consumer of the edge (issue.py). Retired producers impose nothing.
  """
  W = state.issue_t.shape[0]
  k = jnp.arange(state.group, dtype=jnp.int32)
  i = first + k  # [group]
  on = k < count
  c = jnp.mod(i, facts.n)
  p = i[:, None] - facts.dep_off[c]  # [group, D]: producers
  it = (i // facts.n)[:, None]
  live = on[:, None] & facts.dep_on[c] & (p >= state.head)
  p_slot = jnp.mod(p, W)
  mine = p >= first  # producer dispatched in this group (then it issues now or later)
  before = state.issue_t[p_slot]  # issue cycles of older producers
  return dict(i=i, on=on, c=c, p_slot=p_slot, mine=mine, before=before,
              holds=live & (it >= facts.dep_first[c]) & (it < facts.dep_last[c]),
              mine_k=jnp.clip(p - first, 0, state.group - 1),
              ready_at=jnp.where(mine, state.t, before) + facts.dep_w[c])


def _producers_issued(links, now):
  """[group, D] bool: each producer has issued, given which group members issue now."""
  return jnp.where(links["mine"], now[links["mine_k"]], links["before"] < BIG)


def _zero_latency_now(links, facts: Facts, t):
  """[group] bool: which of the group's instructions issue at dispatch.

  A zero-latency instruction without resources issues at once when its operands are
  ready, which may depend on an earlier member of the same group doing so: iterate
  to the fixed point (no iteration at all when none issues at once).
  """
  holds = links["holds"]
  may = facts.zero_latency[links["c"]] & links["on"]

  def now_given(now):
    issued = _producers_issued(links, now)
    return may & ~jnp.any(holds & ~issued, axis=-1) & (
        jnp.max(jnp.where(holds & issued, links["ready_at"], 0), axis=-1) <= t)

  now = now_given(jnp.zeros(links["on"].shape, bool))
  return lax.while_loop(lambda c: jnp.any(c[0] != c[1]),
                        lambda c: (now_given(c[0]), c[0]),
                        (now, jnp.where(jnp.any(now), ~now, now)))[0]


def _write(state: State, facts: Facts, first, count) -> State:
  """Writes the group's `count` instructions (dynamic first...) into the window."""
  W = state.issue_t.shape[0]
  t = state.t
  links = _links(state, facts, first, count)
  now = _zero_latency_now(links, facts, t)
  i, on, c, holds = links["i"], links["on"], links["c"], links["holds"]
  slot = jnp.where(on, jnp.mod(i, W), W)  # W: dropped
  issued = _producers_issued(links, now)
  operands = jnp.max(jnp.where(holds & issued, links["ready_at"], 0), axis=-1)
  waits = holds & ~issued
  users = state.users.at[slot].set(0, mode="drop")
  users = users.at[jnp.where(waits, links["p_slot"], W).reshape(-1)].add(1, mode="drop")
  flags = (LOAD * facts.may_load[c] + STORE * facts.may_store[c]
           + ORDERED_STORE * facts.ordered_store[c]
           + LOAD_BARRIER * facts.load_barrier[c] + STORE_BARRIER * facts.store_barrier[c])
  order = state.issued + jnp.cumsum(now) - 1
  state = state.replace(
      issue_t=state.issue_t.at[slot].set(jnp.where(now, t, BIG), mode="drop"),
      issued=state.issued + jnp.sum(now).astype(jnp.int32),
      ready_t=state.ready_t.at[slot].set(jnp.maximum(operands, t + 1), mode="drop"),
      pending=state.pending.at[slot].set(jnp.sum(waits, axis=-1).astype(jnp.int32),
                                         mode="drop"),
      users=users,
      index=state.index.at[slot].set(c, mode="drop"),
      latency=state.latency.at[slot].set(facts.max_latency[c], mode="drop"),
      flags=state.flags.at[slot].set(flags.astype(jnp.int32), mode="drop"),
      rob_cost=state.rob_cost.at[slot].set(facts.rob_cost[c], mode="drop"),
      prf_cost=state.prf_cost.at[slot].set(facts.prf_cost[c], mode="drop"))
  if state.trace.shape[0]:  # static: only when a trace was asked for
    T = state.trace.shape[0]
    rows = jnp.where(on, i, T)
    why = jnp.where(i == first, state.why, 0)
    cols = jnp.array([DISPATCH, ISSUE, ORDER, HEAD, WHY])
    vals = jnp.stack([jnp.full(state.group, t), jnp.where(now, t, -1), jnp.where(now, order, -1),
                      jnp.full(state.group, state.head), why], axis=-1)
    state = state.replace(trace=state.trace.at[rows[:, None], cols[None, :]].set(
        vals, mode="drop"))
  return state


def dispatch(state: State, facts: Facts, g, on=True) -> State:
  """Dispatches this cycle's instructions (none, and no change, where `on` is false).
  `g`: integer globals (see pipeline.py)."""
  width = g["dispatch_width"]
  slots = jnp.where(state.carry > 0, jnp.maximum(0, width - state.carry), width)
  state = state.replace(carry=jnp.where(on & (state.carry > 0),
                                        state.carry - (width - slots), state.carry))
  slots = jnp.where(on, slots, 0)  # no slot: nothing goes, and nothing is written
  why = state.why

  def group(carry):
    state, slots, _ = carry
    counters = {name: getattr(state, name) for name in _COUNTERS}
    first = state.next
    counters, slots, count, go = _decide(counters, slots, state.total, facts, g, state.group)
    state = _write(state, facts, first, count)
    state = state.replace(**counters, why=jnp.where(count > 0, 0, state.why))
    return state, slots, go

  state, slots, go = group((state, slots, True))
  state, slots, _ = lax.while_loop(lambda c: c[2], group, (state, slots, go))
  counters = {name: getattr(state, name) for name in _COUNTERS}
  row = _rows(facts, jnp.mod(state.next, facts.n))
  return state.replace(why=jnp.where(on, jnp.where(state.next < state.total,
                                                  blockers(counters, slots, row, g), 0), why))
