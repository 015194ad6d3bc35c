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
  measured in sweeps: one pass per block per sweep); more when they disagree.
- A block has converged when `agree_passes` of its passes agree within `agree` (1%);
  its value is then the median of the fastest such cluster (`stats.consensus`): a busy
  neighbour only ever slows a pass, so on a busy core the median pass is a disturbed
  one, while the fastest values that repeat are the block's own. Blocks that have not
  converged after the sweeps are measured again in later sweeps, interleaved with the
  next chunks' and after the last, while a time budget lasts (by default as long again
  as the sweeps took; a quiet machine, where passes agree, spends nothing). Each row
  carries the spread (max - min) / median of all its passes and a confidence from 0 to
  1 (`stats.confidence`: how many passes agree, how tightly).
- Finished blocks go to a resume log (`resume`), so an interrupted run resumes; a block
  logged before its re-measuring ended (`pending`) is measured again on resuming.

What it simplifies: without performance counters nothing checks that the core ran the
block without, say, a microcode assist.
"""

from __future__ import annotations

import dataclasses
import math
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

from diffsim.measure.config import MeasureConfig
from diffsim.measure.cpu import cpu_identity
from diffsim.measure.resume import ResumeLog
from diffsim.measure.runner import Runner, unroll_factors, warm_up
from diffsim.measure.screen import prefilter
from diffsim.measure.stats import best_consensus, confidence, consensus, spread

# Re-measuring sweeps over few blocks are stretched to this many seconds, so that a
# block's extra passes still lie apart in time (a busy spell lasts up to seconds).
MIN_SWEEP_SECONDS = 0.05


@dataclasses.dataclass(frozen=True)
class BlockResult:
  """One block's measurement, or why it has none.

  Attributes:
    cycles: core cycles per 100 iterations (the median of the fastest cluster of
      agreeing passes, `stats.best_consensus`); None when rejected.
    spread: (max - min) / median over all the passes; None when rejected.
    error: `reason: detail` when rejected, else None. The reason is a short category
      (`null-page`, `privileged`, `undecodable`...).
    passes: the per-pass values, in cycles per 100 iterations.
    contended: passes kept although they were disturbed (a busy core).
    confidence: 0 to 1, how far `cycles` can be trusted (`stats.confidence`); None
      when rejected.
    pending: a provisional result, logged while the block waits to be measured again
      (a resumed run measures it again).
    seconds: the block's share of the sweeps' time, which earns the re-measuring
      budget it may use (also on resuming).
  """

  cycles: float | None
  spread: float | None = None
  error: str | None = None
  passes: tuple[float, ...] = ()
  contended: int = 0
  confidence: float | None = None
  pending: bool = False
  seconds: float = 0.0

  @property
  def reason(self) -> str | None:
    return None if self.error is None else self.error.split(":", 1)[0]

  @classmethod
  def from_record(cls, rec: dict) -> BlockResult:
    """The inverse of `dataclasses.asdict` after a JSON round trip (the resume log).
    A record from before confidences has its confidence worked out from its passes
    (with the default settings), and its value kept."""
    passes = tuple(rec.get("passes", ()))
    conf = rec.get("confidence")
    if conf is None and rec["cycles"] is not None:
      conf = _confidence(passes, MeasureConfig())
    return cls(rec["cycles"], rec["spread"], rec["error"], passes, rec.get("contended", 0),
               conf, rec.get("pending", False), rec.get("seconds", 0.0))


def _confidence(values: Sequence[float], cfg: MeasureConfig) -> float:
  return confidence(best_consensus(values, cfg.agree_passes, cfg.agree), cfg.agree_passes,
                    cfg.agree)


class _Block:
  """A block being measured: its layout and the passes it has so far."""

  def __init__(self, runner: Runner, hex_bytes: str, earlier: BlockResult | None = None):
    self.hex = hex_bytes
    self.a, self.b = unroll_factors(len(hex_bytes) // 2)
    self.values: list[float] = list(earlier.passes) if earlier is not None else []
    self.contended = earlier.contended if earlier is not None else 0
    self.seconds = earlier.seconds if earlier is not None else 0.0
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

  def converged(self, cfg: MeasureConfig) -> bool:
    """Whether `agree_passes` passes agree within `agree`, and as many more for each
    pass faster than them (`stats.Consensus.converged`)."""
    k = min(cfg.agree_passes, cfg.max_total_passes)
    c = consensus(self.values, k, cfg.agree)
    return c is not None and c.converged(k)

  def wants_more(self, cfg: MeasureConfig) -> bool:
    """Whether re-measuring would help: no consistent cluster yet, passes left."""
    return (self.error is None and len(self.values) < cfg.max_total_passes
            and not self.converged(cfg))

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

  def result(self, cfg: MeasureConfig, pending: bool = False) -> BlockResult:
    if self.error is not None:
      return BlockResult(None, error=self.error)
    c = best_consensus(self.values, cfg.agree_passes, cfg.agree)
    return BlockResult(c.value, spread(self.values), None, tuple(self.values), self.contended,
                       confidence(c, cfg.agree_passes, cfg.agree), pending,
                       round(self.seconds, 4))


class _Budget:
  """The re-measuring budget: earned as the sweeps take time (`budget_share` of it), or
  fixed (`budget_seconds`); spent by re-measuring sweeps, pauses included."""

  def __init__(self, cfg: MeasureConfig):
    self.cfg = cfg
    self.earned = cfg.budget_seconds if cfg.budget_seconds is not None else 0.0
    self.spent = 0.0

  def earn(self, sweep_seconds: float) -> None:
    if self.cfg.budget_seconds is None:
      self.earned += self.cfg.budget_share * sweep_seconds

  @property
  def any(self) -> bool:
    """Whether re-measuring is on at all."""
    return (self.cfg.budget_seconds or 0) > 0 or (
      self.cfg.budget_seconds is None and self.cfg.budget_share > 0)

  @property
  def left(self) -> float:
    return self.earned - self.spent


def measure_blocks(runner: Runner, hexes: Sequence[str], *,
                   on_pass: Callable[[], None] | None = None,
                   earlier: dict[int, BlockResult] | None = None,
                   stats: RunStats | None = None,
                   ) -> Iterator[tuple[int, BlockResult]]:
  """Measures blocks (already prefiltered) in sweeps; yields (index, result) as each ends,
  and calls `on_pass` after each of a block's first `passes` passes (for progress).

  A block's passes are spread over time rather than run back to back: each sweep gives
  every unfinished block of a chunk one pass, so consecutive passes of a block lie a
  sweep apart (a fraction of a second, longer when the core is busy). A busy spell on
  a shared host can slow a block in ways the canaries miss; spread out, it reaches one
  pass of a block rather than all, and the fastest cluster of agreeing passes sets
  it aside.

  Blocks without such a cluster after their sweeps are yielded as `pending` and join
  a pool that is measured again: one sweep after each chunk, then sweeps until every
  block has converged, reached `max_total_passes` or the budget (`_Budget`) is spent;
  each is yielded again, final, when it leaves the pool. `earlier` maps indices to
  pending results of an interrupted run, which go to the pool with their passes (and
  the budget their sweeps earned). `stats`, when given, counts the re-measuring.
  """
  cfg = runner.config
  budget = _Budget(cfg)
  earlier = earlier or {}
  pool: list[tuple[int, _Block]] = []
  for k, old in earlier.items():
    blk = _Block(runner, hexes[k], old)
    if blk.error is not None or not blk.wants_more(cfg):
      yield k, blk.result(cfg)
      continue
    budget.earn(blk.seconds)
    pool.append((k, blk))
  if stats is not None:
    stats.remeasured += len(pool)
  fresh = [k for k in range(len(hexes)) if k not in earlier]
  for lo in range(0, len(fresh), cfg.chunk):
    t0 = time.perf_counter()
    idx = fresh[lo:lo + cfg.chunk]
    blocks = [_Block(runner, hexes[k]) for k in idx]
    while todo := [blk for blk in blocks if blk.wants_a_pass(cfg)]:
      for blk in todo:
        kept = len(blk.values)
        blk.one_pass(runner)
        if on_pass is not None and kept < len(blk.values) <= cfg.passes:
          on_pass()
    took = time.perf_counter() - t0
    budget.earn(took)
    for k, blk in zip(idx, blocks):
      blk.seconds = took / len(blocks)
      if budget.any and blk.wants_more(cfg):
        pool.append((k, blk))
        if stats is not None:
          stats.remeasured += 1
        yield k, blk.result(cfg, pending=True)
      else:
        yield k, blk.result(cfg)
    yield from _remeasure(runner, pool, budget, 1, stats)
  yield from _remeasure(runner, pool, budget, None, stats)
  for k, blk in pool:  # the budget is spent: they stay as they are
    yield k, blk.result(cfg)
  if stats is not None:
    stats.unconverged += sum(1 for _, blk in pool if blk.error is None)


def _remeasure(runner: Runner, pool: list[tuple[int, _Block]], budget: _Budget,
               sweeps: int | None, stats: RunStats | None) -> Iterator[tuple[int, BlockResult]]:
  """Sweeps over the pool (at most `sweeps`), one pass per block each, while the budget
  lasts; yields each block that converges (or runs out of passes) and drops it."""
  cfg = runner.config
  done = 0
  while pool and budget.left > 0 and (sweeps is None or done < sweeps):
    t0 = time.perf_counter()
    for entry in list(pool):
      if budget.left <= 0:
        break
      k, blk = entry
      t = time.perf_counter()
      kept = len(blk.values)
      blk.one_pass(runner)
      budget.spent += time.perf_counter() - t
      if stats is not None:
        stats.extra_passes += len(blk.values) - kept
      if not blk.wants_more(cfg):
        pool.remove(entry)
        if stats is not None and blk.error is None and not blk.converged(cfg):
          stats.unconverged += 1  # out of passes
        yield k, blk.result(cfg)
    done += 1
    pause = min(MIN_SWEEP_SECONDS - (time.perf_counter() - t0), budget.left)
    if pool and pause > 0 and (sweeps is None or done < sweeps):
      time.sleep(pause)
      budget.spent += pause
    if stats is not None:
      stats.extra_seconds = budget.spent


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
  remeasured: int = 0        # blocks measured again: their passes did not agree
  extra_passes: int = 0      # passes kept while re-measuring
  extra_seconds: float = 0.0  # time spent re-measuring, pauses included
  unconverged: int = 0       # blocks still without agreeing passes at the end (budget or passes)

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
    A block logged as `pending` by an interrupted run is measured again from its
    logged passes (counted as resumed).
  """
  cpu = cpu_identity()
  log = (ResumeLog(log_path, cpu, dataclasses.asdict(config)) if log_path is not None
         else None)
  stats = RunStats()
  results: list[BlockResult | None] = [None] * len(hexes)
  todo: list[int] = []
  earlier: dict[int, BlockResult] = {}  # pending results of an interrupted run
  for i, h in enumerate(hexes):
    if h is None:
      results[i] = BlockResult(None, error="bad-row: no usable hex in column 1")
    elif log is not None and (old := log.lookup(i, h)) is not None:
      results[i] = BlockResult.from_record(old)
      stats.resumed += 1
      if results[i].pending:
        earlier[i] = results[i]
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
  to_time = sorted(to_time + list(earlier))
  try:
    if to_time:
      with Runner(config) as runner:
        warm_up(runner)
        # Progress in passes: a block's come in separate sweeps, and a busy core makes
        # them slow to come at all.
        bar = _bar((len(to_time) - len(earlier)) * config.passes) if progress else None
        t0 = time.perf_counter()
        again = {k: earlier[i] for k, i in enumerate(to_time) if i in earlier}
        counted = set(again)
        for k, result in measure_blocks(runner, [hexes[i] for i in to_time],
                                        on_pass=bar.update if bar is not None else None,
                                        earlier=again, stats=stats):
          i = to_time[k]
          results[i] = result
          if k not in counted:
            counted.add(k)
            stats.measured += 1
          if log is not None:
            log.add(i, hexes[i], dataclasses.asdict(result))
          if result.pending:
            continue
          stats.contended_passes += result.contended
          if on_result is not None:
            on_result(i, result)
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
