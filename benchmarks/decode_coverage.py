"""Decoder coverage and speed over the whole BHive corpus.

Decodes every block of `shared/data/bhive/blocks.csv` (column `hex`) with
`diffsim.isa.decode_blocks` from a cold cache and prints: blocks, decoded, share,
failures by reason (count and one example each), wall time, blocks/s, instructions/s
and the number of distinct opcode keys.

The data lives outside the repository: `$DIFFSIM_SHARED`, else `../shared` next to
the repository root. Without it the script says so and exits 0.

Usage: python benchmarks/decode_coverage.py [--limit N]
"""

from __future__ import annotations

import argparse
import csv
import os
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from diffsim.isa import decode_blocks, summarize


def shared_dir() -> Path:
  """The shared data folder: $DIFFSIM_SHARED, else <repo>/../shared/data."""
  env = os.environ.get("DIFFSIM_SHARED")
  if env:
    p = Path(env)
    return p / "data" if (p / "data").is_dir() else p
  return Path(__file__).resolve().parents[2] / "shared" / "data"


def main() -> int:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--limit", type=int, default=0, help="decode only the first N blocks")
  ap.add_argument("--progress", action="store_true", help="progress bars on stderr")
  args = ap.parse_args()

  path = shared_dir() / "bhive" / "blocks.csv"
  if not path.is_file():
    print(f"decode_coverage: skipped, {path} not found (set DIFFSIM_SHARED)")
    return 0
  with path.open(newline="") as f:
    hexes = [row["hex"] for row in csv.DictReader(f)]
  if args.limit:
    hexes = hexes[:args.limit]

  t0 = time.perf_counter()
  results = decode_blocks(hexes, progress=args.progress)
  wall = time.perf_counter() - t0
  s = summarize(results)

  rows = [
      ("blocks", f"{s['blocks']:,}"),
      ("decoded", f"{s['decoded']:,}"),
      ("decoded %", f"{100 * s['decoded'] / max(s['blocks'], 1):.3f}"),
      ("failed", f"{s['failed']:,}"),
      ("instructions (decoded blocks)", f"{s['instructions']:,}"),
      ("distinct opcode keys", f"{s['keys']:,}"),
      ("wall time (s, cold cache)", f"{wall:.2f}"),
      ("blocks/s", f"{s['blocks'] / wall:,.0f}"),
      ("instructions/s", f"{s['instructions'] / wall:,.0f}"),
  ]
  width = max(len(k) for k, _ in rows)
  print(f"Decoder coverage: {path}")
  for k, v in rows:
    print(f"  {k:<{width}}  {v:>12}")
  if s["by_reason"]:
    print("\n  failures by reason:")
    print(f"  {'reason':<20} {'count':>8}  example")
    for reason, n in s["by_reason"].items():
      print(f"  {reason:<20} {n:>8}  {s['examples'][reason][:90]}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
