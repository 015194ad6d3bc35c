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
  diffsim params --list
  diffsim fit TRAIN.csv --init znver3 [--val VAL.csv] --out DIR
"""

from __future__ import annotations

import argparse
import contextlib
import csv
import importlib
import json
import math
import os
import shutil
import sys
import time
from collections.abc import Iterable, Iterator, Sequence
from pathlib import Path
from typing import Any, TextIO

# Debian's LLVM 14 keeps its unversioned tools here (on PATH only as `llvm-mc-14`).
_LLVM14_BIN = Path("/usr/lib/llvm-14/bin")
_LLVM_TOOLS = ("llvm-mc", "llvm-mca", "llvm-exegesis")


# Subsystems that bring their own subcommands: each module defines
# `add_subcommand(subparsers)`, which adds its parser and sets `func`.
SUBSYSTEM_COMMANDS: tuple[str, ...] = ("diffsim.measure.cli", "diffsim.perfvec.cli",
                                       "diffsim.search.cli")


class CliError(Exception):
  """Unusable input or environment: the command prints the message and exits 2."""


# ---------------------------------------------------------------------------------
# Environment.


def _put_llvm14_on_path() -> None:
  """Makes the unversioned LLVM names (`llvm-mc`, ...) resolve to LLVM 14.

  `diffsim.isa.decode` and `diffsim.params` call the tools by their plain names, but a
  Debian system with only the `llvm-14` package installs them as `llvm-mc-14` or under
  /usr/lib/llvm-14/bin. Putting that folder (or `$DIFFSIM_LLVM_BIN`) first on this
  process's PATH lets every module find the same LLVM 14 as `diffsim.mca` does.
  """
  env_bin = os.environ.get("DIFFSIM_LLVM_BIN")
  folder = Path(env_bin) if env_bin else _LLVM14_BIN
  if not folder.is_dir():
    return
  resolved = [shutil.which(t) for t in _LLVM_TOOLS]
  if all(p and Path(p).resolve().parent == folder.resolve() for p in resolved):
    return
  os.environ["PATH"] = os.pathsep.join([str(folder), os.environ.get("PATH", "")])


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


def _enable_compile_cache() -> None:
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


def _need_llvm(*names: str) -> None:
  """Fails early, with the install hint, when an LLVM 14 tool is missing."""
  from diffsim.mca import find_llvm_tool

  for name in names:
    try:
      find_llvm_tool(name)
    except FileNotFoundError as e:
      raise CliError(str(e)) from None


# ---------------------------------------------------------------------------------
# Input and output.


def _input_path(args: argparse.Namespace) -> Path:
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


def _read_rows(args: argparse.Namespace) -> tuple[Path, list]:
  """(path, every data row in input order, bad rows included), at most --limit rows."""
  from diffsim.data import load_rows

  path = _input_path(args)
  try:
    rows = load_rows(path)
  except (OSError, ValueError) as e:
    msg = str(e)
    raise CliError(msg if str(path) in msg else f"{path}: {msg}") from None
  if args.limit is not None:
    rows = rows[:args.limit]
  if rows and all(r.hex is None for r in rows):
    _say(f"warning: {path}: no row has a usable hex block in column 1")
  return path, rows


def _hex_field(row) -> str:
  """The row's first field as the block's hex (normalised when it is valid)."""
  if row.hex is not None:
    return row.hex
  h = row.fields[0].strip() if row.fields else ""
  return h[2:] if h[:2] in ("0x", "0X") else h


def _decode(rows: Sequence, progress: bool) -> list:
  """A Block or a DecodeError per row; only column 1 matters here.

  A row whose label or width is bad but whose hex is fine is still decoded: labels
  are the business of `eval` alone.
  """
  return _decode_hexes([_hex_field(r) for r in rows], progress)


def _decode_hexes(hexes: Sequence[str], progress: bool = False) -> list:
  from diffsim.isa import decode_blocks

  _need_llvm("llvm-mc")
  try:
    return decode_blocks(hexes, progress=progress)
  except RuntimeError as e:  # llvm-mc missing or broken: the environment, not a row
    raise CliError(str(e)) from None


def _open_out(path: str | None) -> TextIO:
  if path in (None, "-"):
    return sys.stdout
  try:
    return open(path, "w", newline="")
  except OSError as e:
    raise CliError(f"cannot write {path}: {e.strerror}") from None


def _say(msg: str) -> None:
  print(msg, file=sys.stderr, flush=True)


def _fmt(v: float | None) -> str:
  """A throughput for CSV: exact for integers, 10 significant digits otherwise."""
  if v is None or not math.isfinite(v):
    return ""
  return format(v, ".10g")


def _pct(x: float) -> str:
  return "n/a" if x is None or not math.isfinite(x) else f"{100 * x:.1f}%"


def _write_predictions(out_path: str | None, hexes: Sequence[str],
                       preds: Sequence[tuple[float | None, str | None]]) -> None:
  f = _open_out(out_path)
  try:
    w = csv.writer(f, lineterminator="\n")
    w.writerow(["hex", "prediction", "error"])
    for h, (v, err) in zip(hexes, preds):
      w.writerow([h, _fmt(v), "" if v is not None else (err or "no prediction")])
  finally:
    if f is not sys.stdout:
      f.close()


def _report_failures(what: str, preds: Sequence[tuple[float | None, str | None]]) -> None:
  failed = [err for v, err in preds if v is None]
  _say(f"{what}: {len(preds) - len(failed)} of {len(preds)} blocks predicted"
       + (f", {len(failed)} failed (first: {failed[0]})" if failed else ""))


# ---------------------------------------------------------------------------------
# The two predictors, with one result shape: (cycles per 100 iterations | None, error).


def mca_predict(blocks: Sequence, mcpu: str, iterations: int, throughput: str,
                 progress: bool) -> list[tuple[float | None, str | None]]:
  """llvm-mca 14's prediction for each decoded block (errors passed through)."""
  from diffsim.mca import McaError, run_mca, steady

  _need_llvm("llvm-mca")
  out: list[tuple[float | None, str | None]] = [
    (None, f"decode: {b}") if isinstance(b, Exception) else (None, None) for b in blocks]
  good = [i for i, b in enumerate(blocks) if not isinstance(b, Exception)]
  texts = [blocks[i].text for i in good]
  try:
    runs = [run_mca(texts, mcpu, iterations=n, progress=progress)
            for n in ((iterations,) if throughput == "total" else (iterations, 2 * iterations))]
  except McaError as e:
    raise CliError(f"llvm-mca -mcpu={mcpu}: {e}") from None
  for k, i in enumerate(good):
    res = [r[k] for r in runs]
    bad = next((r.error for r in res if r.cycles is None), None)
    if bad is not None:
      out[i] = (None, bad)
    elif throughput == "total":
      out[i] = (res[0].cycles * 100.0 / iterations, None)
    else:
      out[i] = (float(steady(res[1].cycles, res[0].cycles, iterations)), None)
  return out


def _load_table(params: str):
  from diffsim.params.table import load_table

  try:
    return load_table(params)
  except (OSError, ValueError, KeyError) as e:
    raise CliError(f"--params {params}: {e}") from None


def sim_predict(table, blocks: Sequence, iterations: int, throughput: str,
                progress: bool) -> list[tuple[float | None, str | None]]:
  """The simulator's prediction for each decoded block (errors passed through)."""
  blocks = list(blocks)
  return _sim_predict_chunks(table, [blocks], len(blocks), iterations, throughput, progress)


def _sim_predict_chunks(table, chunks: Iterable[Sequence], total: int, iterations: int,
                        throughput: str, progress: bool) -> list[tuple[float | None, str | None]]:
  """`sim_predict` of `total` blocks that arrive in chunks (`simulate_chunks`)."""
  _enable_compile_cache()
  from diffsim.sim import simulate_chunks

  preds = simulate_chunks(table, chunks, iterations=iterations, throughput=throughput,
                          progress=progress, total=total)
  return [(p.cycles, p.error) for p in preds]


DECODE_CHUNK = 5000  # rows decoded at a time while the simulator runs what is decoded


@contextlib.contextmanager
def _decoded_in_background(rows: Sequence) -> Iterator[Iterable[list]]:
  """The rows' decoded blocks, chunk by chunk, decoded by a second process while this
  one starts the simulator (`diffsim.isa.background`). An input of one chunk decodes
  here: a process costs more than it saves."""
  hexes = [_hex_field(r) for r in rows]
  if len(hexes) <= DECODE_CHUNK:
    yield [_decode_hexes(hexes)]
    return
  from diffsim.isa.background import decode_in_background

  _need_llvm("llvm-mc")
  with decode_in_background(hexes, DECODE_CHUNK) as chunks:
    yield _environment_errors(chunks)


def _environment_errors(chunks: Iterator[list]) -> Iterator[list]:
  try:
    yield from chunks
  except RuntimeError as e:  # llvm-mc missing or broken, or the decoder died
    raise CliError(str(e)) from None


# ---------------------------------------------------------------------------------
# Subcommands.


def cmd_decode(args: argparse.Namespace) -> int:
  from diffsim.isa import DecodeError, block_to_json, summarize

  path, rows = _read_rows(args)
  results = _decode(rows, args.progress)
  f = _open_out(args.output)
  try:
    for row, res in zip(rows, results):
      if isinstance(res, DecodeError):
        doc: dict[str, Any] = {"hex": _hex_field(row), "error": str(res)}
      else:
        doc = block_to_json(res)
      f.write(json.dumps(doc) + "\n")
  finally:
    if f is not sys.stdout:
      f.close()
  s = summarize(results)
  reasons = ", ".join(f"{n} {r}" for r, n in s["by_reason"].items())
  _say(f"{path}: decoded {s['decoded']} of {s['blocks']} blocks ({s['instructions']} "
       f"instructions, {s['keys']} distinct opcode keys); failed {s['failed']}"
       + (f": {reasons}" if reasons else ""))
  return 0


def cmd_mca(args: argparse.Namespace) -> int:
  _, rows = _read_rows(args)
  blocks = _decode(rows, args.progress)
  preds = mca_predict(blocks, args.mcpu, args.iterations, args.throughput, args.progress)
  _write_predictions(args.output, [_hex_field(r) for r in rows], preds)
  _report_failures(f"llvm-mca -mcpu={args.mcpu}", preds)
  return 0


def cmd_simulate(args: argparse.Namespace) -> int:
  _, rows = _read_rows(args)
  with _decoded_in_background(rows) as chunks:  # the table and JAX load meanwhile
    table = _load_table(args.params)
    preds = _sim_predict_chunks(table, chunks, len(rows), args.iterations, args.throughput,
                                args.progress)
  _write_predictions(args.output, [_hex_field(r) for r in rows], preds)
  _report_failures(f"diffsim --params {args.params}", preds)
  return 0


def _json_number(x: float) -> float | None:
  """JSON has no NaN: undefined metrics (too few blocks) become null."""
  return None if x is None or not math.isfinite(x) else x


def cmd_eval(args: argparse.Namespace) -> int:
  import numpy as np

  from diffsim.data import metrics

  if args.mca is None and args.params is None:
    raise CliError("eval needs --params CPU_OR_FILE.json (or --mca CPU for llvm-mca)")
  path, rows = _read_rows(args)
  bad_rows = sum(r.error is not None for r in rows)
  usable = [r for r in rows if r.error is None]
  unlabelled = sum(math.isnan(r.y) for r in usable)
  labelled = [r for r in usable if not math.isnan(r.y)]
  if args.mca is not None:
    who = f"llvm-mca -mcpu={args.mca}"
    preds = mca_predict(_decode(labelled, args.progress), args.mca, args.iterations,
                        args.throughput, args.progress)
  else:
    who = f"diffsim --params {args.params}"
    with _decoded_in_background(labelled) as chunks:  # the table and JAX load meanwhile
      table = _load_table(args.params)
      preds = _sim_predict_chunks(table, chunks, len(labelled), args.iterations,
                                  args.throughput, args.progress)
  y = np.array([r.y for r in labelled], np.float64)
  pred = np.array([math.nan if v is None else v for v, _ in preds], np.float64)
  s = metrics.summary(pred, y)
  no_pred = [err for v, err in preds if v is None]
  n_failed = bad_rows + unlabelled + len(no_pred)
  if args.json:
    print(json.dumps({"mape": _json_number(s["mape"]),
                      "kendall_tau": _json_number(s["kendall_tau"]),
                      "within_5pct": _json_number(s["within_5pct"]),
                      "n": s["n"], "n_failed": n_failed}))
    return 0
  tau = s["kendall_tau"]
  print(f"{path}: {who} vs labels ({args.throughput}, {args.iterations} iterations)")
  print(f"  MAPE          {_pct(s['mape'])}")
  print(f"  Kendall tau   {'n/a' if not math.isfinite(tau) else f'{tau:.3f}'}")
  print(f"  within 5%     {_pct(s['within_5pct'])}")
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

    _need_llvm("llvm-mca")
    print("llvm-mca 14 CPU models (diffsim params CPU -o FILE.json builds a table):")
    print("  " + " ".join(mca_cpus()))
    print("shipped tables (--params NAME):")
    print("  " + " ".join(available_tables()))
    return 0
  if not args.cpu:
    raise CliError("params needs a CPU name (or --list)")
  from diffsim.mca import mca_cpus
  from diffsim.params.extract import build_table, write_table

  _need_llvm(*_LLVM_TOOLS)
  if args.cpu not in mca_cpus(include_generic=True):
    raise CliError(f"llvm-mca 14 has no CPU model {args.cpu!r}; see `diffsim params --list`")
  out = args.output or f"{args.cpu}.json"
  t0 = time.perf_counter()
  from diffsim.params.mctools import ToolError

  try:
    table = build_table(args.cpu, progress=args.progress)
  except (ToolError, ValueError) as e:
    raise CliError(f"cannot build a table for {args.cpu}: {e}") from None
  try:
    write_table(table, out)
  except OSError as e:
    raise CliError(f"cannot write {out}: {e.strerror}") from None
  _say(f"{args.cpu}: {len(table['opcodes'])} opcodes, {len(table.get('unsupported', {}))} "
       f"unsupported, {time.perf_counter() - t0:.0f} s -> {out}")
  return 0


def cmd_compare(args: argparse.Namespace) -> int:
  import numpy as np

  from diffsim.data import metrics

  table = _load_table(args.params)
  mcpu = args.mcpu or table.layout.cpu
  if not mcpu:
    raise CliError(f"--params {args.params} names no CPU; pass --mcpu")
  path, rows = _read_rows(args)
  t0 = time.perf_counter()
  blocks = _decode(rows, args.progress)
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
  print(f"  exactly equal        {_pct(exact)}")
  print(f"  within 1%            {_pct(s['within_1pct'])}")
  print(f"  within 5%            {_pct(s['within_5pct'])}")
  print(f"  MAPE                 {_pct(s['mape'])}  (diffsim relative to llvm-mca)")
  print(f"  {'':21}{'wall s':>8} {'blocks/s':>10}")
  print(f"  {'decode (shared)':21}{t_decode:8.2f} {rate(t_decode)}")
  print(f"  {'llvm-mca 14':21}{t_mca:8.2f} {rate(t_mca)}")
  print(f"  {'diffsim (JAX)':21}{t_sim:8.2f} {rate(t_sim)}  (includes compiling)")
  if args.output:
    f = _open_out(args.output)
    try:
      w = csv.writer(f, lineterminator="\n")
      w.writerow(["hex", "diffsim", "llvm_mca", "error"])
      for row, (v1, e1), (v2, e2) in zip(rows, sim, mca):
        errs = "; ".join(dict.fromkeys(e for e in (e1, e2) if e))
        w.writerow([_hex_field(row), _fmt(v1), _fmt(v2), errs])
    finally:
      if f is not sys.stdout:
        f.close()
  return 0


def _load_labelled(path: Path):
  from diffsim.data import load_csv

  try:
    ds = load_csv(path)
  except (OSError, ValueError) as e:
    msg = str(e)
    raise CliError(msg if str(path) in msg else f"{path}: {msg}") from None
  if ds.errors:
    line, why = ds.errors[0]
    _say(f"warning: {path}: {len(ds.errors)} unusable rows left out (line {line}: {why})")
  if not (ds.y == ds.y).any():
    raise CliError(f"{path}: no row has a throughput label in column 2")
  return ds


def cmd_fit(args: argparse.Namespace) -> int:
  _enable_compile_cache()
  from diffsim.data import split
  from diffsim.fit import FitConfig
  from diffsim.fit.run import fit_and_report
  from diffsim.isa import decode_blocks

  path = _input_path(args)
  ds = _load_labelled(path)
  if args.limit is not None:
    ds = ds.take(range(min(args.limit, len(ds))))
  if args.val:
    train, val = ds, _load_labelled(Path(args.val))
    test = _load_labelled(Path(args.test)) if args.test else None
    held = "--test" if args.test else "--val (also used for early stopping)"
  else:
    if args.test:
      raise CliError("--test needs --val too (without --val, TRAIN is split in three)")
    train, val, test = split(ds, seed=args.seed)
    held = f"the test part of {path.name} (hash split, seed {args.seed})"
    _say(f"{path}: split by block into {len(train)} train, {len(val)} validation and "
         f"{len(test)} test blocks (seed {args.seed})")
  table = _load_table(args.init)
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
                 decode=decode, held_out=held, progress=args.progress, log=_say,
                 exact_rounds=args.exact)
  return 0


# ---------------------------------------------------------------------------------
# Argument parsing.


def _int_from(lo: int):
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


_positive_int = _int_from(1)
_non_negative_int = _int_from(0)


def _add_input(p: argparse.ArgumentParser) -> None:
  p.add_argument("input", nargs="?", metavar="IN.csv",
                 help="BHive-format CSV: hex in column 1; header and more columns optional")
  p.add_argument("--shipped", metavar="NAME",
                 help="read a dataset shipped with diffsim instead (mca-small, zen5-small)")
  p.add_argument("--limit", type=_positive_int, metavar="N", help="only the first N rows")
  p.add_argument("--progress", action="store_true", default=None,
                 help="progress bars on stderr (default: when stderr is a terminal)")


def _add_run(p: argparse.ArgumentParser, throughput: str) -> None:
  p.add_argument("--iterations", type=_positive_int, default=100, metavar="N",
                 help="iterations simulated (default 100)")
  p.add_argument("--throughput", choices=("total", "steady"), default=throughput,
                 help="total: Total Cycles x 100/N; steady: 100 x (cycles(2N) - "
                      f"cycles(N)) / N (default {throughput})")


def build_parser() -> argparse.ArgumentParser:
  """The argument parser of the `diffsim` command (one subparser per subcommand)."""
  ap = argparse.ArgumentParser(
    prog="diffsim",
    description="llvm-mca's x86-64 basic-block pipeline model in JAX. Throughputs are "
                "in cycles per 100 iterations, as in BHive files.")
  sub = ap.add_subparsers(dest="command", metavar="COMMAND", required=True)

  p = sub.add_parser("decode", help="decode blocks to JSON lines (one per input row)")
  _add_input(p)
  p.add_argument("-o", "--output", metavar="OUT.jsonl", help="output file (default stdout)")
  p.set_defaults(func=cmd_decode)

  p = sub.add_parser("mca", help="run llvm-mca 14 on every block")
  _add_input(p)
  p.add_argument("--mcpu", required=True, metavar="CPU", help="llvm-mca -mcpu")
  _add_run(p, "total")
  p.add_argument("-o", "--output", metavar="OUT.csv", help="output CSV (default stdout)")
  p.set_defaults(func=cmd_mca)

  p = sub.add_parser("simulate", help="run the JAX simulator on every block")
  _add_input(p)
  p.add_argument("--params", required=True, metavar="CPU_OR_FILE.json",
                 help="a shipped table (`diffsim params --list`) or a JSON table file")
  _add_run(p, "total")
  p.add_argument("-o", "--output", metavar="OUT.csv", help="output CSV (default stdout)")
  p.set_defaults(func=cmd_simulate)

  p = sub.add_parser("eval", help="accuracy against a labelled BHive file")
  _add_input(p)
  p.add_argument("--params", metavar="CPU_OR_FILE.json", help="the simulator's table")
  p.add_argument("--mca", metavar="CPU", help="evaluate llvm-mca -mcpu=CPU instead")
  p.add_argument("--json", action="store_true",
                 help="print one JSON object: mape, kendall_tau, within_5pct, n, n_failed")
  # Measured labels are steady-state throughputs, hence the default.
  _add_run(p, "steady")
  p.set_defaults(func=cmd_eval)

  p = sub.add_parser("compare", help="the simulator against llvm-mca on the same blocks")
  _add_input(p)
  p.add_argument("--params", required=True, metavar="CPU_OR_FILE.json",
                 help="the simulator's table")
  p.add_argument("--mcpu", metavar="CPU", help="llvm-mca's CPU (default: the table's CPU)")
  _add_run(p, "total")
  p.add_argument("-o", "--output", metavar="OUT.csv",
                 help="also write hex,diffsim,llvm_mca,error per row")
  p.set_defaults(func=cmd_compare)

  p = sub.add_parser("params", help="build a parameter table from an llvm-mca CPU model")
  p.add_argument("cpu", nargs="?", metavar="CPU", help="llvm-mca -mcpu name")
  p.add_argument("-o", "--output", metavar="FILE.json", help="output (default CPU.json)")
  p.add_argument("--list", action="store_true",
                 help="list llvm-mca's CPU models and the shipped tables")
  p.add_argument("--progress", action="store_true", default=None,
                 help="log steps on stderr (default: when stderr is a terminal)")
  p.set_defaults(func=cmd_params)

  p = sub.add_parser("fit", help="learn a table from measured throughputs (resumable)")
  _add_input(p)
  p.add_argument("--init", required=True, metavar="CPU_OR_FILE.json",
                 help="the table to start from (a shipped name or a JSON table)")
  p.add_argument("--val", metavar="VAL.csv",
                 help="validation blocks (default: split TRAIN 80/10/10 by block hash)")
  p.add_argument("--test", metavar="TEST.csv", help="held-out blocks for the final report")
  p.add_argument("--out", required=True, metavar="DIR",
                 help="writes DIR/params.json, DIR/loss.png, DIR/report.json and the "
                      "checkpoints; an interrupted fit into DIR resumes")
  p.add_argument("--name", default="fitted", help="CPU name written into params.json")
  p.add_argument("--epochs", type=_non_negative_int, default=30,
                 help="gradient epochs (0: none, only the exact search)")
  p.add_argument("--exact", type=_non_negative_int, default=0, metavar="ROUNDS",
                 help="rounds of exact per-opcode search after the gradient fit: each "
                      "opcode's latency, micro-ops and resource cycles move by one where "
                      "the exact simulator improves on its training blocks (default 0)")
  p.add_argument("--batch-size", type=_positive_int, default=128)
  p.add_argument("--lr", type=float, default=0.1,
                 help="Adam's peak step size, cosine-decayed (default 0.1)")
  p.add_argument("--prior", type=float, default=1.0,
                 help="pull towards the initial table, in training blocks' worth of "
                      "evidence per parameter (default 1)")
  p.add_argument("--tau", type=float, default=0.5,
                 help="soft-mode temperature in cycles (0: exact max; default 0.5)")
  p.add_argument("--straight-through", action="store_true",
                 help="exact (hard) forward, tempered backward")
  p.add_argument("--patience", type=_positive_int, default=6,
                 help="stop after this many epochs without a better validation error")
  p.add_argument("--seed", type=int, default=0, help="split and shuffling seed")
  p.add_argument("--grow", action="store_true",
                 help="after a first fit, add units to resource groups the fit wants "
                      "more of, then fit again")
  p.add_argument("--mca", nargs="*", metavar="CPU",
                 help="llvm-mca models to report beside diffsim (default: --init's CPU "
                      "when llvm-mca has it)")
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
  _put_llvm14_on_path()
  tune_xla()
  one_blas_thread()
  try:
    return args.func(args)
  except CliError as e:
    _say(f"diffsim {args.command}: error: {e}")
    return 2
  except BrokenPipeError:
    # `diffsim decode ... | head`: the reader left; that is not an error.
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, sys.stdout.fileno())
    return 0
  except KeyboardInterrupt:
    _say("interrupted")
    return 130


if __name__ == "__main__":
  sys.exit(main())
