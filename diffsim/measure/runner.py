"""The Python side of `runner.c`'s protocol: one request line per timed pass, every
round's ticks back, turned into core cycles per iteration (`Pass`).

The runner lays a block out unrolled a and b times and times it with the TSC in a
forked child, together with a calibration chain (a 1-cycle-per-instruction `add` chain:
the TSC is not the core clock, and the core clock drifts) and canaries bound by the
ALUs, the load pipes and the store pipes, whose speed tells whether the core was the
pass's own (`Runner.judge`).
"""

from __future__ import annotations

import collections
import dataclasses
import math
import os
import subprocess
import time

import numpy as np

from diffsim.measure.build import MeasureError, runner_path
from diffsim.measure.config import MeasureConfig
from diffsim.measure.stats import lowest_cluster_sorted, snippet_estimates

# Must match runner.c: instructions in the calibration chain's two layouts and the
# times each repeats; iterations of the canaries' two layouts and their repeats.
CHAIN_A, CHAIN_B, CHAIN_REPEAT = 1000, 500, 6
CANARY_A, CANARY_B, CANARY_REPEAT = 200, 100, 10
MAX_ROUNDS = 1024
CANARIES = ("alu", "load", "store")
SNIPPETS = ("chain_a", "chain_b", *(f"{c}_{ab}" for c in CANARIES for ab in "ab"),
            "block_a", "block_b")

# Unrolled code stays within 16 KiB, well inside a 32 KiB L1 instruction cache.
CODE_BUDGET = 16384


def unroll_factors(nbytes: int) -> tuple[int, int]:
  """BHive's unroll pair (a, b): (200, 100), smaller for long blocks, b = a / 2.

  >>> unroll_factors(10), unroll_factors(160)
  ((200, 100), (102, 51))
  """
  a = min(200, CODE_BUDGET // max(nbytes, 1))
  a = max(a - a % 2, 2)
  return a, a // 2


@dataclasses.dataclass(frozen=True)
class Pass:
  """One timed pass: the block's and the canaries' cycles per iteration."""

  cycles: float                # block, core cycles per iteration
  canaries: tuple[float, ...]  # each canary (CANARIES), core cycles per iteration
  tsc_per_cycle: float         # TSC ticks per core cycle during this pass
  quiet_rounds: int            # rounds whose canaries ran at full speed
  steady: float                # least share, over all snippets, of rounds at the minimum

  def undisturbed(self, quiet: np.ndarray, config: MeasureConfig) -> bool:
    """Whether the core was the pass's own: every canary ran at its quiet speed (`quiet`,
    `Runner.quiet_canaries`), and every snippet read its fastest time in most rounds.

    The canaries alone miss a busy spell that hits the block's rounds and not theirs
    (contention on a shared host comes and goes within a millisecond pass); a pass run
    in peace repeats its times, so a minimum that few rounds reach was luck.
    """
    slow = np.asarray(self.canaries) > quiet * (1 + config.contention_tolerance)
    return not slow.any() and self.steady >= config.min_steady


class Disturbed(MeasureError):
  """A pass whose calibration failed: the core was taken from it throughout."""


class Runner:
  """A running `runner` server pinned to one core; one request per timed pass.

  Use as a context manager. The runner forks a child per request, so a block that
  faults or hangs costs that request only.
  """

  def __init__(self, config: MeasureConfig = MeasureConfig()):
    self.config = config
    exe = runner_path()
    cpus = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else [0]
    cpu = cpus[-1] if config.cpu is None else config.cpu
    if cpu not in cpus:
      raise MeasureError(f"cannot run on core {cpu}: this process may use cores "
                         f"{', '.join(map(str, cpus))}")
    self.cpu = cpu
    self._proc = subprocess.Popen([str(exe), "--cpu", str(cpu)], stdin=subprocess.PIPE,
                                  stdout=subprocess.PIPE, text=True, bufsize=1)
    self._canaries: list[tuple[float, ...]] = []  # each pass's canaries, this run
    self._sorted = [np.empty(0) for _ in CANARIES]  # the same, each canary sorted
    self.passes = self.disturbed = 0   # timed passes of blocks, and how many were disturbed
    self._recent: collections.deque[bool] = collections.deque(maxlen=256)  # disturbed?

  def note(self, p: Pass) -> None:
    """Records a pass's canaries, for `quiet_canaries` (kept sorted as they come: the
    reference is read after every pass, and sorting a long run's history each time
    would cost more than the pass)."""
    self._canaries.append(p.canaries)
    if len(self._canaries) > 20_000:
      del self._canaries[:10_000]
      history = np.array(self._canaries)
      self._sorted = [np.sort(column[np.isfinite(column)]) for column in history.T]
      return
    for k, value in enumerate(p.canaries):
      if math.isfinite(value):
        x = self._sorted[k]
        self._sorted[k] = np.insert(x, np.searchsorted(x, value), value)

  def judge(self, p: Pass) -> bool:
    """Records a block's pass, and whether it was undisturbed (`Pass.undisturbed`)."""
    self.note(p)
    quiet = p.undisturbed(self.quiet_canaries, self.config)
    self.passes += 1
    self.disturbed += not quiet
    self._recent.append(not quiet)
    return quiet

  @property
  def busy_host(self) -> bool:
    """Nearly every recent pass was disturbed: a busy spell that waiting will not end
    soon (a neighbour on the host's other hardware thread, say). Blocks then keep their
    disturbed passes at once, flagged, instead of each waiting its budget out."""
    return len(self._recent) == self._recent.maxlen and sum(self._recent) > 0.9 * len(self._recent)

  @property
  def quiet_canaries(self) -> np.ndarray:
    """Each canary's speed on a quiet core: the fastest value that several of the run's
    passes share (`stats.lowest_cluster`).

    Canaries are in core cycles, so clock drift does not move them, and on a quiet core
    they repeat their value closely, while a busy core scatters them upwards; so the
    lowest tight cluster is the quiet speed even when most passes were disturbed (a
    low percentile is not). Not the minimum: a pass whose calibration went wrong can
    read absurdly low, and would make every later pass look contended.
    """
    return np.array([lowest_cluster_sorted(x) for x in self._sorted])

  def close(self) -> None:
    if self._proc.poll() is None:
      self._proc.stdin.close()
      self._proc.wait(timeout=30)

  def __enter__(self) -> Runner:  # noqa: PYI034
    return self

  def __exit__(self, *exc) -> None:
    self.close()

  def time(self, hex_bytes: str, a: int, b: int, rounds: int, repeat: int,
           tries: int = 4) -> Pass | str:
    """Times one pass of a block; a Pass, or `reason: detail` when the child failed.

    A pass whose calibration chain read no slower at its longer length was disturbed
    throughout (a busy or descheduled core): it is timed again, up to `tries` times,
    before the run gives up.
    """
    for attempt in range(tries):
      try:
        return self._time_once(hex_bytes, a, b, rounds, repeat)
      except Disturbed:
        if attempt == tries - 1:
          raise

  def _time_once(self, hex_bytes: str, a: int, b: int, rounds: int, repeat: int) -> Pass | str:
    line = f"{hex_bytes} {a} {b} {rounds} {self.config.max_pages} {repeat}\n"
    try:
      self._proc.stdin.write(line)
      self._proc.stdin.flush()
      answer = self._proc.stdout.readline()
    except (BrokenPipeError, OSError) as e:
      raise MeasureError(f"the runner died ({e})") from None
    if not answer:
      raise MeasureError(f"the runner died (exit status {self._proc.poll()})")
    kind, _, rest = answer.rstrip("\n").partition(" ")
    if kind == "err":
      reason, _, detail = rest.partition(" ")
      return f"{reason}: {detail}"
    head = rest.split(" ", 3)
    quantum, n = int(head[1]), int(head[2])
    times = np.array(head[3].split(), np.float64).reshape(len(SNIPPETS), n)
    return pass_from_times(times, quantum, a, b, repeat)


def pass_from_times(times: np.ndarray, quantum: int, a: int, b: int, repeat: int) -> Pass:
  """Cycles per iteration from every round's ticks ([10, R] float64, SNIPPETS order).

  Each snippet's ticks come from `stats.snippet_estimates`; the calibration chain's
  two lengths give TSC ticks per core cycle, and the a and b layouts' difference the
  block's (and each canary's) cycles per iteration.
  """
  canary_rows = times[SNIPPETS.index(f"{CANARIES[0]}_a"):SNIPPETS.index("block_a")]
  est, near, quiet_rounds = snippet_estimates(times, canary_rows, quantum)
  chain_a, chain_b, *canary_ab, block_a, block_b = est
  tsc_per_cycle = (chain_a - chain_b) / ((CHAIN_A - CHAIN_B) * CHAIN_REPEAT)
  if not tsc_per_cycle > 0:
    raise Disturbed("the calibration chain did not slow down with its length: "
                    f"ticks {chain_a} vs {chain_b}")
  cycles = (block_a - block_b) / ((a - b) * repeat) / tsc_per_cycle
  canaries = tuple(float(ca - cb) / ((CANARY_A - CANARY_B) * CANARY_REPEAT) / tsc_per_cycle
                   for ca, cb in zip(canary_ab[::2], canary_ab[1::2]))
  return Pass(float(cycles), canaries, float(tsc_per_cycle), quiet_rounds, min(near))


def warm_up(runner: Runner, seconds: float = 0.3) -> None:
  """Records the canaries over a few passes of a trivial block.

  Contention is judged against the canaries of the run's passes; a first sample before
  the first real block keeps that block from setting the reference alone.
  """
  t0 = time.perf_counter()
  while time.perf_counter() - t0 < seconds:
    p = runner.time("90", 200, 100, runner.config.rounds, 30)
    if isinstance(p, Pass):
      runner.note(p)
