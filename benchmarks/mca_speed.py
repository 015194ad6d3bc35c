"""How many blocks per second does the llvm-mca bridge simulate?

Runs `diffsim.mca.run_mca` on N real BHive blocks (default: the 2,000 of the shipped
`mca-small.csv`, disassembled by llvm-mc 14) for each requested number of jobs, and
prints one table row per setting: blocks per second over the best of a few repeats.
The disassembly is timed separately and is not part of the figure. Results are checked
against the shipped haswell labels, so a fast but wrong bridge shows up here too.

This is the speed the JAX simulator is compared against (`benchmarks/RESULTS.md`,
Simulator speed, gives it in multiples of llvm-mca's blocks/s).

  python benchmarks/mca_speed.py [--n 2000] [--jobs 1 2] [--mcpu haswell] [--repeats 3]

Skip-safe: without llvm-mca 14 it prints why and exits 0.
"""

from __future__ import annotations

import argparse
import os
import platform
import sys
import time

from diffsim.data import load_csv, shipped
from diffsim.llvmtools import find_llvm_tool, llvm_version
from diffsim.mca import disassemble, run_mca


def _cpu_name() -> str:
  """The host CPU's model name (Linux), else what platform says."""
  try:
    with open("/proc/cpuinfo") as f:
      for line in f:
        if line.startswith("model name"):
          return line.split(":", 1)[1].strip()
  except OSError:
    pass
  return platform.processor() or platform.machine()


def main(argv: list[str] | None = None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--n", type=int, default=2000, help="blocks (cycled if above 2,000)")
  ap.add_argument("--jobs", type=int, nargs="+", default=[1, 2])
  ap.add_argument("--mcpu", default="haswell")
  ap.add_argument("--iterations", type=int, default=100)
  ap.add_argument("--repeats", type=int, default=3)
  args = ap.parse_args(argv)
  try:
    find_llvm_tool("llvm-mca")
    find_llvm_tool("llvm-mc")
  except FileNotFoundError as e:
    print(f"skipped: {e}")
    return 0

  ds = load_csv(shipped("mca-small.csv"))
  idx = [i % len(ds) for i in range(args.n)]
  t0 = time.perf_counter()
  dis = disassemble([ds.hex[i] for i in idx])
  t_dis = time.perf_counter() - t0
  texts = [d.text or "" for d in dis]

  print(f"machine: {_cpu_name()}, {os.cpu_count()} logical CPUs, "
        f"Python {platform.python_version()}")
  print(f"llvm-mca {llvm_version('llvm-mca')} -mcpu={args.mcpu} "
        f"-iterations={args.iterations}; {args.n} blocks from mca-small.csv")
  print(f"llvm-mc disassembly: {t_dis:.2f} s ({args.n / t_dis:,.0f} blocks/s, not counted)")
  print()
  print(f"| {'jobs':>4} | {'best s':>7} | {'blocks/s':>9} | {'errors':>6} | {'label match':>11} |")
  print(f"|{'-' * 6}|{'-' * 9}|{'-' * 11}|{'-' * 8}|{'-' * 13}|")
  for jobs in args.jobs:
    best = float("inf")
    res = []
    for _ in range(args.repeats):
      t0 = time.perf_counter()
      res = run_mca(texts, args.mcpu, iterations=args.iterations, jobs=jobs)
      best = min(best, time.perf_counter() - t0)
    errors = sum(r.error is not None for r in res)
    match = "n/a"
    if args.mcpu == "haswell" and args.iterations in (100, 200):
      col = ds.y if args.iterations == 100 else ds.extra["haswell_200"]
      ok = sum(r.cycles == int(col[i]) for r, i in zip(res, idx))
      match = f"{ok}/{len(res)}"
    print(f"| {jobs:>4} | {best:>7.2f} | {args.n / best:>9,.0f} | {errors:>6} | {match:>11} |")
  return 0


if __name__ == "__main__":
  sys.exit(main())
