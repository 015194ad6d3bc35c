"""Search methods on real enumerations (the simulator's own costs)."""

import numpy as np
import pytest

from diffsim.params.sample import sample_params
from diffsim.params.table import load_table
from diffsim.search.blueprint import blueprint
from diffsim.search.cpus import TrainingSet
from diffsim.search.evaluate import Objective, enumerate_costs_stack
from diffsim.search.glimpse import JointPrior, meta_train, near_optimal, validity_votes
from diffsim.search.space import TASKS
from diffsim.search.trials import run_trial


@pytest.fixture(scope="module")
def axpy_haswell(tmp_path_factory):
  import os

  os.environ["DIFFSIM_SEARCH_CACHE"] = str(tmp_path_factory.mktemp("enum"))
  base = load_table("haswell")
  import jax

  stacked = jax.tree.map(lambda x: np.asarray(x)[None], base.params)
  return enumerate_costs_stack(base, stacked, TASKS["axpy"])[0]


def test_enumeration_marks_the_missing_isa(axpy_haswell):
  task = TASKS["axpy"]
  for c, cost, err in zip(task.configs, axpy_haswell.cost, axpy_haswell.errors):
    if c[0] == "avx512" and task.static_error(c) is None:
      assert np.isnan(cost) and "target lacks it" in err
    if task.static_error(c) is None and c[0] != "avx512":
      assert np.isfinite(cost) and cost > 0 and err is None


def test_random_search_reaches_the_optimum_with_the_whole_space(axpy_haswell):
  task = TASKS["axpy"]
  t = run_trial("random", task, axpy_haswell, budget=task.size, seed=0)
  assert t.reached and 1 <= t.evaluations <= task.size
  assert t.curve[t.evaluations - 1] <= 1.02
  # Waste is counted among the evaluations made before the hit.
  assert 0 <= t.invalid < t.evaluations


@pytest.mark.parametrize("method", ["autotvm", "bo"])
def test_model_based_baselines_run_and_keep_count(axpy_haswell, method):
  task = TASKS["axpy"]
  t = run_trial(method, task, axpy_haswell, budget=12, seed=0)
  assert 1 <= t.evaluations <= 12 and len(t.curve) <= 12
  curve = np.array(t.curve)
  assert (np.diff(curve[np.isfinite(curve)]) <= 0).all()  # best-so-far never worsens
  assert t.reached == (curve.min() <= 1.02)


def test_objective_counts_invalid_evaluations(axpy_haswell):
  task = TASKS["axpy"]
  obj = Objective(task, costs=axpy_haswell)
  bad = [i for i, c in enumerate(axpy_haswell.cost) if np.isnan(c)][:3]
  good = [i for i, c in enumerate(axpy_haswell.cost) if np.isfinite(c)][:2]
  obj(bad + good)
  assert obj.evaluations == 5 and obj.invalid == 3 and set(obj.errors) == set(bad)


@pytest.mark.slow
def test_glimpse_beats_random_on_held_out_sampled_cpus():
  """Meta-train on 6 tables around haswell, test on 2 others: Glimpse needs no more
  evaluations than random search on average, and wastes fewer on invalid ones."""
  task = TASKS["dot"]
  base = load_table("haswell")
  stacked = sample_params(base, 8, seed=4)
  costs = enumerate_costs_stack(base, stacked, task)
  import jax

  from diffsim.params.sample import table_at
  bps = [blueprint(table_at(base, stacked, i)) for i in range(8)]
  training = TrainingSet(np.stack(bps[:6]), np.stack([c.cost for c in costs[:6]]),
                         ("haswell",) * 6, None)
  models = meta_train(task, training, steps=600)
  g, r = [], []
  for i in (6, 7):
    votes = validity_votes(models, task, bps[i]).mean(0)
    assert ((votes > 0.5) == costs[i].valid).mean() > 0.9
    g += [run_trial("glimpse", task, costs[i], budget=100, seed=s, bp=bps[i], models=models)
          for s in range(2)]
    r += [run_trial("random", task, costs[i], budget=100, seed=s) for s in range(2)]
  assert np.mean([t.evaluations for t in g]) <= np.mean([t.evaluations for t in r])
  assert np.mean([t.invalid for t in g]) < np.mean([t.invalid for t in r])
  del jax


def test_transfer_control_follows_the_training_ranking(axpy_haswell):
  task = TASKS["axpy"]
  # Trained on the target itself, the control's first pick is the optimum.
  t = run_trial("transfer", task, axpy_haswell, budget=5, seed=0,
                training_costs=axpy_haswell.cost[None])
  assert t.reached and t.evaluations == 1 and t.invalid == 0
  # Trained on a CPU with the opposite ranking, it reaches it last among valid ones.
  flipped = np.where(np.isfinite(axpy_haswell.cost), 1.0 / axpy_haswell.cost, np.nan)
  t = run_trial("transfer", task, axpy_haswell, budget=task.size, seed=0,
                training_costs=flipped[None])
  assert t.evaluations >= int(axpy_haswell.valid.sum()) - 5


@pytest.mark.slow  # ~70 s of compilation on 2 cores; the CLI tests take the same path
def test_simulating_on_demand_agrees_with_the_enumeration(axpy_haswell):
  # Objective(table=...) simulates per bucket (the CLI's path); the enumeration runs one
  # sweep at the longest length. The two must give the same costs and the same failures.
  task = TASKS["axpy"]
  rng = np.random.default_rng(0)
  ids = rng.choice(task.size, 16, replace=False)
  obj = Objective(task, table=load_table("haswell"))
  got = obj(ids)
  want = axpy_haswell.cost[ids]
  assert np.array_equal(np.isnan(got), np.isnan(want))
  np.testing.assert_allclose(got[~np.isnan(got)], want[~np.isnan(want)], rtol=1e-6)


def test_joint_prior_reads_the_nearest_blueprints(axpy_haswell):
  # Two "CPUs" far apart in Blueprint space with opposite rankings: a new CPU next to
  # the first gets the first's near-optimal configurations, and vice versa.
  cost = axpy_haswell.cost
  flipped = np.where(np.isfinite(cost), 1.0 / cost, np.nan)
  costs = np.stack([cost, cost * 1.01, flipped, flipped * 0.99])
  bps = np.array([[0.0, 0.0], [0.1, 0.0], [5.0, 5.0], [5.1, 5.0]])
  near = near_optimal(costs)
  for metric in (False, True):
    prior = JointPrior.fit(bps, costs, metric=metric)
    scale = 1.0 if prior.scales is None else float(np.sqrt(prior.scales.min()))
    assert prior.bandwidth / scale < 5.0  # the leave-one-out siblings say: stay local
    for bp, want in (([0.05, 0.0], near[0]), ([5.05, 5.0], near[2])):
      lp = prior.log_probs(np.array(bp))
      assert int(np.argmax(lp)) == int(np.argmax(want))
      assert np.isclose(np.exp(lp).sum(), 1.0, atol=1e-4)
  # Leaving a CPU out drops its own weight entirely.
  alone = JointPrior(bps[:2], near[:2], 1.0)
  np.testing.assert_allclose(np.exp(alone.log_probs(bps[0], exclude=0)),
                             (1 - alone.eps) * near[1] + alone.eps / len(cost), rtol=1e-5)


def test_learned_metric_finds_the_entry_that_moves_the_optimum(axpy_haswell):
  # Blueprint entry 0 tells two base CPUs apart (0 or 1) and does not matter; entry 1
  # (0 or 0.3: a variant, say a narrower dispatch) decides which ranking holds. A new
  # base between the two, with or without the variant, has the optimum the variant
  # says: the learned metric weighs entry 1 up and entry 0 down.
  cost = axpy_haswell.cost
  flipped = np.where(np.isfinite(cost), 1.0 / cost, np.nan)
  bps, costs = [], []
  for base in (0.0, 1.0):
    for variant in (0.0, 0.3):
      for jitter in (0.0, 0.1, 0.2):
        bps.append([base + jitter, variant])
        costs.append(flipped * (1 + jitter) if variant else cost * (1 + jitter))
  bps, costs = np.array(bps), np.stack(costs)
  families = [b for b in (0, 1) for _ in range(6)]  # each base with its variant: a family
  for prior in (JointPrior.fit(bps, costs, metric=True),
                JointPrior.fit(bps, costs, families=families)):
    assert prior.scales[1] > prior.scales[0]
    q_plain, q_variant = near_optimal(cost[None])[0], near_optimal(flipped[None])[0]
    lp = prior.log_probs(np.array([0.6, 0.3]))
    assert q_variant @ lp > q_plain @ lp + 1.0  # the variant's near-optimal ones, by far
    lp = prior.log_probs(np.array([0.6, 0.0]))
    assert q_plain @ lp > q_variant @ lp + 1.0
