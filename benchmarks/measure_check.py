"""How right, how repeatable and how fast is `diffsim measure` on this machine's CPU?

Prints, for the CPU it runs on:
1. the validation blocks (known chains, port-bound blocks): measured against expected;
2. N BHive corpus blocks (a seeded uniform sample) measured twice, one full run after
   the other: the median, 90th and 99th percentile relative difference per block and
   the share within 1%, 3% and 5%, over all rows, over rows whose passes agreed, and by
   the harness's confidence; how many passes a busy core disturbed, and the time spent
   re-measuring rows whose passes disagreed;
3. the rate in blocks per second (prefiltering excluded) and the reject rate by reason;
4. a cross-CPU sanity figure: the same blocks against `measured/zen5-measured.csv`.
   Unless this CPU is the Zen 5 of that file (family 1Ah model 2 stepping 1), the two
   are different cores and are not expected to agree; the figure shows how far apart
   they are, not an error.

Blocks come from `../shared/data/bhive/blocks.csv`; without the shared data, from the
shipped `zen5-small.csv` (its blocks are Zen 5 measurements too).

A quiet machine shows little of what the harness does against a busy neighbour (a
cloud VM's other tenants), so `--noise` emulates one: a background process pinned to
the measuring core alternates busy spells (spinning over an 8 MiB buffer, which also
evicts the runner's caches) and idle gaps, each of a random length between a
millisecond and a few hundred, until the runs end.

Usage: python benchmarks/measure_check.py [--n 500] [--seed 0] [--cpu CORE] [--noise]
         [--runs-only] [--budget-seconds S]
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import dataclasses
import math
import os
import random
import subprocess
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


# The neighbour: busy spells and idle gaps of log-uniform lengths (1 ms to 300 ms busy,
# 1 ms to 300 ms idle), spinning over a buffer larger than L2 so that every spell also
# leaves the runner cold caches and predictors.
_NOISE = """
import math, os, random, sys, time
import numpy as np
os.sched_setaffinity(0, {int(sys.argv[1])})
rng = random.Random(int(sys.argv[2]))
buf = np.zeros(2 << 20, np.int32)
def length(lo, hi):
  return math.exp(rng.uniform(math.log(lo), math.log(hi)))
while True:
  end = time.perf_counter() + length(0.001, 0.3)
  while time.perf_counter() < end:
    buf[::16] += 1
  time.sleep(length(0.001, 0.3))
"""


@contextlib.contextmanager
def _neighbour(cpu: int | None, seed: int):
  """A busy neighbour on core `cpu` while the block runs; nothing when `cpu` is None."""
  if cpu is None:
    yield
    return
  proc = subprocess.Popen([sys.executable, "-c", _NOISE, str(cpu), str(seed)])
  try:
    yield
  finally:
    proc.kill()
    proc.wait()


def _agreement(title: str, rel: np.ndarray) -> None:
  """One line of cross-run agreement: median, p90, p99 and the shares within 1/3/5%."""
  if not len(rel):
    print(f"  {title:26} 0 blocks")
    return
  q = np.percentile(rel, [50, 90, 99])
  within = " / ".join(_pct(float(np.mean(rel <= t))) for t in (0.01, 0.03, 0.05))
  print(f"  {title:26} {len(rel):5} blocks: median {_pct(q[0])}, p90 {_pct(q[1])}, "
        f"p99 {_pct(q[2])}; within 1/3/5% {within}")


def main() -> int:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--n", type=int, default=500, help="corpus blocks, each measured twice")
  ap.add_argument("--seed", type=int, default=0, help="sampling seed")
  ap.add_argument("--cpu", type=int, default=None, help="core to run on")
  ap.add_argument("--progress", action="store_true", help="progress bars on stderr")
  ap.add_argument("--noise", action="store_true",
                  help="emulate a busy neighbour on the measuring core during the two runs")
  ap.add_argument("--runs-only", action="store_true",
                  help="only the two runs (section 2) and their rate: no validation blocks, "
                       "no comparison with Zen 5")
  ap.add_argument("--budget-seconds", type=float, default=None,
                  help="the harness's re-measuring budget per run (default: its own)")
  ap.add_argument("--dump", type=Path, default=None,
                  help="write both runs' per-block results (JSON lines) here")
  args = ap.parse_args()

  cpu = cpu_identity()
  fields = {f.name for f in dataclasses.fields(MeasureConfig)}
  extra = {"budget_seconds": args.budget_seconds} if args.budget_seconds is not None else {}
  if extra and "budget_seconds" not in fields:
    ap.error("this harness has no re-measuring budget")
  config = MeasureConfig(cpu=args.cpu, **extra)
  core = args.cpu if args.cpu is not None else sorted(os.sched_getaffinity(0))[-1]
  print(f"CPU: {describe_cpu(cpu)} (family {cpu.get('family')} model {cpu.get('model')} "
        f"stepping {cpu.get('stepping')}); measuring on core {core}"
        + (", with an emulated busy neighbour (--noise)" if args.noise else ""))
  budget = getattr(config, "budget_seconds", None)
  print(f"settings: {config.passes} passes (up to {config.max_passes}), {config.rounds} rounds, "
        f"at most {config.max_pages} pages"
        + (f", re-measuring budget {budget:g} s + {config.budget_share:g} x the sweeps"
           if budget is not None else "")
        + f"; date {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")

  if not args.runs_only:
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
  with _neighbour(core if args.noise else None, args.seed):
    t0 = time.perf_counter()
    first, s1 = measure_hexes(hexes, config, progress=args.progress)
    wall1 = time.perf_counter() - t0
    second, s2 = measure_hexes(hexes, config, progress=args.progress)
  if args.dump is not None:
    import json
    with open(args.dump, "w") as f:
      for h, a, b in zip(hexes, first, second):
        f.write(json.dumps({"hex": h, "run1": dataclasses.asdict(a),
                            "run2": dataclasses.asdict(b)}) + "\n")
  both = [(a, b) for a, b in zip(first, second)
          if a.cycles is not None and b.cycles is not None and a.cycles > 0 and b.cycles > 0]
  x = np.array([(a.cycles, b.cycles) for a, b in both], np.float64).reshape(-1, 2)
  rel = np.abs(x[:, 0] - x[:, 1]) / np.minimum(x[:, 0], x[:, 1])
  print(f"  measured in both runs  {len(x)}")
  _agreement("all rows", rel)
  if len(x):
    for cut in (0.03, 0.05):
      agreed = np.array([a.spread <= cut and b.spread <= cut for a, b in both])
      _agreement(f"spread <= {cut:.0%} in both", rel[agreed])
    if all(getattr(r, "confidence", None) is not None for pair in both for r in pair):
      conf = np.array([min(a.confidence, b.confidence) for a, b in both])
      for lo, hi in ((0.9, 1.01), (0.5, 0.9), (0.0, 0.5)):
        _agreement(f"confidence {lo:.1f}-{min(hi, 1):.1f} (both)",
                   rel[(conf >= lo) & (conf < hi)])
      w = conf / conf.sum()
      order = np.argsort(rel)
      wmed = rel[order][np.searchsorted(np.cumsum(w[order]), 0.5)]
      print(f"  confidence-weighted median {_pct(float(wmed))}; mean confidence "
            f"{np.mean([r.confidence for r in first if r.cycles is not None]):.3f} (run 1)")
  spreads = np.array([r.spread for r in first if r.spread is not None and math.isfinite(r.spread)])
  if len(spreads):
    p = np.percentile(spreads, [50, 90])
    print(f"  spread between passes  median {_pct(p[0])}, p90 {_pct(p[1])} (run 1)")
  timed = s1.passes + s2.passes
  disturbed = s1.disturbed_passes + s2.disturbed_passes
  print(f"  disturbed passes       {_pct(disturbed / max(timed, 1))} of {timed} timed again "
        f"(busy core); kept at a block's last chance: "
        f"{s1.contended_passes + s2.contended_passes}")
  if hasattr(s1, "remeasured"):
    print(f"  re-measured            {s1.remeasured} / {s2.remeasured} rows whose passes "
          f"disagreed, {s1.extra_passes} / {s2.extra_passes} more passes in "
          f"{s1.extra_seconds:.1f} / {s2.extra_seconds:.1f} s (runs 1 / 2); unconverged "
          f"{s1.unconverged} / {s2.unconverged}")

  print("\n3. rate and rejects (run 1)")
  print(f"  rate                   {s1.rate:.1f} blocks/s ({s1.measured} timed in "
        f"{s1.seconds:.1f} s; {wall1:.1f} s wall with decoding and prefiltering)")
  print(f"  second run             {s2.rate:.1f} blocks/s")
  n_rej = sum(s1.rejected.values())
  print(f"  rejected               {n_rej} of {len(hexes)} ({_pct(n_rej / max(len(hexes), 1))})")
  for why, n in sorted(s1.rejected.items(), key=lambda kv: -kv[1]):
    example = next(r.error for r in first if r.reason == why)
    print(f"    {why:22} {n:5} ({_pct(n / len(hexes))})  e.g. {example[:80]}")
  if args.runs_only:
    return 0

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
