"""The `diffsim` command: decode, simulate, run llvm-mca, evaluate, compare, build tables.

Impure code at the edge of diffsim: files in, files and tables out. Every subcommand
reads a BHive-format CSV file (hex in the first column, a header and more columns
optional) and keeps one output row per input row, in input order, so results can be
pasted next to the input. A bad row (empty, odd-length or non-hex) gets an error in its
output row instead of stopping the run; only unusable input (a missing, binary or
non-CSV file, an unknown CPU) makes the command exit non-zero, with a message that
names the file.

Throughputs leave the command in BHive's unit, cycles per 100 iterations:
- `total`: the Total Cycles of an N-iteration run, times 100/N (llvm-mca's own figure).
- `steady`: 100 * (cycles(2N) - cycles(N)) / N, BHive's steady-state definition, which
  cancels the pipeline's fill and drain; measured labels are of this kind.

  diffsim decode IN.csv [-o OUT.jsonl]
  diffsim mca IN.csv --mcpu haswell -o OUT.csv
  diffsim simulate IN.csv --params haswell -o OUT.csv
  diffsim eval IN.csv --params haswell [--json] [--mca haswell]
  diffsim compare IN.csv --params haswell [--mcpu haswell]
  diffsim params haswell -o haswell.json
  diffsim params haswell skylake --out-dir diffsim/params/tables
  diffsim params --list
  diffsim fit TRAIN.csv --init znver3 [--val VAL.csv] --out DIR

`simulate`, `eval`, `fit`, `perfvec train` and `search` also run as several processes
(on one machine or many): start the same command in each, with `--coordinator
HOST:PORT --num-processes N --process-id I` (or JAX's environment variables, or
`--cluster` under SLURM); the processes share the work and process 0 writes the output.
"""

from __future__ import annotations

import argparse
import importlib
import os
import sys
from collections.abc import Sequence

from diffsim.cli.commands import (cmd_compare, cmd_decode, cmd_eval, cmd_fit, cmd_mca,
                                  cmd_params, cmd_simulate)
from diffsim.cli.common import (SMALL_LOOP_BYTES, CliError, add_hosts, add_input,  # noqa: F401
                                add_run, join_hosts, non_negative_int, one_blas_thread,
                                positive_int, say, tune_xla)
from diffsim.cli.predict import mca_predict, sim_predict  # noqa: F401 (public helpers)

# Subcommands with a module of their own: each defines `add_subcommand(subparsers)`,
# which adds its parser and sets `func`.
SUBSYSTEM_COMMANDS: tuple[str, ...] = ("diffsim.cli.measure", "diffsim.cli.calibrate",
                                       "diffsim.cli.perfvec", "diffsim.cli.search")


def build_parser() -> argparse.ArgumentParser:
  """The argument parser of the `diffsim` command (one subparser per subcommand)."""
  ap = argparse.ArgumentParser(
    prog="diffsim",
    description="llvm-mca's x86-64 basic-block pipeline model in JAX. Throughputs are "
                "in cycles per 100 iterations, as in BHive files.")
  sub = ap.add_subparsers(dest="command", metavar="COMMAND", required=True)

  p = sub.add_parser("decode", help="decode blocks to JSON lines (one per input row)")
  add_input(p)
  p.add_argument("-o", "--output", metavar="OUT.jsonl", help="output file (default stdout)")
  p.set_defaults(func=cmd_decode)

  p = sub.add_parser("mca", help="run llvm-mca 14 on every block")
  add_input(p)
  p.add_argument("--mcpu", required=True, metavar="CPU", help="llvm-mca -mcpu")
  add_run(p, "total")
  p.add_argument("-o", "--output", metavar="OUT.csv", help="output CSV (default stdout)")
  p.set_defaults(func=cmd_mca)

  p = sub.add_parser("simulate", help="run the JAX simulator on every block")
  add_input(p)
  p.add_argument("--params", required=True, metavar="CPU_OR_FILE.json",
                 help="a shipped table (`diffsim params --list`) or a JSON table file")
  add_run(p, "total")
  p.add_argument("-o", "--output", metavar="OUT.csv", help="output CSV (default stdout)")
  p.add_argument("--checkpoint", metavar="DIR",
                 help="save results job by job in DIR; rerunning the command into it "
                      "simulates only what is missing (a killed run resumes)")
  add_hosts(p)
  p.set_defaults(func=cmd_simulate)

  p = sub.add_parser("eval", help="accuracy against a labelled BHive file")
  add_input(p)
  p.add_argument("--params", metavar="CPU_OR_FILE.json", help="the simulator's table")
  p.add_argument("--mca", metavar="CPU", help="evaluate llvm-mca -mcpu=CPU instead")
  p.add_argument("--json", action="store_true",
                 help="print one JSON object: mape, kendall_tau, within_5pct, n, n_failed")
  # Measured labels are steady-state throughputs, hence the default.
  add_run(p, "steady")
  add_hosts(p)
  p.set_defaults(func=cmd_eval)

  p = sub.add_parser("compare", help="the simulator against llvm-mca on the same blocks")
  add_input(p)
  p.add_argument("--params", required=True, metavar="CPU_OR_FILE.json",
                 help="the simulator's table")
  p.add_argument("--mcpu", metavar="CPU", help="llvm-mca's CPU (default: the table's CPU)")
  add_run(p, "total")
  p.add_argument("-o", "--output", metavar="OUT.csv",
                 help="also write hex,diffsim,llvm_mca,error per row")
  p.set_defaults(func=cmd_compare)

  p = sub.add_parser("params", help="build parameter tables from llvm-mca CPU models")
  p.add_argument("cpu", nargs="*", metavar="CPU", help="llvm-mca -mcpu names")
  p.add_argument("-o", "--output", metavar="FILE.json",
                 help="output of one CPU's table (default CPU.json)")
  p.add_argument("--out-dir", metavar="DIR",
                 help="write DIR/CPU.json for each CPU (diffsim/params/tables rebuilds the "
                      "shipped tables)")
  p.add_argument("--no-probe", action="store_true",
                 help="skip the timeline probes (read-advance, per-write latency, idioms, "
                      "move elimination keep their defaults)")
  p.add_argument("--list", action="store_true",
                 help="list llvm-mca's CPU models and the shipped tables")
  p.add_argument("--progress", action="store_true", default=None,
                 help="log steps on stderr (default: when stderr is a terminal)")
  p.set_defaults(func=cmd_params)

  p = sub.add_parser("fit", help="learn a table from measured throughputs (resumable)")
  add_input(p)
  p.add_argument("--init", required=True, metavar="CPU_OR_FILE.json",
                 help="the table to start from (a shipped name or a JSON table)")
  p.add_argument("--val", metavar="VAL.csv",
                 help="validation blocks (default: split TRAIN 80/10/10 by block hash)")
  p.add_argument("--test", metavar="TEST.csv", help="held-out blocks for the final report")
  p.add_argument("--out", required=True, metavar="DIR",
                 help="writes DIR/params.json, DIR/loss.png, DIR/report.json and the "
                      "checkpoints; an interrupted fit into DIR resumes")
  p.add_argument("--name", default="fitted", help="CPU name written into params.json")
  p.add_argument("--epochs", type=non_negative_int, default=30,
                 help="gradient epochs (0: none, only the exact search)")
  p.add_argument("--exact", type=non_negative_int, default=0, metavar="ROUNDS",
                 help="rounds of exact search after the gradient fit: the dispatch width "
                      "and each opcode's latency, micro-ops, resource cycles, read-advance, "
                      "forwarding cost and port group move one step where the exact "
                      "simulator improves on the training blocks they touch (default 0)")
  p.add_argument("--anchors", metavar="ANCHORS.csv",
                 help="single instructions measured alone on the same CPU (diffsim "
                      "calibrate's anchors.csv, or `diffsim measure` of one instruction a "
                      "row), fitted beside the blocks in the exact search")
  p.add_argument("--anchor-weight", type=float, default=4.0,
                 help="how many blocks one anchor counts as (default 4)")
  p.add_argument("--cap", type=positive_int, default=48,
                 help="blocks that judge one opcode's move in the exact search (default 48)")
  p.add_argument("--batch-size", type=positive_int, default=128)
  p.add_argument("--lr", type=float, default=0.1,
                 help="Adam's peak step size, cosine-decayed (default 0.1)")
  p.add_argument("--prior", type=float, default=1.0,
                 help="pull towards the initial table, in training blocks' worth of "
                      "evidence per parameter (default 1)")
  p.add_argument("--tau", type=float, default=0.5,
                 help="soft-mode temperature in cycles (0: exact max; default 0.5)")
  p.add_argument("--straight-through", action="store_true",
                 help="exact (hard) forward, tempered backward")
  p.add_argument("--patience", type=positive_int, default=6,
                 help="stop after this many epochs without a better validation error")
  p.add_argument("--seed", type=int, default=0, help="split and shuffling seed")
  p.add_argument("--grow", action="store_true",
                 help="after a first fit, add units to resource groups the fit wants "
                      "more of, then fit again")
  p.add_argument("--mca", nargs="*", metavar="CPU",
                 help="llvm-mca models to report beside diffsim (default: --init's CPU "
                      "when llvm-mca has it)")
  add_hosts(p)
  p.set_defaults(func=cmd_fit)

  for name in SUBSYSTEM_COMMANDS:
    importlib.import_module(name).add_subcommand(sub)
  return ap


def main(argv: Sequence[str] | None = None) -> int:
  """Runs the `diffsim` command.

  Args:
    argv: the arguments after the program name (default: `sys.argv[1:]`).

  Returns:
    The exit status: 0 on success (bad rows included), 2 for unusable input.
  """
  args = build_parser().parse_args(argv)
  if getattr(args, "progress", None) is None:
    args.progress = sys.stderr.isatty()
  tune_xla()
  one_blas_thread()
  try:
    join_hosts(args)  # a multi-process run, when the flags or the environment ask
    return args.func(args)
  except CliError as e:
    print(f"diffsim {args.command}: error: {e}", file=sys.stderr, flush=True)
    return 2
  except BrokenPipeError:
    # `diffsim decode ... | head`: the reader left; that is not an error.
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    return 0
  except KeyboardInterrupt:
    say("interrupted")
    return 130


if __name__ == "__main__":
  sys.exit(main())

