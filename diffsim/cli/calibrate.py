"""The `diffsim calibrate` subcommand: a table for this machine's CPU, in one command.

  diffsim calibrate --out DIR [--minutes 30]

Writes DIR/params.json (for `--params`), DIR/measured.csv (every probe, anchor and
block it measured, with value, spread and confidence), DIR/report.json and
DIR/report.md. Rerunning the same command resumes where it stopped.
"""

from __future__ import annotations

import argparse

from diffsim.cli.common import CliError, positive_int, say


def add_subcommand(subparsers) -> None:
  """Adds `calibrate` to the `diffsim` command's subparsers."""
  p = subparsers.add_parser(
    "calibrate", help="learn a table for this machine's CPU (probes, anchors, blocks, fit)",
    description="Measures this CPU (x86-64 Linux, a C compiler; no performance counters "
                "needed): structure probes that set the table's widths, units and "
                "mechanisms, every opcode key of the shipped corpus sample alone and "
                "chained, and a sample of real basic blocks; then starts from the "
                "candidate table that fits them best with the probed structure and runs "
                "the exact search in the time left. Resumable: rerun the same command.")
  p.add_argument("--out", required=True, metavar="DIR",
                 help="a new or empty folder, or one an earlier calibrate run wrote")
  p.add_argument("--minutes", type=float, default=30.0,
                 help="wall-time budget (default 30); the fit gets what measuring leaves")
  p.add_argument("--blocks", type=positive_int, default=3000,
                 help="corpus-sample blocks to measure (default 3000, at most 6000)")
  p.add_argument("--rounds", type=positive_int, default=3,
                 help="at most this many rounds of the exact search (default 3)")
  p.add_argument("--base", nargs="+", metavar="TABLE",
                 help="candidate start tables (default: llvm-mca's newest models of this "
                      "CPU's vendor and the project's measured table of that vendor)")
  p.add_argument("--quick", action="store_true",
                 help="fewer measuring passes (a first look; noisier)")
  p.add_argument("--progress", action="store_true", default=None,
                 help="progress bars on stderr (default: when stderr is a terminal)")
  p.set_defaults(func=cmd_calibrate)


def cmd_calibrate(args: argparse.Namespace) -> int:
  from diffsim.calibrate import CalibrateConfig, CalibrateError, calibrate
  from diffsim.cli.common import enable_compile_cache
  from diffsim.measure.build import MeasureError

  if args.minutes <= 0:
    raise CliError(f"--minutes {args.minutes:g}: give a positive budget")
  if args.blocks > 6000:
    raise CliError(f"--blocks {args.blocks}: the shipped corpus sample holds 6000")
  enable_compile_cache()
  config = CalibrateConfig(minutes=args.minutes, blocks=args.blocks, rounds=args.rounds,
                           bases=tuple(args.base) if args.base else None, quick=args.quick)
  try:
    report = calibrate(args.out, config, progress=args.progress,
                       log=lambda s: say(s))
  except (CalibrateError, MeasureError) as e:
    raise CliError(str(e)) from None
  say(f"calibrated {report['report']['cpu_label']}: --params {args.out}/params.json "
      f"(report: {args.out}/report.md)")
  return 0
