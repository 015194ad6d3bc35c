"""Whole commands, as a user runs them: `diffsim simulate` against `diffsim mca` on the same
N BHive blocks (seed 1), wall time from the shell, decoding, checks and writing included.

The simulator's command runs twice: first with the compile cache it keeps in
~/.cache/diffsim/jax as found (cold on a fresh machine), then warm. Prints the wall
times, blocks/s, their ratio to llvm-mca, and how often the two commands agree.

  python benchmarks/command_speed.py [--n 20000] [--cpu haswell] [--throughput total|steady]
"""

from __future__ import annotations

import argparse
import csv
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from diffsim.data import corpus_hexes


def timed_command(*args: str) -> float:
  t = time.perf_counter()
  subprocess.run([sys.executable, "-m", "diffsim", *args], check=True,
                 stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
  return time.perf_counter() - t


def predictions(path: Path) -> dict[str, str]:
  with open(path) as f:
    return {r["hex"]: r["prediction"] for r in csv.DictReader(f)}


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--n", type=int, default=20_000)
  ap.add_argument("--cpu", default="haswell")
  ap.add_argument("--throughput", choices=("total", "steady"), default="total",
                  help="steady: both commands run N and 2N iterations (eval's default)")
  args = ap.parse_args(argv)
  mode = ("--throughput", args.throughput)
  hexes, source = corpus_hexes(args.n, seed=1)
  with tempfile.TemporaryDirectory() as d:
    d = Path(d)
    (d / "in.csv").write_text("hex\n" + "\n".join(hexes) + "\n")
    sim = [timed_command("simulate", str(d / "in.csv"), "--params", args.cpu, *mode,
                         "-o", str(d / "sim.csv")) for _ in range(2)]
    mca = timed_command("mca", str(d / "in.csv"), "--mcpu", args.cpu, *mode,
                        "-o", str(d / "mca.csv"))
    a, b = predictions(d / "sim.csv"), predictions(d / "mca.csv")
  same = sum(a[h] == b[h] and a[h] != "" for h in a) / len(a)
  n = len(hexes)
  print(f"# whole commands on {n} blocks of the {source} (seed 1), {args.cpu}, 100 iterations,"
        f" --throughput {args.throughput}")
  print("| command | wall s | blocks/s | ratio to llvm-mca |\n|---|---|---|---|")
  for what, t in (("diffsim simulate (compile cache as found)", sim[0]),
                  ("diffsim simulate (compile cache warm)", sim[1]), ("diffsim mca", mca)):
    print(f"| {what} | {t:.1f} | {n / t:,.0f} | {mca / t:.2f}x |")
  print(f"identical predictions: {same:.3%}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
