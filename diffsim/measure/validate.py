"""Known blocks with known answers: the check that the measuring method is right.

Dependency chains take their latency per iteration on every modern x86 core (add 1,
imul 3, crc32 3; an FMA 4 and a pointer-chasing load 4 on Skylake and Zen), so they
test the clock calibration and the a/b differencing. Port-bound blocks test that the
harness adds no false dependencies (through registers, flags or aliased pages). Their
values depend on the core, so they are only expected on the cores listed here.

Expected values are in cycles per iteration; sources: the Zen 3, Zen 4 and Zen 5 rows
follow AMD's Software Optimization Guides (family 19h, 1Ah) and agree with the microbenchmarks
in `../shared/data/measured/README.md` for Zen 5.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

from diffsim.measure.config import MeasureConfig
from diffsim.measure.cpu import cpu_identity
from diffsim.measure.harness import measure_hexes


@dataclasses.dataclass(frozen=True)
class Check:
  """A known block: its hex, what it shows, and expected cycles per iteration by core."""

  name: str
  hex: str
  asm: str
  expected: dict[str, float]  # core name ("any", "zen3", ...) -> cycles per iteration


CHECKS: tuple[Check, ...] = (
  # Register source: chains of immediate adds run several per cycle on some Intel cores.
  Check("add chain", "4801d8", "add %rbx,%rax", {"any": 1.0}),
  Check("imul chain", "480fafc3", "imul %rbx,%rax", {"any": 3.0}),
  Check("crc32 chain", "f2480f38f1c3", "crc32q %rbx,%rax", {"any": 3.0}),
  Check("pointer-chasing load", "488b00", "mov (%rax),%rax",
        {"zen3": 4.0, "zen4": 4.0, "zen5": 4.0, "skylake": 4.0}),
  Check("FMA chain", "c4e2edb8c1", "vfmadd231pd %ymm1,%ymm2,%ymm0",
        {"zen3": 4.0, "zen4": 4.0, "zen5": 4.0, "skylake": 4.0}),
  Check("vaddpd chain", "c5fd58c1", "vaddpd %ymm1,%ymm0,%ymm0",
        {"zen3": 3.0, "zen4": 3.0, "zen5": 2.0, "skylake": 4.0}),
  Check("8 independent loads", "488b18488b08488b10488b30488b384c8b004c8b084c8b10",
        "mov (%rax),%rbx ... mov (%rax),%r10",
        {"zen3": 8 / 3, "zen4": 8 / 3, "zen5": 2.0, "skylake": 4.0}),
  Check("4 stores", "488903488943084889431048894318",
        "mov %rax,(%rbx) ... mov %rax,24(%rbx)",
        {"zen3": 2.0, "zen4": 2.0, "zen5": 2.0, "skylake": 4.0}),
  Check("4 independent adds", "4883c3014883c1014883c2014883c601",
        "add $1,%rbx; add $1,%rcx; add $1,%rdx; add $1,%rsi",
        {"zen3": 1.0, "zen4": 1.0, "skylake": 1.0}),
)


def core_name(cpu: dict[str, object]) -> str | None:
  """The core of a CPU identity when a check knows it (`zen3`, `zen5`...), else None."""
  fam, model = cpu.get("family"), cpu.get("model")
  if cpu.get("vendor") == "AuthenticAMD" and isinstance(model, int):
    if fam == 25 and (0x10 <= model <= 0x1f or 0x60 <= model <= 0x7f or 0xa0 <= model <= 0xaf):
      return "zen4"
    if fam == 25:  # the rest of family 19h: Milan, Vermeer, Cezanne, Rembrandt...
      return "zen3"
    if fam == 26:
      return "zen5"
  if cpu.get("vendor") == "GenuineIntel" and fam == 6 and model in (0x4e, 0x5e, 0x55, 0x8e,
                                                                     0x9e, 0xa5, 0xa6):
    return "skylake"
  return None


@dataclasses.dataclass(frozen=True)
class CheckResult:
  check: Check
  measured: float | None  # cycles per iteration
  expected: float | None
  spread: float | None
  error: str | None
  contended: int = 0  # passes kept although the core was busy: the value may be off

  @property
  def rel_error(self) -> float:
    if self.measured is None or self.expected is None:
      return math.nan
    return self.measured / self.expected - 1.0


def run_checks(config: MeasureConfig | None = None, *,
               checks: Sequence[Check] = CHECKS) -> tuple[list[CheckResult], dict]:
  """Measures every check on this CPU.

  Returns:
    One CheckResult per check (expected is None where this core has no expectation),
    and the CPU identity.
  """
  cpu = cpu_identity()
  core = core_name(cpu)
  results, _ = measure_hexes([c.hex for c in checks], config or MeasureConfig())
  out = []
  for c, r in zip(checks, results):
    exp = c.expected.get("any", c.expected.get(core) if core else None)
    out.append(CheckResult(c, None if r.cycles is None else r.cycles / 100.0, exp, r.spread,
                           r.error, r.contended))
  return out, cpu


def format_checks(results: Sequence[CheckResult]) -> str:
  """A table: check, measured and expected cycles per iteration, relative error."""
  header = f"{'check':22} {'block':38} {'measured':>9} {'expected':>9} {'error':>7} {'spread':>7}"
  lines = [header]
  for r in results:
    meas = "-" if r.measured is None else f"{r.measured:.3f}"
    exp = "-" if r.expected is None else f"{r.expected:.3f}"
    err = "" if math.isnan(r.rel_error) else f"{100 * r.rel_error:+.2f}%"
    spread = "" if r.spread is None else f"{100 * r.spread:.2f}%"
    lines.append(f"{r.check.name:22} {r.check.asm[:38]:38} {meas:>9} {exp:>9} {err:>7} "
                 f"{spread:>7}" + (f"  {r.error}" if r.error else "")
                 + (f"  ({r.contended} passes on a busy core)" if r.contended else ""))
  return "\n".join(lines)
