"""The Glimpse models the package ships: present for every task, for the current spaces
and Blueprint, and written and read back whole."""

import dataclasses

import jax
import numpy as np
import pytest

from diffsim.search.blueprint import NAMES
from diffsim.search.glimpse import load_models, save_models
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
