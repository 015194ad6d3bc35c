"""What every subcommand shares: the error type, the environment (the LLVM 14 tools,
XLA's settings, the compilation cache), reading input rows, writing output and
argument types."""

from __future__ import annotations

import argparse
import csv
import math
import os
import sys
from collections.abc import Sequence
from pathlib import Path
from typing import TextIO


class CliError(Exception):
  """Unusable input or environment: the command prints the message and exits 2."""


# ---------------------------------------------------------------------------------
# Environment.

# XLA:CPU compiles a while loop whose buffers total at most this many bytes into one
# kernel (its small-while-loop pass; 1 KB by default) rather than running every
# iteration as a sequence of small kernels. The simulator's inner loops (the issue
# round's candidates and each one's units and groups, the zero-latency fixed point,
# the jumps) carry a few KB per device; compiled whole, the 20,000 command blocks
# simulate 6% faster, with the same cycles (`benchmarks/RESULTS.md`, Simulator
# speed). Loops over large buffers keep their kernels.
SMALL_LOOP_BYTES = 131072


def tune_xla() -> None:
  """Sets XLA's CPU options before JAX starts: one device per core, and small loops
  compiled whole (`SMALL_LOOP_BYTES`).

  The simulator shards blocks over local devices, and each device runs its own cycle
  loop on its own thread; on a CPU-only machine that is how both cores get used.
  Has no effect once JAX is initialised; options XLA_FLAGS already sets are kept.
  """
  flags = os.environ.get("XLA_FLAGS", "")
  if "xla_force_host_platform_device_count" not in flags:
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    flags += f" --xla_force_host_platform_device_count={cores or 1}"
  if "xla_backend_extra_options" not in flags:
    flags += (" --xla_backend_extra_options="
              f"xla_cpu_small_while_loop_byte_threshold={SMALL_LOOP_BYTES}")
  os.environ["XLA_FLAGS"] = flags.strip()


def one_blas_thread() -> None:
  """Gives numpy's OpenBLAS one thread, unless the user chose a number, before numpy
  loads. OpenBLAS starts a thread per core that spins at start-up, beside JAX's import
  and the decoder; the commands do their heavy work in XLA, not BLAS (`diffsim
  simulate`: 0.2 CPU-s of 19 spent in the idle BLAS threads, `benchmarks/RESULTS.md`,
  Simulator speed)."""
  os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")


def enable_compile_cache() -> None:
  """Keeps compiled simulator programs on disk between runs.

  Compiling the simulator takes seconds per block-length bucket, which dominates a
  short run; JAX's persistent cache makes the second run start at once. The directory
  is `$DIFFSIM_CACHE_DIR` (`off` disables it), else `~/.cache/diffsim/jax`; a cache
  directory already chosen for JAX (`JAX_COMPILATION_CACHE_DIR`) wins. The simulator's
  compiled executables go beside it (DIR-programs), so that a new run skips tracing
  and lowering as well (`diffsim.sim.programs`).
  """
  choice = os.environ.get("DIFFSIM_CACHE_DIR", "")
  if choice.lower() in ("off", "0", "none"):
    return
  import jax

  if jax.config.jax_compilation_cache_dir:
    return
  base = os.environ.get("XDG_CACHE_HOME") or os.path.join("~", ".cache")
  path = Path(choice or os.path.join(base, "diffsim", "jax")).expanduser()
  try:
    path.mkdir(parents=True, exist_ok=True)
  except OSError:
    return  # a read-only home only costs compile time
  jax.config.update("jax_compilation_cache_dir", str(path))
  from diffsim.sim.programs import keep_programs

  keep_programs(f"{path}-programs")  # and skip tracing too (diffsim.sim.programs)
  # Only programs worth keeping: the simulator's take seconds, helpers milliseconds.
  jax.config.update("jax_persistent_cache_min_compile_time_secs", 1.0)


# Set in a process of a multi-process run other than process 0: it computes its share
# and takes part in every collective, but writes no output and logs nothing.
_QUIET = False


def join_hosts(args: argparse.Namespace) -> bool:
  """Joins a multi-process run when the command's flags (`add_hosts`) or JAX's
  environment (JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES, JAX_PROCESS_ID) ask for one;
  otherwise does nothing (and imports nothing). Processes other than 0 go quiet."""
  global _QUIET
  coordinator = getattr(args, "coordinator", None)
  num, pid = getattr(args, "num_processes", None), getattr(args, "process_id", None)
  auto = getattr(args, "cluster", False)
  if not (coordinator or num is not None or pid is not None or auto
          or any(os.environ.get(k) for k in HOST_ENV)):
    return False
  from diffsim.sim import hosts

  try:
    joined = hosts.initialize(coordinator, num, pid, auto=auto)
  except (ValueError, TypeError, RuntimeError) as e:
    raise CliError(f"cannot join the multi-process run: {e}") from None
  if joined and not hosts.primary():
    _QUIET = True
    sys.stdout = open(os.devnull, "w")  # noqa: SIM115 - for the rest of the process
    if hasattr(args, "progress"):
      args.progress = False
  return joined


HOST_ENV = ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID")


def need_llvm(*names: str) -> None:
  """Fails early, with the install hint, when an LLVM 14 tool is missing."""
  from diffsim.llvmtools import find_llvm_tool

  for name in names:
    try:
      find_llvm_tool(name)
    except FileNotFoundError as e:
      raise CliError(str(e)) from None


# ---------------------------------------------------------------------------------
# Input and output.


def input_path(args: argparse.Namespace) -> Path:
  """The input file: IN.csv, or a shipped dataset named with --shipped."""
  if args.shipped and args.input:
    raise CliError(f"give IN.csv ({args.input}) or --shipped {args.shipped}, not both")
  if args.shipped:
    from diffsim.data import SHIPPED, shipped

    name = args.shipped if args.shipped.endswith(".csv") else args.shipped + ".csv"
    try:
      return shipped(name)
    except FileNotFoundError:
      raise CliError(f"no shipped dataset {args.shipped!r}; known: "
                     f"{', '.join(SHIPPED)}") from None
  if not args.input:
    raise CliError("no input: give IN.csv or --shipped NAME")
  return Path(args.input)


def read_rows(args: argparse.Namespace) -> tuple[Path, list]:
  """(path, every data row in input order, bad rows included), at most --limit rows."""
  from diffsim.data import load_rows

  path = input_path(args)
  try:
    rows = load_rows(path)
  except (OSError, ValueError) as e:
    msg = str(e)
    raise CliError(msg if str(path) in msg else f"{path}: {msg}") from None
  if args.limit is not None:
    rows = rows[:args.limit]
  if rows and all(r.hex is None for r in rows):
    say(f"warning: {path}: no row has a usable hex block in column 1")
  return path, rows


def hex_field(row) -> str:
  """The row's first field as the block's hex (normalised when it is valid)."""
  if row.hex is not None:
    return row.hex
  h = row.fields[0].strip() if row.fields else ""
  return h[2:] if h[:2] in ("0x", "0X") else h


def decode_rows(rows: Sequence, progress: bool) -> list:
  """A Block or a DecodeError per row; only column 1 matters here.

  A row whose label or width is bad but whose hex is fine is still decoded: labels
  are the business of `eval` alone.
  """
  return decode_hexes([hex_field(r) for r in rows], progress)


def decode_hexes(hexes: Sequence[str], progress: bool = False) -> list:
  from diffsim.isa import decode_blocks

  need_llvm("llvm-mc")
  try:
    return decode_blocks(hexes, progress=progress)
  except RuntimeError as e:  # llvm-mc missing or broken: the environment, not a row
    raise CliError(str(e)) from None


def open_out(path: str | None) -> TextIO:
  if _QUIET:  # process 0 of a multi-process run writes the output
    return open(os.devnull, "w")
  if path in (None, "-"):
    return sys.stdout
  try:
    return open(path, "w", newline="")
  except OSError as e:
    raise CliError(f"cannot write {path}: {e.strerror}") from None


def write_file(path: Path, text: str) -> None:
  """`path.write_text(text)`, atomically, and only in process 0 of a multi-process run."""
  if _QUIET:
    return
  tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
  tmp.write_text(text)
  tmp.replace(path)


def say(msg: str) -> None:
  if not _QUIET:
    print(msg, file=sys.stderr, flush=True)


def fmt(v: float | None) -> str:
  """A throughput for CSV: exact for integers, 10 significant digits otherwise."""
  if v is None or not math.isfinite(v):
    return ""
  return format(v, ".10g")


def pct(x: float) -> str:
  return "n/a" if x is None or not math.isfinite(x) else f"{100 * x:.1f}%"


def write_predictions(out_path: str | None, hexes: Sequence[str],
                      preds: Sequence[tuple[float | None, str | None]]) -> None:
  f = open_out(out_path)
  try:
    w = csv.writer(f, lineterminator="\n")
    w.writerow(["hex", "prediction", "error"])
    for h, (v, err) in zip(hexes, preds):
      w.writerow([h, fmt(v), "" if v is not None else (err or "no prediction")])
  finally:
    if f is not sys.stdout:
      f.close()


def report_failures(what: str, preds: Sequence[tuple[float | None, str | None]]) -> None:
  failed = [err for v, err in preds if v is None]
  say(f"{what}: {len(preds) - len(failed)} of {len(preds)} blocks predicted"
      + (f", {len(failed)} failed (first: {failed[0]})" if failed else ""))


# ---------------------------------------------------------------------------------
# Argument parsing.


def int_from(lo: int):
  """An argparse type: an integer of at least `lo`, or a message naming the value."""

  def parse(s: str) -> int:
    try:
      v = int(s)
    except ValueError:
      raise argparse.ArgumentTypeError(f"not an integer: {s!r}") from None
    if v < lo:
      raise argparse.ArgumentTypeError(f"must be at least {lo}, got {v}")
    return v

  return parse


positive_int = int_from(1)
non_negative_int = int_from(0)


def add_input(p: argparse.ArgumentParser) -> None:
  p.add_argument("input", nargs="?", metavar="IN.csv",
                 help="BHive-format CSV: hex in column 1; header and more columns optional")
  p.add_argument("--shipped", metavar="NAME",
                 help="read a dataset shipped with diffsim instead (mca-small, zen5-small)")
  p.add_argument("--limit", type=positive_int, metavar="N", help="only the first N rows")
  p.add_argument("--progress", action="store_true", default=None,
                 help="progress bars on stderr (default: when stderr is a terminal)")


def add_hosts(p: argparse.ArgumentParser) -> None:
  """The flags of a multi-process run (`join_hosts`, `diffsim.sim.hosts`): start the same
  command once per process; process 0 writes the output."""
  g = p.add_argument_group(
      "multi-process runs", "start the same command in every process (JAX's distributed "
      "runtime; also from JAX_COORDINATOR_ADDRESS, JAX_NUM_PROCESSES, JAX_PROCESS_ID); "
      "process 0 writes the output")
  g.add_argument("--coordinator", metavar="HOST:PORT",
                 help="process 0's address, the same in every process")
  g.add_argument("--num-processes", type=positive_int, metavar="N", help="processes in all")
  g.add_argument("--process-id", type=non_negative_int, metavar="I",
                 help="this process's id, 0 to N-1")
  g.add_argument("--cluster", action="store_true",
                 help="take what is missing from the cluster launcher (SLURM, Open MPI...)")


def add_run(p: argparse.ArgumentParser, throughput: str) -> None:
  p.add_argument("--iterations", type=positive_int, default=100, metavar="N",
                 help="iterations simulated (default 100)")
  p.add_argument("--throughput", choices=("total", "steady"), default=throughput,
                 help="total: Total Cycles x 100/N; steady: 100 x (cycles(2N) - "
                      f"cycles(N)) / N (default {throughput})")


def load_table_arg(params: str):
  """The table `--params` names (shipped, a start or a JSON file), or a CliError."""
  from diffsim.params.table import load_table

  try:
    return load_table(params)
  except (OSError, ValueError, KeyError) as e:
    raise CliError(f"--params {params}: {e}") from None
