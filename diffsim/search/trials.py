"""One search run against a known optimum: how many evaluations it took to get close.

Shared by `benchmarks/search_eval.py`, the notebook and the tests. A trial looks costs
up in a precomputed exhaustive enumeration (`evaluate.Costs`), so the same numbers the
simulator gives cost nothing to evaluate again; it stops as soon as a configuration
within `tolerance` of the optimum has been evaluated.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from diffsim.search import ALL_METHODS
from diffsim.search.baselines import METHODS, roofline_search, transfer_search
from diffsim.search.evaluate import Costs, Objective
from diffsim.search.glimpse import glimpse_search
from diffsim.search.space import Task


@dataclasses.dataclass(frozen=True)
class Trial:
  method: str
  seed: int
  evaluations: int  # evaluations until within tolerance (the budget if never)
  reached: bool
  invalid: int  # invalid configurations evaluated on the way
  curve: tuple  # best cost / optimum after each evaluation (inf before any valid one)


def run_method(method: str, task: Task, objective, budget: int, *, seed: int,
               target: float | None = None, bp=None, models=None, training_costs=None,
               roofline=None) -> None:
  """Runs `method` through `objective` for `budget` evaluations, or until `target`.

  `bp`, `models` and `roofline` [C] (the target's `roofline.roofline`) serve "glimpse";
  `training_costs` [T, C] serves the "transfer" control (`baselines.transfer_search`),
  `roofline` the "roofline" one (`baselines.roofline_search`).
  """
  if method == "glimpse":
    glimpse_search(task, bp, objective, budget, models=models, seed=seed, target=target,
                   roofline=roofline)
  elif method == "roofline":
    roofline_search(task, objective, budget, roofline=roofline, seed=seed, target=target)
  elif method == "transfer":
    transfer_search(task, objective, budget, training_costs=training_costs, seed=seed,
                    target=target)
  elif method in METHODS:
    METHODS[method](task, objective, budget, seed=seed, target=target)
  else:
    raise ValueError(f"unknown method {method!r}: choose from {', '.join(ALL_METHODS)}, "
                     "transfer, roofline")


def run_trial(method: str, task: Task, costs: Costs, *, budget: int, seed: int,
              tolerance: float = 0.02, **inputs) -> Trial:
  """Runs `method` on `task` with costs from `costs`, stopping within `tolerance` of the
  optimum; see the module docstring. `inputs`: what `run_method` passes on."""
  objective = Objective(task, costs=costs)
  run_method(method, task, objective, budget, seed=seed,
             target=costs.optimum * (1 + tolerance), **inputs)
  c = np.array([c for _, c in objective.history[:budget]])
  best = np.minimum.accumulate(np.where(np.isfinite(c), c, np.inf)) / costs.optimum
  hit = np.flatnonzero(best <= 1 + tolerance)
  n = int(hit[0]) + 1 if len(hit) else budget
  return Trial(method, seed, n, bool(len(hit)), int((~np.isfinite(c[:n])).sum()),
               tuple(best.tolist()))
