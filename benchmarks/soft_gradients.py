"""Soft mode over the corpus: how close soft is to hard, and that gradients stay finite.

1. Gap: on a seeded sample of BHive blocks, the mean relative difference between the
   soft replay's Total Cycles and the hard simulator's, per temperature (the replay
   is exact at tau = 0 by construction; the gap measures the relaxation).
2. Finite gradients: every block of the corpus (or of the sample with --n), with the
   znver3 table, through the fitting loss at each temperature, plain and straight-
   through: counts blocks whose gradient has a NaN or inf in any parameter.

  python benchmarks/soft_gradients.py [--n 2000] [--all] [--cpu znver3]
"""

from __future__ import annotations

import argparse
import functools
import time

import jax
import jax.numpy as jnp
import numpy as np

from diffsim.cli import tune_xla
from diffsim.data import corpus_hexes
from diffsim.fit import learn
from diffsim.fit.batches import minibatches
from diffsim.params.table import load_table
from diffsim.sim import soft
from diffsim.sim.kernels import window_for

TAUS = (0.0, 0.03, 0.1, 0.3, 1.0, 3.0)
GRAD_TAUS = (0.0, 0.1, 1.0)  # (tau = 0 is the same plain and straight through)


@functools.partial(jax.jit, static_argnames=("layout", "tau", "straight_through"))
def finite_gradient(params, structure, batch, traces, iterations, y, weight, *, layout, tau,
                    straight_through):
  """[] bool: the gradient of the minibatch's summed loss is finite everywhere. A NaN or
  inf in any one block's gradient survives the sum, so this checks every block at the
  cost of one backward pass; `finite_per_block` then names the culprits."""
  def loss(p):
    steady = jax.vmap(lambda b, t, i: soft.block_throughputs(
        p, structure, layout, b, t, i, tau, straight_through)[1])(batch, traces, iterations)
    return jnp.sum(jnp.abs(steady - y) / y * weight)
  g = jax.grad(loss)(params)
  return jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(g)]))


@functools.partial(jax.jit, static_argnames=("layout", "tau", "straight_through"))
def finite_per_block(params, structure, batch, traces, iterations, y, *, layout, tau,
                     straight_through):
  """[B] bool: each block's own loss gradient is finite in every parameter."""
  def one(block, trace, its, label):
    def loss(p):
      steady = soft.block_throughputs(p, structure, layout, block, trace, its, tau,
                                      straight_through)[1]
      return jnp.abs(steady - label) / label
    g = jax.grad(loss)(params)
    return jnp.all(jnp.stack([jnp.all(jnp.isfinite(x)) for x in jax.tree.leaves(g)]))
  return jax.vmap(one)(batch, traces, iterations, y)


def corpus(n: int | None, seed: int = 0) -> list[str]:
  return corpus_hexes(n, seed)[0]


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--n", type=int, default=2000)
  ap.add_argument("--all", action="store_true", help="the whole corpus for the NaN check")
  ap.add_argument("--cpu", default="znver3")
  ap.add_argument("--batch-size", type=int, default=256)
  args = ap.parse_args()
  tune_xla()
  table = load_table(args.cpu)
  W = window_for(np.asarray(table.params.rob_size))
  hexes = corpus(None if args.all else args.n)
  t0 = time.time()
  mbs, skipped = minibatches(table, hexes, np.ones(len(hexes)), args.batch_size)
  print(f"{args.cpu}: {len(hexes)} blocks, {len(skipped)} not simulable, "
        f"{len(mbs)} minibatches ({time.time() - t0:.0f} s to decode and encode)")
  gap = {tau: [] for tau in TAUS}
  bad = {(tau, st): 0 for tau in GRAD_TAUS for st in (False, True)}
  n_blocks = 0
  t0 = time.time()
  for k, mb in enumerate(mbs):
    _, codes, traces = learn.record_local(table, table.params, mb, W)
    real = (mb.weight > 0) & (np.asarray(codes) == 0)
    n_blocks += int(real.sum())
    hard = np.asarray(learn.hard_steady(traces, mb.batch.length, mb.iterations))
    for tau in (TAUS if len(gap[0.0]) < args.n else ()):
      pred = np.asarray(learn.soft_predictions(table.params, table.structure, table.layout,
                                               mb.batch, traces, mb.iterations, tau, False))
      if len(gap[tau]) < args.n:
        ok = real & (hard > 0)
        gap[tau].extend((np.abs(pred - hard) / hard)[ok].tolist())
    y = np.where(hard > 0, hard, 1.0).astype(np.float32)
    for tau in GRAD_TAUS:
      for st in ((False,) if tau == 0 else (False, True)):
        kw = dict(layout=table.layout, tau=tau, straight_through=st)
        w = real.astype(np.float32)
        if bool(finite_gradient(table.params, table.structure, mb.batch, traces,
                                mb.iterations, y, w, **kw)):
          continue
        finite = np.asarray(finite_per_block(table.params, table.structure, mb.batch, traces,
                                             mb.iterations, y, **kw))
        culprits = [hexes[r] for r in mb.rows[real & ~finite]]
        bad[(tau, st)] += len(culprits)
        print(f"  non-finite gradient at tau={tau}, straight_through={st}: {culprits[:3]}")
    if (k + 1) % 20 == 0:
      print(f"  {k + 1}/{len(mbs)} minibatches, {time.time() - t0:.0f} s")
  print(f"\nsoft vs hard steady throughput, {min(args.n, len(gap[0.0]))} blocks "
        f"(relative gap; tau in cycles)")
  print(f"  {'tau':>6} {'mean gap':>10} {'p99 gap':>10} {'max gap':>10}")
  for tau in TAUS:
    g = np.asarray(gap[tau])
    print(f"  {tau:6.2f} {g.mean():10.2e} {np.quantile(g, 0.99):10.2e} {g.max():10.2e}")
  print(f"\nblocks with a NaN or inf anywhere in the gradient, of {n_blocks} "
        f"({time.time() - t0:.0f} s)")
  print(f"  {'tau':>6} {'plain':>8} {'straight-through':>17}")
  for tau in GRAD_TAUS:
    st = "(same)" if tau == 0 else bad[(tau, True)]
    print(f"  {tau:6.2f} {bad[(tau, False)]:8d} {st:>17}")


if __name__ == "__main__":
  main()
