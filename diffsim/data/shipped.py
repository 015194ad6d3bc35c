"""The small datasets shipped inside the package, and the larger shared data folder.

The package carries a few small BHive-format files (under `diffsim/data/shipped/`,
made by `make_shipped.py`) so that tests, notebooks and examples run anywhere. The full
corpus, the full Zen 5 measurements and the corpus-wide llvm-mca labels stay outside the
package, in the shared data folder; code that needs them asks `shared_data_dir()` and
skips cleanly when it returns None.
"""

from __future__ import annotations

import os
from pathlib import Path

_SHIPPED_DIR = Path(__file__).resolve().parent / "shipped"

# name -> what it holds (the README in the folder gives the full provenance).
SHIPPED = {
  "zen5-small.csv": "3,000 Zen 5 measured blocks (spread <= 0.05); "
                    "hex,cycles_per_100_iterations,source_app,spread",
  "mca-small.csv": "2,000 BHive blocks with llvm-mca 14 Total Cycles; "
                   "hex,haswell_100,haswell_200,skylake_100,skylake_200,znver3_100,znver3_200",
  "graniterapids-anchors.csv": "2,224 single instructions (202 rewritten to read their own "
                               "result) measured alone on the Xeon 6 "
                               "(benchmarks/measure_anchors.py --chains); "
                               "hex,cycles_per_100_iterations,spread,error",
  "corpus-sample.csv": "6,000 BHive corpus blocks, a uniform seeded sample (the blocks "
                       "`diffsim calibrate` measures); hex,apps",
  "calibrate-zen4.json": "the report of `diffsim calibrate` (default settings) on an AMD "
                         "EPYC Zen 4 VM: stage times, probed structure, held-out table",
  "zen4-calibrate-measured.csv": "what that calibration measured (48 probes, 1,723 anchors, "
                                 "3,000 blocks); hex,cycles_per_100_iterations,spread,"
                                 "confidence,error,kind,name",
  "search-measured-xeon6.json": "every valid sse/avx2 configuration of the search tasks "
                                "(gemm, dot, axpy) measured on a Xeon 6; "
                                "{task: diffsim.search.measured.MeasuredSpace JSON}",
}


def shipped(name: str) -> Path:
  """The path of a shipped dataset.

  Args:
    name: one of `SHIPPED` (e.g. `"zen5-small.csv"`), or another file of the folder
      such as `"BHIVE-LICENSE.txt"`.

  Returns:
    Its absolute path.

  Raises:
    FileNotFoundError: no such shipped file (the message lists the known names).

  >>> shipped("zen5-small.csv").name
  'zen5-small.csv'
  """
  path = _SHIPPED_DIR / name
  if "/" in name or "\\" in name or not path.is_file():
    raise FileNotFoundError(
      f"no shipped dataset {name!r} in {_SHIPPED_DIR}; known: {', '.join(SHIPPED)}"
    )
  return path


def shared_data_dir() -> Path | None:
  """The shared data folder (`bhive/`, `measured/`, `mca/`), or None if absent.

  Looks at `$DIFFSIM_SHARED` first (when set, it alone decides), then at
  `../shared/data` relative to the repository root and to the working directory.

  Returns:
    The folder's absolute path, or None.
  """
  env = os.environ.get("DIFFSIM_SHARED")
  if env:
    p = Path(env).expanduser().resolve()
    return p if p.is_dir() else None
  repo_root = Path(__file__).resolve().parents[2]
  for base in (repo_root, Path.cwd()):
    p = (base / ".." / "shared" / "data").resolve()
    if p.is_dir():
      return p
  return None


def corpus_hexes(n: int | None = None, seed: int = 0) -> tuple[list[str], str]:
  """A seeded sample of BHive block hexes for experiments, and where it came from: the
  whole corpus (`bhive/blocks.csv` of the shared data) when present, else the 2,000
  blocks of the shipped `mca-small.csv`. The benchmarks' one sampler, so that their
  figures are taken on the same blocks.

  Args:
    n: blocks wanted (None: all, shuffled).
    seed: the shuffle's seed (`random.Random(seed)`).

  >>> hexes, source = corpus_hexes(5, seed=1)
  >>> len(hexes), source in ("BHive corpus", "shipped mca-small.csv")
  (5, True)
  """
  import csv
  import random

  shared = shared_data_dir()
  path = shared / "bhive" / "blocks.csv" if shared is not None else shipped("mca-small.csv")
  with open(path) as f:
    hexes = [r[0] for r in csv.reader(f)][1:]
  random.Random(seed).shuffle(hexes)
  return (hexes if n is None else hexes[:n],
          "BHive corpus" if shared is not None else "shipped mca-small.csv")
