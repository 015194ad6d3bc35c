"""One block through the whole pipeline: the cycle loop.

`step` is one cycle, a straight list of stage calls in llvm-mca's order: retire,
issue (the execute stage's release/complete/wake-up are implicit in the cycle
numbers it compares), then dispatch (pipeline-model.md 4). `run_block` repeats it
until every instruction of every iteration has retired.
"""

from __future__ import annotations

import jax.numpy as jnp
from jax import lax

from diffsim.sim import dispatch as dispatch_stage
from diffsim.sim import issue as issue_stage
from diffsim.sim import period
from diffsim.sim import retire as retire_stage
from diffsim.sim.facts import Facts
from diffsim.sim.state import State, init


def integer_globals(params) -> dict:
  """The global parameters, rounded as llvm-mca's integer tables are."""
  r = lambda x: jnp.round(jnp.asarray(x)).astype(jnp.int32)  # noqa: E731
  return dict(dispatch_width=r(params.dispatch_width), rob_size=r(params.rob_size),
              retire_width=r(params.retire_width), buffer_size=r(params.buffer_size),
              load_queue=r(params.load_queue), store_queue=r(params.store_queue),
              prf_size=r(params.prf_size))


def step(state: State, facts: Facts, members, g) -> State:
  """One cycle."""
  state = retire_stage.retire(state, facts, g["retire_width"])
  state = issue_stage.issue(state, facts, members)
  state = dispatch_stage.dispatch(state, facts, g)
  return state.replace(t=state.t + 1)


def run_block(facts: Facts, params, members, iterations, *, window: int, max_cycles: int,
              fast_forward: bool = True, trace: int = 0):
  """Total cycles for `iterations` iterations of one block (llvm-mca's Total Cycles).

  Returns:
    (cycles [] int32, overflow [] bool): overflow is set when the block did not
    finish within `max_cycles` cycles; the cycle count is then meaningless.
  """
  g = integer_globals(params)
  U = facts.unit_cycles.shape[-1]
  state = init(facts.n * iterations, U, members, params.buffer_size.shape[0],
               params.prf_size.shape[0], window, trace)

  def running(carry):
    state, _ = carry
    return (state.head < state.total) & (state.t < max_cycles)

  def cycle(carry):
    state, memory = carry
    before = state.next
    state = step(state, facts, members, g)
    if fast_forward:
      state, memory = period.fast_forward(state, memory, before, facts.n)
    return state, memory

  state, _ = lax.while_loop(running, cycle, (state, period.init_memory()))
  overflow = state.head < state.total
  if trace:
    return state.last_retire + 1, overflow, state.trace
  return state.last_retire + 1, overflow
