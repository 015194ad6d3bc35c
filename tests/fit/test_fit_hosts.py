"""Data-parallel fitting: a fit epoch in two local processes (loopback) gives the table
one process gives, to float rounding."""

import textwrap

import jax
import numpy as np

from diffsim.fit.batches import minibatches, share
from diffsim.params.table import load_table

# A fit of 1 epoch on 48 short measured blocks, 3 minibatches of 16, lr high enough to
# move many parameters; no validation set (the training blocks score each epoch).
SCRIPT = """
import sys
import numpy as np
import jax
from diffsim.data import load_csv, shipped
from diffsim.fit import FitConfig, fit
from diffsim.isa import decode_blocks
from diffsim.params.table import load_table
from diffsim.sim import hosts

hosts.initialize()  # from JAX's environment variables
ds = load_csv(shipped("zen5-small.csv"))
blocks = decode_blocks(list(ds.hex[:300]))
keep = [i for i, b in enumerate(blocks) if not isinstance(b, Exception) and len(b.instrs) <= 8]
r = fit(load_table("znver3"), ds.take(keep[:48]), None, sys.argv[1],
        FitConfig(epochs=1, batch_size=16, lr=1.0, seed=3), progress=False, log=print)
np.savez(sys.argv[1] + f"/p{hosts.index()}.npz",
         *[np.asarray(x) for x in jax.tree.leaves(r.last)],
         history=np.array([[h["val_soft"], h["val_hard"]] for h in r.history]))
"""


def test_two_processes_fit_the_table_one_process_fits(tmp_path, processes):
  start, wait = processes
  script = tmp_path / "fit.py"
  script.write_text(textwrap.dedent(SCRIPT))
  two, one = tmp_path / "two", tmp_path / "one"
  handles = start([str(script), str(two)], 2)
  wait([start([str(script), str(one)], 1)[0]])  # (a run of one process, meanwhile)
  wait(handles)
  ref = np.load(one / "p0.npz")
  init = [np.asarray(x) for x in jax.tree.leaves(load_table("znver3").params)]
  moved = sum(int(np.sum(ref[f"arr_{i}"] != x)) for i, x in enumerate(init))
  assert moved > 20  # the epoch changed the table
  for p in (0, 1):
    got = np.load(two / f"p{p}.npz")
    for k in ref.files:
      # float32 sums taken in another order (per process, then across): rounding only.
      np.testing.assert_allclose(got[k], ref[k], rtol=1e-5, atol=1e-6, err_msg=k)
  # Both processes hold the same table, bit for bit (the same sums in the same order).
  a, b = np.load(two / "p0.npz"), np.load(two / "p1.npz")
  assert all(np.array_equal(a[k], b[k]) for k in a.files)
  assert (two / "history.json").exists() and (two / "checkpoints").exists()


def test_parts_of_a_minibatch_cover_it_once():
  import csv

  from diffsim.data import shipped

  with open(shipped("zen5-small.csv")) as f:
    rows = list(csv.reader(f))[1:40]
  table = load_table("znver3")
  mb = minibatches(table, [r[0] for r in rows], np.array([float(r[1]) for r in rows]), 16)[0][0]
  parts = [share(mb, 3, p) for p in range(3)]
  assert all(len(sub.weight) == 6 for sub, _ in parts)
  pos = np.concatenate([p for _, p in parts])
  assert sorted(pos[pos >= 0].tolist()) == list(range(16))
  assert sum(float(sub.weight.sum()) for sub, _ in parts) == float(mb.weight.sum())
  for sub, p in parts:
    np.testing.assert_array_equal(sub.y[p >= 0], mb.y[p[p >= 0]])
    assert (sub.weight[p < 0] == 0).all()
