"""How hard to measure: the settings of a measuring run (passes, rounds, patience, and
the time it may spend measuring again the blocks whose passes disagree)."""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True)
class MeasureConfig:
  """How hard to measure. The defaults follow the Zen 5 harness's README.

  Attributes:
    passes: independent passes per block (each a forked child).
    max_passes: passes when the first ones disagree by more than `disagree`.
    disagree: relative spread, (max - min) / median, that calls for more passes.
    rounds: timed rounds per pass; every snippet is timed once per round.
    max_pages: scratch pages a block may touch before it is rejected (no longer
      L1-resident).
    target_cycles: the b-layout is repeated until it lasts about this many cycles, so
      a coarse TSC (steps of 26 ticks here) still resolves 0.1%.
    contention_tolerance: a pass with a canary this much slower than on a quiet core
      was run on a busy core, and is repeated.
    min_steady: share of a pass's rounds in which each snippet (block, calibration
      chain, canaries) must read its fastest time (within 1%), or the pass was disturbed
      and is repeated like a contended one.
    defer_after: seconds of pauses (2 ms, doubling) a disturbed pass may wait for the
      core to become quiet before it is deferred to the next sweep.
    deferrals: sweeps a block's disturbed pass may be deferred; at the last chance it
      waits on, and after `contention_wait` seconds of pauses for the block it is kept
      and counted in `BlockResult.contended`.
    contention_wait: seconds of pauses a block may spend waiting for a quiet core.
    chunk: blocks measured together in sweeps (each sweep gives every unfinished block
      one pass), so that a block's passes are spread in time; an interrupted run
      loses at most the chunk it was measuring.
    cpu: the core to pin the runner to (default: the last one this process may use).
    agree: passes within this relative width of each other agree.
    agree_passes: a block has converged when this many of its passes agree (the
      fastest such cluster gives its value: noise only ever slows a pass down); one
      that has not after the sweeps is measured again, in later sweeps.
    max_total_passes: passes a block may get in all, re-measuring included.
    budget_share: re-measuring may take this share of the time the sweeps took (1:
      a busy machine spends at most about as long again; a quiet one, where passes
      agree, nothing).
    budget_seconds: a fixed re-measuring budget per run, in seconds, instead of
      `budget_share` (0: never measure again).
  """

  passes: int = 3
  max_passes: int = 5
  disagree: float = 0.03
  rounds: int = 32
  max_pages: int = 12
  target_cycles: float = 3000.0
  contention_tolerance: float = 0.03
  min_steady: float = 0.5
  defer_after: float = 0.03
  deferrals: int = 3
  contention_wait: float = 0.2
  chunk: int = 128
  cpu: int | None = None
  agree: float = 0.01
  agree_passes: int = 3
  max_total_passes: int = 16
  budget_share: float = 1.0
  budget_seconds: float | None = None

  @classmethod
  def quick(cls) -> MeasureConfig:
    """Fewer rounds and passes: for tests and notebooks, about 3x faster."""
    return cls(passes=2, max_passes=3, rounds=16, agree_passes=2, max_total_passes=8)
