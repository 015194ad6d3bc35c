"""The cost function: configurations simulated on a target CPU's table.

Cost is simulated steady-state cycles per iteration (`simulate_blocks(...,
throughput="steady")`, cycles per 100 iterations, divided by 100) over the useful
floating-point operations of the iteration: cycles per flop. A configuration that
cannot be compiled (`Task.static_error`) or whose instructions the target's table lacks
(`diffsim.sim.blocks.block_error`: an ISA the target does not have) has no cost and an
error instead; a search that evaluates it has wasted an evaluation.

`enumerate_costs` runs the whole space at once (the batched simulator), which is how
the true optimum of a (task, CPU) pair is known; `Objective` evaluates on demand for
the command line.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
from pathlib import Path

import jax
import numpy as np

from diffsim.search.codegen import lower_many
from diffsim.search.space import Task

ITERATIONS = 100


def cache_dir() -> Path:
  """Where enumerations are cached: `$DIFFSIM_SEARCH_CACHE` or ~/.cache/diffsim/search."""
  return Path(os.environ.get("DIFFSIM_SEARCH_CACHE",
                             Path.home() / ".cache" / "diffsim" / "search"))


def table_fingerprint(table) -> str:
  """A short hash of everything in a table that changes a simulated cycle count."""
  h = hashlib.sha256(table.layout.cpu.encode())
  h.update("\0".join(table.layout.keys).encode())
  for leaf in list(dataclasses.astuple(table.params)) + [table.structure.supported]:
    h.update(np.ascontiguousarray(np.asarray(leaf, np.float32)).tobytes())
  return h.hexdigest()[:16]


@dataclasses.dataclass(frozen=True)
class Costs:
  """One (task, CPU) pair, exhaustively: C configurations in `task.configs` order."""

  cost: np.ndarray  # [C] float64: cycles per flop; nan where invalid
  errors: tuple  # [C] str | None: why a configuration has no cost

  @property
  def valid(self) -> np.ndarray:
    return np.isfinite(self.cost)

  @property
  def optimum(self) -> float:
    return float(np.nanmin(self.cost))


def static_errors(task: Task) -> list[str | None]:
  return [task.static_error(c) for c in task.configs]


def _simulate(table, task: Task, ids) -> tuple[np.ndarray, list]:
  from diffsim.sim import simulate_blocks

  blocks = lower_many(task, [task.configs[i] for i in ids])
  preds = simulate_blocks(table, blocks, iterations=ITERATIONS, throughput="steady")
  cost = np.full(len(ids), np.nan)
  errs: list = [None] * len(ids)
  for n, (i, p) in enumerate(zip(ids, preds)):
    if p.cycles is None:
      errs[n] = f"target lacks it: {p.error}" if "not in the" in (p.error or "") else p.error
    else:
      cost[n] = p.cycles / 100.0 / task.useful_ops(task.configs[i])
  return cost, errs


def enumerate_costs(table, task: Task, *, cache: bool = True) -> Costs:
  """The cost of every configuration of `task` on `table` (cached on disk by content).

  Simulated as a one-table `enumerate_costs_stack`: one program at the task's longest
  length, rather than one per length bucket, since compiling dominates.
  """
  from diffsim.sim import hosts

  hit = _read(cache_dir() / f"{task.name}-{table_fingerprint(table)}.json", task)
  if cache and hosts.agree(hit is not None):
    return hit
  stacked = jax.tree.map(lambda x: np.asarray(x)[None], table.params)
  return enumerate_costs_stack(table, stacked, task, cache=cache)[0]


def enumerate_costs_stack(base, stacked, task: Task, *, cache: bool = True) -> list[Costs]:
  """`enumerate_costs` for many tables of one layout at once (`simulate_sweep`).

  Args:
    base: the table whose layout and structure every parameter set shares.
    stacked: Params with a leading axis P (`diffsim.params.sample.sample_params`).
    task: the task.

  Returns:
    P Costs, one per parameter set; each is cached under its own table's fingerprint,
    so `enumerate_costs(table_at(base, stacked, i), task)` finds it later.

  All blocks are encoded at one length (the task's longest bucket) so that a sweep
  compiles one program per task rather than one per bucket: compiling dominates.
  """
  from diffsim.isa.encode import BUCKETS
  from diffsim.params.sample import table_at
  from diffsim.sim import encode, hosts, simulate_sweep, status
  from diffsim.sim.blocks import block_error

  P = int(np.shape(stacked.dispatch_width)[0])
  tables = [table_at(base, stacked, i) for i in range(P)]
  paths = [cache_dir() / f"{task.name}-{table_fingerprint(t)}.json" for t in tables]
  if cache:
    hits = [_read(p, task) for p in paths]
    # (a multi-process run simulates unless every process has every table cached)
    if hosts.agree(all(h is not None for h in hits)):
      return hits
  errors = static_errors(task)
  ids = [i for i, e in enumerate(errors) if e is None]
  blocks = lower_many(task, [task.configs[i] for i in ids])
  run = []
  for i, b in zip(ids, blocks):
    err = block_error(base, b)
    if err:
      errors[i] = f"target lacks it: {err}" if "not in the" in err else err
    else:
      run.append((i, b))
  cost = np.full((P, task.size), np.nan)
  codes = np.zeros((P, task.size), np.int32)  # status of each run
  if run:
    L = next(x for x in BUCKETS if max(len(b.instrs) for _, b in run) <= x)
    batch = encode(base, [b for _, b in run], length=L)
    c1, s1 = simulate_sweep(base, batch, params=stacked, iterations=ITERATIONS, throw=False)
    c2, s2 = simulate_sweep(base, batch, params=stacked, iterations=2 * ITERATIONS,
                            throw=False)
    ops = np.array([task.useful_ops(task.configs[i]) for i, _ in run], np.float64)
    steady = (np.asarray(c2, np.float64) - np.asarray(c1, np.float64)) / ITERATIONS
    codes[:, [i for i, _ in run]] = s1 | s2
    cost[:, [i for i, _ in run]] = np.where((s1 | s2) != 0, np.nan, steady / ops)
  out = []
  for p in range(P):
    errs = list(errors)
    for i, _ in run:
      if codes[p, i]:
        errs[i] = status.message(codes[p, i])
    out.append(Costs(cost[p], tuple(errs)))
    if cache:
      _write(paths[p], tables[p], task, out[-1])
  return out


def _read(path: Path, task: Task) -> Costs | None:
  """A cached enumeration of `task`, or None when there is none of the right size."""
  try:
    doc = json.loads(path.read_text())
  except (OSError, ValueError):
    return None
  if len(doc["cost"]) != task.size:
    return None
  return Costs(np.array([np.nan if c is None else c for c in doc["cost"]]),
               tuple(doc["errors"]))


def _write(path: Path, table, task: Task, costs: Costs) -> None:
  path.parent.mkdir(parents=True, exist_ok=True)
  tmp = path.with_suffix(f".{os.getpid()}.tmp")  # processes may share the folder
  tmp.write_text(json.dumps({
    "cpu": table.layout.cpu, "task": task.name,
    "cost": [None if not np.isfinite(c) else float(c) for c in costs.cost],
    "errors": list(costs.errors)}))
  tmp.replace(path)


class Logged:
  """An objective's log: `history` holds (config index, cost or nan) per evaluation."""

  history: list[tuple[int, float]]

  @property
  def evaluations(self) -> int:
    return len(self.history)

  @property
  def invalid(self) -> int:
    return sum(1 for _, c in self.history if not np.isfinite(c))


class Objective(Logged):
  """Evaluates configurations on demand and counts what each evaluation cost.

  Either simulates (`table` given) or looks up a precomputed `Costs` (the benchmark:
  the same numbers, without simulating each run again).
  """

  def __init__(self, task: Task, *, table=None, costs: Costs | None = None):
    if (table is None) == (costs is None):
      raise ValueError("give exactly one of table and costs")
    self.task, self.table, self.costs = task, table, costs
    self.history: list[tuple[int, float]] = []  # (config index, cost or nan)
    self.errors: dict[int, str] = {}
    self._static = None

  def __call__(self, indices) -> np.ndarray:
    """Costs of the configurations at `indices` (nan: invalid); each call is logged."""
    indices = [int(i) for i in indices]
    if self.costs is not None:
      out = self.costs.cost[indices]
      for i in indices:
        if self.costs.errors[i]:
          self.errors[i] = self.costs.errors[i]
    else:
      out = np.full(len(indices), np.nan)
      todo = []
      for n, i in enumerate(indices):
        err = self.task.static_error(self.task.configs[i])
        if err:
          self.errors[i] = err
        else:
          todo.append(n)
      if todo:
        cost, errs = _simulate(self.table, self.task, [indices[n] for n in todo])
        for n, c, e in zip(todo, cost, errs):
          out[n] = c
          if e:
            self.errors[indices[n]] = e
    self.history += list(zip(indices, out.tolist()))
    return out

