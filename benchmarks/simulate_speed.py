"""How fast is `simulate`, next to llvm-mca on the same blocks and machine?

Prints one table: blocks/s of diffsim's exact simulator after compilation (compile
time reported apart), of llvm-mca through the bridge (one process, and one per core),
and their ratio; peak memory; and how time grows with iterations, block length and
the width of the window of in-flight instructions.

  python benchmarks/simulate_speed.py [--n 10000] [--cpu haswell] [--quick]

Blocks come from ../shared/data/bhive (seeded sample) when present, else from the
shipped mca-small.csv.
"""

from __future__ import annotations

import argparse
import platform
import resource
import sys
import time

from diffsim.cli import tune_xla

tune_xla()  # one XLA CPU device per core, small loops whole: before JAX starts

import jax  # noqa: E402
import numpy as np  # noqa: E402

from diffsim.data import corpus_hexes  # noqa: E402
from diffsim.isa import decode_blocks  # noqa: E402
from diffsim.llvmtools import llvm_version  # noqa: E402
from diffsim.mca import run_mca  # noqa: E402
from diffsim.params.table import load_table  # noqa: E402
from diffsim.sim import encode, simulate, simulate_blocks  # noqa: E402
from diffsim.sim.kernels import window_for  # noqa: E402


def timed(fn, *args, **kw):
  t0 = time.perf_counter()
  out = fn(*args, **kw)
  return out, time.perf_counter() - t0


def main(argv=None):
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--n", type=int, default=10_000)
  ap.add_argument("--cpu", default="haswell")
  ap.add_argument("--iterations", type=int, default=100)
  ap.add_argument("--quick", action="store_true", help="toy size, for CI smoke runs")
  args = ap.parse_args(argv)
  n = 200 if args.quick else args.n
  hexes, source = corpus_hexes(n)
  blocks, t_decode = timed(decode_blocks, hexes)
  ok = [b for b in blocks if not isinstance(b, Exception)]
  table = load_table(args.cpu)

  rows = []
  # llvm-mca through the bridge: one process, then one per core.
  mca1, t_mca1 = timed(run_mca, [b.text for b in ok], args.cpu, iterations=args.iterations,
                       jobs=1)
  mcaj, t_mcaj = timed(run_mca, [b.text for b in ok], args.cpu, iterations=args.iterations)
  # diffsim: the first call compiles one program per bucket shape, the second is warm.
  _, t_first = timed(simulate_blocks, table, ok, iterations=args.iterations)
  sim, t_warm = timed(simulate_blocks, table, ok, iterations=args.iterations)
  cyc = np.array([p.cycles if p.cycles is not None else np.nan for p in sim])
  ref = np.array([m.cycles if m.cycles is not None else np.nan for m in mca1], float)
  ref = ref * 100.0 / args.iterations
  both = ~np.isnan(cyc) & ~np.isnan(ref)
  exact = float(np.mean(cyc[both] == ref[both]))
  nb = len(ok)
  rows.append(("llvm-mca, 1 process", nb / t_mca1, t_mca1, 1.0))
  rows.append((f"llvm-mca, {len(__import__('os').sched_getaffinity(0))} processes",
               nb / t_mcaj, t_mcaj, t_mca1 / t_mcaj))
  rows.append(("diffsim simulate (warm)", nb / t_warm, t_warm, t_mca1 / t_warm))
  rows.append(("diffsim simulate (incl. compile)", nb / t_first, t_first, t_mca1 / t_first))

  print(f"# simulate speed: {nb} blocks ({source}), {args.cpu}, {args.iterations} iterations")
  print(f"# machine: {platform.processor() or platform.machine()}, "
        f"{len(__import__('os').sched_getaffinity(0))} cores; jax {jax.__version__} on "
        f"{jax.devices()[0].device_kind}; {llvm_version()}")
  print(f"# decode: {t_decode:.2f} s ({nb / t_decode:.0f} blocks/s); "
        f"compile: {t_first - t_warm:.1f} s; exact agreement with llvm-mca: {exact:.1%}")
  print(f"{'what':36s} {'blocks/s':>10s} {'seconds':>9s} {'x llvm-mca(1 proc)':>19s}")
  for name, bps, sec, ratio in rows:
    print(f"{name:36s} {bps:10.0f} {sec:9.2f} {ratio:19.2f}")
  peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
  print(f"peak resident memory: {peak:.0f} MiB")

  # Growth with iterations (same blocks, warm after one call each).
  sub = ok[: min(len(ok), 1000)]
  print("\n# time vs iterations (first 1000 blocks, warm)")
  print(f"{'iterations':>10s} {'seconds':>9s} {'blocks/s':>10s}")
  for its in (50, 100, 200, 400):
    simulate_blocks(table, sub, iterations=its)
    _, sec = timed(simulate_blocks, table, sub, iterations=its)
    print(f"{its:10d} {sec:9.2f} {len(sub) / sec:10.0f}")
  print("\n# time vs block length (warm)")
  print(f"{'length':>10s} {'blocks':>7s} {'seconds':>9s} {'blocks/s':>10s}")
  for lo, hi in ((1, 4), (5, 8), (9, 16), (17, 32), (33, 64), (65, 256)):
    grp = [b for b in ok if lo <= len(b.instrs) <= hi][:500]
    if not grp:
      continue
    simulate_blocks(table, grp, iterations=args.iterations)
    _, sec = timed(simulate_blocks, table, grp, iterations=args.iterations)
    print(f"{f'{lo}-{hi}':>10s} {len(grp):7d} {sec:9.2f} {len(grp) / sec:10.0f}")

  # What the per-cycle passes over the window cost: the same blocks with a wider ring
  # (identical cycle counts; only the window-wide work grows).
  grp = [b for b in ok if 5 <= len(b.instrs) <= 8][:1000]
  batch = encode(table, grp, length=8)
  base = window_for(table.params.rob_size)
  print(f"\n# time vs window width ({len(grp)} blocks of 5-8 instructions, warm; "
        "the cycle counts do not change)")
  print(f"{'window':>10s} {'seconds':>9s} {'blocks/s':>10s}")
  secs = {}
  for w in (base, 2 * base):
    ref_cycles = simulate(table, batch, iterations=args.iterations, window=w)[0]
    (cycles, _), secs[w] = timed(simulate, table, batch, iterations=args.iterations,
                                 window=w)
    assert (cycles == ref_cycles).all()
    print(f"{w:10d} {secs[w]:9.2f} {len(grp) / secs[w]:10.0f}")
  print(f"share of the time that grows with the window at {base} slots: "
        f"{(secs[2 * base] - secs[base]) / secs[base]:.0%}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
