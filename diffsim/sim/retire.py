"""Retire stage: in-order retirement from the reorder-buffer head.

At the start of cycle t, every instruction from the head whose executed cycle is
before t retires, up to the retire width when the model has one
(diffsim/sim/MODEL.md#retire). Retiring frees ROB entries, load/store-queue entries and
physical registers, which dispatch can reuse in the same cycle.
"""

from __future__ import annotations

import jax.numpy as jnp

from diffsim.sim.facts import Facts
from diffsim.sim.state import LOAD, STORE, State, inflight


def retire(state: State, facts: Facts, retire_width, on=True) -> State:
  """Retires the executed prefix of the ROB (nothing where `on` is false)."""
  W = state.issue_t.shape[0]
  pos = jnp.mod(jnp.arange(W, dtype=jnp.int32) - state.head, W)  # distance from the head
  del facts  # everything needed was copied into the window at dispatch
  executed = inflight(state) & (state.issue_t + state.latency < state.t)
  # Length of the executed run that starts at the head: the first position that is
  # not executed bounds it.
  blocker = jnp.min(jnp.where(executed, W, pos))
  count = jnp.where(retire_width > 0, jnp.minimum(blocker, retire_width), blocker)
  count = jnp.where(on, count, 0)
  gone = inflight(state) & (pos < count)
  freed = lambda x: jnp.sum(jnp.where(gone, x, 0))  # noqa: E731
  T = state.trace.shape[0]
  retired_now = (jnp.arange(T) >= state.head) & (jnp.arange(T) < state.head + count)
  trace = state.trace.at[:, 2].set(jnp.where(retired_now, state.t, state.trace[:, 2]))
  return state.replace(
      trace=trace,
      head=state.head + count,
      last_retire=jnp.where(count > 0, state.t, state.last_retire),
      rob_used=state.rob_used - freed(state.rob_cost),
      lq_used=state.lq_used - freed((state.flags & LOAD) != 0),
      sq_used=state.sq_used - freed((state.flags & STORE) != 0),
      prf_used=state.prf_used - jnp.sum(jnp.where(gone[:, None], state.prf_cost, 0), axis=0))
