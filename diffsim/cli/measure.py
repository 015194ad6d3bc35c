"""The `diffsim measure` subcommand: throughputs of basic blocks on this machine's CPU.

  diffsim measure IN.csv -o OUT.csv      BHive-format measurements, resumable
  diffsim measure --validate             known chains and port-bound blocks

The output keeps one row per input row, in order: `hex,cycles_per_100_iterations,
spread,confidence,error`, where a rejected or bad row has an empty value and the reason.
`spread` is (max - min) / median over all of a block's passes; `confidence` (0 to 1)
says how many passes agree on the value and how tightly, and
`diffsim.measure.confidence_weights` turns it into fit weights. Blocks whose passes
disagree (a busy core) are measured again in later sweeps until they agree or a time
budget ends (`--budget-seconds`; by default as long again as the sweeps took, which a
quiet machine does not use). The CPU's identity, the settings and a summary go to the
sidecar `OUT.csv.json`. While it runs, finished blocks are logged to `OUT.csv.partial`
(fsynced); rerunning the same command after an interruption measures only the blocks
the log lacks, and those it was still measuring again.
"""

from __future__ import annotations

import argparse
import csv
import json
import math
import time
from pathlib import Path

from diffsim.cli.common import CliError, add_input, fmt, hex_field, positive_int, read_rows, say


def add_subcommand(subparsers) -> None:
  """Adds `measure` to the `diffsim` command's subparsers."""
  p = subparsers.add_parser(
    "measure", help="measure block throughputs on this CPU (BHive format, resumable)",
    description="Measures each block's steady-state throughput on this machine's CPU "
                "(cycles per 100 iterations, BHive's definition) with a native runner "
                "built at first use by the system C compiler. Each block runs in a "
                "forked child; the TSC is calibrated to core cycles by an add chain "
                "timed alongside. A block's value is the fastest cluster of passes that "
                "agree within 1%% (noise on a busy core only slows a pass down); blocks "
                "without one are measured again in later sweeps while a time budget "
                "lasts, and every row gets a confidence from 0 to 1 (columns "
                "hex,cycles_per_100_iterations,spread,confidence,error). Then `diffsim "
                "fit OUT.csv --init znver3 --out DIR` learns a table for this CPU.")
  add_input(p)
  p.add_argument("-o", "--output", metavar="OUT.csv",
                 help="output CSV (needed unless --validate); also writes OUT.csv.json and, "
                      "while running, the resume log OUT.csv.partial")
  p.add_argument("--validate", action="store_true",
                 help="measure known chains and port-bound blocks and print them beside "
                      "their expected values (no input needed)")
  p.add_argument("--passes", type=positive_int, default=3,
                 help="independent passes per block (default 3; 2 more when they disagree, "
                      "and more in later sweeps until 3 agree or the budget ends)")
  p.add_argument("--rounds", type=positive_int, default=32,
                 help="timed rounds per pass (default 32)")
  p.add_argument("--max-pages", type=positive_int, default=12,
                 help="reject blocks that touch more scratch pages (default 12)")
  p.add_argument("--cpu", type=int, metavar="N",
                 help="core to run on (default: the last one available)")
  p.add_argument("--budget-seconds", type=_seconds, metavar="S",
                 help="time this run may spend measuring again the blocks whose passes "
                      "disagree, until 3 agree within 1%% (default: as long as the first "
                      "sweeps took, so at most about twice the time on a busy machine and "
                      "next to nothing on a quiet one; 0: never)")
  p.set_defaults(func=cmd_measure)


def _seconds(text: str) -> float:
  try:
    value = float(text)
  except ValueError:
    value = math.nan
  if not value >= 0 or math.isinf(value):
    raise argparse.ArgumentTypeError(f"expected seconds, 0 or more, got {text!r}")
  return value


def _config(args: argparse.Namespace):
  from diffsim.measure.config import MeasureConfig

  if args.rounds > 1024:
    raise CliError(f"--rounds {args.rounds}: at most 1024")
  return MeasureConfig(passes=args.passes, max_passes=args.passes + 2, rounds=args.rounds,
                       max_pages=args.max_pages, cpu=args.cpu,
                       agree_passes=min(3, args.passes),
                       budget_seconds=getattr(args, "budget_seconds", None))


def cmd_measure(args: argparse.Namespace) -> int:
  from diffsim.measure.build import MeasureError

  try:
    if args.validate:
      if args.input or args.shipped:
        raise CliError("--validate measures its own blocks; give no IN.csv")
      return _validate(args)
    return _measure(args)
  except MeasureError as e:
    raise CliError(str(e)) from None


def _validate(args: argparse.Namespace) -> int:
  from diffsim.measure.cpu import describe_cpu
  from diffsim.measure.validate import format_checks, run_checks

  results, cpu = run_checks(_config(args))
  print(f"CPU: {describe_cpu(cpu)}")
  print("cycles per iteration (measured: median of passes)")
  print(format_checks(results))
  return 0


def _write_csv(out: Path, rows: list, hexes: list, results: list, bad: dict) -> None:
  """One row per input row, in order; a bad or rejected row has its reason, no value.
  `confidence` comes after `spread` and before `error`, so that readers by position of
  the older `hex,cycles_per_100_iterations,spread,error` still find the first three."""
  with open(out, "w", newline="") as f:
    w = csv.writer(f, lineterminator="\n")
    w.writerow(["hex", "cycles_per_100_iterations", "spread", "confidence", "error"])
    for i, (h, r) in enumerate(zip(hexes, results)):
      err = r.error
      if i in bad:
        err = f"bad-row: {bad[i]}"
      w.writerow([h if h is not None else hex_field(rows[i]), fmt(r.cycles),
                  "" if r.spread is None else f"{r.spread:.4f}",
                  "" if r.confidence is None else f"{r.confidence:.3f}", err or ""])


def _measure(args: argparse.Namespace) -> int:
  from diffsim.measure.cpu import describe_cpu
  from diffsim.measure.harness import measure_hexes

  if not args.output or args.output == "-":
    raise CliError("measure needs -o OUT.csv (it keeps a resume log and a sidecar beside it)")
  out = Path(args.output)
  partial = Path(str(out) + ".partial")
  path, rows = read_rows(args)
  hexes = [hex_field(r) if r.hex is not None else None for r in rows]
  bad = {i: r.error for i, r in enumerate(rows) if r.hex is None}
  config = _config(args)
  if partial.exists():
    say(f"{partial}: resuming")
  t0 = time.perf_counter()
  try:
    results, stats = measure_hexes(hexes, config, log_path=partial, progress=args.progress)
  except OSError as e:
    raise CliError(f"cannot write {partial}: {e.strerror}") from None
  wall = time.perf_counter() - t0

  try:
    _write_csv(out, rows, hexes, results, bad)
  except OSError as e:
    raise CliError(f"cannot write {out}: {e.strerror}") from None

  from diffsim.measure.cpu import cpu_identity

  cpu = cpu_identity()
  ok = [r for r in results if r.cycles is not None]
  spreads = sorted(r.spread for r in ok if r.spread is not None and math.isfinite(r.spread))
  confs = sorted(r.confidence for r in ok if r.confidence is not None)
  summary = {
    "cpu": cpu, "input": str(path), "rows": len(rows), "measured": len(ok),
    "rejected": stats.rejected, "resumed": stats.resumed,
    "blocks_per_second": None if math.isnan(stats.rate) else stats.rate,
    "median_spread": spreads[len(spreads) // 2] if spreads else None,
    "contended_passes": stats.contended_passes,
    "passes": stats.passes, "disturbed_passes": stats.disturbed_passes,
    "remeasured": stats.remeasured, "remeasure_passes": stats.extra_passes,
    "remeasure_seconds": round(stats.extra_seconds, 3), "unconverged": stats.unconverged,
    "median_confidence": confs[len(confs) // 2] if confs else None,
    "config": {k: getattr(config, k) for k in ("passes", "max_passes", "rounds", "max_pages",
                                               "agree", "agree_passes", "max_total_passes",
                                               "budget_share", "budget_seconds")},
    "date": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
  }
  Path(str(out) + ".json").write_text(json.dumps(summary, indent=2) + "\n")
  partial.unlink(missing_ok=True)

  rejected = ", ".join(f"{n} {why}" for why, n in sorted(stats.rejected.items(),
                                                         key=lambda kv: -kv[1]))
  rate = "" if math.isnan(stats.rate) else f", {stats.rate:.1f} blocks/s"
  say(f"{path}: {len(ok)} of {len(rows)} blocks measured on {describe_cpu(cpu)} "
      f"in {wall:.1f} s{rate}" + (f"; {stats.resumed} from the resume log" if stats.resumed
                                  else "") + (f"; rejected: {rejected}" if rejected else ""))
  if stats.passes and stats.disturbed_passes > 0.2 * stats.passes:
    say(f"warning: {stats.disturbed_passes} of {stats.passes} passes were disturbed (the core "
        f"was busy: another process, or the host's other thread on this core); "
        f"{stats.contended_passes} disturbed passes had to be kept. Rows with a low "
        "confidence are the ones to distrust, or measure again on a quieter machine")
  if stats.remeasured:
    say(f"{stats.remeasured} blocks whose passes disagreed were measured again "
        f"({stats.extra_passes} passes, {stats.extra_seconds:.1f} s); "
        f"{stats.unconverged} still disagreed when the budget or their passes ran out"
        + (" (raise it with --budget-seconds)" if stats.unconverged else ""))
  say(f"wrote {out} and {out}.json")
  return 0
