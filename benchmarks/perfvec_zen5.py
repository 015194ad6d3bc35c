"""The pretrained PerfVec adapted to Zen 5 from K measured blocks, beside the simulator's
table and gradient-boosted trees on opcode counts trained on the same K rows.

Data: ../shared/data/measured/zen5-measured.csv split as benchmarks/fit_zen5.py splits
it (`split_ids` seed 0, 80/10/10 by block hash; redis-server held out entirely; training
rows with a measurement spread above 5% left out). The K rows are a seeded draw from the
training part; every predictor is scored on the same seeded `--test` blocks of the test
part (and on redis-server's blocks).

Predictors at each K:
- PerfVec: `perfvec.adapt.adapt` (what `diffsim perfvec adapt` runs), the uarch vector
  alone, with `--fine-tune`'s refit of the last program layer, and with `--retrain`'s
  (`diffsim perfvec adapt --fine-tune all`) of the whole program encoder at K >=
  `--retrain-min-k`;
- the simulator: the zen5-facts table (znver3 with Zen 5's public facts) fitted by
  gradient descent (`diffsim.fit.fit`, `--sim-epochs`) on the K rows; at K = all, the
  shipped zen5 table, which the exact search fitted on all training rows;
- trees on opcode counts (`diffsim.fit.trees.OpcodeTrees`) fitted on the K rows.

  python benchmarks/perfvec_zen5.py [--ks 32,128,512,2048,all] [--test 1000] [--retrain]
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np

from diffsim.cli import sim_predict, tune_xla
from diffsim.cli.common import enable_compile_cache
from diffsim.data import load_csv, metrics, shared_data_dir
from diffsim.data.split import split_ids


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--ks", default="32,128,512,2048,all")
  ap.add_argument("--test", type=int, default=1000, help="test-part blocks scored (seeded)")
  ap.add_argument("--sim-epochs", type=int, default=3, help="0: no simulator fit")
  ap.add_argument("--sim-max-k", type=int, default=512, help="largest K fitted by gradient")
  ap.add_argument("--fine-tune", action="store_true", help="also the fine-tuned PerfVec")
  ap.add_argument("--retrain", action="store_true",
                  help="also PerfVec with its program encoder retrained (fine-tune all)")
  ap.add_argument("--retrain-min-k", type=int, default=512)
  ap.add_argument("--only", choices=("all", "baselines", "perfvec"), default="all",
                  help="baselines: only the simulator and trees (OUT/baselines.json, no model "
                       "needed); perfvec: only PerfVec, with OUT/baselines.json's columns")
  ap.add_argument("--out", default="runs/perfvec-zen5")
  ap.add_argument("--model", default=None, help="a model DIR (default: the shipped one)")
  ap.add_argument("--print", action="store_true",
                  help="only print the tables of OUT/report.json and OUT/baselines.json")
  ap.add_argument("--write-rows", action="store_true",
                  help="only write OUT/zen5-train-K.csv, the K rows of each K, for the CLI "
                       "(`diffsim perfvec adapt`), and stop")
  args = ap.parse_args()
  tune_xla()
  enable_compile_cache()
  from diffsim.fit import FitConfig, fit
  from diffsim.fit.trees import OpcodeTrees
  from diffsim.isa import decode_blocks
  from diffsim.params.table import Table, load_table
  from diffsim.perfvec import load
  from diffsim.perfvec.adapt import adapt, programs, usable

  out = Path(args.out)
  out.mkdir(parents=True, exist_ok=True)
  if args.print:
    rows = json.loads((out / "report.json").read_text())
    base = {r["K"]: r for r in json.loads((out / "baselines.json").read_text())} \
        if (out / "baselines.json").exists() else {}
    rows = [{**base.get(r["K"], {}), **r} for r in rows]
    print_tables(rows, args.test, args.test)
    return
  ds = load_csv(shared_data_dir() / "measured" / "zen5-measured.csv")
  apps = np.asarray(ds.extra["source_app"])
  spread = np.asarray(ds.extra["spread"], np.float64)
  part = split_ids(ds.hex, seed=0)
  t = time.time()
  blocks = decode_blocks(list(ds.hex))
  ok_rows, _ = usable(blocks, ds.y)
  good = np.zeros(len(ds), bool)
  good[ok_rows] = True
  rng = np.random.default_rng(0)
  train = rng.permutation(np.flatnonzero((part == 0) & (apps != "redis-server")
                                         & (spread <= 0.05) & good))
  test = np.sort(rng.permutation(np.flatnonzero((part == 2) & (apps != "redis-server")
                                                & good))[:args.test])
  redis = np.sort(rng.permutation(np.flatnonzero((apps == "redis-server") & good))[:args.test])
  print(f"{len(ds)} Zen 5 blocks, decoded in {time.time() - t:.0f} s: {len(train)} training "
        f"rows; scoring on {len(test)} test-part blocks and {len(redis)} redis-server blocks")
  ks = [len(train) if k == "all" else int(k) for k in args.ks.split(",")]
  if args.write_rows:
    for K in ks:
      path = out / f"zen5-train-{K}.csv"
      path.write_text("hex,cycles_per_100_iterations\n"
                      + "".join(f"{ds.hex[i]},{ds.y[i]:.2f}\n" for i in train[:K]))
      print(f"wrote {path}")
    return
  take = lambda ids: [blocks[i] for i in ids]  # noqa: E731
  base_file = out / "baselines.json"
  baselines = ({r["K"]: r for r in json.loads(base_file.read_text())}
               if args.only == "perfvec" and base_file.exists() else {})
  if args.only != "baselines":
    trained = load(args.model)
    t = time.time()
    p_test, p_redis = trained.embed(take(test)), trained.embed(take(redis))
    print(f"embedded the scored blocks in {time.time() - t:.0f} s", flush=True)
    t = time.time()
    p_train = trained.embed(take(train[:max(ks)]))
    print(f"embedded {max(ks)} training rows in {time.time() - t:.0f} s", flush=True)

  def score(pred, ids):
    return dict(mape=metrics.mape(pred, ds.y[ids]), tau=metrics.kendall_tau(pred, ds.y[ids]))

  rows = []
  shipped = load_table("zen5")
  for K in ks:
    ids = train[:K]
    row = dict(K=K, **{k: v for k, v in baselines.get(K, {}).items() if k != "K"})
    if args.only != "baselines":
      t = time.time()
      a = adapt(trained, take(ids), ds.y[ids], programs=p_train[:K])
      row["perfvec_s"] = time.time() - t
      row["perfvec"] = score(trained.predict(p_test, a.uarch), test)
      row["perfvec_redis"] = score(trained.predict(p_redis, a.uarch), redis)
      row["perfvec_cv"], row["init"] = a.cv_mape, a.init
    if args.fine_tune and args.only != "baselines":
      t = time.time()
      f = adapt(trained, take(ids), ds.y[ids], fine_tune=True, programs=p_train[:K])
      row["fine_s"] = time.time() - t
      row["fine"] = score(trained.predict(programs(trained, take(test), f), f.uarch), test)
      row["fine_redis"] = score(trained.predict(programs(trained, take(redis), f), f.uarch),
                                redis)
      row["fine_cv"] = f.cv_mape
    if args.retrain and args.only != "baselines" and K >= args.retrain_min_k:
      t = time.time()
      f = adapt(trained, take(ids), ds.y[ids], fine_tune="all", programs=p_train[:K],
                log=print)
      row["retrain_s"] = time.time() - t
      row["retrain"] = score(trained.predict(programs(trained, take(test), f), f.uarch), test)
      row["retrain_redis"] = score(
          trained.predict(programs(trained, take(redis), f), f.uarch), redis)
      row["retrain_cv"] = f.cv_mape
    if args.only == "perfvec":
      rows.append(row)
      print(json.dumps(row, default=float), flush=True)
      continue
    t = time.time()
    trees = OpcodeTrees().fit(take(ids), ds.y[ids])
    row["trees"] = score(trees.predict(take(test)), test)
    row["trees_redis"] = score(trees.predict(take(redis)), redis)
    row["trees_s"] = time.time() - t
    table = None
    if K == len(train):
      table, row["sim_how"] = shipped, "shipped zen5 (exact search, all training rows)"
    elif args.sim_epochs and K <= args.sim_max_k:
      t = time.time()
      start = load_table("zen5-facts")
      res = fit(start, ds.take(ids), None, out / f"fit-K{K}",
                FitConfig(epochs=args.sim_epochs, batch_size=min(64, K)), progress=False,
                log=lambda *_: None, throw=False)
      table = Table(res.params, start.structure, start.layout)
      row["sim_how"], row["sim_fit_s"] = f"zen5-facts, fit {args.sim_epochs} epochs", \
          time.time() - t
    if table is not None:
      for name, sel in (("sim", test), ("sim_redis", redis)):
        pred = np.array([np.nan if v is None else v
                         for v, _ in sim_predict(table, take(sel), 100, "steady", False)])
        row[name] = score(pred, sel)
    rows.append(row)
    print(json.dumps(row, default=float), flush=True)
    name = "baselines.json" if args.only == "baselines" else "report.json"
    (out / name).write_text(json.dumps(rows, indent=1, default=float))
  if args.only == "baselines":
    return
  (out / "report.json").write_text(json.dumps(rows, indent=1, default=float))

  print_tables(rows, len(test), len(redis))


def print_tables(rows, n_test, n_redis):
  def cell(r, key):
    return f"{100 * r[key]['mape']:.1f}% ({r[key]['tau']:.3f})" if key in r else "-"

  fine_tune, retrain = (any(k in r for r in rows) for k in ("fine", "retrain"))

  for suffix, title in (("", f"test part ({n_test} blocks)"),
                        ("_redis", f"redis-server ({n_redis} blocks)")):
    print(f"\nZen 5, {title}: MAPE (Kendall tau) after K measured training rows")
    heads = ["PerfVec adapt", *(["PerfVec adapt --fine-tune"] if fine_tune else []),
             *(["PerfVec adapt --fine-tune all"] if retrain else []),
             "simulator table", "trees on opcode counts"]
    print("| K | " + " | ".join(heads) + " | PerfVec CV (its own estimate) |")
    print("|---|" + "---|" * (len(heads) + 1))
    for r in rows:
      cells = [cell(r, "perfvec" + suffix),
               *([cell(r, "fine" + suffix)] if fine_tune else []),
               *([cell(r, "retrain" + suffix)] if retrain else []),
               cell(r, "sim" + suffix), cell(r, "trees" + suffix)]
      cv = f"{100 * r['perfvec_cv']:.1f}%" if "perfvec_cv" in r else "-"
      print(f"| {r['K']:,} | " + " | ".join(cells) + f" | {cv} |")


if __name__ == "__main__":
  main()
