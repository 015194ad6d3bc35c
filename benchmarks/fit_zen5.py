"""Learning a Zen 5 table from real measurements, reported on held-out blocks.

Fits the znver3 table (llvm-mca's closest model) to the measured Zen 5 throughputs
of ../shared/data/measured (or the shipped 3,000-block sample when ../shared is
absent), growing resource groups the fit asks more of, then compares on the test
part of a seeded 80/10/10 split by block: llvm-mca with each of its distinct x86
models, diffsim with the initial table and with the learned one (steady state, 100
iterations, exact hard simulator with the rounded table).

Blocks whose measurement passes disagreed by more than 5% (`spread`, see the data's
README) are left out of training and validation; the test part keeps them all and
the stable subset is reported as well.

  python benchmarks/fit_zen5.py [--train-limit 12000] [--epochs 10] [--out runs/zen5]
      [--ship]   # also copy the learned table to diffsim/params/tables/zen5.json
"""

from __future__ import annotations

import argparse
import shutil
import time
from pathlib import Path

import numpy as np

from diffsim.cli import mca_predict, sim_predict, tune_xla
from diffsim.data import load_csv, shared_data_dir, shipped, split
from diffsim.fit import FitConfig
from diffsim.fit.run import fit_and_report, format_report
from diffsim.isa import decode_blocks
from diffsim.params.table import TABLES_DIR, load_table


def measured():
  shared = shared_data_dir()
  if shared is not None and (shared / "measured" / "zen5-measured.csv").exists():
    return load_csv(shared / "measured" / "zen5-measured.csv")
  print("../shared not found: using the shipped 3,000-block sample")
  return load_csv(shipped("zen5-small.csv"))


def stable_mask(ds) -> np.ndarray:
  """Blocks whose measurement passes agreed within 5% (the data's README)."""
  return np.asarray(ds.extra.get("spread", [0.0] * len(ds)), np.float64) <= 0.05


def stable(ds):
  return ds.take(np.flatnonzero(stable_mask(ds)))


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--train-limit", type=int, default=12000,
                  help="training blocks used (a seeded subset; 0 = all)")
  ap.add_argument("--val-limit", type=int, default=1500)
  ap.add_argument("--epochs", type=int, default=6)
  ap.add_argument("--lr", type=float, default=0.03,
                  help="Adam's peak step (smaller than the CLI's default: ~100 steps/epoch)")
  ap.add_argument("--out", default="runs/zen5")
  ap.add_argument("--mca-models", default="all", help="'all' distinct models or a list a,b")
  ap.add_argument("--ship", action="store_true")
  args = ap.parse_args()
  tune_xla()
  from diffsim.mca.cpus import mca_cpu_groups

  ds = measured()
  train, val, test = split(ds, seed=0)
  rng = np.random.default_rng(0)
  train, val = stable(train), stable(val)
  if args.train_limit and len(train) > args.train_limit:
    train = train.take(np.sort(rng.choice(len(train), args.train_limit, replace=False)))
  if args.val_limit and len(val) > args.val_limit:
    val = val.take(np.sort(rng.choice(len(val), args.val_limit, replace=False)))
  print(f"{len(ds)} measured blocks: {len(train)} train, {len(val)} validation (stable "
        f"only), {len(test)} test")
  groups = [g for g in mca_cpu_groups() if "generic" not in g]
  if args.mca_models != "all":
    keep = set(args.mca_models.split(","))
    groups = [g for g in groups if keep & set(g)]
  predictors = {}
  for g in groups:
    name = next((n for n in ("haswell", "skylake", "znver3", "znver2", "znver1", "broadwell",
                             "icelake-client", "skx", "btver2", "bdver2", "atom", "slm")
                 if n in g), g[0])
    label = f"llvm-mca -mcpu={name}" + (f" (= {len(g) - 1} more)" if len(g) > 1 else "")
    predictors[label] = lambda blocks, cpu=name: mca_predict(blocks, cpu, 100, "steady", False)
  t0 = time.time()
  report = fit_and_report(
      load_table("znver3"), train, val, test, Path(args.out),
      FitConfig(epochs=args.epochs, lr=args.lr), init_name="znver3", name="zen5", grow=True,
      predictors=predictors,
      simulate=lambda t: (lambda blocks: sim_predict(t, blocks, 100, "steady", True)),
      decode=lambda hexes: decode_blocks(hexes, progress=True),
      held_out="test part, seed 0", progress=True, subsets={"stable": stable_mask(test)})
  print(f"fit and report: {time.time() - t0:.0f} s")
  for phase, hist in report["history"].items():
    secs = [h["seconds"] for h in hist if h["train"] is not None]
    print(f"{phase}: {len(secs)} epochs, {np.median(secs):.1f} s per epoch (median), "
          f"{sum(secs):.0f} s in all")
  out = Path(args.out)
  rows = [dict(name=r["name"], **r["subsets"]["stable"]) for r in report["held_out_results"]]
  print(format_report(rows, f"stable test blocks only (spread <= 5%, "
                            f"{int(stable_mask(test).sum())} blocks):"))
  if args.ship:
    shutil.copy(out / "params.json", TABLES_DIR / "zen5.json")
    print(f"shipped as {TABLES_DIR / 'zen5.json'}")


if __name__ == "__main__":
  main()
