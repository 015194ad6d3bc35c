"""Measuring basic-block throughput on this machine's CPU: the harness around the runner.

The native runner (`runner.c`) lays a block out unrolled a and b times, times it with
the TSC in a forked child and hands back every round's ticks; this module decides what
to run and turns ticks into core cycles per 100 iterations, BHive's unit and
definition: 100 (L_a - L_b) / (a - b). It follows the method of the harness behind
`../shared/data/measured/` (its README):

- The TSC is not the core clock, and the core clock drifts, so a 1-cycle-per-instruction
  `add` chain timed in the same rounds calibrates every pass.
- Canaries bound by the ALUs, the load pipes and the store pipes are timed in the same
  rounds too. Rounds in which one runs slow are left out. A pass with a canary still
  slower than on a quiet core (the lowest speed several of the run's passes share), or
  whose snippets rarely repeat their fastest time, was disturbed: it is repeated after
  short pauses, then deferred to a later sweep. On a shared host (a cloud VM) the core's other hardware
  thread can stay busy for seconds, and what is timed meanwhile reads 10-60% off.
- Several passes, each in its own forked child and spread over time (blocks are
  measured in sweeps: one pass per block per sweep); more when they disagree; the value
  is the median pass and the spread (max - min) / median is reported with it.

What it simplifies: without performance counters nothing checks that the core ran the
block without, say, a microcode assist.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import math
import os
import subprocess
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import numpy as np

from diffsim.measure.build import MeasureError, runner_path

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

  @classmethod
  def quick(cls) -> MeasureConfig:
    """Fewer rounds and passes: for tests and notebooks, about 3x faster."""
    return cls(passes=2, max_passes=3, rounds=16)


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
    passes share (`_lowest_cluster`).

    Canaries are in core cycles, so clock drift does not move them, and on a quiet core
    they repeat their value closely, while a busy core scatters them upwards; so the
    lowest tight cluster is the quiet speed even when most passes were disturbed (a
    low percentile is not). Not the minimum: a pass whose calibration went wrong can
    read absurdly low, and would make every later pass look contended.
    """
    return np.array([_lowest_cluster_sorted(x) for x in self._sorted])

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


def _lowest_cluster(values: np.ndarray, k: int = 5, width: float = 0.015) -> float:
  """The lowest v with at least k values in [v, v (1 + width)]; inf when there is none.

  >>> _lowest_cluster(np.array([0.4, 2.0, 2.01, 2.0, 2.02, 2.0, 3.1, 3.3]))
  2.0
  """
  return _lowest_cluster_sorted(np.sort(values[np.isfinite(values)]), k, width)


def _lowest_cluster_sorted(x: np.ndarray, k: int = 5, width: float = 0.015) -> float:
  """`_lowest_cluster` of finite values already sorted. It looks at the lowest values
  first, in growing groups, since the cluster is almost always among them."""
  start, step = 0, 64
  while start < len(x):
    low = x[start:start + step]
    ends = np.searchsorted(x, low * (1 + width), side="right")
    dense = np.flatnonzero(ends - np.arange(start, start + len(low)) >= k)
    if len(dense):
      return float(low[dense[0]])
    start, step = start + step, 2 * step
  return math.inf


def _pass_from_times(times: np.ndarray, quantum: int, a: int, b: int, repeat: int) -> Pass:
  """Cycles per iteration from every round's ticks ([10, R] float64, SNIPPETS order).

  Rounds in which a canary ran slower than its best in the pass by more than 1% (and a
  TSC step) were disturbed, most often by another thread on the same core, and are
  left out.
  Among the rest, each snippet's estimate is the mean of the rounds within one TSC step
  of its minimum: undisturbed rounds read the duration rounded down or up to a step,
  depending on the uniform phase of the start, so their mean is unbiased below the
  step, where a minimum would not be.
  """
  canary_rows = times[SNIPPETS.index(f"{CANARIES[0]}_a"):SNIPPETS.index("block_a")]
  quiet = np.all(canary_rows <= canary_rows.min(axis=1, keepdims=True) * 1.01 + quantum, axis=0)
  if quiet.sum() < 2:  # busy throughout: `Pass.undisturbed` will say so
    quiet = np.ones_like(quiet)
  est, near = [], []
  for row in times:
    v = row[quiet]
    est.append(v[v <= v.min() + quantum].mean())
    near.append(float(np.mean(row <= v.min() * 1.01 + quantum)))
  chain_a, chain_b, *canary_ab, block_a, block_b = est
  tsc_per_cycle = (chain_a - chain_b) / ((CHAIN_A - CHAIN_B) * CHAIN_REPEAT)
  if not tsc_per_cycle > 0:
    raise _Disturbed("the calibration chain did not slow down with its length: "
                     f"ticks {chain_a} vs {chain_b}")
  cycles = (block_a - block_b) / ((a - b) * repeat) / tsc_per_cycle
  canaries = tuple(float(ca - cb) / ((CANARY_A - CANARY_B) * CANARY_REPEAT) / tsc_per_cycle
                   for ca, cb in zip(canary_ab[::2], canary_ab[1::2]))
  return Pass(float(cycles), canaries, float(tsc_per_cycle), int(quiet.sum()), min(near))


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
        n < cfg.passes or (n < cfg.max_passes and _spread(self.values) > cfg.disagree))

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
    return BlockResult(med, _spread(self.values), None, tuple(self.values), self.contended)


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


def _spread(values: Sequence[float]) -> float:
  if len(values) < 2:
    return math.inf
  med = float(np.median(values))
  return float(max(values) - min(values)) / med if med > 0 else math.inf


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
            log.add(i, hexes[i], results[i])
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
