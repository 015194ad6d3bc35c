"""PerfVec trained on simulator sweeps: accuracy where training never looked, speed,
and the foundation-model use on real Zen 5 measurements.

1. Draws BHive blocks (../shared/data/bhive; the shipped mca-small sample without it),
   keeping one application out entirely, and labels them on every uarch with the
   simulator (training tables: llvm-mca's haswell and znver3 and tables sampled around
   them; held out: more sampled tables, and llvm-mca's skylake model entirely).
2. Trains PerfVec (`diffsim perfvec train` does the same) and prints MAPE and Kendall's
   tau against the simulator's labels for seen/unseen uarchs x unseen blocks and the
   held-out application, next to llvm-mca itself on the held-out model. Unseen tables
   are scored zero-shot (the table encoder) and adapted on M simulated probe blocks
   (`Trained.adapt`), for M from 32 to 1,024.
3. Speed: sweep labelling (pairs/s), training (blocks/s), prediction (pairs/s) beside
   the simulator and llvm-mca, embedding (blocks/s).
4. Zen 5: freezes everything but a new uarch vector, fits it on K measured blocks
   (K = 32, 128, 512) and reports held-out MAPE against the measurements, beside
   `diffsim fit` of the znver3 table on the same K blocks.

  python benchmarks/perfvec_eval.py [--out runs/perfvec] [--blocks 2000] [--samples 32]
      [--dim 256] [--epochs 30] [--quick]
"""

from __future__ import annotations

import argparse
import csv
import json
import time
from pathlib import Path

import numpy as np

from diffsim.cli import mca_predict, sim_predict, tune_xla
from diffsim.data import load_csv, metrics, shared_data_dir, shipped
from diffsim.fit import FitConfig, fit
from diffsim.isa import decode_blocks
from diffsim.params.table import Table, load_table
from diffsim.perfvec import Experiment, build_data, evaluate, load, save, train
from diffsim.perfvec.reuse import PROBES, fit_uarch


def corpus(limit: int, seed: int) -> tuple[list[str], list[str], str]:
  """(hexes, apps, source) of a seeded sample of the BHive corpus."""
  shared = shared_data_dir()
  if shared is None:
    ds = load_csv(shipped("mca-small.csv"))
    return list(ds.hex), [""] * len(ds), "shipped mca-small.csv (no ../shared)"
  with open(shared / "bhive" / "blocks.csv") as f:
    rows = list(csv.DictReader(f))
  pick = np.random.default_rng(seed).permutation(len(rows))[:limit]
  return ([rows[i]["hex"] for i in pick], [rows[i]["apps"] for i in pick],
          f"{len(pick)} of {len(rows)} BHive blocks (seed {seed})")


def table(rows: list[dict], title: str) -> None:
  print(f"\n{title}")
  print(f"| {'what':<72} | {'MAPE':>7} | {'tau':>5} | {'within 5%':>9} | {'pairs':>6} |")
  print(f"|{'-' * 74}|{'-' * 9}|{'-' * 7}|{'-' * 11}|{'-' * 8}|")
  for r in rows:
    print(f"| {r['what']:<72} | {100 * r['mape']:6.2f}% | {r['kendall_tau']:5.3f} | "
          f"{100 * r['within_5pct']:8.1f}% | {r['n']:>6} |")


def speed(trained, data, exp: Experiment, mca_cpu: str) -> list[dict]:
  """Predictions per second (after compiling): PerfVec (features, embedding and product),
  the simulator, llvm-mca."""
  test = [b for b, p in zip(data.blocks, data.part) if p >= 2]

  def timed(run):
    run()  # the first call compiles what the blocks' shapes need
    t = time.time()
    out = run()
    return out, time.time() - t

  u = trained.uarch(mca_cpu)
  (progs, _), t_pv = timed(lambda: (lambda p: (p, trained.predict(p, u)))(trained.embed(test)))
  sk = load_table(mca_cpu)
  sim, t_sim = timed(lambda: sim_predict(sk, test, exp.iterations, "steady", False))
  t = time.time()
  mca = mca_predict(test, mca_cpu, exp.iterations, "steady", False)
  t_mca = time.time() - t
  n = len(test)
  rows = [dict(what="PerfVec (embed + product)", per_s=n / t_pv),
          dict(what=f"diffsim simulate ({mca_cpu}, steady)", per_s=n / t_sim),
          dict(what=f"llvm-mca {mca_cpu} (1 process, steady)", per_s=n / t_mca)]
  lab = data.y[[i for i, x in enumerate(data.uarchs) if x.name == mca_cpu][0]][data.part >= 2]
  acc = dict(sim=metrics.mape([p for p, _ in sim], lab), mca=metrics.mape([p for p, _ in mca], lab),
             perfvec=metrics.mape(trained.predict(progs, u), lab),
             perfvec_adapted=metrics.mape(trained.predict(progs, trained.adapt(mca_cpu)), lab))
  return rows, acc


def zen5(trained, data, exp: Experiment, ks, out: Path, sim_epochs: int) -> list[dict]:
  """Fits a Zen 5 uarch vector (and, for comparison, the znver3 table) on K blocks."""
  shared = shared_data_dir()
  path = (shared / "measured" / "zen5-measured.csv") if shared else shipped("zen5-small.csv")
  ds = load_csv(path)
  seen = {b.hex for b in data.blocks}
  blocks = decode_blocks(list(ds.hex))
  ok = [i for i, b in enumerate(blocks)
        if not isinstance(b, Exception) and 0 < len(b.instrs) <= exp.max_len
        and b.hex not in seen and np.isfinite(ds.y[i]) and ds.y[i] > 0]
  rng = np.random.default_rng(exp.seed)
  ok = list(rng.permutation(ok))
  test, pool = ok[:1000], ok[1000:]
  progs = trained.embed([blocks[i] for i in test + pool[:max(ks)]])
  p_test, p_pool = progs[:len(test)], progs[len(test):]
  y_test = ds.y[test]
  init = trained.uarch("znver3")
  rows = [dict(K=0, perfvec=metrics.mape(trained.predict(p_test, init), y_test),
               perfvec_tau=metrics.kendall_tau(trained.predict(p_test, init), y_test))]
  z3 = load_table("znver3")
  sim0 = [p for p, _ in sim_predict(z3, [blocks[i] for i in test], 100, "steady", False)]
  rows[0].update(sim=metrics.mape(sim0, y_test), sim_tau=metrics.kendall_tau(sim0, y_test))
  for K in ks:
    t = time.time()
    u = fit_uarch(trained, p_pool[:K], ds.y[pool[:K]], init)
    pred = trained.predict(p_test, u)
    row = dict(K=K, perfvec=metrics.mape(pred, y_test),
               perfvec_tau=metrics.kendall_tau(pred, y_test), perfvec_s=time.time() - t)
    cv = trained.predict(p_test, fit_uarch(trained, p_pool[:K], ds.y[pool[:K]], init,
                                           prior="cv"))  # the pull chosen by CV
    row.update(perfvec_cv=metrics.mape(cv, y_test))
    if sim_epochs:
      t = time.time()
      train_ds = ds.take(pool[:K])
      # The CLI's defaults (lr 0.1), with batches small enough for several steps per
      # epoch; early stopping on the K blocks themselves, since there is nothing else.
      res = fit(z3, train_ds, None, out / f"zen5-fit-K{K}",
                FitConfig(epochs=sim_epochs, batch_size=min(32, K)), progress=False,
                log=lambda *_: None)
      learned = Table(res.params, z3.structure, z3.layout)
      sim = [p for p, _ in sim_predict(learned, [blocks[i] for i in test], 100, "steady", False)]
      row.update(sim=metrics.mape(sim, y_test), sim_tau=metrics.kendall_tau(sim, y_test),
                 sim_s=time.time() - t)
    rows.append(row)
    print(f"  K={K}: {row}", flush=True)
  return rows, len(test), str(path)


CURVE = (32, 64, 128, 256, 512, 1024)  # probe counts of the adaptation curve


def adaptation(trained, data, rows: list[dict]) -> list[dict]:
  """Unseen tables x unseen blocks as the number of simulated probe blocks grows (read
  from `evaluate`'s rows over CURVE), and what `Trained.adapt` costs for one table from
  scratch (simulation, compilation included)."""
  curve = []
  for m in (0,) + CURVE:
    how = f", adapted on {m} probes" if m else ""
    got = {r["what"].split(" x ")[0]: r["mape"] for r in rows
           if r["what"].startswith("held-out") and r["what"].endswith(f"x unseen blocks{how}")}
    if got:  # a small run keeps fewer probes than the largest counts
      curve.append(dict(probes=m, **got))
  name = next(u.name for u, r in zip(data.uarchs, data.role) if r == "heldout_model")
  t = time.time()
  trained.adapt(name)
  curve.append(dict(adapt_seconds=time.time() - t, table=name))
  t = time.time()
  trained.adapt(name)
  curve.append(dict(adapt_seconds_warm=time.time() - t, table=name))
  return curve


def embed_corpus(trained, limit: int) -> dict:
  """Embedding throughput over the BHive corpus (decode, features + LSTM, separately)."""
  from diffsim.perfvec.features import SEQ_BUCKETS, encode_sequences

  shared = shared_data_dir()
  if shared is None:
    return {}
  with open(shared / "bhive" / "blocks.csv") as f:
    hexes = [r["hex"] for r in csv.DictReader(f)][:limit or None]
  t = time.time()
  blocks = [b for b in decode_blocks(hexes) if not isinstance(b, Exception) and b.instrs
            and 2 * len(b.instrs) <= SEQ_BUCKETS[-1]]
  t_dec = time.time() - t
  t = time.time()
  for s in range(0, len(blocks), 4096):  # features alone (the host part of embedding)
    for blk in blocks[s:s + 4096]:
      encode_sequences([blk])
  t_feat = time.time() - t
  t = time.time()
  vecs = trained.embed(blocks)
  t_emb = time.time() - t
  r = dict(blocks=len(blocks), of=len(hexes), decode_s=t_dec, features_s=t_feat,
           embed_s=t_emb, blocks_per_s=len(blocks) / t_emb, finite=bool(np.isfinite(vecs).all()))
  print(f"\nembedding the corpus: {r['blocks']:,} of {r['of']:,} blocks (<= "
        f"{SEQ_BUCKETS[-1] // 2} instructions) in {t_emb:.0f} s = {r['blocks_per_s']:,.0f} "
        f"blocks/s (features and LSTM; features alone {t_feat:.0f} s), after decoding "
        f"({t_dec:.0f} s)")
  return r


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--out", default="runs/perfvec")
  ap.add_argument("--labels", help="label cache folder (default OUT/labels; labels depend "
                  "only on the blocks, tables and iterations, so runs can share them)")
  ap.add_argument("--lr", type=float, default=2e-3)
  ap.add_argument("--batch-size", type=int, default=64)
  ap.add_argument("--patience", type=int, default=6)
  ap.add_argument("--corpus", type=int, default=12000, help="BHive rows read (seeded sample)")
  ap.add_argument("--blocks", type=int, default=2000)
  ap.add_argument("--train-bases", default="haswell,znver3", metavar="A,B",
                  help="llvm-mca models trained on, each with --samples tables around it")
  ap.add_argument("--heldout-models", default="skylake", metavar="A,B",
                  help="llvm-mca models held out entirely")
  ap.add_argument("--samples", type=int, default=32)
  ap.add_argument("--heldout-samples", type=int, default=8)
  ap.add_argument("--extra-blocks", type=int, default=0,
                  help="more training blocks, labelled on --extra-tables tables per base")
  ap.add_argument("--extra-tables", type=int, default=8)
  ap.add_argument("--encoder-steps", type=int, default=2000)
  ap.add_argument("--encoder-tables", type=int, default=0,
                  help="more sampled tables per base for the table encoder's refit alone")
  ap.add_argument("--encoder-blocks", type=int, default=400)
  ap.add_argument("--heldout-app", default="sqlite")
  ap.add_argument("--max-len", type=int, default=32)
  ap.add_argument("--dim", type=int, default=256)
  ap.add_argument("--epochs", type=int, default=30)
  ap.add_argument("--sim-epochs", type=int, default=10,
                  help="epochs of the diffsim fit compared at each K (0: skip it)")
  ap.add_argument("--ks", default="32,128,512")
  ap.add_argument("--quick", action="store_true", help="a toy run (minutes)")
  ap.add_argument("--embed-corpus", type=int, default=None, metavar="N",
                  help="only embed the first N corpus blocks (0: all) with the model in --out")
  args = ap.parse_args()
  tune_xla()
  if args.quick:
    args.corpus, args.blocks, args.samples, args.heldout_samples = 1500, 200, 3, 2
    args.dim, args.epochs, args.max_len, args.ks, args.sim_epochs = 64, 2, 16, "32", 1
  if args.embed_corpus is not None:
    embed_corpus(load(args.out), args.embed_corpus)
    return
  exp = Experiment(train_bases=tuple(args.train_bases.split(",")),
                   heldout_models=tuple(args.heldout_models.split(",")), samples=args.samples,
                   heldout_samples=args.heldout_samples,
                   extra_blocks=args.extra_blocks, extra_tables=args.extra_tables,
                   encoder_steps=args.encoder_steps, encoder_tables=args.encoder_tables,
                   encoder_blocks=args.encoder_blocks,
                   max_len=args.max_len, blocks=args.blocks, heldout_app=args.heldout_app,
                   dim=args.dim, epochs=args.epochs, lr=args.lr, batch_size=args.batch_size,
                   patience=args.patience)
  out = Path(args.out)
  hexes, apps, source = corpus(args.corpus, exp.seed)
  print(f"blocks: {source}")
  t = time.time()
  data = build_data(hexes, apps, exp, Path(args.labels) if args.labels else out / "labels")
  t_data = time.time() - t
  variables, cfg = train(data, exp, out)
  save(out, variables, cfg, exp, data)
  trained = load(out)
  history = json.loads((out / "history.json").read_text())
  every = evaluate(trained, data, CURVE)
  rows = [r for r in every if "adapted on" not in r["what"]
          or r["what"].endswith(f"adapted on {min(PROBES, len(trained.probes))} probes")]
  table(rows, "PerfVec against the simulator's labels (steady state, cycles per 100 its):")
  adapt = adaptation(trained, data, every)
  print("\nunseen tables x unseen blocks, MAPE, against probe blocks simulated on each:")
  heads = [k for k in adapt[0] if k != "probes"]
  print("| probes | " + " | ".join(heads) + " |\n|---|" + "---|" * len(heads))
  for r in adapt[:-2]:
    print(f"| {r['probes']} | " + " | ".join(f"{100 * r[h]:.1f}%" for h in heads) + " |")
  print(f"Trained.adapt({adapt[-1]['table']!r}) with {PROBES} probes: "
        f"{adapt[-2]['adapt_seconds']:.1f} s (compiling included), "
        f"{adapt[-1]['adapt_seconds_warm']:.1f} s warm")
  spd, acc = speed(trained, data, exp, exp.heldout_models[0])
  print(f"\nheld-out model {exp.heldout_models[0]}, test and held-out-application blocks, "
        f"MAPE against the labels: "
        f"PerfVec {100 * acc['perfvec']:.2f}% (adapted on {PROBES} probes "
        f"{100 * acc['perfvec_adapted']:.2f}%), diffsim {100 * acc['sim']:.2f}%, "
        f"llvm-mca {100 * acc['mca']:.2f}%")
  print("\n| predictor | predictions/s |\n|---|---|")
  for r in spd:
    print(f"| {r['what']} | {r['per_s']:,.0f} |")
  fits = [h["blocks_per_s"] for h in history[1:]] or [history[0]["blocks_per_s"]]
  print(f"training: {np.median(fits):,.0f} blocks/s (median epoch; each block x "
        f"{cfg.train_tables} uarchs), labels+data {t_data:.0f} s")
  ks = [int(k) for k in args.ks.split(",") if k]
  z, n_test, zpath = zen5(trained, data, exp, ks, out, args.sim_epochs)
  print(f"\nZen 5 ({zpath}): uarch vector fitted on K measured blocks, encoder frozen; "
        f"MAPE on {n_test} held-out measured blocks (<= {exp.max_len} instructions):")
  print("| K | PerfVec MAPE | tau | PerfVec, pull by CV | diffsim fit (znver3 init) MAPE "
        "| tau |\n|---|---|---|---|---|---|")
  for r in z:
    sim = f"{100 * r['sim']:.1f}% | {r['sim_tau']:.3f}" if "sim" in r else "- | -"
    cv = f"{100 * r['perfvec_cv']:.1f}%" if "perfvec_cv" in r else "-"
    print(f"| {r['K']} | {100 * r['perfvec']:.1f}% | {r['perfvec_tau']:.3f} | {cv} | {sim} |")
  (out / "benchmark.json").write_text(json.dumps(
      dict(rows=rows, adaptation=adapt, speed=spd, heldout_model_mape=acc, zen5=z, history=history,
           experiment=vars(args)), indent=1, default=float))


if __name__ == "__main__":
  main()
