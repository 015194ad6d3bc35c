"""Does the simulator reproduce llvm-mca? Total Cycles on a seeded BHive sample.

For each CPU model: the share of blocks whose Total Cycles (100 iterations) equal
llvm-mca's exactly, within 1% and within 5%, and the mean absolute percentage
difference; then the largest disagreements. The reference is the real llvm-mca 14 run
through the bridge on the same assembly text the simulator decoded; agreement with
the precomputed labels in ../shared/data/mca is printed alongside (those were made
from llvm-mc's raw disassembly, which splits `lock` prefixes into instructions of
their own, so a few blocks legitimately differ).

Any shipped table of an llvm-mca model can be checked (`diffsim params --list`).

  python benchmarks/fidelity.py [--n 2000] [--seed 0] [--cpus haswell skylake znver3]
"""

from __future__ import annotations

import argparse
import csv
import sys
import time

import numpy as np

from diffsim.data import corpus_hexes, shared_data_dir, shipped
from diffsim.isa import decode_blocks
from diffsim.mca import run_mca
from diffsim.params.table import load_table
from diffsim.sim import simulate_blocks


def sample(n: int, seed: int):
  """(hexes, {cpu: label array}) from the corpus sample, or the shipped file."""
  shared = shared_data_dir()
  if shared is not None:
    hexes, _ = corpus_hexes(n, seed)
    labels = {}
    for path in sorted((shared / "mca").glob("*.csv")):
      with open(path) as f:
        lab = {r[0]: r[1] for r in csv.reader(f)}
      labels[path.stem] = np.array([float(lab.get(h) or "nan") for h in hexes])
    return hexes, labels
  with open(shipped("mca-small.csv")) as f:
    rows = list(csv.DictReader(f))[:n]
  return [r["hex"] for r in rows], {
      cpu: np.array([float(r[f"{cpu}_100"] or "nan") for r in rows])
      for cpu in ("haswell", "skylake", "znver3")}


def agreement(pred, ref):
  ok = ~np.isnan(pred) & ~np.isnan(ref)
  rel = np.abs(pred[ok] - ref[ok]) / ref[ok]
  return dict(n=int(ok.sum()), exact=float(np.mean(pred[ok] == ref[ok])),
              within_1pct=float(np.mean(rel <= 0.01)), within_5pct=float(np.mean(rel <= 0.05)),
              mape=float(rel.mean()))


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--n", type=int, default=2000)
  ap.add_argument("--seed", type=int, default=0)
  ap.add_argument("--cpus", nargs="+", default=["haswell", "skylake", "znver3"])
  ap.add_argument("--worst", type=int, default=8, help="disagreements to list per CPU")
  args = ap.parse_args(argv)
  hexes, labels = sample(args.n, args.seed)
  blocks = decode_blocks(hexes)
  ok = [i for i, b in enumerate(blocks) if not isinstance(b, Exception)]
  print(f"# fidelity: {len(hexes)} blocks (seed {args.seed}), {len(ok)} decoded, "
        "Total Cycles at 100 iterations")
  header = (f"{'cpu':14s} {'n':>5s} {'exact':>7s} {'<=1%':>7s} {'<=5%':>7s} {'MAPE':>8s}   "
            f"{'labels: exact':>13s} {'<=1%':>7s}  {'sim s':>7s}")
  print(header)
  worst = {}
  for cpu in args.cpus:
    table = load_table(cpu)
    t0 = time.perf_counter()
    preds = simulate_blocks(table, [blocks[i] for i in ok])
    sim_s = time.perf_counter() - t0
    pred = np.array([p.cycles if p.cycles is not None else np.nan for p in preds])
    ref = np.array([m.cycles if m.cycles is not None else np.nan
                    for m in run_mca([blocks[i].text for i in ok], cpu)], float)
    a = agreement(pred, ref)
    # Precomputed labels exist for some models only.
    lab = (f"{'-':>13s} {'-':>7s}" if cpu not in labels else
           "{exact:13.2%} {within_1pct:7.2%}".format(**agreement(pred, labels[cpu][ok])))
    print(f"{cpu:14s} {a['n']:5d} {a['exact']:7.2%} {a['within_1pct']:7.2%} "
          f"{a['within_5pct']:7.2%} {a['mape']:8.3%}   {lab}  {sim_s:7.1f}")
    rel = np.where(np.isnan(pred) | np.isnan(ref), -1, np.abs(pred - ref) / ref)
    worst[cpu] = [(ok[i], ref[i], pred[i]) for i in np.argsort(-rel)[:args.worst] if rel[i] > 0]
  for cpu, rows in worst.items():
    print(f"\n# largest disagreements, {cpu} (llvm-mca, diffsim, block)")
    for i, r, p in rows:
      text = blocks[i].text.replace("\n", "; ")
      print(f"{r:8.0f} {p:8.0f}  {text[:110]}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
