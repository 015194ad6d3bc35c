"""CPU variants that change what binds, and the optimum they move."""

import jax
import numpy as np
import pytest

from diffsim.params.table import load_table
from diffsim.search.blueprint import NAMES, blueprint
from diffsim.search.cpus import VARIANTS, load_cpu, training_groups, variant_params


def _named(table):
  return dict(zip(NAMES, blueprint(table)))


def test_variants_change_what_they_say_and_nothing_else():
  hsw = load_table("haswell")
  idx = hsw.layout.index
  base = jax.tree.map(np.asarray, hsw.params)
  fma, load, add = idx["VFMADD231PSYr"], idx["MOV64rm"], idx["ADD64ri8"]
  p = variant_params(hsw, "fp-half")
  np.testing.assert_array_equal(p.res_cycles[fma], 2 * base.res_cycles[fma])
  np.testing.assert_array_equal(p.res_cycles[add], base.res_cycles[add])  # integer add: same
  p = variant_params(hsw, "load-half")
  assert (p.res_cycles[load] == 2 * base.res_cycles[load]).all()
  p = variant_params(hsw, "split256")
  y, x = idx["VMOVUPSYrm"], idx["MOVUPSrm"]
  assert p.uops[y] == 2 * base.uops[y] and p.uops[x] == base.uops[x]
  assert variant_params(hsw, "fma-lat2x").latency[fma, 0] == 2 * base.latency[fma, 0]
  assert float(variant_params(hsw, "narrow").dispatch_width) == 2.0
  assert float(variant_params(hsw, "small-rob").rob_size) == float(base.rob_size) / 4
  for kind in VARIANTS:  # integral, as llvm-mca's own tables
    for leaf in jax.tree.leaves(variant_params(hsw, kind)):
      np.testing.assert_array_equal(leaf, np.round(leaf))
  with pytest.raises(ValueError, match="unknown variant"):
    variant_params(hsw, "quantum")


def test_blueprint_sees_each_variant():
  hsw = _named(load_table("haswell"))
  assert _named(load_cpu("haswell/fp-half"))["fma256.rthroughput"] == 2 * hsw["fma256.rthroughput"]
  assert _named(load_cpu("haswell/narrow"))["dispatch_width"] == 2 / 8
  assert _named(load_cpu("haswell/fma-lat2x"))["fma256.latency"] == 2 * hsw["fma256.latency"]
  assert _named(load_cpu("haswell/split256"))["load256.uops"] == 2 * hsw["load256.uops"]


def test_training_groups_stack_variants_with_their_base():
  g = training_groups(1)[0]
  assert g.names[:1 + len(VARIANTS)] == ("haswell", *(f"haswell/{k}" for k in VARIANTS))
  assert len(g.names) == 2 + len(VARIANTS)
  assert np.shape(g.stacked.dispatch_width) == (len(g.names),)


@pytest.mark.slow  # one sweep of 3 tables over axpy's space: about a minute on 2 cores
def test_a_variant_moves_the_optimum_away_from_transfers_pick(tmp_path, monkeypatch):
  """skylake with no 256-bit datapath: the optimum is not where skylake and haswell put
  it, so a search that reuses their ranking (transfer) misses it with its first pick."""
  monkeypatch.setenv("DIFFSIM_SEARCH_CACHE", str(tmp_path))
  from diffsim.search.evaluate import enumerate_costs_stack
  from diffsim.search.space import TASKS
  from diffsim.search.trials import run_trial

  task = TASKS["axpy"]
  sky = load_table("skylake")
  stacked = jax.tree.map(lambda *x: np.stack(x), jax.tree.map(np.asarray, sky.params),
                         variant_params(sky, "split256"))
  base, split = enumerate_costs_stack(sky, stacked, task)
  hsw = enumerate_costs_stack(load_table("haswell"), jax.tree.map(
      lambda x: np.asarray(x)[None], load_table("haswell").params), task)[0]
  assert np.nanargmin(base.cost) != np.nanargmin(split.cost)
  training = np.stack([base.cost, hsw.cost])
  t = run_trial("transfer", task, split, budget=task.size, seed=0, training_costs=training)
  assert t.evaluations > 1  # its first pick is more than 2% off
  first = run_trial("transfer", task, base, budget=task.size, seed=0, training_costs=training)
  assert first.evaluations == 1
