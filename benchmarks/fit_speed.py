"""How long does one fitting epoch over tens of thousands of measured blocks take?

On N measured Zen 5 blocks (default 50,000 of `zen5-measured.csv`; the shipped 3,000
without ../shared), in one run on this machine:
  - decoding (llvm-mc) and encoding, once per fit;
  - one exact evaluation pass: steady-state throughput of every block (100 and 200
    iterations) with the `zen5` table, the unit of the exact search's judgement;
  - one epoch of the exact search (`diffsim.fit.exact.refine`, one round of every move
    kind, each opcode judged on at most `--cap` of its blocks);
  - the gradient fit (`diffsim.fit.learn.fit`, soft mode, Adam) on `--grad-n` of the
    blocks, a tenth of them held out for validation as `diffsim fit` does: two epochs,
    the first of which compiles every length bucket's step; the second epoch's time,
    scaled to N, is the steady cost of an epoch;
  - the peer: llvm-mca 14 (znver3) on the same blocks, 100 and 200 iterations, with as
    many processes as cores; the ratios are against it.

  python benchmarks/fit_speed.py [--n 50000] [--grad-n 50000] [--cap 40] [--skip-search]

The issue's bar: one epoch over 50k blocks in under 5 minutes on 2 cores.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time

import numpy as np

from diffsim.cli import mca_predict, tune_xla
from diffsim.cli.common import enable_compile_cache
from diffsim.data import load_csv, shared_data_dir, shipped


def _blocks(n: int):
  shared = shared_data_dir()
  path = (shared / "measured" / "zen5-measured.csv") if shared else shipped("zen5-small.csv")
  ds = load_csv(path)
  pick = np.random.default_rng(0).permutation(len(ds))[:n]
  return ds.take(np.sort(pick)), path


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--n", type=int, default=50_000)
  ap.add_argument("--grad-n", type=int, default=50_000)
  ap.add_argument("--cap", type=int, default=40)
  ap.add_argument("--skip-search", action="store_true")
  ap.add_argument("--skip-mca", action="store_true")
  args = ap.parse_args()
  tune_xla()
  enable_compile_cache()
  from diffsim.fit.exact import MOVES, Judge, refine
  from diffsim.fit.learn import FitConfig, fit
  from diffsim.isa import decode_blocks
  from diffsim.params.table import load_table

  ds, path = _blocks(args.n)
  n = len(ds)
  print(f"{n} blocks of {path.name}, {os.cpu_count()} cores")
  rows = []

  def record(name: str, seconds: float, blocks: int) -> None:
    rows.append((name, seconds, blocks))
    print(f"  {name}: {seconds:.1f} s", flush=True)  # the whole run takes minutes

  t = time.time()
  blocks = decode_blocks(list(ds.hex), progress=False)
  record("decode (llvm-mc)", time.time() - t, n)
  table = load_table("zen5")
  t = time.time()
  judge = Judge(table, blocks)
  record("encode", time.time() - t, n)
  ids = np.arange(n)
  judge(table, ids[:min(n, 2048)])  # compile the shapes of a sample
  t = time.time()
  pred = judge(table, ids)
  record("exact evaluation pass (steady, zen5)", time.time() - t, n)
  if not args.skip_mca:
    t = time.time()
    mca_predict(blocks, "znver3", 100, "steady", progress=False)
    record("llvm-mca 14 znver3 (steady)", time.time() - t, n)
  if not args.skip_search:
    t = time.time()
    with tempfile.TemporaryDirectory() as tmp:
      refine(table, blocks, ds.y, MOVES, rounds=1, cap=args.cap, state_dir=tmp,
             log=lambda s: print("  " + s, flush=True))
    record("exact search epoch (one round, every move kind)", time.time() - t, n)
  # The gradient fit as `diffsim fit` runs it: a tenth held out for validation, two
  # epochs; the first compiles each length bucket's step, the second is the steady cost.
  m = min(args.grad_n, n)
  cut = m - m // 10
  train, val = ds.take(np.arange(cut)), ds.take(np.arange(cut, m))
  with tempfile.TemporaryDirectory() as tmp:
    t = time.time()
    res = fit(table, train, val, tmp, FitConfig(epochs=2, patience=99), progress=False,
              log=lambda s: None)
    total = time.time() - t
  first, steady = res.history[-2], res.history[-1]
  setup = total - first["seconds"] - steady["seconds"]
  record("gradient fit set-up: minibatches, first validation (compiles)", setup, m)
  record("gradient epoch 1 (compiles the steps)", first["seconds"], cut)
  record(f"gradient epoch 2: steps over {cut} blocks", steady["steps_seconds"], cut)
  record(f"gradient epoch 2: validation on {m - cut} blocks",
         steady["seconds"] - steady["steps_seconds"], m - cut)
  record("gradient epoch 2 in all (steps and validation)"
         + (f", scaled to {n} blocks" if m < n else ""), steady["seconds"] * n / m, n)
  peer = next((s for name, s, _ in rows if name.startswith("llvm-mca")), None)
  print("\n| step | seconds | blocks | blocks/s | x llvm-mca time |")
  print("|---|---|---|---|---|")
  for name, s, k in rows:
    ratio = f"{s / peer * n / k:.2f}" if peer else ""
    print(f"| {name} | {s:.1f} | {k} | {k / s:.0f} | {ratio} |")
  print(f"(valid predictions: {np.isfinite(pred).sum()} of {n})")


if __name__ == "__main__":
  main()
