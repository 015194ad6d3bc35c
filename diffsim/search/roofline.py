"""Each configuration's roofline on a table: its cycles per flop as the table's bounds
give them, without simulating.

The Blueprint says what a CPU is; the roofline reads that specification against each
candidate kernel, as a performance engineer would before timing anything. Per loop
iteration, four bounds:
- front end: the iteration's micro-ops over the dispatch width;
- resources: per resource (a unit or a group), the cycles its users hold it over its
  units, as if the load balanced perfectly;
- recurrence: the loop-carried dependency chains (accumulators, pointers), as the
  growth per iteration of the dataflow's start times when every edge waits for its
  producer's latency less the reader's read-advance (an FMA with a folded load reads
  its accumulator late);
- windows: what the reorder buffer, each scheduler and the load and store queues hold
  in flight (Little's law), the largest of them.
Bounds that nearly tie contend for the same cycles: a kernel where two bind runs slower
than either alone. So the roofline combines them in a `NORM`-norm rather than taking the
largest (`norm=np.inf` gives the largest). It still ignores what only simulation
sees (the reorder buffer filling, ports picked unevenly), so it is a prior, not a cost:
Glimpse's acquisition learns how far to trust it, and `roofline_search` orders
candidates by it alone (an ablation).
"""
from __future__ import annotations

import dataclasses
import functools

import numpy as np

from diffsim.search.space import Task

_ITERATIONS = 16  # dataflow iterations unrolled for the recurrence; the last half measure it
# The norm that combines the bounds. Chosen on the training CPUs alone (haswell, znver3,
# their variants and sampled tables): ordering configurations by the roofline reaches
# 2% of the simulated optimum in 1.61 / 1.14 / 1.14 evaluations (axpy / dot / gemm)
# against 2.05 / 1.10 / 2.37 for the largest bound; norms 2, 3, 6, 8 and 16 did no
# better overall.
NORM = 4.0


@dataclasses.dataclass(frozen=True)
class _Lowered:
  """A task's valid configurations decoded once, padded: L instructions, D deps each."""

  ids: np.ndarray  # [V] configuration indices
  instrs: tuple  # [V] the decoded instructions of each
  producer: np.ndarray  # [V, L, D] int: producing instruction (-1: no edge)
  distance: np.ndarray  # [V, L, D] int: iterations back
  role: np.ndarray  # [V, L, D] int: the producer's write role (latency column)
  read: np.ndarray  # [V, L, D] int: the reader's read class (read-advance column)


@functools.lru_cache(maxsize=None)
def _lowered(task: Task) -> _Lowered:
  from diffsim.isa.encode import dependencies
  from diffsim.search.codegen import lower_many

  ids = np.array([i for i, c in enumerate(task.configs) if task.static_error(c) is None], int)
  blocks = lower_many(task, [task.configs[i] for i in ids])
  for i, b in zip(ids, blocks):
    if isinstance(b, Exception):
      raise RuntimeError(f"{task.name} configuration {task.as_dict(task.configs[i])}: {b}")
  deps = [dependencies(b) for b in blocks]
  L = max(len(b.instrs) for b in blocks)
  D = max((len(d) for ds in deps for d in ds), default=1) or 1
  producer = np.full((len(ids), L, D), -1, int)
  distance = np.zeros((len(ids), L, D), int)
  role = np.zeros((len(ids), L, D), int)
  read = np.zeros((len(ids), L, D), int)
  for v, ds in enumerate(deps):
    for c, edges in enumerate(ds):
      for e, edge in enumerate(edges):
        producer[v, c, e], distance[v, c, e], role[v, c, e], read[v, c, e] = edge
  return _Lowered(ids, tuple(tuple(b.instrs) for b in blocks), producer, distance, role, read)


def _keys(low: _Lowered, table) -> np.ndarray:
  """[V, L] each instruction's key index in `table` (-1: padding; -2: the table lacks
  it)."""
  from diffsim.isa.encode import key_lookup

  idx = table.layout.index
  lookup = key_lookup(idx)
  supported = np.asarray(table.structure.supported)
  out = np.full(low.producer.shape[:2], -1, int)
  for v, instrs in enumerate(low.instrs):
    for c, ins in enumerate(instrs):
      k = lookup(ins)
      out[v, c] = idx[k] if k is not None and supported[idx[k]] else -2
  return out


def roofline(task: Task, table, *, norm: float = NORM) -> np.ndarray:
  """[C] the roofline of every configuration on `table`, in cycles per flop (inf where
  the configuration is invalid or the table lacks one of its instructions): its bounds'
  `norm`-norm (`np.inf`: the largest, a lower bound on the simulated cost up to the
  simulator's steady-state estimate).

  >>> from diffsim.params.table import load_table
  >>> from diffsim.search.space import get_task
  >>> r = roofline(get_task("dot"), load_table("haswell"))
  >>> bool(np.isfinite(r).any()) and float(np.nanmin(r[np.isfinite(r)])) > 0
  True
  """
  low = _lowered(task)
  keys = _keys(low, table)
  lacking = (keys == -2).any(1)
  real = keys >= 0
  k = np.where(real, keys, 0)
  p = table.params
  # Front end.
  each = np.where(real, np.asarray(p.uops, np.float64)[k], 0.0)  # [V, L] micro-ops
  front = each.sum(1) / float(p.dispatch_width)
  # Resources: cycles held x units needed, over the resource's units.
  members = [1 << u for u in range(len(table.layout.units))] + list(table.layout.group_members)
  width = np.array([bin(m).count("1") for m in members], np.float64)
  held = np.asarray(p.res_cycles, np.float64) * np.asarray(table.structure.res_need)
  resources = (np.where(real[..., None], held[k], 0.0).sum(1) / width).max(1)
  # Recurrence: start times over unrolled iterations; an edge waits for its producer's
  # start in its iteration plus the producer's latency for that write, less the
  # reader's read-advance for that read.
  latency = np.asarray(p.latency, np.float64)
  advance = np.asarray(p.read_advance, np.float64)
  V, L, D = low.producer.shape
  edge = low.producer >= 0
  prod = np.where(edge, low.producer, 0)
  pkey = np.take_along_axis(k, prod.reshape(V, -1), 1).reshape(V, L, D)
  wait = np.maximum(latency[pkey, low.role] - advance[k[..., None], low.read], 0.0)
  start = np.full((_ITERATIONS, V, L), 0.0)
  rows = np.arange(V)[:, None]
  for it in range(_ITERATIONS):
    for c in range(L):
      back = it - low.distance[:, c]  # [V, D]
      ok = edge[:, c] & (back >= 0)
      ready = start[np.maximum(back, 0), rows, prod[:, c]] + wait[:, c]
      start[it, :, c] = np.max(np.where(ok, ready, 0.0), 1)
  half = _ITERATIONS // 2
  recurrence = (start[-1].max(1) - start[half - 1].max(1)) / half
  # Windows (Little's law): a micro-op holds a reorder-buffer entry from its dispatch
  # (at the dispatch width, in order) until it retires (once it and every older one
  # have finished, within one iteration's dataflow), a scheduler entry until its
  # operands are ready, a load or store queue entry until it retires.
  own = np.where(real, latency[k].max(-1), 0.0)
  depth = np.zeros((V, L))
  for c in range(L):
    same = edge[:, c] & (low.distance[:, c] == 0)
    depth[:, c] = np.max(np.where(same, depth[rows, prod[:, c]] + wait[:, c], 0.0), 1)
  retire = np.maximum.accumulate(depth + own, 1)
  dispatch = (np.cumsum(each, 1) - each) / float(p.dispatch_width)
  in_rob = np.maximum(retire - dispatch, 1.0)
  windows = [(each * in_rob).sum(1) / float(p.rob_size)]
  st = table.structure
  size = np.asarray(p.buffer_size, np.float64)
  takes = np.asarray(st.buffers)[k] & real[..., None]  # [V, L, R]
  waiting = np.maximum(depth - dispatch, 1.0)
  windows += [(takes[..., r] * waiting).sum(1) / size[r] for r in np.flatnonzero(size > 0)]
  for uses, entries in ((st.may_load, p.load_queue), (st.may_store, p.store_queue)):
    if float(entries) > 0:  # 0: unbounded
      windows.append(((np.asarray(uses)[k] & real) * in_rob).sum(1) / float(entries))
  window = np.max(windows, 0)
  bounds = np.array([front, resources, recurrence, window])
  top = bounds.max(0)
  cycles = top if np.isinf(norm) else top * ((bounds / top) ** norm).sum(0) ** (1 / norm)
  flops = np.array([task.useful_ops(task.configs[i]) for i in low.ids], np.float64)
  out = np.full(task.size, np.inf)
  out[low.ids] = np.where(lacking, np.inf, cycles / flops)
  return out
