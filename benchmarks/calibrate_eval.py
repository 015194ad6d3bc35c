"""How good is `diffsim calibrate`'s table on blocks it never measured, on this CPU?

Draws `--n` BHive corpus blocks that are not in the shipped corpus sample (so calibrate
never measured them), measures them twice on this machine with `diffsim measure`
(resumable; the files stay in `--work`), keeps the blocks on which both runs agree
within 3% (as the project's Ice Lake figures did), and scores in one run on those
blocks:
- the calibrated table (`--params DIR/params.json`);
- the nearest shipped measured table (`zen5` on AMD, `graniterapids` on Intel) and
  llvm-mca 14's closest model (`znver3`, `icelake-server`);
- the trivial bound 100 x max(instructions / 5, loads / 2, stores / 1);
- gradient-boosted trees on opcode counts trained on calibrate's own training blocks.
It prints the CPU by CPUID, the cross-run agreement and a table of MAPE, Kendall tau
and within-5%. The scored blocks go to `--work`/heldout.csv, for `diffsim eval`.

  python benchmarks/calibrate_eval.py --params runs/cal/params.json --cal runs/cal
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import numpy as np

from diffsim.calibrate.run import CLOSEST_MCA, NEAREST_SHIPPED
from diffsim.data import load_csv, metrics, shared_data_dir, shipped
from diffsim.data.split import split_ids
from diffsim.isa import decode_blocks
from diffsim.measure import cpu_identity, describe_cpu


def held_out_hexes(n: int, seed: int) -> list[str]:
  shared = shared_data_dir()
  if shared is None:
    raise SystemExit("needs ../shared/data/bhive/blocks.csv (the corpus beyond the sample)")
  corpus = load_csv(shared / "bhive" / "blocks.csv")
  seen = set(load_csv(shipped("corpus-sample.csv")).hex)
  pool = [h for h in corpus.hex if h not in seen]
  pick = np.random.default_rng([seed, 4]).choice(len(pool), n, replace=False)
  return [pool[i] for i in sorted(pick)]


def measure_twice(hexes: list[str], work: Path) -> tuple[np.ndarray, np.ndarray]:
  work.mkdir(parents=True, exist_ok=True)
  todo = work / "heldout-blocks.csv"
  todo.write_text("hex\n" + "".join(f"{h}\n" for h in hexes))
  runs = []
  for k in (1, 2):
    out = work / f"heldout-run{k}.csv"
    if not out.exists():
      subprocess.run([sys.executable, "-m", "diffsim", "measure", str(todo), "-o", str(out)],
                     check=True)
    ds = load_csv(out, dedupe=False)
    runs.append(ds.y)
  return runs[0], runs[1]


def trivial(blocks) -> np.ndarray:
  out = np.full(len(blocks), np.nan)
  for i, b in enumerate(blocks):
    if not isinstance(b, Exception):
      n = len(b.instrs)
      loads = sum(bool(x.loads) for x in b.instrs)
      stores = sum(bool(x.stores) for x in b.instrs)
      out[i] = 100 * max(n / 5, loads / 2, stores / 1)
  return out


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--params", required=True, help="the calibrated table")
  ap.add_argument("--cal", required=True, help="the calibration folder (for its training blocks)")
  ap.add_argument("--n", type=int, default=2000)
  ap.add_argument("--seed", type=int, default=0)
  ap.add_argument("--work", default="runs/calibrate-eval")
  ap.add_argument("--agree", type=float, default=0.03,
                  help="keep blocks whose two runs agree within this (default 3%%)")
  args = ap.parse_args()

  from diffsim.cli import mca_predict, sim_predict
  from diffsim.fit.trees import OpcodeTrees
  from diffsim.params.table import load_table

  cpu = cpu_identity()
  print(f"CPU: {describe_cpu(cpu)}")
  hexes = held_out_hexes(args.n, args.seed)
  a, b = measure_twice(hexes, Path(args.work))
  both = np.isfinite(a) & np.isfinite(b)
  diff = np.abs(a - b)[both] / np.minimum(a, b)[both]
  print(f"{args.n} held-out blocks, {both.sum()} measured twice: cross-run median "
        f"{100 * np.median(diff):.2f}%, p90 {100 * np.percentile(diff, 90):.2f}%, "
        f"within 3% {100 * np.mean(diff <= 0.03):.1f}%")
  keep = np.flatnonzero(both)[diff <= args.agree]
  y = (a[keep] + b[keep]) / 2
  blocks = decode_blocks([hexes[i] for i in keep])
  ok = np.array([not isinstance(x, Exception) for x in blocks])
  blocks, y = [x for x, good in zip(blocks, ok) if good], y[ok]
  heldout = Path(args.work) / "heldout.csv"
  heldout.write_text("hex,cycles_per_100_iterations\n" + "".join(
      f"{x.hex},{v:.2f}\n" for x, v in zip(blocks, y)))
  print(f"scored on {len(blocks)} blocks whose two runs agree within "
        f"{100 * args.agree:g}% (written to {heldout}: `diffsim eval {heldout} --params "
        f"{args.params}` gives the calibrated row)")

  cal = load_csv(Path(args.cal) / "blocks.csv", dedupe=False)
  part = split_ids(list(cal.hex), seed=0)
  tr = np.flatnonzero((part == 0) & np.isfinite(cal.y))
  tr_blocks = decode_blocks([cal.hex[i] for i in tr])
  vendor = cpu.get("vendor")

  def cycles(pairs) -> np.ndarray:
    return np.array([np.nan if v is None else v for v, _ in pairs])

  def simulated(table, bl):
    return cycles(sim_predict(table, bl, 100, "steady", False))

  def mca(bl, mcpu):
    return cycles(mca_predict(bl, mcpu, 100, "steady", False))

  preds = {"calibrated table": simulated(load_table(args.params), blocks)}
  if vendor in NEAREST_SHIPPED:
    preds[f"shipped {NEAREST_SHIPPED[vendor]}"] = simulated(load_table(NEAREST_SHIPPED[vendor]),
                                                           blocks)
  if vendor in CLOSEST_MCA:
    preds[f"llvm-mca -mcpu={CLOSEST_MCA[vendor]}"] = mca(blocks, CLOSEST_MCA[vendor])
  preds["trivial bound"] = trivial(blocks)
  preds["trees on opcode counts (calibrate's training blocks)"] = \
      OpcodeTrees().fit(tr_blocks, cal.y[tr]).predict(blocks)
  print(f"\n| predictor ({describe_cpu(cpu)}) | MAPE | Kendall tau | within 5% | n |")
  print("|---|---|---|---|---|")
  for name, p in preds.items():
    s = metrics.summary(p, y)
    print(f"| {name} | {100 * s['mape']:.1f}% | {s['kendall_tau']:.3f} | "
          f"{100 * s['within_5pct']:.1f}% | {s['n']} |")


if __name__ == "__main__":
  main()
