"""Soft mode: the hard simulator's schedule with differentiable cycle numbers.

A simulated schedule is a max-plus system. Every event (an instruction's dispatch,
issue or retirement) happens at the latest of its constraints, each an earlier event
plus a weight taken from the table:

- dispatch: the previous instruction's dispatch plus a width step (0 or 1 cycle),
  and, when the reorder buffer was full, the retirement that made room;
- issue: dispatch plus one, every producer's issue plus its latency minus the
  read-advance, and the release of each unit it needed by that unit's previous user
  (issue plus resource cycles; for a group, of the member that freed up first);
- retirement: its own issue plus latency plus one, and the previous retirement.

The hard run (`pipeline.run_block` with a trace) fixes the discrete decisions:
issue order, unit choice, which instructions share a dispatch cycle. `replay` then
recomputes every event time from float parameters along that graph, in the order
the events happened, with the max relaxed by a temperature `tau`: the Boltzmann
operator sum(softmax(v / tau) * v), which equals the max when one constraint binds
and at ties, and tends to it as tau -> 0. Whatever the hard schedule waited for
beyond these constraints (priority, memory order, full queues, retire width) enters
as a constant slack, so at the table's own integer values and tau = 0 the replay
reproduces the hard cycle counts exactly; it is one simulator, differentiated.

Gradients reach latencies and read-advances (dependency edges), resource cycles
(unit releases), micro-ops and the dispatch width (each instruction's width step is
differentiated as the fluid share uops / width, straight through: a dispatch group
of total width costs exactly one cycle), and the ROB size (a full ROB waits for the
retirement that ROB-size instructions earlier would have been: the slope of the
retirement sequence there). `straight_through` keeps the exact max forward and the
tempered gradient backward.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jax import lax

from diffsim.sim.facts import Facts
from diffsim.sim.state import DISPATCH, HEAD, ISSUE, ORDER, PREV, RETIRE, ROB, WHY, WIDTH

NEG = -1e9  # a candidate that does not exist


def smooth_max(vals, on, tau: float, straight_through: bool = False):
  """Max over the `on` entries of the last axis, tempered by `tau` (0: exact)."""
  z = jnp.where(on, vals, NEG)
  hard = jnp.max(z, axis=-1)
  if tau == 0:
    return jnp.where(jnp.any(on, -1), hard, 0.0)
  weights = jnp.exp((z - lax.stop_gradient(hard)[..., None]) / tau) * on
  weights = weights / jnp.maximum(jnp.sum(weights, -1, keepdims=True), 1e-30)
  soft = jnp.sum(weights * jnp.where(on, vals, 0.0), axis=-1)
  if straight_through:
    soft = lax.stop_gradient(hard) + (soft - lax.stop_gradient(soft))
  return jnp.where(jnp.any(on, -1), soft, 0.0)


def event_graph(facts: Facts, trace, iterations, soft: dict, hard: dict, dispatch_width,
                rob_size):
  """The schedule's constraint graph for ONE block.

  Events: dispatch of dynamic instruction i is event i, its issue T + i, its
  retirement 2T + i (T = trace rows).

  Args:
    facts: the block's hard facts (edges and which hold when).
    trace: [T, trace_columns] the hard run's record.
    iterations: [] iterations simulated (T >= n * iterations).
    soft, hard: `facts.timing` of the block with float and with integer numbers.

  Returns:
    dict of src [3T, C] int, on [3T, C] bool, weight [3T, C] float (differentiable),
    hard_times [3T] int, slack [3T] float (constant), order [3T] int (replay order),
    live [T] bool.
  """
  T = trace.shape[0]
  n = facts.n
  i = jnp.arange(T, dtype=jnp.int32)
  c = jnp.mod(i, n)
  it = i // n
  live = i < n * iterations
  d_t, i_t, r_t = trace[:, DISPATCH], trace[:, ISSUE], trace[:, RETIRE]
  H = jnp.concatenate([d_t, i_t, r_t])
  sg = lax.stop_gradient

  def cands(entries):
    """Stacks (src, on, weight, hard weight) columns into [T, k] arrays."""
    return [jnp.stack([jnp.broadcast_to(e[j], (T,)) for e in entries], -1) for j in range(4)]

  # Dispatch: width step from the previous instruction, and the ROB's retirement.
  why = trace[:, WHY]
  step = ((why & WIDTH) != 0).astype(jnp.float32)
  share = soft["uops"][c] / dispatch_width
  head = trace[:, HEAD]
  rob_on = live & ((why & ROB) != 0) & (head >= 1)
  slope = sg(jnp.where(head >= 2, r_t[jnp.maximum(head - 1, 0)] - r_t[jnp.maximum(head - 2, 0)],
                       0).astype(jnp.float32))
  dispatch = cands([
      (i - 1, live & (i >= 1), step + (share - sg(share)), step),
      (2 * T + head - 1, rob_on, -(rob_size - sg(rob_size)) * slope, jnp.zeros(T))])

  # Issue: dispatch + 1 (0 for what issued at dispatch), producers, unit releases.
  at_dispatch = (i_t == d_t).astype(jnp.float32)
  D = facts.dep_off.shape[-1]
  holds = (it[:, None] >= facts.dep_first[c]) & (it[:, None] < facts.dep_last[c])
  p = i[:, None] - facts.dep_off[c]
  # As in the hard run, a producer that retired before its consumer dispatched imposes
  # nothing (only an edge of fixed weight can bind then: a register producer that
  # retired has its result ready).
  retired = r_t[jnp.clip(p, 0, T - 1)] <= d_t[:, None]
  dep_on = live[:, None] & facts.dep_on[c] & holds & (p >= 0) & ~retired
  issue = [
      jnp.concatenate([i[:, None], T + p], -1),
      jnp.concatenate([live[:, None], dep_on], -1),
      jnp.concatenate([(1 - at_dispatch)[:, None], soft["dep_w"][c]], -1),
      jnp.concatenate([(1 - at_dispatch)[:, None], hard["dep_w"][c].astype(jnp.float32)], -1)]
  prev = trace[:, PREV::2]
  col = trace[:, PREV + 1::2]
  prev_c = jnp.mod(jnp.maximum(prev, 0), n)
  res = [T + prev, live[:, None] & (prev >= 0), soft["res_cycles"][prev_c, col],
         hard["res_cycles"][prev_c, col].astype(jnp.float32)]
  issue = [jnp.concatenate([a, b], -1) for a, b in zip(issue, res)]

  # Retirement: executed (issue + latency) one cycle earlier, and in order.
  retire = cands([
      (T + i, live, soft["max_latency"][c] + 1, hard["max_latency"][c] + 1),
      (2 * T + i - 1, live & (i >= 1), jnp.zeros(T), jnp.zeros(T))])

  C = 1 + D + prev.shape[-1]
  pad = lambda x, fill: jnp.pad(x, ((0, 0), (0, C - x.shape[-1])), constant_values=fill)
  src, on, weight, weight_hard = [
      jnp.concatenate([pad(a, f), pad(b, f), pad(r, f)])
      for a, b, r, f in zip(dispatch, issue, retire, (0, False, 0.0, 0.0))]
  src = jnp.clip(src, 0, 3 * T - 1)
  best = jnp.max(jnp.where(on, H[src] + weight_hard, NEG), axis=-1)
  slack = jnp.where(jnp.any(on, -1), H - best, H).astype(jnp.float32)

  # Replay order: by cycle; in a cycle retire, then issue (in issue order), then
  # dispatch (program order), then what issued at dispatch.
  big = jnp.int32(1 << 29)
  phase_issue = jnp.where(i_t == d_t, 3, 1)
  primary = jnp.concatenate([d_t * 4 + 2, i_t * 4 + phase_issue, r_t * 4])
  primary = jnp.where(jnp.concatenate([live, live, live]), primary, big)
  secondary = jnp.concatenate([i, trace[:, ORDER], i])
  order = jnp.lexsort((secondary, primary))
  return dict(src=src, on=on, weight=weight, hard_times=H, slack=slack, order=order, live=live)


def replay(graph: dict, tau: float, straight_through: bool = False):
  """[3T] float event times along the graph (see the module docstring)."""
  src, on, weight, slack = graph["src"], graph["on"], graph["weight"], graph["slack"]

  def step(times, e):
    t = smooth_max(times[src[e]] + weight[e], on[e], tau, straight_through) + slack[e]
    return times.at[e].set(t), None

  times0 = jnp.zeros(src.shape[0], weight.dtype)
  times, _ = lax.scan(step, times0, graph["order"])
  return times


def throughputs(times, n, iterations, T):
  """(total, steady) cycles from replayed times: Total Cycles for `iterations`
  iterations, and 100 x the cycles per iteration over the second half of the run."""
  retire = times[2 * T:]
  last = n * iterations - 1
  half = n * (iterations // 2) - 1
  total = retire[last] + 1
  steady = 100.0 * (retire[last] - retire[half]) / (iterations - iterations // 2)
  return total, steady


def block_throughputs(params, structure, layout, block, trace, iterations: int, tau: float,
                      straight_through: bool = False):
  """Soft (total, steady, min slack) of ONE encoded block (a row of a `BlockBatch`) from
  its hard trace; differentiable in `params` (the schedule's structure and the slack
  come from the rounded table the trace was recorded with)."""
  from diffsim.sim.facts import gather, timing

  params = jax.tree.map(jnp.asarray, params)
  fixed = lax.stop_gradient(params)
  facts = gather(fixed, structure, layout, block)
  graph = event_graph(facts, trace, iterations, timing(params, block, hard=False),
                      timing(fixed, block, hard=True), params.dispatch_width, params.rob_size)
  times = replay(graph, tau, straight_through)
  total, steady = throughputs(times, facts.n, iterations, trace.shape[0])
  return total, steady, jnp.min(jnp.where(graph["live"], jnp.minimum(
      graph["slack"][:trace.shape[0]], graph["slack"][trace.shape[0]:2 * trace.shape[0]]), 0))
