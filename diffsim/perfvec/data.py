"""Training data for PerfVec: blocks x microarchitectures, labelled by the simulator.

Programs are BHive blocks; microarchitectures are parameter tables: llvm-mca's models
and tables sampled around them (`diffsim.params.sample`). Labels are the simulator's
steady-state throughput, 100 * (cycles(2N) - cycles(N)) / N cycles per 100 iterations
(BHive's definition, as measured data use), from `simulate_sweep`: every sampled table
of one base crosses every block in one queued, sharded sweep (shared out over the
processes of a multi-process run, `diffsim.sim.hosts`). The sweeps are cached on disk
chunk by chunk, so an interrupted labelling resumes.
"""

from __future__ import annotations

import dataclasses
import hashlib
import json
import os
import time
from pathlib import Path
from typing import Sequence

import jax
import numpy as np

from diffsim.isa.encode import BUCKETS
from diffsim.isa.ir import Block
from diffsim.params.sample import sample_params, table_at
from diffsim.params.table import Params, Table, load_table
from diffsim.sim import hosts, programs
from diffsim.sim.api import encode, simulate_sweep
from diffsim.sim.blocks import block_error


@dataclasses.dataclass(frozen=True)
class Uarch:
  """One microarchitecture: a base table, or the i-th table sampled around it."""

  base: str  # a shipped table name or a JSON table path
  sample: int = -1  # -1: the base table itself
  seed: int = 0

  @property
  def name(self) -> str:
    return self.base if self.sample < 0 else f"{self.base}~{self.seed}.{self.sample}"

  @staticmethod
  def parse(name: str) -> Uarch:
    """The inverse of `name` (`haswell`, `haswell~0.12`)."""
    if "~" not in name:
      return Uarch(name)
    base, rest = name.rsplit("~", 1)
    seed, sample = rest.split(".")
    return Uarch(base, int(sample), int(seed))


def uarch_params(uarchs: Sequence[Uarch]) -> tuple[Table, Params]:
  """The base table of uarchs that share one base, and their params stacked [P]."""
  bases = {u.base for u in uarchs}
  if len(bases) != 1:
    raise ValueError(f"uarchs of one base expected, got {sorted(bases)}")
  table = load_table(uarchs[0].base)
  samples = {seed: sample_params(table, 1 + max(u.sample for u in uarchs if u.seed == seed), seed)
             for seed in {u.seed for u in uarchs if u.sample >= 0}}
  per = [jax.tree.map(np.asarray, table.params) if u.sample < 0
         else jax.tree.map(lambda x, u=u: np.asarray(x)[u.sample], samples[u.seed])
         for u in uarchs]
  return table, jax.tree.map(lambda *xs: np.stack(xs), *per)


def uarch_table(u: Uarch) -> Table:
  """One uarch as a table of its own: its base, or the base with the i-th sampled values."""
  return table_at(*uarch_params([u]), 0)


def runnable(blocks: Sequence[Block], tables: Sequence[Table], max_len: int) -> np.ndarray:
  """[N] bool: the block decodes, has at most max_len instructions, and every table can
  simulate it (so that each block has a label on every uarch)."""
  ok = np.zeros(len(blocks), bool)
  supported = [np.asarray(t.structure.supported) for t in tables]
  for i, b in enumerate(blocks):
    if isinstance(b, Exception) or not b.instrs or len(b.instrs) > max_len:
      continue
    ok[i] = all(block_error(t, b, s) is None for t, s in zip(tables, supported))
  return ok


def _digest(blocks: Sequence[Block], uarchs: Sequence[Uarch], iterations: int,
            tables: tuple) -> str:
  """A chunk's cache key: the blocks, the uarchs' names and iterations, the tables' values
  themselves (parameters and structure), and the source of the decoder, the tables and
  the simulator, so that a changed sampler, a rebuilt table or a corrected simulator
  relabels instead of reading labels it would no longer compute."""
  h = hashlib.blake2b(digest_size=8)
  h.update(json.dumps([iterations, [u.name for u in uarchs],
                       programs.source_digest(*programs.PROGRAM_SOURCES)]).encode())
  for b in blocks:
    h.update(b.hex.encode() + b";")
  for leaf in jax.tree.leaves(tables):
    x = np.ascontiguousarray(leaf)
    h.update(str((x.dtype.str, x.shape)).encode() + x.tobytes())
  return h.hexdigest()


def sweep_labels(blocks: Sequence[Block], uarchs: Sequence[Uarch], cache_dir: Path, *,
                 iterations: int = 20, chunk: int = 8, progress: bool = True,
                 log=print) -> np.ndarray:
  """[P, N] steady-state cycles per 100 iterations of every (uarch, block) pair.

  All uarchs must share one base (one layout). Pairs the simulator could not finish
  are NaN. Each chunk of `chunk` uarchs is saved as it completes, under a name that
  hashes the blocks, its uarchs (names and values), iterations and the simulator's source
  (`_digest`): a rerun resumes, and a sweep that adds tables (more samples) reuses the
  chunks it shares with an earlier one.
  """
  table, params = uarch_params(uarchs)
  cache_dir = Path(cache_dir)
  cache_dir.mkdir(parents=True, exist_ok=True)
  P, N = len(uarchs), len(blocks)
  by_len: dict[int, list[int]] = {}
  for i, b in enumerate(blocks):
    by_len.setdefault(next(L for L in BUCKETS if len(b.instrs) <= L), []).append(i)
  encoded = {L: encode(table, [blocks[i] for i in ids], length=L) for L, ids in by_len.items()}
  out = np.full((P, N), np.nan, np.float32)
  starts = range(0, P, chunk)
  bar = _bar(len(starts), f"labels {uarchs[0].base}", progress)
  t0, done_pairs = time.time(), 0
  for s in starts:
    mine = jax.tree.map(lambda x, s=s: x[s:s + chunk], params)
    tag = _digest(blocks, uarchs[s:s + chunk], iterations, (mine, table.structure))
    path = cache_dir / f"labels-{tag}.npy"
    cached = _load(path)
    # The key fixes the shape; a file of another shape is damaged: label again. In a
    # multi-process run, every process labels the chunk unless all of them have it.
    if hosts.agree(cached is not None and cached.shape == (min(chunk, P - s), N)):
      out[s:s + chunk] = cached
      bar.update(1)
      continue
    # Every chunk has `chunk` tables (the last padded with copies of its last), so each
    # bucket compiles once.
    take = np.minimum(np.arange(s, s + chunk), P - 1)
    sub = jax.tree.map(lambda x, take=take: x[take], params)
    part = np.full((chunk, N), np.nan, np.float32)
    for L, ids in by_len.items():
      c1, s1 = simulate_sweep(table, encoded[L], params=sub, iterations=iterations,
                              throw=False)
      c2, s2 = simulate_sweep(table, encoded[L], params=sub, iterations=2 * iterations,
                              throw=False)
      steady = 100.0 * (c2 - c1) / iterations
      part[:, ids] = np.where((s1 | s2) != 0, np.nan, steady)
    part = part[:min(chunk, P - s)]
    _save(path, part)
    out[s:s + chunk] = part
    done_pairs += part.size
    bar.update(1)
  bar.close()
  if done_pairs:
    # A base's programs are not run again, and a process holds only so many compiled
    # ones (memory mappings): labelling four bases with their encoder tables ran out.
    jax.clear_caches()
    dt = time.time() - t0
    log(f"labelled {done_pairs} (uarch, block) pairs of {uarchs[0].base} in {dt:.1f} s: "
        f"{done_pairs / dt:.0f} pairs/s")
  return out


def _load(path: Path) -> np.ndarray | None:
  """A saved chunk, or None where there is none or it cannot be read."""
  try:
    return np.load(path)
  except (OSError, ValueError, EOFError):
    return None


def _save(path: Path, part: np.ndarray) -> None:
  """Atomically (written aside, then renamed), so that a process killed while writing
  leaves no half chunk, and processes that share the folder never read one."""
  tmp = path.with_name(f".{path.stem}.{os.getpid()}.tmp.npy")
  np.save(tmp, part)
  tmp.replace(path)


def _bar(total: int, desc: str, enabled: bool):
  from tqdm.auto import tqdm

  return tqdm(total=total, desc=desc, unit="chunk", leave=False, disable=not enabled)
