"""How fast is the simulator on an accelerator, next to llvm-mca on the same host's CPU?

On whatever device JAX sees first (a GPU when jax[cuda] is installed), one run:
  1. steady state: blocks/s of the exact simulator's steady-state throughput,
     100 * (cycles(2N) - cycles(N)) / N, on N BHive blocks (`simulate`, per length
     bucket, in chunks);
  2. a sweep: pairs/s of P sampled tables x the same blocks (`simulate_sweep`);
  3. a fit epoch: blocks/s of one gradient epoch on measured blocks (`diffsim.fit`);
and llvm-mca 14 on this host's CPU on the same blocks (one process, and one per
core), steady state too; the ratios are against llvm-mca with one process per core.

So that a run on a rented GPU takes minutes rather than a round of debugging, it
checks as it goes, and fails loudly where a check fails:
  - compile once: the timed (second) pass of every part compiles nothing;
  - no host round-trip per cycle: one program launch per chunk, however many cycles
    the chunk simulates (the cycle loop runs on the device);
  - a memory ceiling: chunks are sized from XLA's memory analysis of a first, small
    chunk (bytes per block or per table, scaled), and every program run stays under
    the ceiling (default 80% of the device's memory; --memory-gb on a CPU).
The device, versions, figures and checks go to --out as JSON.

  python benchmarks/gpu.py [--n 20000] [--tables 64] [--fit-blocks 8192] [--out gpu.json]
  python benchmarks/gpu.py --dry-run     # the whole script at toy size, on the CPU (CI)
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sys
import tempfile
import time

import numpy as np


def _args(argv):
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--n", type=int, default=20_000, help="BHive blocks (20,000)")
  ap.add_argument("--cpu", default="haswell", help="the table and llvm-mca's -mcpu")
  ap.add_argument("--iterations", type=int, default=100, help="N of the steady state")
  ap.add_argument("--tables", type=int, default=64, help="sampled tables of the sweep (64)")
  ap.add_argument("--sweep-blocks", type=int, default=4096,
                  help="blocks of the sweep, the first of the sample (4,096)")
  ap.add_argument("--fit-blocks", type=int, default=8192, help="measured blocks fitted")
  ap.add_argument("--fit-batch", type=int, default=1024, help="fit minibatch (1,024)")
  ap.add_argument("--slots", type=int, default=None,
                  help="blocks side by side per device (default: 64 on a CPU, the chunk "
                       "on an accelerator, where width is what keeps it busy)")
  ap.add_argument("--memory-gb", type=float, default=None,
                  help="the ceiling per program (default: 80%% of the device's memory; "
                       "4 GB where the device does not say, as on a CPU)")
  ap.add_argument("--max-chunk", type=int, default=16384, help="largest chunk of blocks")
  ap.add_argument("--max-tables", type=int, default=1024, help="largest chunk of tables")
  ap.add_argument("--skip-mca", action="store_true")
  ap.add_argument("--out", default=None, help="write the figures as JSON here")
  ap.add_argument("--dry-run", action="store_true",
                  help="everything at toy size on the CPU: 48 short blocks, 3 tables, a "
                       "32-block fit, a ceiling that forces several chunks")
  args = ap.parse_args(argv)
  if args.dry_run:
    args.n, args.tables, args.sweep_blocks, args.fit_blocks, args.fit_batch = 48, 3, 16, 32, 16
    args.max_chunk, args.max_tables = 8, 2  # several chunks; the probe's shape is theirs
  return args


def main(argv=None) -> int:
  args = _args(argv)
  if args.dry_run:
    os.environ["JAX_PLATFORMS"] = "cpu"
  from diffsim.cli import tune_xla
  from diffsim.cli.common import enable_compile_cache

  tune_xla()  # before JAX starts: one XLA device per core where the device is the CPU
  enable_compile_cache()
  import jax

  compiles = _count_compiles(jax)
  from diffsim.data import corpus_hexes, load_csv, shared_data_dir, shipped
  from diffsim.isa import decode_blocks
  from diffsim.params.table import load_table

  dev = jax.devices()[0]
  limit = (dev.memory_stats() or {}).get("bytes_limit") if hasattr(dev, "memory_stats") \
      else None
  ceiling = int(args.memory_gb * 2**30) if args.memory_gb else \
      int(0.8 * limit) if limit else 4 * 2**30
  on_cpu = dev.platform == "cpu"
  record = dict(device=dict(platform=dev.platform, kind=dev.device_kind,
                            count=len(jax.local_devices()), memory_bytes=limit),
                host=dict(cpu=_cpu_name(), cores=len(os.sched_getaffinity(0))),
                versions=dict(jax=jax.__version__, python=platform.python_version()),
                ceiling_bytes=ceiling, dry_run=args.dry_run, checks={}, figures={})
  print(f"# {dev.platform} {dev.device_kind} x{len(jax.local_devices())}, jax {jax.__version__};"
        f" host {record['host']['cpu']}, {record['host']['cores']} cores; ceiling "
        f"{ceiling / 2**30:.2f} GiB per program")

  # Blocks: a seeded BHive sample (the shipped llvm-mca sample without ../shared).
  shared = shared_data_dir()
  hexes, source = corpus_hexes(None, 0)
  table = load_table(args.cpu)
  blocks = [b for b in decode_blocks(hexes[:4 * args.n if args.dry_run else args.n])
            if not isinstance(b, Exception) and b.instrs
            and (not args.dry_run or len(b.instrs) <= 8)][:args.n]
  from diffsim.sim.blocks import block_error

  supported = np.asarray(table.structure.supported)
  blocks = [b for b in blocks if block_error(table, b, supported) is None]
  print(f"# {len(blocks)} blocks of the {source}, {args.cpu}, {args.iterations} iterations")

  steady = _steady(args, table, blocks, ceiling, on_cpu, compiles, record)
  _sweep(args, table, blocks[:args.sweep_blocks], ceiling, on_cpu, compiles, record)
  measured = shared / "measured" / "zen5-measured.csv" if shared else shipped("zen5-small.csv")
  _fit_epoch(args, load_csv(measured), measured.name, compiles, record)
  if not args.skip_mca:
    _mca(args, blocks, steady, record)

  print()
  print(f"{'what':44s} {'items/s':>12s} {'seconds':>9s} {'x llvm-mca':>11s}")
  mca = record["figures"].get("llvm-mca, one process per core", {}).get("per_s")
  for name, f in record["figures"].items():
    # (a pair is a block on one table: llvm-mca would run it once per table)
    ratio = f"{f['per_s'] / mca:11.2f}" if mca and f["unit"] in ("blocks", "pairs") \
        else f"{'':11s}"
    print(f"{name:44s} {f['per_s']:12,.0f} {f['seconds']:9.2f} {ratio}  ({f['unit']})")
  print("checks: " + ", ".join(f"{k} {v}" for k, v in record["checks"].items()))
  if args.out:
    with open(args.out, "w") as f:
      json.dump(record, f, indent=1, default=float)
    print(f"wrote {args.out}")
  return 0


def _steady(args, table, blocks, ceiling, on_cpu, compiles, record) -> np.ndarray:
  """Steady-state cycles per 100 iterations of every block (nan: failed), timed warm."""
  from diffsim.isa.encode import bucket_length
  from diffsim.sim import encode, programs, simulate
  from diffsim.sim.kernels import simulate_jobs

  by_len: dict[int, list[int]] = {}
  for i, b in enumerate(blocks):
    by_len.setdefault(bucket_length(len(b.instrs)), []).append(i)
  chunks = {}
  for L, ids in sorted(by_len.items()):
    batch = encode(table, [blocks[i] for i in ids], length=L)

    def run(lo, size, batch=batch, ids=ids):
      part = _rows(batch, lo, size, len(ids))
      slots = args.slots or (None if on_cpu else size)
      one = simulate(table, part, iterations=args.iterations, slots=slots, throw=False)
      two = simulate(table, part, iterations=2 * args.iterations, slots=slots, throw=False)
      return one, two

    chunks[L] = _chunk(run, len(ids), ceiling, simulate_jobs, args.max_chunk)
  out = np.full(len(blocks), np.nan)
  cycles = 0
  for warm in (False, True):  # the first pass compiles; the second is timed
    before, launches = compiles(), programs.LAUNCHES["simulate_jobs"]
    t0 = time.perf_counter()
    for L, ids in sorted(by_len.items()):
      batch = encode(table, [blocks[i] for i in ids], length=L)
      size = chunks[L]
      for lo in range(0, len(ids), size):
        part = _rows(batch, lo, size, len(ids))
        slots = args.slots or (None if on_cpu else size)
        one = simulate(table, part, iterations=args.iterations, slots=slots, throw=False)
        two = simulate(table, part, iterations=2 * args.iterations, slots=slots, throw=False)
        _check_memory(simulate_jobs, ceiling, record)
        n = min(size, len(ids) - lo)
        ok = (one.status[:n] | two.status[:n]) == 0
        v = 100.0 * (two.total[:n] - one.total[:n]) / args.iterations
        out[np.asarray(ids[lo:lo + n])] = np.where(ok, v, np.nan)
        cycles += int(two.total[:n].sum() + one.total[:n].sum()) if warm else 0
    seconds = time.perf_counter() - t0
  launched = programs.LAUNCHES["simulate_jobs"] - launches
  _check(record, "steady: compiled once", compiles() == before)
  _check(record, "steady: one launch per chunk, not per cycle",
         launched == 2 * sum(-(-len(ids) // chunks[L]) for L, ids in by_len.items()))
  record["checks"]["steady: cycles simulated per launch"] = cycles // max(launched, 1)
  record["checks"]["steady: chunk per bucket"] = {str(L): c for L, c in chunks.items()}
  _figure(record, "diffsim steady state (warm)", len(blocks), seconds, "blocks")
  return out


def _sweep(args, table, blocks, ceiling, on_cpu, compiles, record) -> None:
  """pairs/s of tables x blocks (`simulate_sweep`), tables chunked under the ceiling."""
  import jax

  from diffsim.isa.encode import bucket_length
  from diffsim.params.sample import sample_params
  from diffsim.sim import encode, simulate_sweep
  from diffsim.sim.kernels import sweep_jobs

  L = bucket_length(max(len(b.instrs) for b in blocks))
  batch = encode(table, blocks, length=L)
  stacked = jax.tree.map(np.asarray, sample_params(table, args.tables, 0))
  slots = args.slots or (None if on_cpu else min(len(blocks) * args.tables, 65536))

  def run(lo, size):
    take = np.minimum(np.arange(lo, lo + size), args.tables - 1)
    return simulate_sweep(table, batch, params=jax.tree.map(lambda x: x[take], stacked),
                          iterations=args.iterations, slots=slots, throw=False)

  size = _chunk(run, args.tables, ceiling, sweep_jobs, min(args.tables, args.max_tables))
  for warm in (False, True):
    before = compiles()
    t0 = time.perf_counter()
    for lo in range(0, args.tables, size):
      run(lo, size)
      _check_memory(sweep_jobs, ceiling, record)
    seconds = time.perf_counter() - t0
  _check(record, "sweep: compiled once", compiles() == before)
  record["checks"]["sweep: tables per chunk"] = size
  _figure(record, f"diffsim sweep, {args.tables} tables x {len(blocks)} blocks",
          args.tables * len(blocks), seconds, "pairs")


def _fit_epoch(args, ds, name, compiles, record) -> None:
  """blocks/s of one gradient epoch (its second: the first compiles)."""
  from diffsim.fit import FitConfig, fit
  from diffsim.params.table import load_table

  pick = np.sort(np.random.default_rng(0).permutation(len(ds))[:args.fit_blocks])
  train = ds.take(pick)
  with tempfile.TemporaryDirectory() as out:
    config = FitConfig(epochs=2, batch_size=args.fit_batch, patience=10)
    marks = []
    result = fit(load_table("znver3"), train, None, out, config, progress=False,
                 log=lambda msg: marks.append(compiles()))
  seconds = result.history[-1]["seconds"]
  # The log's last two lines close epochs 1 and 2: nothing compiled in between.
  _check(record, "fit: compiled once", marks[-1] == marks[-2])
  _figure(record, f"diffsim fit epoch ({name})", len(train), seconds, "blocks fitted")
  record["figures"][f"diffsim fit epoch ({name})"]["first_epoch_s"] = \
      result.history[1]["seconds"]


def _mca(args, blocks, steady, record) -> None:
  from diffsim.mca import run_mca
  from diffsim.mca import steady as mca_steady

  texts = [b.text for b in blocks]
  for jobs, name in ((1, "llvm-mca, one process"), (None, "llvm-mca, one process per core")):
    t0 = time.perf_counter()
    one = run_mca(texts, args.cpu, iterations=args.iterations, jobs=jobs)
    two = run_mca(texts, args.cpu, iterations=2 * args.iterations, jobs=jobs)
    _figure(record, name, len(blocks), time.perf_counter() - t0, "blocks")
  ref = np.array([np.nan if a.cycles is None or b.cycles is None else
                  float(mca_steady(b.cycles, a.cycles, args.iterations))
                  for a, b in zip(one, two)])
  both = np.isfinite(ref) & np.isfinite(steady)
  record["checks"]["steady: equal to llvm-mca's"] = f"{np.mean(steady[both] == ref[both]):.1%}"


def _chunk(run, n: int, ceiling: int, fn, largest: int) -> int:
  """The largest power-of-two chunk (at most `largest`, at most n rounded up) whose
  program stays under `ceiling`: from one run at a small chunk, whose bytes (XLA's
  memory analysis) scale with the chunk at most linearly."""
  from diffsim.sim import programs

  first = min(8, _pow2(n), largest)
  run(0, first)
  used = programs.footprint(fn)
  if used is None:  # no analysis on this backend: stay at the first size's multiple
    return min(_pow2(n), largest)
  size = first
  while size * 2 <= min(_pow2(n), largest) and used * (size * 2) / first <= ceiling:
    size *= 2
  return size


def _rows(batch, lo: int, size: int, n: int):
  """Rows lo..lo+size of a batch, the last chunk padded with copies of its last row."""
  import jax

  take = np.minimum(np.arange(lo, lo + size), n - 1)
  return jax.tree.map(lambda x: np.asarray(x)[take], batch)


def _pow2(n: int) -> int:
  return 1 << max(0, (n - 1).bit_length())


def _check_memory(fn, ceiling: int, record) -> None:
  from diffsim.sim import programs

  used = programs.footprint(fn)
  key = "largest program, bytes"
  record["checks"][key] = max(record["checks"].get(key, 0), used or 0)
  _check(record, "under the memory ceiling", used is None or used <= ceiling)


def _check(record, name: str, ok: bool) -> None:
  record["checks"][name] = bool(ok) and record["checks"].get(name, True)
  if not ok:
    raise SystemExit(f"check failed: {name}")


def _figure(record, name: str, items: int, seconds: float, unit: str) -> None:
  record["figures"][name] = dict(items=items, seconds=seconds, per_s=items / seconds,
                                 unit=unit)


def _count_compiles(jax):
  """A counter of the simulator's and the fit's compiled programs in this process: the
  kept programs (`diffsim.sim.programs`) and the entries of the fit's jitted functions'
  caches. (Not every XLA compilation: a first `x + 1` on a new scalar compiles too.)"""
  from diffsim.fit import learn
  from diffsim.sim import kernels, programs

  jitted = (kernels.record_jobs, learn.loss_and_grad, learn.soft_predictions,
            learn.hard_steady)
  return lambda: programs.held() + sum(f._cache_size() for f in jitted)


def _cpu_name() -> str:
  try:
    with open("/proc/cpuinfo") as f:
      return next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
  except (OSError, StopIteration):
    return platform.processor() or platform.machine()


if __name__ == "__main__":
  sys.exit(main())
