"""Learning a Zen 5 (or Xeon 6) table from real measurements, against black-box models,
on held-out blocks.

Data: ../shared/data/measured/zen5-measured.csv (or the shipped 3,000-block sample
when ../shared is absent), split 80/10/10 by block hash with seed 0, and one
application (`--app`, redis-server by default) held out entirely: its blocks are in
no training or validation part and are reported on their own. Blocks whose
measurement passes disagreed by more than 5% (`spread`) are left out of training and
validation; the test parts keep them all.

The fit: start from `--init` (default `zen5-facts`: znver3 changed by the public Zen 5
facts, `diffsim.params.starts`), then `--exact` rounds of the exact per-opcode search
(`diffsim.fit.exact`) on every training block, the round chosen by validation MAPE.
Reported side by side, on the same blocks, in one run: llvm-mca 14 (`--mca-models`),
gradient-boosted trees on opcode counts trained on the same training blocks
(`diffsim.fit.trees`), with `--perfvec` the shipped PerfVec model adapted to the same
training blocks, the previously shipped table (`--compare`), the starting table and the
fitted one; MAPE, Kendall tau and within-5%, overall and per category.
`--anchors` adds single instructions measured alone on the same CPU
(`benchmarks/measure_anchors.py`) to the training rows, weighted `--anchor-weight`.

  python benchmarks/fit_zen5.py [--exact 3] [--out runs/zen5-bench] [--ship]
  python benchmarks/fit_zen5.py --data graniterapids-measured.csv --name graniterapids \
      --init graniterapids-facts --compare '' --mca-models skylake --out runs/gnr-bench
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from pathlib import Path

import jax
import numpy as np

from diffsim.cli import mca_predict, sim_predict, tune_xla
from diffsim.cli.common import enable_compile_cache
from diffsim.data import load_csv, metrics, shared_data_dir, shipped
from diffsim.data.split import split_ids
from diffsim.isa import decode_blocks
from diffsim.params.table import TABLES_DIR, load_table, write_json


def measured(name: str):
  shared = shared_data_dir()
  if shared is not None and (shared / "measured" / name).exists():
    return load_csv(shared / "measured" / name)
  if name != "zen5-measured.csv":
    raise SystemExit(f"../shared/data/measured/{name} not found")
  print("../shared not found: using the shipped 3,000-block sample")
  return load_csv(shipped("zen5-small.csv"))


def categories(blocks) -> dict[str, np.ndarray]:
  """Named masks: what a block does (loads, stores, stack, div, vector) and its length."""
  def facts(b):
    if isinstance(b, Exception):
      return {}
    ins = b.instrs
    n = len(ins)
    return {"load": any(i.loads and not i.stack for i in ins),
            "store": any(i.stores and not i.stack for i in ins),
            "no memory": not any(i.loads or i.stores for i in ins),
            "stack": any(i.stack for i in ins),
            "div": any(i.mnemonic in ("div", "idiv") for i in ins),
            "vector": any(r.reg.startswith(("XMM", "YMM", "ZMM"))
                          for i in ins for r in (*i.reads, *i.writes)),
            "<= 4 instrs": n <= 4, "5-12 instrs": 4 < n <= 12, "> 12 instrs": n > 12}
  rows = [facts(b) for b in blocks]
  names = ["load", "store", "no memory", "stack", "div", "vector", "<= 4 instrs",
           "5-12 instrs", "> 12 instrs"]
  return {k: np.array([r.get(k, False) for r in rows]) for k in names}


def score(pred, y) -> dict:
  s = metrics.summary(pred, y)
  return dict(mape=s["mape"], tau=s["kendall_tau"], w5=s["within_5pct"], n=s["n"])


def table_rows(results: dict[str, np.ndarray], y: np.ndarray, cats: dict) -> list[str]:
  head = "| predictor | MAPE | Kendall tau | within 5% | " + " | ".join(cats) + " |"
  lines = [head, "|" + "---|" * (4 + len(cats))]
  counts = "| blocks | | | | " + " | ".join(f"{int(m.sum()):,}" for m in cats.values()) + " |"
  for name, pred in results.items():
    s = score(pred, y)
    per = [f"{100 * metrics.mape(pred[m], y[m]):.1f}%" if m.any() else "-" for m in cats.values()]
    lines.append(f"| {name} | {100 * s['mape']:.1f}% | {s['tau']:.3f} | {100 * s['w5']:.1f}% | "
                 + " | ".join(per) + " |")
  return lines + [counts]


def perfvec_predictors(blocks, y) -> dict:
  """The shipped PerfVec adapted to the training rows: uarch vector alone, with its last
  program layer fine-tuned, and with its whole program encoder retrained (`diffsim
  perfvec adapt [--fine-tune [all]]`)."""
  from diffsim.perfvec import reuse
  from diffsim.perfvec.adapt import adapt, programs, usable

  t0 = time.time()
  trained = reuse.load()
  ok, _ = usable(blocks, y)
  blocks, y = [blocks[i] for i in ok], y[ok]
  P = trained.embed(blocks)
  out = {}
  for name, fine in (("uarch vector", False), ("fine-tuned", "last"),
                     ("encoder retrained", "all")):
    a = adapt(trained, blocks, y, fine_tune=fine, programs=P, folds=2,
              log=lambda s: print(f"PerfVec: {s}", flush=True))

    def predict(bl, a=a):
      pred = np.full(len(bl), np.nan)
      ok, _ = usable(bl, np.ones(len(bl)))
      if len(ok):
        pred[ok] = trained.predict(programs(trained, [bl[i] for i in ok], a), a.uarch)
      return pred

    out[f"PerfVec adapted to the same training blocks ({name})"] = predict
  print(f"PerfVec adapted in {time.time() - t0:.0f} s", flush=True)
  return out


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--data", default="zen5-measured.csv",
                  help="a file of ../shared/data/measured (graniterapids-measured.csv: the Xeon 6)")
  ap.add_argument("--name", default="zen5", help="the fitted table's CPU name")
  ap.add_argument("--init", default="zen5-facts")
  ap.add_argument("--compare", default="zen5", help="a shipped table reported beside (or '')")
  ap.add_argument("--exact", type=int, default=3, help="rounds of the exact search")
  ap.add_argument("--cap", type=int, default=48, help="judging blocks per opcode")
  ap.add_argument("--app", default="redis-server", help="application held out entirely")
  ap.add_argument("--train-limit", type=int, default=0, help="training blocks (0 = all)")
  ap.add_argument("--mca-models", default="znver3")
  ap.add_argument("--out", default="runs/zen5-bench")
  ap.add_argument("--anchors", default="",
                  help="single-instruction micro-benchmarks measured on the same CPU "
                       "(benchmarks/measure_anchors.py; a shipped name or a path), fitted "
                       "beside the training blocks")
  ap.add_argument("--anchor-weight", type=float, default=4.0,
                  help="how much one anchor's error counts against one block's")
  ap.add_argument("--perfvec", action="store_true",
                  help="also report the shipped PerfVec model adapted to the same training "
                       "rows (`diffsim.perfvec.adapt`): its uarch vector alone, fine-tuned, and "
                       "with its program encoder retrained")
  ap.add_argument("--ship", action="store_true",
                  help="copy the fitted table to diffsim/params/tables/NAME.json")
  args = ap.parse_args()
  tune_xla()
  enable_compile_cache()
  from diffsim.fit.recipe import Rows, fit_measured
  from diffsim.fit.trees import OpcodeTrees
  from diffsim.params.export import to_json

  out = Path(args.out)
  out.mkdir(parents=True, exist_ok=True)
  ds = measured(args.data)
  apps = np.asarray(ds.extra.get("source_app", [""] * len(ds)))
  spread = np.asarray(ds.extra.get("spread", [0.0] * len(ds)), np.float64)
  part = split_ids(ds.hex, seed=0)
  unseen = apps == args.app
  train_ids = np.flatnonzero((part == 0) & ~unseen & (spread <= 0.05))
  if args.train_limit and len(train_ids) > args.train_limit:
    rng = np.random.default_rng(0)
    train_ids = np.sort(rng.choice(train_ids, args.train_limit, replace=False))
  val_ids = np.flatnonzero((part == 1) & ~unseen & (spread <= 0.05))
  test_ids = np.flatnonzero((part == 2) & ~unseen)
  app_ids = np.flatnonzero(unseen)
  print(f"{len(ds)} measured blocks: {len(train_ids)} train, {len(val_ids)} validation "
        f"(stable only), {len(test_ids)} test, {len(app_ids)} of {args.app} held out")
  t0 = time.time()
  blocks = decode_blocks(list(ds.hex))
  print(f"decoded in {time.time() - t0:.0f} s")
  take = lambda ids: [blocks[i] for i in ids]  # noqa: E731

  t0 = time.time()
  trees = OpcodeTrees().fit(take(train_ids), ds.y[train_ids])
  trees_s = time.time() - t0
  start = load_table(args.init)
  train = Rows.of(take(train_ids), ds.y[train_ids])
  anchors = None
  if args.anchors:
    a = load_csv(args.anchors if Path(args.anchors).exists() else shipped(args.anchors))
    ok = np.isfinite(a.y) & (np.asarray(a.extra["spread"], np.float64) <= 0.05)
    anchors = Rows.of(decode_blocks([h for h, good in zip(a.hex, ok) if good]), a.y[ok])
  t0 = time.time()
  refined = fit_measured(start, train, anchors=anchors, anchor_weight=args.anchor_weight,
                         val=Rows.of(take(val_ids), ds.y[val_ids]), rounds=args.exact,
                         cap=args.cap, state_dir=out / "exact")
  fit_s = time.time() - t0
  doc = to_json(refined.table, cpu=args.name,
                source=f"diffsim.fit.exact from {args.init} on {len(train_ids)} measured "
                       f"blocks ({args.data}, split seed 0, {args.app} held out)"
                       + (f" and {len(anchors)} anchors ({args.anchors})"
                          if anchors is not None else "") + f", {args.exact} rounds")
  write_json(doc, out / "params.json")
  (out / "history.json").write_text(json.dumps(refined.history, indent=1))
  fitted = load_table(str(out / "params.json"))
  jax.clear_caches()  # the search's programs: the reports below compile their own

  def sim(table):
    return lambda bl: np.array([np.nan if v is None else v
                                for v, _ in sim_predict(table, bl, 100, "steady", False)])

  predictors = {f"llvm-mca -mcpu={m}": (lambda bl, m=m: np.array(
      [np.nan if v is None else v for v, _ in mca_predict(bl, m, 100, "steady", False)]))
      for m in args.mca_models.split(",") if m}
  predictors["trees on opcode counts (same training blocks)"] = trees.predict
  if args.perfvec:
    predictors.update(perfvec_predictors(take(train_ids), ds.y[train_ids]))
  if args.compare:
    predictors[f"diffsim, shipped {args.compare} (before)"] = sim(load_table(args.compare))
  predictors[f"diffsim, {args.init} (start)"] = sim(start)
  if args.exact:  # with no rounds the fitted table is the start
    predictors["diffsim, fitted (exact search)"] = sim(fitted)
  report = {}
  for title, ids in ((f"test part, seed 0 ({len(test_ids)} blocks)", test_ids),
                     (f"{args.app}, held out entirely ({len(app_ids)} blocks)", app_ids)):
    if not len(ids):
      continue
    bl, y = take(ids), ds.y[ids]
    results = {name: np.asarray(f(bl), np.float64) for name, f in predictors.items()}
    print(f"\n{title}:")
    print("\n".join(table_rows(results, y, categories(bl))))
    report[title] = {name: score(p, y) for name, p in results.items()}
  print(f"\nfit: {fit_s:.0f} s (exact search, {args.exact} rounds, validation MAPE "
        f"{100 * refined.val_mape:.2f}%); trees: {trees_s:.0f} s")
  report["fit_seconds"], report["history"] = fit_s, refined.history
  (out / "report.json").write_text(json.dumps(report, indent=1, default=float))
  if args.ship:
    shutil.copy(out / "params.json", TABLES_DIR / f"{args.name}.json")
    print(f"shipped as {TABLES_DIR / f'{args.name}.json'}")


if __name__ == "__main__":
  main()
