"""Execute stage: out-of-order issue to ports and resource groups.

Each cycle, after retirement, instructions whose operands are ready, whose memory
ordering allows it and whose resources are free issue one at a time, best priority
first, until none can (diffsim/sim/MODEL.md#issue). Priority is (age - users, age):
an older instruction, or one that more dispatched readers wait on, goes first.
A group picks one free member unit round-robin from its highest unit down; every
unit that becomes busy moves the round-robin state of every group containing it.
Units and groups are bitmasks over units, so availability is a few integer ops.

llvm-mca's loop ("issue the best available candidate, repeat") equals one pass over
the candidates in priority order, because within a cycle resources only get taken:
a candidate that cannot issue now cannot later in the same cycle. So each round
first drops every instruction whose resources are already busy (one vectorised test
per static instruction), takes the K best of the rest from the window, and a short
loop over those K touches only the small resource state. Two things can add
candidates within the cycle: a reader woken by a producer whose value it may read at
once (latency not above its read-advance), and more than K ready candidates; another
round covers both, and the scan stops early only where an issue may really wake a
reader (cost: rounds run as long as the slowest block of the batch needs them).

Memory ordering (llvm-mca's default -noalias=true, LSUnit): a store waits until every
older load and store has issued; a load waits for the latest older load barrier to
execute, a store for the latest older store barrier, and a load barrier for the
older loads. With memory dependences (a table field, off in llvm-mca's tables) stores
do not wait for older memory operations: the dependence edges order what aliases.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from diffsim.sim.facts import BIG, Facts
from diffsim.sim.state import (ISSUE, LOAD, LOAD_BARRIER, ORDER, ORDERED_STORE, PREV, STORE,
                               STORE_BARRIER, State, inflight, slot_dyn)

K = 2  # candidates considered per round
POS_BITS = 10  # priority keys end in the slot's distance from the head: windows <= 1024


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


def _free(busy, t):
  bits = 1 << jnp.arange(busy.shape[0], dtype=jnp.int32)
  return jnp.sum(jnp.where(busy <= t, bits, 0)).astype(jnp.int32)


def _get(arr, i):
  """arr[i] for a small vector and a traced index, as a fusible masked sum."""
  return jnp.sum(jnp.where(jnp.arange(arr.shape[0]) == i, arr, 0)).astype(arr.dtype)


def _set(arr, i, value, on):
  """arr.at[i].set(value) where `on`, as a fusible select (no scatter)."""
  return jnp.where((jnp.arange(arr.shape[0]) == i) & on, value, arr)


def can_take(res, row, members, t) -> jax.Array:
  """[] bool: the candidate's resources (`row`: its facts) are free in `res`."""
  busy, reserved_until = res[0], res[3]
  free = _free(busy, t)
  ok = (row["unit_mask"] & ~free) == 0
  free_members = lax.population_count(free & row["grp_members"])
  ok &= jnp.all(~row["grp_on"] | row["grp_reserved"] | (free_members >= row["grp_need"]))
  ok &= ~jnp.any(row["blocked_by"] & (reserved_until > t))
  return ok


def take(res, row, members, t, on, dyn=None):
  """Allocates the candidate's resources (when `on`): direct units, then groups.

  `res` is (busy_until, seq, skip, reserved_until, last_user, last_col, rec). With
  `dyn` (the candidate's dynamic index, when a trace is kept) each use records in
  `rec` [uses, 2] the unit's previous user and its column: for a group, that of the
  member that freed up first, the one the candidate could at the earliest have had.
  """
  U = res[0].shape[0]
  DU = row["dunit"].shape[0]

  def remember(res, j, prev_unit, unit, col, use):
    if dyn is None:
      return res
    busy, seq, skip, reserved_until, last_user, last_col, rec = res
    prev = jnp.stack([_get(last_user, prev_unit), _get(last_col, prev_unit)])
    rec = rec.at[j].set(jnp.where(use, prev, jnp.array([-1, 0])))
    last_user = _set(last_user, unit, dyn, use)
    last_col = _set(last_col, unit, col, use)
    return busy, seq, skip, reserved_until, last_user, last_col, rec

  def unit(j, res):
    busy, seq, skip, *rest = res
    u, use = row["dunit"][j], on & row["dunit_on"][j]
    res = remember(res, j, u, u, u, use)
    busy = _set(busy, u, t + row["dunit_cycles"][j], use)
    seq, skip = notify(seq, skip, members, (1 << u).astype(jnp.int32), use)
    return (busy, seq, skip) + tuple(res[3:])

  def group(q, res):
    busy, seq, skip, reserved_until, *rest = res
    g, cyc = row["grp"][q], row["grp_cycles"][q]
    group_on = on & row["grp_on"][q]
    reserve = row["grp_reserved"][q]
    reserved_until = _set(reserved_until, g, t + cyc, group_on & reserve)
    g_members = row["grp_members"][q]
    unit, bit, seq_g, skip_g = choose(_get(seq, g), _get(skip, g), g_members, _free(busy, t))
    pick = group_on & ~reserve
    if dyn is not None:
      in_g = ((g_members >> jnp.arange(U, dtype=jnp.int32)) & 1) != 0
      first_free = jnp.argmin(jnp.where(in_g, busy, BIG)).astype(jnp.int32)
      res = remember(res, DU + q, first_free, unit, U + g, pick)
    seq = _set(seq, g, seq_g, pick)
    skip = _set(skip, g, skip_g, pick)
    busy = _set(busy, unit, t + cyc, pick)
    seq, skip = notify(seq, skip, members, bit, pick)
    return (busy, seq, skip, reserved_until) + tuple(res[4:])

  # Direct units in bit order, then kept groups in llvm-mca's order.
  res = lax.fori_loop(0, DU, unit, res)
  return lax.fori_loop(0, row["grp"].shape[0], group, res)


_ROW = ("unit_mask", "dunit", "dunit_cycles", "dunit_on", "grp", "grp_cycles", "grp_need",
        "grp_reserved", "grp_on", "grp_members", "blocked_by")


def _free_rows(busy, reserved_until, facts: Facts, members, t, index):
  """Whose resources are free: ([L] per static instruction, [W] per window slot)."""
  res = (busy, None, None, reserved_until)
  free = jax.vmap(lambda row: can_take(res, row, members, t))(
      {name: getattr(facts, name) for name in _ROW})
  L = free.shape[0]
  if L <= 32:  # as a bitmask: a vectorised shift per slot instead of a gather
    bits = jnp.sum(jnp.where(free, 1 << jnp.arange(L, dtype=jnp.int32), 0))
    return free, ((bits >> index) & 1) != 0
  return free, free[index]


def _best(key, k, head):
  """The slots of the k smallest keys. Keys are distinct and end in the slot's distance
  from the ROB head (POS_BITS bits), so a plain min finds each: XLA:CPU vectorises a
  min, not an argmin."""
  top = jnp.iinfo(jnp.int32).max
  W = key.shape[0]
  slots, valid = [], []
  for _ in range(k):
    low = jnp.min(key)
    slots.append(jnp.mod(head + (low & ((1 << POS_BITS) - 1)), W))
    valid.append(low < top)
    key = jnp.where(key == low, top, key)
  return jnp.stack(slots), jnp.stack(valid)


def issue_round(state: State, facts: Facts, members) -> State:
  """Scans the K best untried candidates once; sets `state.more` when another round of
  the same cycle is due."""
  t = state.t
  W = state.issue_t.shape[0]
  dyn = slot_dyn(state)
  live = inflight(state)
  unissued = live & (state.issue_t >= BIG)
  executed = live & (state.issue_t + state.latency <= t)
  tried = state.tried
  waiting = unissued & (state.pending == 0) & (state.ready_t <= t) & ~tried
  has = lambda bit: (state.flags & bit) != 0  # noqa: E731
  store = has(STORE)
  load = has(LOAD) & ~store
  ordered = has(ORDERED_STORE)  # waits for every older memory operation to issue
  # Barrier orderings wait on completions, which cannot change within the cycle.
  oldest = lambda m: jnp.min(jnp.where(m, dyn, BIG))  # noqa: E731
  lb_ok = oldest(live & ~executed & has(LOAD_BARRIER)) >= dyn
  sb_ok = oldest(live & ~executed & has(STORE_BARRIER)) >= dyn
  old_loads_ok = oldest(live & ~executed & has(LOAD)) >= dyn
  mem_ok = jnp.where(store, sb_ok, jnp.where(load, lb_ok & (~has(LOAD_BARRIER) | old_loads_ok),
                                             True))
  # Resources only get taken within a cycle, so an instruction whose resources are
  # busy now cannot issue later in it: it is no candidate (decided per static
  # instruction, then spread over the window).
  free_now, free_slot = _free_rows(state.busy_until, state.reserved_until, facts, members, t,
                                   state.index)
  ready = waiting & mem_ok & free_slot
  # A store needs every older memory operation issued. One that waits on an older
  # operation that cannot issue this cycle is no candidate; the rest are checked
  # exactly in the scan below.
  is_mem = live & has(LOAD | STORE)
  stuck = oldest(unissued & is_mem & ~ready)
  cand = ready & (~ordered | (dyn <= stuck))
  pos = dyn - state.head
  key = jnp.where(cand, ((pos - state.users + 8192) << POS_BITS) + pos,
                  jnp.iinfo(jnp.int32).max)
  slots, valid = _best(key, K, state.head)
  dyn_k = dyn[slots]
  c_k = state.index[slots]
  ordered_k = ordered[slots]
  mem_k = (facts.may_load[c_k] | facts.may_store[c_k])
  older = jnp.sum(unissued[None, :] & is_mem[None, :] & (dyn[None, :] < dyn_k[:, None]),
                  axis=-1)

  rows = {name: getattr(facts, name)[c_k] for name in _ROW}  # [K, ...] each

  # Issuing either may make another instruction ready in this same cycle (a reader
  # with enough read-advance, a store whose older memory operations have now all
  # issued); llvm-mca then picks the best ready one again, so the scan stops there.
  # Each candidate's readers [K, C], and their iterations: an edge may hold only from
  # some iteration on (encode).
  q_dyn = dyn_k[:, None] + facts.use_off[c_k]
  q_it = (dyn_k // facts.n)[:, None] + facts.use_it[c_k]
  linked = (facts.use_on[c_k] & (q_dyn < state.next) & (q_it >= facts.use_first[c_k])
            & (q_it < facts.use_last[c_k]))
  q_slot = jnp.mod(q_dyn, W)
  # A reader it may make ready at once: linked by a zero-weight edge, still waiting on
  # a producer, its other operands ready and its resources free at the round's start.
  may_wake = (linked & (facts.use_w[c_k] == 0) & (state.pending[q_slot] > 0)
              & (state.ready_t[q_slot] <= t) & free_now[facts.use_dst[c_k]])
  wakes_k = jnp.any(may_wake, axis=-1) | (mem_k & jnp.any(ordered & cand))

  record = state.trace.shape[0] > 0  # static: keep the schedule's decisions
  uses = rows["dunit"].shape[-1] + rows["grp"].shape[-1]

  def scan(k, carry):  # the candidates in priority order
    res, issued, done_older, seen, recs = carry
    row = {name: v[k] for name, v in rows.items()}
    go = valid[k] & ~jnp.any(issued & wakes_k)
    ok = go & can_take(res, row, members, t)
    ok &= ~ordered_k[k] | (older[k] == done_older[k])
    res = take(res + (jnp.full((uses, 2), -1, jnp.int32),), row, members, t, ok,
               dyn_k[k] if record else None)
    res, rec = res[:-1], res[-1]
    recs = recs.at[k].set(rec)
    issued = _set(issued, k, True, ok)
    seen = _set(seen, k, True, go)
    done_older = done_older + (ok & mem_k[k] & (dyn_k[k] < dyn_k)).astype(jnp.int32)
    return res, issued, done_older, seen, recs

  res = (state.busy_until, state.seq, state.skip, state.reserved_until, state.last_user,
         state.last_col)
  res, issued, _, seen, recs = lax.fori_loop(
      0, K, scan, (res, jnp.zeros(K, bool), jnp.zeros(K, jnp.int32), jnp.zeros(K, bool),
                   jnp.full((K, uses, 2), -1, jnp.int32)))
  busy, seq, skip, reserved_until, last_user, last_col = res

  # Write back: issue cycles, scheduler entries, and wake the dispatched readers.
  slot_i = jnp.where(issued, slots, W)
  issue_t = state.issue_t.at[slot_i].set(t, mode="drop")
  rs_used = state.rs_used - jnp.sum(
      jnp.where(issued[:, None], facts.buffers[c_k], False), axis=0).astype(jnp.int32)
  woke = issued[:, None] & linked
  q_slot = jnp.where(woke, q_slot, W).reshape(-1)
  ready_t = state.ready_t.at[q_slot].max((t + facts.use_w[c_k]).reshape(-1), mode="drop")
  pending = state.pending.at[q_slot].add(-1, mode="drop")
  # Scanned candidates that did not issue cannot later this cycle (resources only
  # get taken), except stores once an older memory operation has issued.
  tried = tried | jnp.zeros(W, bool).at[jnp.where(seen, slots, W)].set(True, mode="drop")
  mem_issued = jnp.any(issued & mem_k)
  tried = jnp.where(mem_issued, tried & ~(ordered & cand), tried)
  # Another round if a woken reader is ready now, a store may now pass (it is the
  # oldest memory operation left), or K was too few; each only if its resources are
  # still free after this round's issues (the next round's own test), so a cycle whose
  # remaining candidates all found their units taken ends here.
  free_after, free_after_slot = _free_rows(busy, reserved_until, facts, members, t,
                                           state.index)
  reader_ready = (woke & (facts.use_w[c_k] == 0) & (pending[q_slot.reshape(K, -1) % W] == 0)
                  & (ready_t[q_slot.reshape(K, -1) % W] <= t) & free_after[facts.use_dst[c_k]])
  left = unissued & (issue_t >= BIG)
  store_passes = ordered & cand & left & (dyn == oldest(left & is_mem)) & free_after_slot
  more = (jnp.any(reader_ready) | mem_issued & jnp.any(store_passes)
          | jnp.any(cand & ~tried & free_after_slot))
  order = state.issued + jnp.cumsum(issued) - 1  # issue sequence numbers
  state = state.replace(busy_until=busy, seq=seq, skip=skip, reserved_until=reserved_until,
                        last_user=last_user, last_col=last_col, issue_t=issue_t,
                        rs_used=rs_used, ready_t=ready_t, pending=pending,
                        issued=state.issued + jnp.sum(issued).astype(jnp.int32),
                        tried=tried, more=more)
  if record:
    rows_k = jnp.where(issued, dyn_k, state.trace.shape[0])
    state = state.replace(trace=state.trace.at[rows_k, ISSUE].set(t, mode="drop")
                          .at[rows_k, ORDER].set(order, mode="drop")
                          .at[rows_k, PREV:].set(recs.reshape(K, -1), mode="drop"))
  return state
