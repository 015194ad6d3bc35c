"""Measuring basic-block throughput on this machine's CPU: the harness around the runner.

The native runner (`runner.c`) lays a block out unrolled a and b times, times it with
the TSC in a forked child and hands back every round's ticks; this module decides what
to run and turns ticks into core cycles per 100 iterations, BHive's unit and
definition: 100 (L_a - L_b) / (a - b). It follows the method of the harness behind
`../shared/data/measured/` (its README):

- The TSC is not the core clock, and the core clock drifts, so a 1-cycle-per-instruction
  `add` chain timed in the same rounds calibrates every pass.
- A canary (independent adds, bound by the ALUs) is timed in the same rounds too. Rounds
  in which it runs slow are left out; a pass whose canary is still slower than on a
  quiet core (a low percentile of recent passes) was contended and is repeated.
- Several passes, each in its own forked child; more when they disagree; the value is
  the median pass and the spread (max - min) / median is reported with it.

What it simplifies: passes of one block follow each other (they are independent
processes, not spread over the run), and without performance counters nothing checks
that the core ran the block without, say, a microcode assist.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from diffsim.measure.build import MeasureError, runner_path

# Must match runner.c: instructions in the calibration chain's two layouts and the
# times each repeats; iterations of the canary's two layouts and their repeats.
CHAIN_A, CHAIN_B, CHAIN_REPEAT = 1000, 500, 6
CANARY_A, CANARY_B, CANARY_REPEAT = 200, 100, 15
MAX_ROUNDS = 1024
SNIPPETS = ("chain_a", "chain_b", "canary_a", "canary_b", "block_a", "block_b")

# Unrolled code stays within 16 KiB, well inside a 32 KiB L1 instruction cache.
CODE_BUDGET = 16384

# Instructions that a user-space harness cannot time (category, reason per mnemonic):
# they trap to the kernel or hypervisor, need privileges, end the block's straight-line
# flow, or read the very clock the harness times with.
_SYSTEM = ("syscall sysenter sysexit sysret int int1 int3 into iret iretd iretq "
           "ud0 ud1 ud2 ud2b")
_PRIVILEGED = ("hlt in insb insw insd out outsb outsw outsd cli sti clts lgdt lidt lldt ltr "
               "lmsw invd wbinvd wbnoinvd invlpg invlpga invpcid rdmsr wrmsr rdpmc swapgs "
               "xsetbv monitor mwait monitorx mwaitx vmcall vmmcall vmlaunch vmresume vmxoff "
               "vmxon vmrun vmload vmsave stgi clgi skinit sgdt sidt sldt str smsw "
               "wrfsbase wrgsbase rdfsbase rdgsbase")
_CONTROL_FLOW = ("call jmp ret retf loop loope loopne jrcxz jecxz ja jae jb jbe je jg jge jl jle "
                 "jne jno jnp jns jo jp js")
# cpuid and rdrand/rdseed may exit to the hypervisor; TSX aborts or is absent.
_UNTIMEABLE = "cpuid rdtsc rdtscp rdpid rdrand rdseed xbegin xend xabort xtest"
_SEGMENT_REGISTERS = ("%cs", "%ds", "%es", "%fs", "%gs", "%ss")
UNTIMEABLE: dict[str, str] = {}
for _cat, _names in (("untimeable", _UNTIMEABLE), ("control-flow", _CONTROL_FLOW),
                     ("privileged", _PRIVILEGED), ("system", _SYSTEM)):
  UNTIMEABLE.update((name, _cat) for name in _names.split())


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
    contention_tolerance: a pass whose canary is this much slower than the best canary
      seen was run on a busy core, and is repeated.
    contention_retries: repeats of a contended pass before its value is kept anyway.
    cpu: the core to pin the runner to (default: the last one this process may use).
  """

  passes: int = 3
  max_passes: int = 5
  disagree: float = 0.03
  rounds: int = 32
  max_pages: int = 12
  target_cycles: float = 3000.0
  contention_tolerance: float = 0.03
  contention_retries: int = 3
  cpu: int | None = None

  @classmethod
  def quick(cls) -> MeasureConfig:
    """Fewer rounds and passes: for tests and notebooks, about 3x faster."""
    return cls(passes=2, max_passes=3, rounds=16, contention_retries=2)


@dataclasses.dataclass(frozen=True)
class BlockResult:
  """One block's measurement, or why it has none.

  Attributes:
    cycles: core cycles per 100 iterations (median pass); None when rejected.
    spread: (max - min) / median over the passes; None when rejected.
    error: `reason: detail` when rejected, else None. The reason is a short category
      (`null-page`, `privileged`, `undecodable`...).
    passes: the per-pass values, in cycles per 100 iterations.
    contended: passes kept although their canary said the core was busy.
  """

  cycles: float | None
  spread: float | None = None
  error: str | None = None
  passes: tuple[float, ...] = ()
  contended: int = 0

  @property
  def reason(self) -> str | None:
    return None if self.error is None else self.error.split(":", 1)[0]


def cpu_identity() -> dict[str, object]:
  """The CPU this process runs on, from /proc/cpuinfo (vendor, family, model, ...)."""
  info: dict[str, str] = {}
  try:
    with open("/proc/cpuinfo") as f:
      for line in f:
        if not line.strip():
          break  # the first processor is enough
        key, _, value = line.partition(":")
        info[key.strip()] = value.strip()
  except OSError:
    pass

  def as_int(key: str) -> int | None:
    try:
      return int(info[key])
    except (KeyError, ValueError):
      return None

  flags = info.get("flags", "").split()
  return {"vendor": info.get("vendor_id", "unknown"), "family": as_int("cpu family"),
          "model": as_int("model"), "stepping": as_int("stepping"),
          "model_name": info.get("model name", "unknown"),
          "virtualised": "hypervisor" in flags, "logical_cpus": os.cpu_count()}


def describe_cpu(cpu: dict[str, object]) -> str:
  """`AuthenticAMD family 25 model 17 stepping 1 (AMD EPYC), a VM`."""
  fam, model = cpu.get("family"), cpu.get("model")

  def hx(v: object) -> str:
    return "?" if v is None else f"{v} (0x{v:x})"

  s = (f"{cpu.get('vendor')} family {hx(fam)} model {hx(model)} stepping "
       f"{cpu.get('stepping')} ({cpu.get('model_name')})")
  return s + (", virtualised" if cpu.get("virtualised") else "")


def unroll_factors(nbytes: int) -> tuple[int, int]:
  """BHive's unroll pair (a, b): (200, 100), smaller for long blocks, b = a / 2.

  >>> unroll_factors(10), unroll_factors(160)
  ((200, 100), (102, 51))
  """
  a = min(200, CODE_BUDGET // max(nbytes, 1))
  a = max(a - a % 2, 2)
  return a, a // 2


def untimeable_reason(block) -> str | None:
  """`category: mnemonic (text)` when a decoded block cannot be timed in user space."""
  for k, ins in enumerate(block.instrs):
    category = UNTIMEABLE.get(ins.mnemonic)
    if category is None and ins.mnemonic == "mov" and ("%cr" in ins.text or "%db" in ins.text
                                                       or "%dr" in ins.text):
      category = "privileged"  # moves to and from control and debug registers
    if category is None and ins.mnemonic in ("mov", "pop") and ins.text.rstrip().endswith(
        _SEGMENT_REGISTERS):
      category = "privileged"  # loading a segment register: the thread's own fs, say
    if category is not None:
      return f"{category}: instruction {k} `{ins.text}` cannot be timed in user space"
  return None


@dataclasses.dataclass(frozen=True)
class Pass:
  """One timed pass: the block's and the canary's cycles per iteration."""

  cycles: float          # block, core cycles per iteration
  canary: float          # canary, core cycles per iteration
  tsc_per_cycle: float   # TSC ticks per core cycle during this pass
  quiet_rounds: int      # rounds whose canary ran at full speed


class _Disturbed(MeasureError):
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
    self._canaries: list[float] = []  # cycles per canary iteration, recent passes

  def note_canary(self, canary: float) -> None:
    """Records a pass's canary, for `quiet_canary`."""
    self._canaries = self._canaries[-199:] + [canary]

  @property
  def quiet_canary(self) -> float:
    """The canary's speed on a quiet core: a low percentile of recent passes.

    Not the minimum: one pass that reads low by chance would make every later pass
    look contended.
    """
    if not self._canaries:
      return math.inf
    return float(np.percentile(self._canaries, 20))

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
      except _Disturbed:
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
    return _pass_from_times(times, quantum, a, b, repeat)


def _pass_from_times(times: np.ndarray, quantum: int, a: int, b: int, repeat: int) -> Pass:
  """Cycles per iteration from every round's ticks ([6, R] float64, SNIPPETS order).

  Rounds whose canary ran slower than the pass's best by more than 1% (and a TSC step)
  were disturbed, most often by another thread on the same core, and are left out.
  Among the rest, each snippet's estimate is the mean of the rounds within one TSC step
  of its minimum: undisturbed rounds read the duration rounded down or up to a step,
  depending on the uniform phase of the start, so their mean is unbiased below the
  step, where a minimum would not be.
  """
  ca, cb = times[SNIPPETS.index("canary_a")], times[SNIPPETS.index("canary_b")]
  quiet = (ca <= ca.min() * 1.01 + quantum) & (cb <= cb.min() * 1.01 + quantum)
  if quiet.sum() < 2:  # busy throughout: the canary check in `measure_block` will say so
    quiet = np.ones_like(quiet)
  est = []
  for row in times:
    v = row[quiet]
    est.append(v[v <= v.min() + quantum].mean())
  chain_a, chain_b, canary_a, canary_b, block_a, block_b = est
  tsc_per_cycle = (chain_a - chain_b) / ((CHAIN_A - CHAIN_B) * CHAIN_REPEAT)
  if not tsc_per_cycle > 0:
    raise _Disturbed("the calibration chain did not slow down with its length: "
                     f"ticks {chain_a} vs {chain_b}")
  cycles = (block_a - block_b) / ((a - b) * repeat) / tsc_per_cycle
  canary = (canary_a - canary_b) / ((CANARY_A - CANARY_B) * CANARY_REPEAT) / tsc_per_cycle
  return Pass(float(cycles), float(canary), float(tsc_per_cycle), int(quiet.sum()))


def measure_block(runner: Runner, hex_bytes: str) -> BlockResult:
  """Measures one block (already prefiltered) with the runner's configuration."""
  cfg = runner.config
  a, b = unroll_factors(len(hex_bytes) // 2)
  # A short probe: catches faults before any real pass, and sizes the repeat count.
  probe = runner.time(hex_bytes, a, b, 4, 1)
  if isinstance(probe, str):
    return BlockResult(None, error=probe)
  est = max(probe.cycles, 0.05)
  repeat = int(min(max(math.ceil(cfg.target_cycles / (b * est)), 1), 10_000))
  values: list[float] = []
  contended = 0
  while len(values) < cfg.passes or (len(values) < cfg.max_passes
                                     and _spread(values) > cfg.disagree):
    for attempt in range(cfg.contention_retries + 1):
      p = runner.time(hex_bytes, a, b, cfg.rounds, repeat)
      if isinstance(p, str):  # faults now but not in the probe (rare: timing-dependent)
        return BlockResult(None, error=p)
      runner.note_canary(p.canary)
      if p.canary <= runner.quiet_canary * (1 + cfg.contention_tolerance):
        break
    else:
      contended += 1  # still busy after the retries: keep the last pass, but say so
    values.append(100.0 * p.cycles)
  med = float(np.median(values))
  return BlockResult(med, _spread(values), None, tuple(values), contended)


def _spread(values: Sequence[float]) -> float:
  if len(values) < 2:
    return math.inf
  med = float(np.median(values))
  return float(max(values) - min(values)) / med if med > 0 else math.inf


def warm_up(runner: Runner, seconds: float = 0.3) -> None:
  """Records the canary over a few passes of a trivial block.

  Contention is judged against the canary of recent passes; a first sample before
  the first real block keeps that block from setting the reference alone.
  """
  t0 = time.perf_counter()
  while time.perf_counter() - t0 < seconds:
    p = runner.time("90", 200, 100, runner.config.rounds, 30)
    if isinstance(p, Pass):
      runner.note_canary(p.canary)


# ---------------------------------------------------------------------------------
# Many blocks, with prefiltering and resumable progress.


def prefilter(hexes: Sequence[str], *, progress: bool = False) -> list[str | None]:
  """Why each block cannot be measured (None when it can), from the decoder.

  Undecodable blocks keep the decoder's reason; decoded ones are rejected when an
  instruction is system, privileged, control flow or untimeable (`UNTIMEABLE`).
  """
  from diffsim.isa import decode_blocks

  out: list[str | None] = []
  for blk in decode_blocks(list(hexes), progress=progress):
    if isinstance(blk, Exception):
      out.append(f"undecodable: {blk}")
    else:
      out.append(untimeable_reason(blk))
  return out


class ResumeLog:
  """Append-only record of finished blocks, so that an interrupted run resumes.

  One JSON object per line: a header (CPU identity, configuration), then one line per
  finished row, flushed and fsynced as it is written. A half-written last line (the
  run was killed mid-write) is ignored. A log from another CPU is refused: its numbers
  would not belong in this file.
  """

  def __init__(self, path: Path, cpu: dict[str, object], config: MeasureConfig):
    self.path = path
    self.done: dict[int, tuple[str, BlockResult]] = {}
    header = {"diffsim_measure": 1, "cpu": cpu, "config": dataclasses.asdict(config)}
    if path.exists():
      lines = path.read_text().splitlines()
      try:
        old = json.loads(lines[0]) if lines else None
      except json.JSONDecodeError:
        old = None
      if old is not None and old.get("cpu", {}).get("model") is not None and (
          _cpu_key(old["cpu"]) != _cpu_key(cpu)):
        raise MeasureError(f"{path} holds measurements of another CPU "
                           f"({describe_cpu(old['cpu'])}); delete it to start over")
      for line in lines[1:]:
        try:
          rec = json.loads(line)
        except json.JSONDecodeError:
          continue
        self.done[rec["row"]] = (rec["hex"], BlockResult(
            rec["cycles"], rec["spread"], rec["error"], tuple(rec.get("passes", ())),
            rec.get("contended", 0)))
      self._f = open(path, "a")  # noqa: SIM115 (open for the whole run; see close)
    else:
      path.parent.mkdir(parents=True, exist_ok=True)
      self._f = open(path, "w")  # noqa: SIM115
      self._write(header)

  def lookup(self, row: int, hex_bytes: str) -> BlockResult | None:
    rec = self.done.get(row)
    return rec[1] if rec is not None and rec[0] == hex_bytes else None

  def add(self, row: int, hex_bytes: str, result: BlockResult) -> None:
    self._write({"row": row, "hex": hex_bytes, "cycles": result.cycles,
                 "spread": result.spread, "error": result.error,
                 "passes": list(result.passes), "contended": result.contended})

  def _write(self, obj: dict) -> None:
    self._f.write(json.dumps(obj) + "\n")
    self._f.flush()
    os.fsync(self._f.fileno())

  def close(self) -> None:
    self._f.close()


def _cpu_key(cpu: dict) -> tuple:
  return (cpu.get("vendor"), cpu.get("family"), cpu.get("model"), cpu.get("stepping"))


@dataclasses.dataclass
class RunStats:
  """What a run did: blocks measured, reused from the log, rejected, and how fast."""

  measured: int = 0
  resumed: int = 0
  rejected: dict[str, int] = dataclasses.field(default_factory=dict)
  seconds: float = 0.0  # time spent measuring (prefiltering excluded)
  contended_passes: int = 0

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
  log = ResumeLog(log_path, cpu, config) if log_path is not None else None
  stats = RunStats()
  results: list[BlockResult | None] = [None] * len(hexes)
  todo: list[int] = []
  for i, h in enumerate(hexes):
    if h is None:
      results[i] = BlockResult(None, error="bad-row: no usable hex in column 1")
    elif log is not None and (old := log.lookup(i, h)) is not None:
      results[i] = old
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
        log.add(i, hexes[i], results[i])
  try:
    if to_time:
      with Runner(config) as runner:
        warm_up(runner)
        bar = _bar(len(to_time)) if progress else None
        t0 = time.perf_counter()
        for i in to_time:
          results[i] = measure_block(runner, hexes[i])
          stats.measured += 1
          stats.contended_passes += results[i].contended
          if log is not None:
            log.add(i, hexes[i], results[i])
          if on_result is not None:
            on_result(i, results[i])
          if bar is not None:
            bar.update(1)
        stats.seconds = time.perf_counter() - t0
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

  return tqdm(total=total, desc="measure", unit="block", leave=False)
