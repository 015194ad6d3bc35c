"""Builds the small datasets shipped in `diffsim/data/shipped/` from the shared data.

Run from the repository root (the shared folder is found as `shared_data_dir()` finds
it, or given with --shared):

  python -m diffsim.data.make_shipped [--shared ../shared/data] [--seed 0]

It writes
- `zen5-small.csv`: 3,000 blocks drawn uniformly (seeded) from
  `measured/zen5-measured.csv` among those with spread <= 0.05, in the source file's
  order, with its columns `hex,cycles_per_100_iterations,source_app,spread` copied
  verbatim;
- `mca-small.csv`: 2,000 blocks drawn uniformly (seeded) from `bhive/blocks.csv` among
  those that llvm-mca labelled under all three models, in corpus order, with
  `hex,haswell_100,haswell_200,skylake_100,skylake_200,znver3_100,znver3_200` from
  `mca/{haswell,skylake,znver3}.csv` (Total Cycles for 100 and 200 iterations);
- `corpus-sample.csv`: 6,000 blocks drawn uniformly (seeded) from `bhive/blocks.csv`,
  in corpus order, with its columns `hex,apps` copied: the blocks `diffsim calibrate`
  measures on a user's CPU (a user has no shared folder);
- `BHIVE-LICENSE.txt`: BHive's MIT licence, copied.
The same seed and the same shared files give byte-identical outputs. The folder's
README.md (written by hand) documents the files.
"""

from __future__ import annotations

import argparse
import csv
import shutil
import sys
from pathlib import Path

import numpy as np

from diffsim.data.shipped import _SHIPPED_DIR, shared_data_dir

ZEN5_N = 3000
ZEN5_MAX_SPREAD = 0.05
MCA_N = 2000
MCA_CPUS = ("haswell", "skylake", "znver3")
CORPUS_N = 6000


def _read(path: Path) -> tuple[list[str], list[list[str]]]:
  with open(path, newline="") as f:
    rows = list(csv.reader(f))
  return rows[0], rows[1:]


def _write(path: Path, header: list[str], rows: list[list[str]]) -> None:
  with open(path, "w", newline="") as f:
    w = csv.writer(f, lineterminator="\n")
    w.writerow(header)
    w.writerows(rows)


def _sample(n_pool: int, n: int, rng: np.random.Generator) -> list[int]:
  """n distinct positions out of n_pool, returned in increasing (file) order."""
  if n_pool < n:
    raise ValueError(f"only {n_pool} eligible rows, {n} wanted")
  return sorted(rng.choice(n_pool, size=n, replace=False).tolist())


def make_zen5(shared: Path, out: Path, seed: int) -> int:
  header, rows = _read(shared / "measured" / "zen5-measured.csv")
  assert header == ["hex", "cycles_per_100_iterations", "source_app", "spread"], header
  pool = [r for r in rows if float(r[3]) <= ZEN5_MAX_SPREAD]
  # A separate stream per file, so changing one file's size leaves the other alone.
  picked = _sample(len(pool), ZEN5_N, np.random.default_rng([seed, 1]))
  _write(out / "zen5-small.csv", header, [pool[i] for i in picked])
  return len(picked)


def make_mca(shared: Path, out: Path, seed: int) -> int:
  _, blocks = _read(shared / "bhive" / "blocks.csv")
  labels = {}
  for cpu in MCA_CPUS:
    header, rows = _read(shared / "mca" / f"{cpu}.csv")
    assert header == ["hex", "total_cycles_100", "total_cycles_200"], header
    labels[cpu] = {r[0]: (r[1], r[2]) for r in rows}
  pool = []
  for b in blocks:
    vals = [v for cpu in MCA_CPUS for v in labels[cpu].get(b[0], ("", ""))]
    if all(vals):  # the few blocks llvm-mc or llvm-mca rejected carry no labels
      pool.append([b[0], *vals])
  picked = _sample(len(pool), MCA_N, np.random.default_rng([seed, 2]))
  header = ["hex"] + [f"{cpu}_{n}" for cpu in MCA_CPUS for n in (100, 200)]
  _write(out / "mca-small.csv", header, [pool[i] for i in picked])
  return len(picked)


def make_corpus(shared: Path, out: Path, seed: int) -> int:
  header, rows = _read(shared / "bhive" / "blocks.csv")
  assert header[:2] == ["hex", "apps"], header
  picked = _sample(len(rows), CORPUS_N, np.random.default_rng([seed, 3]))
  _write(out / "corpus-sample.csv", ["hex", "apps"], [rows[i][:2] for i in picked])
  return len(picked)


def main(argv: list[str] | None = None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  ap.add_argument("--shared", type=Path, default=None, help="the shared data folder")
  ap.add_argument("--seed", type=int, default=0)
  ap.add_argument("--out", type=Path, default=_SHIPPED_DIR)
  args = ap.parse_args(argv)
  shared = args.shared or shared_data_dir()
  if shared is None:
    print("shared data folder not found; pass --shared", file=sys.stderr)
    return 1
  args.out.mkdir(parents=True, exist_ok=True)
  n1 = make_zen5(shared, args.out, args.seed)
  n2 = make_mca(shared, args.out, args.seed)
  n3 = make_corpus(shared, args.out, args.seed)
  shutil.copyfile(shared / "bhive" / "LICENSE.txt", args.out / "BHIVE-LICENSE.txt")
  for name in ("zen5-small.csv", "mca-small.csv", "corpus-sample.csv", "BHIVE-LICENSE.txt"):
    print(f"{args.out / name}: {(args.out / name).stat().st_size:,} bytes")
  print(f"zen5-small: {n1} blocks, mca-small: {n2} blocks, corpus-sample: {n3} blocks, "
        f"seed {args.seed}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
