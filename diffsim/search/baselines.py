"""The methods Glimpse is compared with; none of them sees the Blueprint.

- `random_search`: configurations in a random order.
- `autotvm_search`: AutoTVM's XGBTuner recipe with scikit-learn's
  HistGradientBoostingRegressor as the cost model: fit on what has been measured
  (relative throughput, 0 for a configuration that failed), simulated annealing over
  the knob grid on the model's predictions, the top unvisited points measured in
  batches of 8, with 5% random picks.
- `bo_search`: Bayesian optimisation with scikit-learn's GaussianProcessRegressor
  (Matern 5/2 plus white noise, hyperparameters fitted each step) on log cost and
  expected improvement over every unvisited configuration; a failed configuration is
  recorded at the worst cost seen so far.
All take the same (task, objective, budget, seed, target) and stop early at `target`.

`transfer_search` is a control, not a peer: it tries configurations in the order of
their mean rank on the training CPUs, which is what a prior learned from those CPUs
could do without reading the target's blueprint at all.
"""

from __future__ import annotations

import warnings

import numpy as np
from scipy.stats import norm

from diffsim.search.space import Task


def _run(objective, picks, target):
  """Evaluates `picks` one at a time; True once `target` is reached."""
  for i in picks:
    c = float(objective([i])[0])
    if target is not None and np.isfinite(c) and c <= target:
      return True
  return False


def _start(task: Task, objective, n: int, rng, target):
  """Evaluates `n` random configurations: (the seen mask, whether `target` was reached)."""
  seen = np.zeros(task.size, bool)
  first = rng.choice(task.size, size=n, replace=False)
  seen[first] = True
  return seen, _run(objective, first, target)


def _observed(objective):
  """(configuration indices, costs with nan where invalid) evaluated so far."""
  return (np.array([i for i, _ in objective.history]),
          np.array([c for _, c in objective.history]))


def _best(objective):
  costs = [(c, i) for i, c in objective.history if np.isfinite(c)]
  return min(costs) if costs else (np.inf, None)


def random_search(task: Task, objective, budget: int, *, seed: int = 0,
                  target: float | None = None) -> dict:
  order = np.random.default_rng(seed).permutation(task.size)[:budget]
  for i in order:
    if _run(objective, [i], target):
      break
  c, i = _best(objective)
  return {"best": i, "cost": c}


def _anneal(task: Task, score: np.ndarray, rng, *, chains: int = 64, steps: int = 100) -> list:
  """Simulated annealing on the knob grid maximising `score` [C]; visited points, best first.

  A move changes one knob to another of its values, as AutoTVM's SA does.
  """
  sizes = np.array([len(k.values) for k in task.knobs])
  strides = np.concatenate([np.cumprod(sizes[::-1])[::-1][1:], [1]])
  state = rng.integers(0, sizes, (chains, len(sizes)))
  cur = score[state @ strides]
  visited = {}
  for t in range(steps):
    temp = max(1.0 - t / steps, 1e-3) * (np.std(score) + 1e-9)
    cand = state.copy()
    knob = rng.integers(0, len(sizes), chains)
    cand[np.arange(chains), knob] = rng.integers(0, sizes[knob])
    new = score[cand @ strides]
    take = (new >= cur) | (rng.random(chains) < np.exp((new - cur) / temp))
    state[take], cur[take] = cand[take], new[take]
    for idx, s in zip(state @ strides, cur):
      visited[int(idx)] = float(s)
  return sorted(visited, key=lambda i: -visited[i])


def autotvm_search(task: Task, objective, budget: int, *, seed: int = 0,
                   target: float | None = None, batch: int = 8, epsilon: float = 0.05) -> dict:
  from sklearn.ensemble import HistGradientBoostingRegressor

  rng = np.random.default_rng(seed)
  X = task.features
  seen, done = _start(task, objective, min(batch, budget), rng, target)
  while not done and objective.evaluations < budget and not seen.all():
    ids, costs = _observed(objective)
    best = np.nanmin(costs) if np.isfinite(costs).any() else 1.0
    y = np.where(np.isfinite(costs), best / np.where(np.isfinite(costs), costs, 1.0), 0.0)
    model = HistGradientBoostingRegressor(max_iter=100, min_samples_leaf=2, learning_rate=0.1,
                                          random_state=seed)
    model.fit(X[ids], y)
    ranked = [i for i in _anneal(task, model.predict(X), rng) if not seen[i]]
    n = min(batch, budget - objective.evaluations)
    picks = []
    for _ in range(n):
      if rng.random() < epsilon or not ranked:
        free = np.flatnonzero(~seen)
        free = free[~np.isin(free, picks)]
        if not len(free):
          break
        picks.append(int(rng.choice(free)))
      else:
        picks.append(ranked.pop(0))
    picks = list(dict.fromkeys(picks))
    if not picks:
      break
    seen[picks] = True
    done = _run(objective, picks, target)
  c, i = _best(objective)
  return {"best": i, "cost": c}


def bo_search(task: Task, objective, budget: int, *, seed: int = 0,
              target: float | None = None, initial: int = 5) -> dict:
  from sklearn.exceptions import ConvergenceWarning
  from sklearn.gaussian_process import GaussianProcessRegressor
  from sklearn.gaussian_process.kernels import ConstantKernel, Matern, WhiteKernel

  rng = np.random.default_rng(seed)
  X = task.features
  seen, done = _start(task, objective, min(initial, budget), rng, target)
  while not done and objective.evaluations < budget and not seen.all():
    ids, costs = _observed(objective)
    if not np.isfinite(costs).any():  # nothing valid yet: keep sampling at random
      i = int(rng.choice(np.flatnonzero(~seen)))
    else:
      y = np.log(np.where(np.isfinite(costs), costs, np.nanmax(costs)))
      gp = GaussianProcessRegressor(
        ConstantKernel(1.0) * Matern(length_scale=1.0, nu=2.5) + WhiteKernel(1e-3),
        normalize_y=True, random_state=seed)
      with warnings.catch_warnings():
        warnings.simplefilter("ignore", ConvergenceWarning)
        gp.fit(X[ids], y)
      free = np.flatnonzero(~seen)
      mu, sd = gp.predict(X[free], return_std=True)
      sd = np.maximum(sd, 1e-9)
      gain = y.min() - mu
      ei = gain * norm.cdf(gain / sd) + sd * norm.pdf(gain / sd)
      i = int(free[np.argmax(ei)])
    seen[i] = True
    done = _run(objective, [i], target)
  c, i = _best(objective)
  return {"best": i, "cost": c}


def transfer_order(training_costs: np.ndarray) -> np.ndarray:
  """[C] configurations by their mean log(cost / optimum) over the training CPUs [T, C]
  (invalid ones count as e^10 times the optimum): what transfer evaluates, in order."""
  c = np.asarray(training_costs, np.float64)
  z = np.where(np.isfinite(c), np.log(c / np.nanmin(c, 1, keepdims=True)), 10.0)
  return np.argsort(z.mean(0), kind="stable")


def transfer_search(task: Task, objective, budget: int, *, training_costs: np.ndarray,
                    seed: int = 0, target: float | None = None) -> dict:
  """Configurations in `transfer_order`, blind to the target."""
  del seed  # deterministic
  _run(objective, transfer_order(training_costs)[:budget], target)
  c, i = _best(objective)
  return {"best": i, "cost": c}


def roofline_search(task: Task, objective, budget: int, *, roofline: np.ndarray,
                    seed: int = 0, target: float | None = None) -> dict:
  """Configurations by their roofline on the target [C] (`roofline.roofline`), ties in a
  seeded random order: the table's analytic reading alone, with no search."""
  tie = np.random.default_rng(seed).permutation(task.size)
  _run(objective, np.lexsort((tie, np.asarray(roofline)))[:budget], target)
  c, i = _best(objective)
  return {"best": i, "cost": c}


METHODS = {"random": random_search, "autotvm": autotvm_search, "bo": bo_search}
