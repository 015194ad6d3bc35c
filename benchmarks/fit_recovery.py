"""Does fitting through the simulator recover a known CPU table? (DiffTune's check)

The labels are llvm-mca 14's own skylake steady-state throughputs on the shipped BHive
blocks (`mca-small.csv`: skylake_200 - skylake_100, cycles per 100 iterations), so the
answer is known: the skylake table reproduces them. Two starts are fitted on the
training split: the haswell table (a close relative), and a random table with
haswell's structure and DiffTune's random numbers. For each start, before and after
the fit, the script prints the held-out (test split) MAPE and Kendall tau of the
exact simulator with the rounded table, and the distance of the table's numbers to
skylake's own, on the opcodes the training blocks use (the only ones a fit can learn).

  python benchmarks/fit_recovery.py [--epochs 8] [--limit N] [--out DIR] [--random-seed 0]
      [--lr 0.1] [--prior 0] [--starts haswell random] [--exact ROUNDS]
      [--anchors WEIGHT [--chains]]

Resource columns are compared where the names match after HW -> SKL; the structure
(which resources an opcode uses, reservations, the SKLPort05 group haswell lacks)
stays haswell's, so part of the distance cannot be closed by any fit.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
import tempfile
import time
from pathlib import Path

from diffsim.cli import tune_xla

tune_xla()  # one XLA CPU device per core, small loops whole: before JAX starts

import jax
import numpy as np

from diffsim.data import load_csv, metrics, shipped, split
from diffsim.fit import FitConfig, fit
from diffsim.isa import decode_blocks
from diffsim.isa.encode import table_key
from diffsim.params.export import to_json
from diffsim.params.table import WRITE_ROLES, Table, from_json, load_table
from diffsim.sim import simulate_blocks


def _compile_cache() -> None:
  """Reuses compiled simulator programs across runs (the `diffsim` command's cache)."""
  choice = os.environ.get("DIFFSIM_CACHE_DIR", "")
  if choice.lower() in ("off", "0", "none") or jax.config.jax_compilation_cache_dir:
    return
  path = Path(choice or "~/.cache/diffsim/jax").expanduser()
  try:
    path.mkdir(parents=True, exist_ok=True)
  except OSError:
    return
  jax.config.update("jax_compilation_cache_dir", str(path))
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 1.0)


def skylake_steady():
  """The shipped blocks labelled with llvm-mca's skylake steady state (per 100 its)."""
  ds = load_csv(shipped("mca-small.csv"))
  y = np.asarray(ds.extra["skylake_200"], float) - np.asarray(ds.extra["skylake_100"], float)
  ds = dataclasses.replace(ds, y=y, label="skylake_steady")
  return ds.take(np.flatnonzero(np.isfinite(y) & (y > 0)))


def with_anchors(blocks, y, weight: float, chained: bool = False):
  """The training blocks plus single instructions of them (`diffsim.fit.anchors`;
  with `chained`, also each one rewritten to read its own result), labelled like the
  blocks (llvm-mca skylake steady), and each row's weight."""
  from diffsim.cli import mca_predict
  from diffsim.fit.anchors import chains, pick

  good = [b for b in blocks if not isinstance(b, Exception)]
  rows = pick(good)
  rows += chains(rows) if chained else []
  alone = decode_blocks([h for _, h, _ in rows])
  labels = [v for v, _ in mca_predict(alone, "skylake", 100, "steady", False)]
  keep = [i for i, v in enumerate(labels) if v is not None and v > 0]
  print(f"# {len(keep)} anchors (single instructions, llvm-mca skylake"
        f"{', chained forms too' if chained else ''}), weight {weight:g}")
  return (list(blocks) + [alone[i] for i in keep],
          np.concatenate([y, [labels[i] for i in keep]]),
          np.concatenate([np.ones(len(y)), np.full(len(keep), weight)]))


def with_register_file(table: Table) -> Table:
  """`table` with one inert register file when it has none.

  Works around `diffsim.fit` checkpointing: orbax refuses zero-size arrays, and a
  table without register files (haswell, skylake) has empty `prf_size` and
  `move_elim_per_cycle`. A file that renames no register kind, of size 0
  (unbounded), never holds anything up, so the simulation is unchanged.
  """
  if np.size(table.params.prf_size):
    return table
  dtype = np.asarray(table.params.uops).dtype
  params = table.params.replace(prf_size=np.zeros(1, dtype),
                                move_elim_per_cycle=np.zeros(1, dtype))
  layout = dataclasses.replace(table.layout, file_kinds=((),))
  return dataclasses.replace(table, params=params, layout=layout)


def random_table(base: Table, seed: int) -> Table:
  """`base`'s structure and layout with DiffTune's random numbers (seeded).

  uops ~ U{1..4}; one latency ~ U{0..10} for every write role of an opcode; no read
  advance; each resource the base uses held U{1..4} cycles; dispatch width U{1..8}.
  The ROB and everything not fitted stay as in `base`.
  """
  rng = np.random.default_rng(seed)
  p = base.params
  K, E = np.shape(p.latency)
  dtype = np.asarray(p.uops).dtype
  used = np.asarray(p.res_cycles) > 0
  # Drawn in name order: the table's column order of groups whose names sort alike
  # (HWPort15, HWPort015) follows Python's string hashing, so differs between runs.
  names = list(base.layout.units) + list(base.layout.groups)
  canonical = sorted(names)
  cycles = rng.integers(1, 5, used.shape)[:, [canonical.index(n) for n in names]]
  params = p.replace(
      uops=rng.integers(1, 5, K).astype(dtype),
      latency=np.repeat(rng.integers(0, 11, (K, 1)), E, axis=1).astype(dtype),
      read_advance=np.zeros_like(np.asarray(p.read_advance)),
      res_cycles=np.where(used, cycles, 0).astype(dtype),
      dispatch_width=np.asarray(rng.integers(1, 9), dtype))
  return dataclasses.replace(base, params=params)


def rounded_table(table: Table, params, name: str) -> Table:
  """The integer table a fit exports (what the hard simulator is judged with)."""
  return from_json(to_json(table, params, cpu=name))


def held_out(table: Table, blocks, y) -> dict:
  """Steady-state accuracy of the exact simulator with `table` on decoded blocks."""
  preds = simulate_blocks(table, blocks, throughput="steady")
  pred = np.array([np.nan if p.cycles is None else p.cycles for p in preds])
  s = metrics.summary(pred, y)
  s["failed"] = int(np.sum(~np.isfinite(pred)))
  return s


def write_role(w) -> int:
  """The latency column (WRITE_ROLES) of a write, as `diffsim.isa.encode` assigns it."""
  name = (w.role if w.role.startswith("op") else w.reg)
  return WRITE_ROLES.index(name if name in WRITE_ROLES else "other")


def used_keys(table: Table, hexes) -> dict[str, set[int]]:
  """The opcode keys of `table` in the decoded blocks, each with the write roles seen."""
  used: dict[str, set[int]] = {}
  idx = table.layout.index
  for b in decode_blocks(list(hexes)):
    if isinstance(b, Exception):
      continue
    for ins in b.instrs:
      key = table_key(ins, idx)
      if key is not None:
        used.setdefault(key, set()).update(write_role(w) for w in ins.writes)
  return used


class Distance:
  """Mean absolute differences of a haswell-layout table's numbers to skylake's."""

  def __init__(self, layout, target: Table, used: dict[str, set[int]]):
    self.target = target
    common = sorted(k for k in used if k in target.layout.index)
    self.keys = common
    # Latency columns of the roles the blocks write: the only ones a fit can learn
    # (a role no instruction writes keeps its start value, and "max over roles" sees it).
    self.written = np.zeros((len(common), len(WRITE_ROLES)), bool)
    for i, k in enumerate(common):
      self.written[i, sorted(used[k])] = True
    self.has_write = self.written.any(1)
    self.rows = np.array([layout.index[k] for k in common])
    self.trows = np.array([target.layout.index[k] for k in common])
    names = list(layout.units) + list(layout.groups)
    tnames = list(target.layout.units) + list(target.layout.groups)
    pairs = [(i, tnames.index("SKL" + n[2:])) for i, n in enumerate(names)
             if n.startswith("HW") and "SKL" + n[2:] in tnames]
    self.cols = np.array([i for i, _ in pairs], int)
    self.tcols = np.array([j for _, j in pairs], int)
    self.matched = [names[i] for i in self.cols]

  def __call__(self, params) -> dict:
    t, r, tr = self.target.params, self.rows, self.trows
    def a(x):
      return np.asarray(x, np.float64)

    res = a(params.res_cycles)[np.ix_(r, self.cols)] - a(t.res_cycles)[np.ix_(tr, self.tcols)]
    w, h = self.written[self.has_write], self.has_write
    lat_w = (np.where(w, a(params.latency)[r[h]], -np.inf).max(1)
             - np.where(w, a(t.latency)[tr[h]], -np.inf).max(1))
    return {
        "uops": float(np.mean(np.abs(a(params.uops)[r] - a(t.uops)[tr]))),
        "latency": float(np.mean(np.abs(a(params.latency)[r].max(1)
                                        - a(t.latency)[tr].max(1)))),
        "latency_written": float(np.mean(np.abs(lat_w))),
        "res_cycles": float(np.mean(np.abs(res))),
        "dispatch_width": float(abs(a(params.dispatch_width) - a(t.dispatch_width))),
        "dispatch_width_value": float(a(params.dispatch_width)),
    }


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--epochs", type=int, default=8)
  ap.add_argument("--out", type=Path, default=None, help="fit checkpoints (default: a temp dir)")
  ap.add_argument("--random-seed", type=int, default=0, help="seed of the random table")
  ap.add_argument("--limit", type=int, default=None, help="use only the first N training blocks")
  ap.add_argument("--lr", type=float, default=0.1)
  ap.add_argument("--prior", type=float, default=0.0,
                  help="pull towards the start table (0: none, as in DiffTune)")
  ap.add_argument("--starts", nargs="+", default=["haswell", "random"],
                  choices=["haswell", "random"])
  ap.add_argument("--exact", type=int, default=0, metavar="ROUNDS",
                  help="instead of the gradient fit, this many rounds of the exact "
                       "per-opcode search (diffsim.fit.exact)")
  ap.add_argument("--anchors", type=float, default=0.0, metavar="WEIGHT",
                  help="with --exact: also fit single instructions of the training blocks "
                       "(diffsim.fit.anchors), labelled by llvm-mca skylake, at this weight")
  ap.add_argument("--chains", action="store_true",
                  help="with --anchors: also each anchor rewritten to read its own result "
                       "(`diffsim.fit.anchors.chains`), which shows its latency")
  args = ap.parse_args(argv)
  _compile_cache()
  out = args.out or Path(tempfile.mkdtemp(prefix="fit_recovery_"))

  ds = skylake_steady()
  train, val, test = split(ds, seed=0)
  if args.limit is not None:
    train = train.take(np.arange(min(args.limit, len(train))))
  print(f"# fit recovery: skylake steady labels from mca-small.csv; split seed 0: "
        f"{len(train)} train, {len(val)} val, {len(test)} test; {jax.device_count()} "
        f"{jax.devices()[0].platform} devices; jax {jax.__version__}; out {out}")

  sky, has = load_table("skylake"), with_register_file(load_table("haswell"))
  tables = {"haswell": has, "random": random_table(has, args.random_seed)}
  used = used_keys(has, train.hex)
  dist = Distance(has.layout, sky, used)
  print(f"# {len(used)} opcode keys used by the training blocks, {len(dist.keys)} of them "
        f"in both tables; resource columns matched HW->SKL: {len(dist.matched)} of "
        f"{has.layout.num_resources} ({', '.join(dist.matched)}); skylake has "
        f"{sky.layout.num_resources}")

  test_blocks = decode_blocks(list(test.hex))
  rows = []

  def report(name, table, params_for_distance):
    t0 = time.perf_counter()
    acc = held_out(table, test_blocks, test.y)
    d = params_for_distance(table)
    rows.append({"name": name, **acc, **{f"d_{k}": v for k, v in d.items()}})
    print(f"  {name}: MAPE {acc['mape']:.2%}, tau {acc['kendall_tau']:.3f}, "
          f"{acc['failed']} failed; distances {d} ({time.perf_counter() - t0:.0f} s)", flush=True)

  # The target against itself: distances are zero by construction.
  report("skylake (target)", sky, lambda t: {
      **dict.fromkeys(("uops", "latency", "latency_written", "res_cycles", "dispatch_width"),
                      0.0), "dispatch_width_value": float(t.params.dispatch_width)})
  config = FitConfig(epochs=args.epochs, batch_size=128, lr=args.lr, tau=0.5, prior=args.prior)
  timing = {}
  for start in args.starts:
    table = tables[start]
    report(f"{start} before", rounded_table(table, table.params, start),
           lambda t: dist(t.params))
    t0 = time.perf_counter()
    if args.exact:
      from diffsim.fit.exact import MOVES, refine

      start_table = rounded_table(table, table.params, start)
      blocks, y, weights = decode_blocks(list(train.hex)), train.y, np.ones(len(train))
      if args.anchors:
        blocks, y, weights = with_anchors(blocks, y, args.anchors, args.chains)
      refined = refine(start_table, blocks, y, MOVES, rounds=args.exact,
                       val=(decode_blocks(list(val.hex)), val.y), weights=weights,
                       state_dir=out / start / "exact",
                       log=lambda s: print(f"    {s}", flush=True))
      timing[start] = {"total": time.perf_counter() - t0, "epochs": []}
      report(f"{start} after exact search ({args.exact} rounds)", refined.table,
             lambda t: dist(t.params))
      continue
    result = fit(table, train, val, out / start, config, progress=False,
                 log=lambda s: print(f"    {s}", flush=True))
    total = time.perf_counter() - t0
    epochs = [h["seconds"] for h in result.history if h["epoch"] > 0]
    timing[start] = {"total": total, "epochs": epochs}
    report(f"{start} after", rounded_table(table, result.params, f"{start}-fit"),
           lambda t: dist(t.params))

  print(f"\n# held-out ({len(test)} test blocks) vs llvm-mca skylake steady; distances to "
        f"skylake's table over {len(dist.keys)} used opcodes (latency: max over all write "
        f"roles, and over the roles the training blocks write ({int(dist.has_write.sum())} "
        f"opcodes); res: {len(dist.matched)} matched columns)")
  print("| start table | MAPE | Kendall tau | uops | latency (all roles) | latency (written) "
        "| res cycles | dispatch width (value) |")
  print("|---|---|---|---|---|---|---|---|")
  for r in rows:
    print(f"| {r['name']} | {r['mape']:.2%} | {r['kendall_tau']:.3f} | {r['d_uops']:.3f} | "
          f"{r['d_latency']:.3f} | {r['d_latency_written']:.3f} | {r['d_res_cycles']:.3f} | "
          f"{r['d_dispatch_width']:.0f} ({r['d_dispatch_width_value']:.0f}) |")
  for start, t in timing.items():
    per = ", ".join(f"{s:.0f}" for s in t["epochs"])
    print(f"# {start}: fit {t['total']:.0f} s in all; seconds per epoch: {per} "
          f"(the first includes compilation)")
  summary = {"rows": rows, "timing": timing, "args": {k: str(v) for k, v in vars(args).items()}}
  (out / "recovery.json").write_text(json.dumps(summary, indent=1))
  return 0


if __name__ == "__main__":
  sys.exit(main())
