"""Glimpse's search quality in the default suite, with the models `diffsim search` ships.

The slow test in test_search.py meta-trains anew; this one guards what ships, on two
CPUs never meta-trained on (`search.cpus.heldout_groups`): skylake dispatching 2 wide
(only 2 of the 63 valid axpy configurations are within 2% of the optimum) and skylake
with a quarter of its ROB, schedulers and queues (where Glimpse needs its roofline:
without it, 6 evaluations). One sweep simulates both (about 15 s on 2 cores).
Deterministic: the costs are simulated, and the searches are seeded.
"""

from __future__ import annotations

import jax
import numpy as np
import pytest

from diffsim.params.table import load_table
from diffsim.search.blueprint import blueprint
from diffsim.search.cpus import load_cpu
from diffsim.search.evaluate import enumerate_costs_stack
from diffsim.search.glimpse import load_models
from diffsim.search.roofline import roofline
from diffsim.search.space import TASKS
from diffsim.search.trials import run_trial

# Held-out CPU -> most evaluations Glimpse may take to within 2% of the simulated
# optimum, on every seed (the shipped models take 1 and 3; random search 44 and 26
# on average over 10 seeds; benchmarks/RESULTS.md, "Hardware-prior search").
MOST = {"skylake/narrow": 2, "skylake/small-rob": 4}


@pytest.fixture(scope="module")
def axpy_costs(tmp_path_factory) -> dict:
  """{held-out CPU: every axpy configuration's simulated cost on it}."""
  tables = [load_cpu(name) for name in MOST]
  stacked = jax.tree.map(lambda *x: np.stack([np.asarray(v) for v in x]),
                         *[t.params for t in tables])
  with pytest.MonkeyPatch.context() as mp:
    mp.setenv("DIFFSIM_SEARCH_CACHE", str(tmp_path_factory.mktemp("enum")))
    costs = enumerate_costs_stack(load_table("skylake"), stacked, TASKS["axpy"])
  return dict(zip(MOST, costs))


@pytest.mark.parametrize("cpu", sorted(MOST))
def test_glimpse_reaches_the_optimum_in_a_few_evaluations_where_random_needs_many(
    cpu, axpy_costs):
  task, costs, table = TASKS["axpy"], axpy_costs[cpu], load_cpu(cpu)
  models = load_models(task)
  assert models is not None, "the shipped models are stale: test_glimpse_models.py says why"
  bp, roof = blueprint(table), roofline(task, table)
  for seed in range(3):
    t = run_trial("glimpse", task, costs, budget=100, seed=seed, bp=bp, models=models,
                  roofline=roof)
    assert t.reached and t.evaluations <= MOST[cpu] and t.invalid == 0, (seed, t.evaluations)
  # The target is no easy one: blind search needs several times as many.
  random = [run_trial("random", task, costs, budget=task.size, seed=s).evaluations
            for s in range(10)]
  assert np.mean(random) > 5 * MOST[cpu], random
