"""How right, how repeatable and how fast is `diffsim measure` on this machine's CPU?

Prints, for the CPU it runs on:
1. the validation blocks (known chains, port-bound blocks): measured against expected;
2. N BHive corpus blocks (a seeded uniform sample) measured twice, one full run after
   the other: the median, 90th and 99th percentile relative difference per block, the
   share that differs by more than 5%, the same over blocks whose passes agreed, and
   how many passes a busy core disturbed;
3. the rate in blocks per second (prefiltering excluded) and the reject rate by reason;
4. a cross-CPU sanity figure: the same blocks against `measured/zen5-measured.csv`.
   Unless this CPU is the Zen 5 of that file (family 1Ah model 2 stepping 1), the two
   are different cores and are not expected to agree; the figure shows how far apart
   they are, not an error.

Blocks come from `../shared/data/bhive/blocks.csv`; without the shared data, from the
shipped `zen5-small.csv` (its blocks are Zen 5 measurements too).

Usage: python benchmarks/measure_check.py [--n 500] [--seed 0] [--cpu CORE]
"""

from __future__ import annotations

import argparse
import csv
import math
import random
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from diffsim.data import kendall_tau, shared_data_dir, shipped
from diffsim.measure import MeasureConfig, cpu_identity, describe_cpu, measure_hexes, run_checks
from diffsim.measure.validate import format_checks

ZEN5 = ("AuthenticAMD", 26, 2, 1)  # vendor, family, model, stepping of the shared file


def _read_hexes(path: Path) -> list[str]:
  with open(path, newline="") as f:
    r = csv.reader(f)
    next(r)
    return [row[0] for row in r if row]


def _read_labels(path: Path) -> dict[str, float]:
  with open(path, newline="") as f:
    r = csv.reader(f)
    next(r)
    return {row[0]: float(row[1]) for row in r if len(row) > 1 and row[1]}


def _pct(x: float) -> str:
  return "n/a" if not math.isfinite(x) else f"{100 * x:.2f}%"


def main() -> int:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--n", type=int, default=500, help="corpus blocks, each measured twice")
  ap.add_argument("--seed", type=int, default=0, help="sampling seed")
  ap.add_argument("--cpu", type=int, default=None, help="core to run on")
  ap.add_argument("--progress", action="store_true", help="progress bars on stderr")
  args = ap.parse_args()

  cpu = cpu_identity()
  config = MeasureConfig(cpu=args.cpu)
  print(f"CPU: {describe_cpu(cpu)}")
  print(f"settings: {config.passes} passes (up to {config.max_passes}), {config.rounds} rounds, "
        f"at most {config.max_pages} pages; date {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")

  print("\n1. validation blocks, cycles per iteration")
  checks, _ = run_checks(config)
  print(format_checks(checks))

  shared = shared_data_dir()
  if shared is not None and (shared / "bhive" / "blocks.csv").is_file():
    pool = _read_hexes(shared / "bhive" / "blocks.csv")
    source = "shared/data/bhive/blocks.csv"
  else:
    pool = _read_hexes(shipped("zen5-small.csv"))
    source = "shipped zen5-small.csv (no shared data)"
  hexes = random.Random(args.seed).sample(pool, min(args.n, len(pool)))

  print(f"\n2. {len(hexes)} blocks sampled from {source} (seed {args.seed}), measured twice")
  t0 = time.perf_counter()
  first, s1 = measure_hexes(hexes, config, progress=args.progress)
  wall1 = time.perf_counter() - t0
  second, s2 = measure_hexes(hexes, config, progress=args.progress)
  both = [(a, b) for a, b in zip(first, second)
          if a.cycles is not None and b.cycles is not None and a.cycles > 0 and b.cycles > 0]
  x = np.array([(a.cycles, b.cycles) for a, b in both], np.float64).reshape(-1, 2)
  rel = np.abs(x[:, 0] - x[:, 1]) / np.minimum(x[:, 0], x[:, 1])
  print(f"  measured in both runs  {len(x)}")
  if len(x):
    q = np.percentile(rel, [50, 90, 99])
    print(f"  relative difference    median {_pct(q[0])}, p90 {_pct(q[1])}, p99 {_pct(q[2])}")
    print(f"  differ by more than 5% {_pct(float(np.mean(rel > 0.05)))}")
    steady = np.array([a.spread <= 0.03 and b.spread <= 0.03 for a, b in both])
    if steady.any():
      q = np.percentile(rel[steady], [50, 90, 99])
      print(f"  passes agreed (<= 3%)  {steady.sum()} blocks: median {_pct(q[0])}, p90 "
            f"{_pct(q[1])}, p99 {_pct(q[2])}, > 5% {_pct(float(np.mean(rel[steady] > 0.05)))}")
  spreads = np.array([r.spread for r in first if r.spread is not None and math.isfinite(r.spread)])
  if len(spreads):
    p = np.percentile(spreads, [50, 90])
    print(f"  spread between passes  median {_pct(p[0])}, p90 {_pct(p[1])} (run 1)")
  timed = s1.passes + s2.passes
  disturbed = s1.disturbed_passes + s2.disturbed_passes
  print(f"  disturbed passes       {_pct(disturbed / max(timed, 1))} of {timed} timed again "
        f"(busy core); kept at a block's last chance: "
        f"{s1.contended_passes + s2.contended_passes}")

  print("\n3. rate and rejects (run 1)")
  print(f"  rate                   {s1.rate:.1f} blocks/s ({s1.measured} timed in "
        f"{s1.seconds:.1f} s; {wall1:.1f} s wall with decoding and prefiltering)")
  print(f"  second run             {s2.rate:.1f} blocks/s")
  n_rej = sum(s1.rejected.values())
  print(f"  rejected               {n_rej} of {len(hexes)} ({_pct(n_rej / max(len(hexes), 1))})")
  for why, n in sorted(s1.rejected.items(), key=lambda kv: -kv[1]):
    example = next(r.error for r in first if r.reason == why)
    print(f"    {why:22} {n:5} ({_pct(n / len(hexes))})  e.g. {example[:80]}")

  zen5_path = (shared / "measured" / "zen5-measured.csv") if shared is not None else None
  labels = _read_labels(zen5_path) if zen5_path and zen5_path.is_file() else \
    _read_labels(shipped("zen5-small.csv"))
  same = (cpu.get("vendor"), cpu.get("family"), cpu.get("model"), cpu.get("stepping")) == ZEN5
  title = "agreement with" if same else "CROSS-CPU comparison (different cores) against"
  print(f"\n4. {title} zen5-measured.csv (AMD family 1Ah model 2 stepping 1, Zen 5)")
  pairs = [(r.cycles, labels[h]) for h, r in zip(hexes, first)
           if r.cycles is not None and r.cycles > 0 and h in labels]
  print(f"  blocks in both         {len(pairs)}")
  if pairs:
    here, z5 = np.array(pairs, np.float64).T
    ratio = here / z5
    print(f"  this CPU / Zen 5       median {np.median(ratio):.3f}, p10 "
          f"{np.percentile(ratio, 10):.3f}, p90 {np.percentile(ratio, 90):.3f}")
    print(f"  within 5% of Zen 5     {_pct(float(np.mean(np.abs(ratio - 1) <= 0.05)))}")
    print(f"  MAPE vs Zen 5          {_pct(float(np.mean(np.abs(ratio - 1))))}")
    print(f"  Kendall tau            {kendall_tau(here, z5):.3f}")
  zen5_rejected = sum(1 for h, r in zip(hexes, first) if r.cycles is None and h in labels)
  print(f"  rejected here, measured on Zen 5: {zen5_rejected}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
