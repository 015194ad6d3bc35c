"""The core subcommands: decode, mca, simulate, eval, params, compare, fit."""

from __future__ import annotations

import argparse
import csv
import json
import math
import sys
import time
from pathlib import Path
from typing import Any

from diffsim.cli.common import (CliError, decode_rows, enable_compile_cache, fmt, hex_field,
                                input_path, load_table_arg, need_llvm, open_out, pct,
                                read_rows, report_failures, say, write_predictions)
from diffsim.cli.predict import decoded_in_background, mca_predict, sim_predict, sim_predict_chunks
from diffsim.llvmtools import TOOLS


def cmd_decode(args: argparse.Namespace) -> int:
  from diffsim.isa import DecodeError, block_to_json, summarize

  path, rows = read_rows(args)
  results = decode_rows(rows, args.progress)
  f = open_out(args.output)
  try:
    for row, res in zip(rows, results):
      if isinstance(res, DecodeError):
        doc: dict[str, Any] = {"hex": hex_field(row), "error": str(res)}
      else:
        doc = block_to_json(res)
      f.write(json.dumps(doc) + "\n")
  finally:
    if f is not sys.stdout:
      f.close()
  s = summarize(results)
  reasons = ", ".join(f"{n} {r}" for r, n in s["by_reason"].items())
  say(f"{path}: decoded {s['decoded']} of {s['blocks']} blocks ({s['instructions']} "
      f"instructions, {s['keys']} distinct opcode keys); failed {s['failed']}"
      + (f": {reasons}" if reasons else ""))
  return 0


def cmd_mca(args: argparse.Namespace) -> int:
  _, rows = read_rows(args)
  blocks = decode_rows(rows, args.progress)
  preds = mca_predict(blocks, args.mcpu, args.iterations, args.throughput, args.progress)
  write_predictions(args.output, [hex_field(r) for r in rows], preds)
  report_failures(f"llvm-mca -mcpu={args.mcpu}", preds)
  return 0


def cmd_simulate(args: argparse.Namespace) -> int:
  _, rows = read_rows(args)
  with decoded_in_background(rows) as chunks:  # the table and JAX load meanwhile
    table = load_table_arg(args.params)
    preds = sim_predict_chunks(table, chunks, len(rows), args.iterations, args.throughput,
                               args.progress, checkpoint=args.checkpoint)
  write_predictions(args.output, [hex_field(r) for r in rows], preds)
  report_failures(f"diffsim --params {args.params}", preds)
  return 0


def json_number(x: float) -> float | None:
  """JSON has no NaN: undefined metrics (too few blocks) become null."""
  return None if x is None or not math.isfinite(x) else x


def cmd_eval(args: argparse.Namespace) -> int:
  import numpy as np

  from diffsim.data import metrics

  if args.mca is None and args.params is None:
    raise CliError("eval needs --params CPU_OR_FILE.json (or --mca CPU for llvm-mca)")
  path, rows = read_rows(args)
  bad_rows = sum(r.error is not None for r in rows)
  usable = [r for r in rows if r.error is None]
  unlabelled = sum(math.isnan(r.y) for r in usable)
  labelled = [r for r in usable if not math.isnan(r.y)]
  if args.mca is not None:
    who = f"llvm-mca -mcpu={args.mca}"
    preds = mca_predict(decode_rows(labelled, args.progress), args.mca, args.iterations,
                        args.throughput, args.progress)
  else:
    who = f"diffsim --params {args.params}"
    with decoded_in_background(labelled) as chunks:  # the table and JAX load meanwhile
      table = load_table_arg(args.params)
      preds = sim_predict_chunks(table, chunks, len(labelled), args.iterations,
                                 args.throughput, args.progress)
  y = np.array([r.y for r in labelled], np.float64)
  pred = np.array([math.nan if v is None else v for v, _ in preds], np.float64)
  s = metrics.summary(pred, y)
  no_pred = [err for v, err in preds if v is None]
  n_failed = bad_rows + unlabelled + len(no_pred)
  if args.json:
    print(json.dumps({"mape": json_number(s["mape"]),
                      "kendall_tau": json_number(s["kendall_tau"]),
                      "within_5pct": json_number(s["within_5pct"]),
                      "n": s["n"], "n_failed": n_failed}))
    return 0
  tau = s["kendall_tau"]
  print(f"{path}: {who} vs labels ({args.throughput}, {args.iterations} iterations)")
  print(f"  MAPE          {pct(s['mape'])}")
  print(f"  Kendall tau   {'n/a' if not math.isfinite(tau) else f'{tau:.3f}'}")
  print(f"  within 5%     {pct(s['within_5pct'])}")
  print(f"  evaluated     {s['n']}")
  parts = [f"{n} {what}" for n, what in ((bad_rows, "bad rows"), (unlabelled, "unlabelled"),
                                          (len(no_pred), "without a prediction")) if n]
  print(f"  failed        {n_failed}" + (f" ({', '.join(parts)})" if parts else ""))
  if no_pred:
    print(f"  first failure {no_pred[0]}")
  return 0


def cmd_params(args: argparse.Namespace) -> int:
  from diffsim.params.table import available_tables

  if args.list:
    from diffsim.mca import mca_cpus

    need_llvm("llvm-mca")
    print("llvm-mca 14 CPU models (diffsim params CPU -o FILE.json builds a table):")
    print("  " + " ".join(mca_cpus()))
    print("shipped tables (--params NAME):")
    print("  " + " ".join(available_tables()))
    return 0
  if not args.cpu:
    raise CliError("params needs a CPU name (or --list)")
  if args.output and (args.out_dir or len(args.cpu) > 1):
    raise CliError("-o names the file of one CPU's table; for several, use --out-dir")
  from diffsim.mca import mca_cpus
  from diffsim.params.extract import build_table
  from diffsim.params.mctools import ToolError
  from diffsim.params.table import write_json

  need_llvm(*TOOLS)
  for cpu in args.cpu:
    if cpu not in mca_cpus(include_generic=True):
      raise CliError(f"llvm-mca 14 has no CPU model {cpu!r}; see `diffsim params --list`")
  for cpu in args.cpu:
    out = args.output or str(Path(args.out_dir or ".") / f"{cpu}.json")
    t0 = time.perf_counter()
    try:
      table = build_table(cpu, progress=args.progress, probe=not args.no_probe)
    except (ToolError, ValueError) as e:
      raise CliError(f"cannot build a table for {cpu}: {e}") from None
    try:
      Path(out).parent.mkdir(parents=True, exist_ok=True)
      write_json(table, out)
    except OSError as e:
      raise CliError(f"cannot write {out}: {e.strerror}") from None
    say(f"{cpu}: {len(table['opcodes'])} opcodes, {len(table.get('unsupported', {}))} "
        f"unsupported, {time.perf_counter() - t0:.0f} s -> {out}")
  return 0


def cmd_compare(args: argparse.Namespace) -> int:
  import numpy as np

  from diffsim.data import metrics

  table = load_table_arg(args.params)
  mcpu = args.mcpu or table.layout.cpu
  if not mcpu:
    raise CliError(f"--params {args.params} names no CPU; pass --mcpu")
  path, rows = read_rows(args)
  t0 = time.perf_counter()
  blocks = decode_rows(rows, args.progress)
  t_decode = time.perf_counter() - t0
  t0 = time.perf_counter()
  mca = mca_predict(blocks, mcpu, args.iterations, args.throughput, args.progress)
  t_mca = time.perf_counter() - t0
  t0 = time.perf_counter()
  sim = sim_predict(table, blocks, args.iterations, args.throughput, args.progress)
  t_sim = time.perf_counter() - t0

  a = np.array([math.nan if v is None else v for v, _ in sim], np.float64)
  b = np.array([math.nan if v is None else v for v, _ in mca], np.float64)
  # llvm-mca is the reference here; a zero steady-state figure has no relative error.
  both = np.isfinite(a) & np.isfinite(b) & (b > 0)
  s = metrics.summary(a[both], b[both])
  # Both sides scale the same integer cycle counts, so equal counts agree to rounding.
  exact = float(np.mean(np.isclose(a[both], b[both], rtol=1e-12, atol=0))) if both.any() \
    else math.nan
  decoded = [not isinstance(x, Exception) for x in blocks]
  n_dec = sum(decoded)
  sim_fail = sum(ok and v is None for ok, (v, _) in zip(decoded, sim))
  mca_fail = sum(ok and v is None for ok, (v, _) in zip(decoded, mca))

  def rate(t: float) -> str:
    return f"{n_dec / t:10.1f}" if t > 0 and n_dec else "       n/a"

  print(f"{path}: diffsim --params {args.params} vs llvm-mca -mcpu={mcpu} "
        f"({args.throughput}, {args.iterations} iterations)")
  print(f"  blocks               {len(rows)} ({n_dec} decoded; diffsim failed on "
        f"{sim_fail}, llvm-mca on {mca_fail})")
  print(f"  compared             {s['n']}")
  print(f"  exactly equal        {pct(exact)}")
  print(f"  within 1%            {pct(s['within_1pct'])}")
  print(f"  within 5%            {pct(s['within_5pct'])}")
  print(f"  MAPE                 {pct(s['mape'])}  (diffsim relative to llvm-mca)")
  print(f"  {'':21}{'wall s':>8} {'blocks/s':>10}")
  print(f"  {'decode (shared)':21}{t_decode:8.2f} {rate(t_decode)}")
  print(f"  {'llvm-mca 14':21}{t_mca:8.2f} {rate(t_mca)}")
  print(f"  {'diffsim (JAX)':21}{t_sim:8.2f} {rate(t_sim)}  (includes compiling)")
  if args.output:
    f = open_out(args.output)
    try:
      w = csv.writer(f, lineterminator="\n")
      w.writerow(["hex", "diffsim", "llvm_mca", "error"])
      for row, (v1, e1), (v2, e2) in zip(rows, sim, mca):
        errs = "; ".join(dict.fromkeys(e for e in (e1, e2) if e))
        w.writerow([hex_field(row), fmt(v1), fmt(v2), errs])
    finally:
      if f is not sys.stdout:
        f.close()
  return 0


def load_labelled(path: Path):
  from diffsim.data import load_csv

  try:
    ds = load_csv(path)
  except (OSError, ValueError) as e:
    msg = str(e)
    raise CliError(msg if str(path) in msg else f"{path}: {msg}") from None
  if ds.errors:
    line, why = ds.errors[0]
    say(f"warning: {path}: {len(ds.errors)} unusable rows left out (line {line}: {why})")
  if not (ds.y == ds.y).any():
    raise CliError(f"{path}: no row has a throughput label in column 2")
  return ds


def cmd_fit(args: argparse.Namespace) -> int:
  enable_compile_cache()
  from diffsim.data import split
  from diffsim.fit import FitConfig
  from diffsim.fit.run import fit_and_report
  from diffsim.isa import decode_blocks

  path = input_path(args)
  ds = load_labelled(path)
  if args.limit is not None:
    ds = ds.take(range(min(args.limit, len(ds))))
  if args.anchors and not args.exact:
    raise CliError("--anchors weigh in the exact search: give --exact ROUNDS too")
  if args.val:
    train, val = ds, load_labelled(Path(args.val))
    test = load_labelled(Path(args.test)) if args.test else None
    held = "--test" if args.test else "--val (also used for early stopping)"
  else:
    if args.test:
      raise CliError("--test needs --val too (without --val, TRAIN is split in three)")
    train, val, test = split(ds, seed=args.seed)
    held = f"the test part of {path.name} (hash split, seed {args.seed})"
    say(f"{path}: split by block into {len(train)} train, {len(val)} validation and "
        f"{len(test)} test blocks (seed {args.seed})")
  table = load_table_arg(args.init)
  config = FitConfig(epochs=args.epochs, batch_size=args.batch_size, lr=args.lr,
                     tau=args.tau, straight_through=args.straight_through, prior=args.prior,
                     patience=args.patience, seed=args.seed)
  mca = args.mca
  if mca is None:  # default: the initial table's llvm-mca model, when there is one
    from diffsim.mca import mca_cpus

    mca = [table.layout.cpu] if table.layout.cpu in mca_cpus(include_generic=True) else []
  predictors = {f"llvm-mca -mcpu={cpu}": (lambda blocks, cpu=cpu: mca_predict(
      blocks, cpu, 100, "steady", args.progress)) for cpu in mca}
  simulate = lambda t: (lambda blocks: sim_predict(t, blocks, 100, "steady", args.progress))  # noqa
  decode = lambda hexes: decode_blocks(hexes, progress=args.progress)  # noqa: E731
  fit_and_report(table, train, val, test, Path(args.out), config, init_name=args.init,
                 name=args.name, grow=args.grow, predictors=predictors, simulate=simulate,
                 decode=decode, held_out=held, progress=args.progress, log=say,
                 exact_rounds=args.exact, exact_cap=args.cap, anchor_weight=args.anchor_weight,
                 anchors=load_labelled(Path(args.anchors)) if args.anchors else None)
  return 0


