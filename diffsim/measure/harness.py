"""Measuring basic-block throughput on this machine's CPU: many blocks, in sweeps.

The native runner (`runner.c`, driven by `runner`) times one pass of a block; this
module decides what to run and turns passes into core cycles per 100 iterations,
BHive's unit and definition: 100 (L_a - L_b) / (a - b). It follows the method of the
harness behind `../shared/data/measured/` (its README):

- Blocks that cannot be timed in user space are rejected first (`screen`).
- The TSC is not the core clock, and the core clock drifts, so a 1-cycle-per-instruction
  `add` chain timed in the same rounds calibrates every pass.
- Canaries bound by the ALUs, the load pipes and the store pipes are timed in the same
  rounds too. Rounds in which one runs slow are left out. A pass with a canary still
  slower than on a quiet core (the lowest speed several of the run's passes share), or
  whose snippets rarely repeat their fastest time, was disturbed: it is repeated after
  short pauses, then deferred to a later sweep. On a shared host (a cloud VM) the core's
  other hardware thread can stay busy for seconds, and what is timed meanwhile reads
  10-60% off.
- Several passes, each in its own forked child and spread over time (blocks are
  measured in sweeps: one pass per block per sweep); more when they disagree; the value
  is the median pass and the spread (max - min) / median is reported with it.
- Finished blocks go to a resume log (`resume`), so an interrupted run resumes.

What it simplifies: without performance counters nothing checks that the core ran the
block without, say, a microcode assist.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import numpy as np

from diffsim.measure.config import MeasureConfig
from diffsim.measure.cpu import cpu_identity
from diffsim.measure.resume import ResumeLog
from diffsim.measure.runner import Runner, unroll_factors, warm_up
from diffsim.measure.screen import prefilter
from diffsim.measure.stats import spread


@dataclasses.dataclass(frozen=True)
class BlockResult:
  """One block's measurement, or why it has none.

  Attributes:
    cycles: core cycles per 100 iterations (median pass); None when rejected.
    spread: (max - min) / median over the passes; None when rejected.
    error: `reason: detail` when rejected, else None. The reason is a short category
      (`null-page`, `privileged`, `undecodable`...).
    passes: the per-pass values, in cycles per 100 iterations.
    contended: passes kept although they were disturbed (a busy core).
  """

  cycles: float | None
  spread: float | None = None
  error: str | None = None
  passes: tuple[float, ...] = ()
  contended: int = 0

  @property
  def reason(self) -> str | None:
    return None if self.error is None else self.error.split(":", 1)[0]

  @classmethod
  def from_record(cls, rec: dict) -> BlockResult:
    """The inverse of `dataclasses.asdict` after a JSON round trip (the resume log)."""
    return cls(rec["cycles"], rec["spread"], rec["error"], tuple(rec.get("passes", ())),
               rec.get("contended", 0))


class _Block:
  """A block being measured: its layout and the passes it has so far."""

  def __init__(self, runner: Runner, hex_bytes: str):
    self.hex = hex_bytes
    self.a, self.b = unroll_factors(len(hex_bytes) // 2)
    self.values: list[float] = []
    self.contended = 0
    self.deferred = 0
    self.waited = 0.0  # seconds of pauses for a busy core
    self.error: str | None = None
    # A short probe: catches faults before any real pass, and sizes the repeat count.
    probe = runner.time(hex_bytes, self.a, self.b, 4, 1)
    if isinstance(probe, str):
      self.error = probe
      return
    est = max(probe.cycles, 0.05)
    cfg = runner.config
    self.repeat = int(min(max(math.ceil(cfg.target_cycles / (self.b * est)), 1), 10_000))

  def wants_a_pass(self, cfg: MeasureConfig) -> bool:
    n = len(self.values)
    return self.error is None and (
        n < cfg.passes or (n < cfg.max_passes and spread(self.values) > cfg.disagree))

  def one_pass(self, runner: Runner) -> None:
    """Times a pass. A disturbed one is timed again after short pauses (2 ms, doubling)
    and then deferred to a later sweep, `deferrals` times; at its last chance the pauses
    go on (up to 0.2 s each) until the block has waited `contention_wait` seconds in
    all, and only then is a disturbed pass kept, and counted."""
    cfg = runner.config
    last_chance = self.deferred >= cfg.deferrals
    pause, waited = 0.002, 0.0
    while True:
      p = runner.time(self.hex, self.a, self.b, cfg.rounds, self.repeat)
      if isinstance(p, str):  # faults now but not in the probe (rare: timing-dependent)
        self.error = p
        return
      if runner.judge(p):
        break
      if runner.busy_host:
        self.contended += 1
        break
      if not last_chance and waited + pause > cfg.defer_after:
        self.deferred += 1
        return
      if last_chance and self.waited + pause > cfg.contention_wait:
        self.contended += 1  # still busy: keep the pass, but say so
        break
      time.sleep(pause)
      waited += pause
      self.waited += pause
      pause = min(2 * pause, 0.2)
    self.values.append(100.0 * p.cycles)

  def result(self) -> BlockResult:
    if self.error is not None:
      return BlockResult(None, error=self.error)
    med = float(np.median(self.values))
    return BlockResult(med, spread(self.values), None, tuple(self.values), self.contended)


def measure_blocks(runner: Runner, hexes: Sequence[str], *,
                   on_pass: Callable[[], None] | None = None,
                   ) -> Iterator[tuple[int, BlockResult]]:
  """Measures blocks (already prefiltered) in sweeps; yields (index, result) as each ends,
  and calls `on_pass` after each of a block's first `passes` passes (for progress).

  A block's passes are spread over time rather than run back to back: each sweep gives
  every unfinished block of a chunk one pass, so consecutive passes of a block lie a
  sweep apart (a fraction of a second, longer when the core is busy). A busy spell on
  a shared host can slow a block in ways the canaries miss; spread out, it reaches one
  pass of a block rather than all, and the median sets it aside.
  """
  cfg = runner.config
  for lo in range(0, len(hexes), cfg.chunk):
    blocks = [_Block(runner, h) for h in hexes[lo:lo + cfg.chunk]]
    while todo := [blk for blk in blocks if blk.wants_a_pass(cfg)]:
      for blk in todo:
        kept = len(blk.values)
        blk.one_pass(runner)
        if on_pass is not None and kept < len(blk.values) <= cfg.passes:
          on_pass()
    for k, blk in enumerate(blocks):
      yield lo + k, blk.result()


@dataclasses.dataclass
class RunStats:
  """What a run did: blocks measured, reused from the log, rejected, and how fast."""

  measured: int = 0
  resumed: int = 0
  rejected: dict[str, int] = dataclasses.field(default_factory=dict)
  seconds: float = 0.0  # time spent measuring (prefiltering excluded)
  contended_passes: int = 0  # disturbed passes kept (a block's last chance)
  passes: int = 0            # passes timed, disturbed ones included
  disturbed_passes: int = 0  # passes timed again because the core was busy

  @property
  def rate(self) -> float:
    """Blocks measured (or rejected at run time) per second."""
    return self.measured / self.seconds if self.seconds > 0 else math.nan


def measure_hexes(hexes: Sequence[str | None], config: MeasureConfig = MeasureConfig(), *,
                  log_path: Path | None = None, progress: bool = False,
                  on_result: Callable[[int, BlockResult], None] | None = None,
                  ) -> tuple[list[BlockResult], RunStats]:
  """Measures blocks given as hex strings, in order, resuming from `log_path`.

  Args:
    hexes: each block's machine code as hex; None for a row with no usable hex.
    config: how hard to measure (`MeasureConfig`).
    log_path: the resume log (`ResumeLog`); blocks already in it are not measured again.
    progress: a progress bar on stderr.
    on_result: called with (index, result) as each block finishes.

  Returns:
    One BlockResult per input (rejected ones carry their reason), and the run's stats.
  """
  cpu = cpu_identity()
  log = (ResumeLog(log_path, cpu, dataclasses.asdict(config)) if log_path is not None
         else None)
  stats = RunStats()
  results: list[BlockResult | None] = [None] * len(hexes)
  todo: list[int] = []
  for i, h in enumerate(hexes):
    if h is None:
      results[i] = BlockResult(None, error="bad-row: no usable hex in column 1")
    elif log is not None and (old := log.lookup(i, h)) is not None:
      results[i] = BlockResult.from_record(old)
      stats.resumed += 1
    else:
      todo.append(i)
  reasons = prefilter([hexes[i] for i in todo], progress=progress) if todo else []
  to_time = []
  for i, why in zip(todo, reasons):
    if why is None:
      to_time.append(i)
    else:
      results[i] = BlockResult(None, error=why)
      if log is not None:
        log.add(i, hexes[i], dataclasses.asdict(results[i]))
  try:
    if to_time:
      with Runner(config) as runner:
        warm_up(runner)
        # Progress in passes: a block's come in separate sweeps, and a busy core makes
        # them slow to come at all.
        bar = _bar(len(to_time) * config.passes) if progress else None
        t0 = time.perf_counter()
        for k, result in measure_blocks(runner, [hexes[i] for i in to_time],
                                        on_pass=bar.update if bar is not None else None):
          i = to_time[k]
          results[i] = result
          stats.measured += 1
          stats.contended_passes += results[i].contended
          if log is not None:
            log.add(i, hexes[i], dataclasses.asdict(results[i]))
          if on_result is not None:
            on_result(i, results[i])
        stats.seconds = time.perf_counter() - t0
        stats.passes, stats.disturbed_passes = runner.passes, runner.disturbed
        if bar is not None:
          bar.close()
  finally:
    if log is not None:
      log.close()
  for r in results:
    if r is not None and r.error is not None:
      stats.rejected[r.reason] = stats.rejected.get(r.reason, 0) + 1
  return [r for r in results if r is not None], stats


def _bar(total: int):
  from tqdm.auto import tqdm

  return tqdm(total=total, desc="measure", unit="pass", leave=False)
