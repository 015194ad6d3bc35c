"""The `diffsim perfvec` subcommands: train on simulator sweeps, embed, predict, adapt
to a measured CPU, and rank candidate tables (design-space exploration).

  diffsim perfvec train [IN.csv | --shipped NAME] --out DIR     resumable
  diffsim perfvec embed IN.csv [--model DIR] -o VECS.npy
  diffsim perfvec predict IN.csv [--model DIR] --uarch NAME|PARAMS.json|UARCH.npz -o OUT.csv
  diffsim perfvec adapt MEASURED.csv [--model DIR] [--fine-tune [last|all]] -o UARCH.npz
  diffsim perfvec dse IN.csv [--model DIR] --base zen5 --candidates 1000 [--check 10]

Without --model, the pretrained model that ships in the package is used
(diffsim/perfvec/pretrained, trained by benchmarks/perfvec_pretrain.py).

`train` labels the input's blocks on llvm-mca tables and tables sampled around them
(`diffsim.params.sample`) with the simulator, fits the model, and writes DIR/model.npz,
DIR/model.json, DIR/history.json and DIR/report.json. `embed` writes one program vector
per input row (NaN for a row it cannot embed; the reasons go to stderr). `predict`
writes `hex,prediction,error` like `diffsim simulate`, in cycles per 100 iterations:
`--uarch` names a training uarch (its own vector), an `adapt` output (UARCH.npz), or any
table: the encoder's vector, adapted on `--probes` of the model's probe blocks simulated
on that table (0: the encoder's vector alone). `adapt` fits a uarch vector to measured
throughputs (BHive format) and reports its cross-validated error; it refuses, naming
why, when fewer than 8 rows are usable (256 for `--fine-tune all`, which retrains the
whole program encoder, reports its error on a tenth of the rows kept out, and checkpoints
every epoch in OUT.retrain-HASH/, so that the same command resumes after an interruption). `dse` ranks candidate tables sampled around a
base by their mean predicted cycles on the input's blocks.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import shutil
from pathlib import Path

from diffsim.cli.common import (CliError, add_hosts, add_input, decode_rows, enable_compile_cache,
                                non_negative_int, positive_int, read_rows, report_failures, say,
                                write_file, write_predictions)

PROBES = 1024  # diffsim.perfvec.reuse.PROBES, without importing jax for --help


def add_subcommand(subparsers) -> None:
  """Adds `perfvec` (train, embed, predict, adapt, dse) to the `diffsim` command."""
  top = subparsers.add_parser(
    "perfvec", help="PerfVec program and uarch representations (train, embed, predict, "
                    "adapt, dse)",
    description="Program vectors (an LSTM over the looped block) and microarchitecture "
                "vectors whose product predicts throughput, trained on the simulator's "
                "sweeps over llvm-mca tables and tables sampled around them.")
  sub = top.add_subparsers(dest="perfvec_command", metavar="ACTION", required=True)

  p = sub.add_parser("train", help="label blocks with simulator sweeps and train (resumable)")
  add_input(p)
  p.add_argument("--out", required=True, metavar="DIR",
                 help="model, checkpoints, label cache and report; rerunning resumes")
  p.add_argument("--train-tables", default="haswell,znver3", metavar="A,B",
                 help="llvm-mca tables trained on, with their samples (default haswell,znver3)")
  p.add_argument("--heldout-models", default="skylake", metavar="A,B",
                 help="tables held out entirely, for testing (default skylake; '' for none)")
  p.add_argument("--samples", type=int, default=32, help="sampled tables per base (32)")
  p.add_argument("--heldout-samples", type=int, default=8,
                 help="sampled tables per base kept for testing (8)")
  p.add_argument("--extra-blocks", type=non_negative_int, default=0,
                 help="more training blocks, each labelled on the first --extra-tables "
                      "training tables of each base only (0)")
  p.add_argument("--extra-tables", type=positive_int, default=8,
                 help="training tables per base that label the extra blocks (8)")
  p.add_argument("--blocks", type=positive_int, default=2000, help="blocks drawn (2000)")
  p.add_argument("--max-len", type=positive_int, default=32,
                 help="longest block drawn, in instructions (32)")
  p.add_argument("--heldout-app", default="",
                 help="a BHive application (apps column) kept out of training")
  p.add_argument("--dim", type=positive_int, default=256, help="vector width (256)")
  p.add_argument("--layers", type=positive_int, default=2, help="LSTM layers (2)")
  p.add_argument("--epochs", type=positive_int, default=30)
  p.add_argument("--batch-size", type=positive_int, default=64)
  p.add_argument("--lr", type=float, default=2e-3)
  p.add_argument("--encoder-steps", type=non_negative_int, default=2000,
                 help="steps of the table encoder's refit on frozen program vectors (2000)")
  p.add_argument("--encoder-tables", type=non_negative_int, default=0,
                 help="more sampled tables per base for the table encoder's refit alone, "
                      "each labelled on --encoder-blocks training blocks (0)")
  p.add_argument("--encoder-blocks", type=positive_int, default=400,
                 help="training blocks that label the encoder's tables (400)")
  p.add_argument("--seed", type=int, default=0)
  add_hosts(p)  # the label sweeps are shared out
  p.set_defaults(func=cmd_train)

  model_help = "a `perfvec train --out` DIR (default: the pretrained model shipped)"
  p = sub.add_parser("embed", help="program vectors of blocks (.npy, one row per input row)")
  add_input(p)
  p.add_argument("--model", metavar="DIR", help=model_help)
  p.add_argument("-o", "--output", required=True, metavar="VECS.npy")
  p.set_defaults(func=cmd_embed)

  p = sub.add_parser("predict", help="throughputs on a uarch, hex,prediction,error")
  add_input(p)
  p.add_argument("--model", metavar="DIR", help=model_help)
  p.add_argument("--uarch", required=True, metavar="NAME|PARAMS.json|UARCH.npz",
                 help="a training uarch (see the model's model.json), a shipped table, a "
                      "JSON table, or a `perfvec adapt` output")
  p.add_argument("--probes", type=non_negative_int, default=PROBES,
                 help="for a table not trained on: probe blocks simulated on it to adapt "
                      f"the encoder's vector ({PROBES}; 0: the encoder's vector alone)")
  p.add_argument("-o", "--output", metavar="OUT.csv", help="output CSV (default stdout)")
  p.set_defaults(func=cmd_predict)

  p = sub.add_parser("adapt", help="fit a uarch vector to measured throughputs (UARCH.npz)")
  add_input(p)
  p.add_argument("--model", metavar="DIR", help=model_help)
  p.add_argument("-o", "--output", required=True, metavar="UARCH.npz")
  p.add_argument("--init", metavar="NAME",
                 help="start from this uarch (default: the training uarch that predicts the "
                      "rows best)")
  p.add_argument("--fine-tune", nargs="?", const="last", choices=("last", "all"),
                 help="also refit the program encoder: `last` (the flag alone) its last "
                      "(linear) layer, pulled towards the trained one; `all` the whole "
                      "encoder, from thousands of rows (a tenth kept out to stop it)")
  p.add_argument("--folds", type=positive_int, default=5,
                 help="folds of the cross-validated error reported (5; `--fine-tune all` "
                      "reports its error on the tenth of the rows it kept out instead)")
  p.set_defaults(func=cmd_adapt)

  p = sub.add_parser("dse", help="rank candidate tables by mean predicted cycles on blocks")
  add_input(p)
  p.add_argument("--model", metavar="DIR", help=model_help)
  p.add_argument("--base", default="zen5", metavar="NAME",
                 help="candidates are tables sampled around this one (default zen5)")
  p.add_argument("--candidates", type=positive_int, default=1000, metavar="M",
                 help="candidate tables (1000)")
  p.add_argument("--seed", type=int, default=1, help="the candidates' sampling seed (1)")
  p.add_argument("--top", type=positive_int, default=10, help="rows written (10)")
  p.add_argument("--check", type=non_negative_int, default=0, metavar="N",
                 help="simulate the best N candidates on the blocks to check (0)")
  p.add_argument("-o", "--output", metavar="RANKING.csv", help="output CSV (default stdout)")
  p.set_defaults(func=cmd_dse)


def _names(s: str) -> tuple[str, ...]:
  return tuple(x for x in s.split(",") if x)


def cmd_train(args: argparse.Namespace) -> int:
  enable_compile_cache()  # the label sweeps' simulator programs
  from diffsim.data import load_csv
  from diffsim.perfvec import Experiment, build_data, evaluate, load, save, train

  path, rows = read_rows(args)
  try:
    ds = load_csv(path)
  except (OSError, ValueError) as e:
    raise CliError(f"{path}: {e}") from None
  hexes = list(ds.hex)[:args.limit] if args.limit else list(ds.hex)
  apps = ds.extra.get("apps")
  exp = Experiment(
    train_bases=_names(args.train_tables), heldout_models=_names(args.heldout_models),
    samples=args.samples, heldout_samples=args.heldout_samples,
    extra_blocks=args.extra_blocks, extra_tables=args.extra_tables, max_len=args.max_len,
    blocks=args.blocks, heldout_app=args.heldout_app, dim=args.dim, layers=args.layers,
    epochs=args.epochs, batch_size=args.batch_size, lr=args.lr, seed=args.seed,
    encoder_steps=args.encoder_steps, encoder_tables=args.encoder_tables,
    encoder_blocks=args.encoder_blocks)
  if not exp.train_bases:
    raise CliError("--train-tables: name at least one table")
  if args.heldout_app and apps is None:
    raise CliError(f"--heldout-app {args.heldout_app}: {path} has no apps column")
  out = Path(args.out)
  out.mkdir(parents=True, exist_ok=True)
  write_file(out / "experiment.json", json.dumps(exp.__dict__, indent=1))
  try:
    data = build_data(hexes, apps, exp, out / "labels", progress=args.progress, log=say)
  except (OSError, ValueError, KeyError) as e:
    raise CliError(str(e)) from None
  from diffsim.sim import hosts

  if not hosts.primary():
    return 0  # the label sweeps were shared out; process 0 trains and writes the model
  if not (data.part == 0).any():
    raise CliError(f"{path}: no block usable for training (need blocks of at most "
                   f"{exp.max_len} instructions that every table can simulate)")
  variables, cfg = train(data, exp, out, progress=args.progress, log=say)
  save(out, variables, cfg, exp, data)
  rows_ = evaluate(load(out), data)
  (out / "report.json").write_text(json.dumps(rows_, indent=1, default=float))
  for r in rows_:
    print(f"{r['what']}: MAPE {100 * r['mape']:.2f}%, Kendall tau {r['kendall_tau']:.3f} "
          f"({r['n']} pairs)")
  say(f"wrote {out / 'model.npz'}, {out / 'model.json'}, {out / 'report.json'}")
  return 0


def _load_model(args: argparse.Namespace):
  from diffsim.perfvec import load

  try:
    return load(args.model)
  except (OSError, ValueError) as e:
    raise CliError(f"--model {args.model}: {e}" if args.model else str(e)) from None


def _embed_rows(args: argparse.Namespace):
  """(trained model, hexes, vectors [N, dim] with NaN rows, (value, error) per row)."""
  import numpy as np

  from diffsim.perfvec.features import SEQ_BUCKETS

  trained = _load_model(args)
  _, rows = read_rows(args)
  blocks = decode_rows(rows, args.progress)
  status: list[tuple[float | None, str | None]] = []
  good = []
  for i, b in enumerate(blocks):
    if isinstance(b, Exception):
      status.append((None, f"decode: {b}"))
    elif not b.instrs:
      status.append((None, "empty block"))
    elif 2 * len(b.instrs) > SEQ_BUCKETS[-1]:
      status.append((None, f"block has {len(b.instrs)} instructions; PerfVec takes at most "
                           f"{SEQ_BUCKETS[-1] // 2}"))
    else:
      status.append((0.0, None))
      good.append(i)
  vecs = np.full((len(blocks), trained.cfg.dim), np.nan, np.float32)
  if good:
    vecs[good] = trained.embed([blocks[i] for i in good])
  return trained, [b.hex if not isinstance(b, Exception) else "" for b in blocks], vecs, status


def cmd_embed(args: argparse.Namespace) -> int:
  enable_compile_cache()  # the encoder's programs, one per sequence bucket
  import numpy as np

  _, _, vecs, status = _embed_rows(args)
  try:
    np.save(args.output, vecs)
  except OSError as e:
    raise CliError(f"cannot write {args.output}: {e.strerror}") from None
  report_failures("perfvec embed", status)
  say(f"wrote {args.output}: {vecs.shape[0]} x {vecs.shape[1]} program vectors")
  return 0


def cmd_predict(args: argparse.Namespace) -> int:
  enable_compile_cache()  # `adapt` simulates the probes
  from diffsim.cli.common import hex_field

  if args.uarch.endswith(".npz"):
    import numpy as np

    from diffsim.perfvec.adapt import Adapted, programs

    try:
      adapted = Adapted.load(args.uarch)
    except (OSError, ValueError, KeyError) as e:
      raise CliError(f"--uarch {args.uarch}: {e}") from None
    trained, _, vecs, status = _embed_rows(args)
    if adapted.model != trained.fingerprint:
      raise CliError(f"--uarch {args.uarch} was adapted for another model (fingerprint "
                     f"{adapted.model}, this one {trained.fingerprint}); adapt again with "
                     f"this --model")
    if adapted.kernel is not None or adapted.encoder is not None:  # the vectors change too
      _, rows = read_rows(args)
      good = [i for i, (_, err) in enumerate(status) if err is None]
      blocks = decode_rows([rows[i] for i in good], False)
      vecs[good] = programs(trained, blocks, adapted)
    u = np.asarray(adapted.uarch)
  else:
    trained, _, vecs, status = _embed_rows(args)
    try:
      u = trained.adapt(args.uarch, args.probes, log=say)
    except (OSError, ValueError, KeyError) as e:
      raise CliError(f"--uarch {args.uarch}: {e}") from None
  pred = trained.predict(vecs, u)
  out = [(float(p), None) if err is None else (None, err) for p, (_, err) in zip(pred, status)]
  _, rows = read_rows(args)
  write_predictions(args.output, [hex_field(r) for r in rows], out)
  report_failures("perfvec predict", out)
  return 0


def cmd_adapt(args: argparse.Namespace) -> int:
  enable_compile_cache()
  import numpy as np

  from diffsim.perfvec.adapt import adapt, check_rows, usable

  trained = _load_model(args)
  path, rows = read_rows(args)
  blocks = decode_rows(rows, args.progress)
  y = np.array([r.y for r in rows], np.float64)
  ok, reasons = usable(blocks, y)
  if len(ok) < len(rows) and any(r.error for r in rows):
    bad = sum(1 for r in rows if r.error)
    reasons = {**reasons, "are malformed rows": bad}
  # Retraining checkpoints every epoch beside the output, under a name that hashes the
  # model and the rows, so that a rerun of the same command resumes; gone once written.
  digest = hashlib.blake2b(trained.fingerprint.encode() + "".join(
      f"{blocks[i].hex},{y[i]}\n" for i in ok).encode(), digest_size=6).hexdigest()
  checkpoints = Path(f"{args.output}.retrain-{digest}")
  try:
    check_rows(len(rows), ok, reasons)
    a = adapt(trained, [blocks[i] for i in ok], y[ok], init=args.init,
              fine_tune=args.fine_tune or False, folds=args.folds, progress=args.progress,
              checkpoints=checkpoints if args.fine_tune == "all" else None, log=say)
  except (ValueError, KeyError) as e:
    raise CliError(f"{path}: {e}") from None
  try:
    a.save(args.output)
  except OSError as e:
    raise CliError(f"cannot write {args.output}: {e.strerror}") from None
  shutil.rmtree(checkpoints, ignore_errors=True)
  if len(ok) < len(rows):
    say(f"perfvec adapt: {len(rows) - len(ok)} of {len(rows)} rows left out ("
        + "; ".join(f"{n} {r}" for r, n in reasons.items()) + ")")
  how = "on the tenth kept out" if a.encoder is not None else "cross-validated"
  say(f"wrote {args.output}: MAPE {100 * a.cv_mape:.1f}% {how} ({a.rows} rows); "
      f"predict with `diffsim perfvec predict IN.csv --uarch {args.output}`")
  return 0


def cmd_dse(args: argparse.Namespace) -> int:
  import csv
  import sys
  import time

  import numpy as np

  from diffsim.cli.common import open_out
  from diffsim.perfvec.dse import candidates, encode_tables, rank_tables

  enable_compile_cache()
  t0 = time.time()
  trained, _, vecs, status = _embed_rows(args)
  good = [i for i, (_, err) in enumerate(status) if err is None]
  if not good:
    raise CliError("no block of the input could be embedded")
  try:
    cands = candidates(args.base, args.candidates, seed=args.seed)
  except (OSError, ValueError, KeyError) as e:
    raise CliError(f"--base {args.base}: {e}") from None
  t1 = time.time()
  uarchs = encode_tables(trained, cands)
  t2 = time.time()
  order, score = rank_tables(vecs[good], uarchs)
  t3 = time.time()
  say(f"perfvec dse: {len(good)} blocks embedded in {t1 - t0:.1f} s, {len(cands)} tables "
      f"encoded in {t2 - t1:.1f} s, ranked in {1e3 * (t3 - t2):.1f} ms")
  top = order[:args.top]
  sim = {}
  if args.check:
    from diffsim.sim import simulate_blocks

    _, rows = read_rows(args)
    blocks = decode_rows([rows[i] for i in good], False)
    for i in order[:args.check]:
      p = simulate_blocks(cands.at(int(i)), blocks, iterations=20, throughput="steady")
      c = np.array([np.nan if x.cycles is None else x.cycles for x in p])
      sim[int(i)] = float(np.nanmean(c))
  f = open_out(args.output)
  try:
    w = csv.writer(f, lineterminator="\n")
    w.writerow(["rank", "table", "predicted_mean", *(["simulated_mean"] if sim else [])])
    for r, i in enumerate(top):
      w.writerow([r + 1, cands.names[i], f"{score[i]:.2f}",
                  *([f"{sim[int(i)]:.2f}" if int(i) in sim else ""] if sim else [])])
  finally:
    if f is not sys.stdout:
      f.close()
  return 0
