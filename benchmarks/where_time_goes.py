"""Where does the time go? `simulate` per shipped table, stage by stage, against llvm-mca.

On N BHive blocks (seed 1), for each table: decoding (llvm-mc, once for all tables),
encoding, compiling (the first call's time beyond a warm call's, every bucket's program
compiled in this process: no compile cache), the kernel (the warm cycle loop on the
encoded buckets) and writing the results, each as a ratio to llvm-mca 14's time on the
same blocks (100 iterations, one process per core, the closest -mcpu). Then, with
`--search`, an exact search of two short rounds on the shipped `zen5-small.csv`, which
prints the process's memory mappings after each move kind: compiled programs hold
mappings, and a long fit dies once it passes the kernel's cap (vm.max_map_count), so
the count must stay flat after the first round.

  python benchmarks/where_time_goes.py [--n 5000] [--tables haswell zen5 graniterapids]
                                       [--search] [--search-n 600]
"""

from __future__ import annotations

import argparse
import csv
import io
import os
import sys
import time

from diffsim.cli import tune_xla

tune_xla()  # one XLA CPU device per core, before JAX starts

import jax  # noqa: E402
import numpy as np  # noqa: E402

from diffsim.isa import decode_blocks  # noqa: E402
from diffsim.isa.encode import bucket_length  # noqa: E402
from diffsim.mca import run_mca  # noqa: E402
from diffsim.params.table import load_table  # noqa: E402
from diffsim.sim import encode, simulate  # noqa: E402

from diffsim.data import corpus_hexes  # noqa: E402

# llvm-mca's closest model per table (LLVM 14 has no Zen 5 or Granite Rapids model).
PEER = {"haswell": "haswell", "zen5": "znver3", "graniterapids": "icelake-server",
        "zen4": "znver3", "skylake": "skylake", "znver3": "znver3"}


def timed(fn, *args, **kw):
  t0 = time.perf_counter()
  out = fn(*args, **kw)
  return out, time.perf_counter() - t0


def buckets(blocks) -> dict[int, list]:
  out: dict[int, list] = {}
  for b in blocks:
    out.setdefault(bucket_length(len(b.instrs)), []).append(b)
  return out


def stages(name: str, blocks, decode_s: float) -> tuple[list, float]:
  """[(stage, seconds)] of one table's simulate, and llvm-mca's seconds."""
  table = load_table(name)
  by = buckets(blocks)
  batches, enc_s = timed(lambda: {L: encode(table, bs, length=L) for L, bs in by.items()})

  def run():
    return {L: simulate(table, b, iterations=100, throw=False) for L, b in batches.items()}

  _, first = timed(run)
  out, warm = timed(run)
  warm = min(warm, timed(run)[1])
  rows = [(b.text, float(c)) for L, bs in by.items() for b, c in zip(bs, out[L].total)]
  sink = io.StringIO()
  _, io_s = timed(lambda: csv.writer(sink).writerows(rows))
  _, mca_s = timed(run_mca, [b.text for b in blocks], PEER.get(name, "znver3"), iterations=100)
  return [("decode (llvm-mc)", decode_s), ("encode", enc_s), ("compile", first - warm),
          ("kernel (warm)", warm), ("write results", io_s)], mca_s


def search_mappings(n: int) -> None:
  """Two short rounds of the exact search; the mappings after each move kind."""
  from diffsim.data import load_csv, shipped
  from diffsim.fit.exact import Move, refine

  ds = load_csv(shipped("zen5-small.csv"))
  blocks = decode_blocks(list(ds.hex[:n]))
  ok = [i for i, b in enumerate(blocks) if not isinstance(b, Exception)]
  table = load_table("zen5-facts")
  moves = [Move("latency", -1), Move("latency", +1), Move("uops", +1), Move("cycles", -1)]
  t0 = time.perf_counter()
  refined = refine(table, [blocks[i] for i in ok], np.asarray(ds.y)[ok], moves, rounds=2,
                   log=lambda s: None)
  print(f"\n# exact search, {len(ok)} zen5-small blocks, 2 rounds of {len(moves)} move kinds "
        f"({time.perf_counter() - t0:.0f} s): memory mappings after each")
  print(f"{'round':>5s} {'move':>12s} {'seconds':>8s} {'mappings':>9s}")
  for rec in refined.history:
    print(f"{rec['round']:5d} {rec['move']:>12s} {rec['seconds']:8.1f} {rec['mappings']:9d}")
  first = [r["mappings"] for r in refined.history if r["round"] == 0][-1]
  last = refined.history[-1]["mappings"]
  print(f"after round 0: {first}, after round 1: {last} "
        f"({'flat' if last <= first * 1.05 else 'GROWING'}; the kernel's cap: 65,530)")


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--n", type=int, default=5000)
  ap.add_argument("--tables", nargs="+", default=["haswell", "zen5", "graniterapids"])
  ap.add_argument("--search", action="store_true", help="also the mapping check")
  ap.add_argument("--search-n", type=int, default=600)
  args = ap.parse_args(argv)
  hexes, source = corpus_hexes(args.n, seed=1)
  decoded, decode_s = timed(decode_blocks, hexes)
  blocks = [b for b in decoded if not isinstance(b, Exception)]
  print(f"# where the time goes: {len(blocks)} blocks ({source}), 100 iterations, "
        f"{len(jax.devices())} XLA CPU devices; ratios are to llvm-mca 14 on the same blocks "
        f"({len(os.sched_getaffinity(0))} processes)")
  print(f"{'table':>14s} {'stage':>18s} {'seconds':>8s} {'x llvm-mca':>10s}")
  for name in args.tables:
    parts, mca_s = stages(name, blocks, decode_s)
    for stage, sec in parts:
      print(f"{name:>14s} {stage:>18s} {sec:8.2f} {sec / mca_s:10.2f}")
    total = sum(s for _, s in parts)
    warm = total - dict(parts)["compile"]
    print(f"{name:>14s} {'all, compiled':>18s} {total:8.2f} {total / mca_s:10.2f}")
    print(f"{name:>14s} {'all, warm':>18s} {warm:8.2f} {warm / mca_s:10.2f}")
    print(f"{name:>14s} {'llvm-mca ' + PEER.get(name, 'znver3'):>18s} {mca_s:8.2f} {1:10.2f}")
  if args.search:
    search_mappings(args.search_n)
  return 0


if __name__ == "__main__":
  sys.exit(main())
