"""The Glimpse models the package ships: present for every task, for the current spaces
and Blueprint, and written and read back whole."""

import dataclasses

import jax
import numpy as np
import pytest

from diffsim.search.blueprint import NAMES, blueprint
from diffsim.search.cpus import load_cpu
from diffsim.search.evaluate import Costs, Objective
from diffsim.search.glimpse import glimpse_search, load_models, save_models, validity_votes
from diffsim.search.roofline import roofline
from diffsim.search.space import TASKS


@pytest.mark.parametrize("name", sorted(TASKS))
def test_every_task_ships_models_for_its_current_space(name):
  models = load_models(TASKS[name])
  assert models is not None, (f"diffsim/search/pretrained lacks {name}'s models or they were "
                              "meta-trained on another space: "
                              "python benchmarks/search_eval.py --ship")
  assert models.roofline and models.joint.bps.shape[1] == len(NAMES)
  assert models.joint.dists.shape[1] == TASKS[name].size and len(models.validity) == 5


def test_saved_models_read_back_whole_and_only_for_their_task(tmp_path):
  dot, axpy = TASKS["dot"], TASKS["axpy"]
  models = load_models(dot)
  path = save_models(models, dot, tmp_path / "m.msgpack")
  again = load_models(dot, path)
  for field in ("prior", "acquisition", "validity"):
    a, b = getattr(models, field), getattr(again, field)
    assert all(np.array_equal(x, y) for x, y in zip(jax.tree.leaves(a), jax.tree.leaves(b)))
  assert dataclasses.asdict(models.joint).keys() == dataclasses.asdict(again.joint).keys()
  assert np.allclose(models.joint.log_probs(models.joint.bps[0]),
                     again.joint.log_probs(models.joint.bps[0]))
  assert load_models(axpy, path) is None  # another task's space


def test_the_roofline_decides_validity_whatever_the_ensemble_votes():
  # Models that use rooflines take validity from the target's roofline (the
  # configuration lowers and the table runs it): with an ensemble that accepts
  # everything, the search still evaluates every configuration with a finite roofline
  # before giving up, and never one with an infinite roofline.
  task = TASKS["gemm"]
  models = load_models(task)

  def accept_all(params):
    out = jax.tree.map(np.array, params)
    out["params"]["_MLP_0"]["Dense_2"]["bias"][:] = 100.0
    return out
  models = dataclasses.replace(models, validity=[accept_all(v) for v in models.validity])
  table = load_cpu("zen5/narrow")
  assert (validity_votes(models, task, blueprint(table)) > 0.5).all()
  roof = roofline(task, table)
  finite = np.isfinite(roof)
  cost = np.where(finite, 1.0 + np.arange(task.size), np.nan)
  obj = Objective(task, costs=Costs(cost, tuple(None if f else "invalid" for f in finite)))
  found = glimpse_search(task, blueprint(table), obj, task.size, models=models, roofline=roof)
  assert found["rejected"] == int((~finite).sum()) > 0
  assert obj.evaluations == int(finite.sum()) and obj.invalid == 0
