"""Single-instruction micro-benchmarks ("anchors") for fitting a table to the CPU at hand.

A fitted table can buy a lower training error with wrong per-opcode numbers: an opcode
that is rarely critical absorbs errors made elsewhere. One instruction run alone in a
loop is clean evidence of its own latency (when it reads what it writes) or its
throughput. This script picks, from the training part of a measured CSV (split seed 0,
`--app` left out like `fit_zen5.py` leaves it out), up to `--forms` operand forms per
opcode key and up to `--per-key` instructions in all, and measures each one alone with
`diffsim measure` on this machine. `fit_zen5.py --anchors OUT.csv` then fits on them
beside the measured blocks. Run it only on the CPU the measured CSV came from.

  python benchmarks/measure_anchors.py --data graniterapids-measured.csv \
      -o diffsim/data/shipped/graniterapids-anchors.csv
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np

from diffsim.data import load_csv, shared_data_dir
from diffsim.data.split import split_ids
from diffsim.fit.anchors import chains, pick
from diffsim.isa import decode_blocks

def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--data", default="graniterapids-measured.csv",
                  help="a file of ../shared/data/measured, measured on this CPU")
  ap.add_argument("--app", default="redis-server", help="application left out entirely")
  ap.add_argument("--forms", type=int, default=4, help="operand forms per opcode key")
  ap.add_argument("--per-key", type=int, default=4, help="instructions per opcode key")
  ap.add_argument("--chains", action="store_true",
                  help="also each instruction rewritten to read its own result (its latency)")
  ap.add_argument("-o", "--output", required=True, help="the anchors' measured CSV")
  args = ap.parse_args()
  shared = shared_data_dir()
  if shared is None or not (shared / "measured" / args.data).exists():
    raise SystemExit(f"../shared/data/measured/{args.data} not found")
  ds = load_csv(shared / "measured" / args.data)
  apps = np.asarray(ds.extra.get("source_app", [""] * len(ds)))
  train = np.flatnonzero((split_ids(ds.hex, seed=0) == 0) & (apps != args.app))
  blocks = [b for b in decode_blocks([ds.hex[i] for i in train])
            if not isinstance(b, Exception)]
  rows = pick(blocks, args.forms, args.per_key)
  rows += chains(rows) if args.chains else []
  print(f"{len(rows)} instructions of {len({k for k, _, _ in rows})} opcode keys, "
        f"from {len(blocks)} training blocks")
  with tempfile.TemporaryDirectory() as tmp:
    todo = Path(tmp) / "anchors.csv"
    todo.write_text("hex\n" + "".join(f"{h}\n" for _, h, _ in rows))
    subprocess.run([sys.executable, "-m", "diffsim", "measure", str(todo), "-o",
                    args.output], check=True)


if __name__ == "__main__":
  main()
