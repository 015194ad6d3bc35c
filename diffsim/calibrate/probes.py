"""Structure probes: throughput-only micro-benchmarks that fix a table's structure.

A fit moves the numbers of the structure it starts from, never the structure: with
znver3's three load pipes no fit finds four. So before the per-opcode search,
`diffsim calibrate` measures a few dozen small blocks with `diffsim measure` (no
performance counters: as nanoBench, uops.info and pmtestbench infer port counts from
throughput alone) and reads the structure off their cycles per iteration:

- units: N independent copies of one instruction run at min(units, dispatch width)
  a cycle, so `units = per / cycles` (`alu.add`: 12 register adds, 3.0 cycles, 4 ALUs);
- latencies: a chain through one register runs at its latency (`fma.lat@ymm`);
- switches: a chain that an idiom, an eliminated move or the stack engine should
  break runs well below the chain's cost when the CPU has the mechanism.

Each verdict names the probes behind it in its evidence, and most have a second probe
that must agree (`agree` in the evidence). `apply` writes the verdicts into any
llvm-mca-format table by finding the resources the probed opcode uses there, so it
works whatever the model calls its ports (see `apply` for the rules).

Registers in the harness: every GPR but rsp holds one address A, memory holds A,
rsp a stack (`diffsim.isa.memory`), so `8(%rcx)` and `8(%rdx)` are one address.
"""

from __future__ import annotations

import copy
import dataclasses
import math
import re
from collections.abc import Iterable, Mapping, Sequence

# Registers an N-wide probe writes: 12 GPRs besides rax (the base/source) and rsp.
_GPRS = ("rbx", "rcx", "rdx", "rsi", "rdi", "rbp", "r8", "r9", "r10", "r11", "r12", "r13")
_GPR32 = {"rbx": "ebx", "rcx": "ecx", "rdx": "edx", "rsi": "esi", "rdi": "edi", "rbp": "ebp",
          **{f"r{i}": f"r{i}d" for i in range(8, 16)}}
_R32 = ("ebx", "ecx", "edx", "esi", "edi", "ebp")
WIDTHS = ("xmm", "ymm", "zmm")
MAX_UNITS = 31  # units a table may have: the simulator's unit masks are int32
_EPS = 0.15  # how far from a whole rate a measured one may be and still count as it


@dataclasses.dataclass(frozen=True)
class Probe:
  """One micro-benchmark: `per` copies of the measured thing in `asm`."""

  name: str  # e.g. "alu.add"
  asm: str  # AT&T, instructions separated by "\n"
  per: int  # copies of the measured instruction (or chain links) in the block
  doc: str  # what it measures


@dataclasses.dataclass(frozen=True)
class Verdict:
  """One structural fact read off the probes."""

  field: str  # "dispatch_width", "alu_units", "fma_units@ymm", "split@zmm", ...
  value: float | int | bool
  evidence: dict  # probe -> cycles per iteration (and "/instr"), plus derived figures


def _lines(*xs: str) -> str:
  return "\n".join(xs)


# Vector probes: (kind, independent form, chain form); {w} is the register family.
_VECTOR = {
    "fma": ("vfmadd231pd %{w}0,%{w}0,%{w}{n}", "vfmadd231pd %{w}1,%{w}2,%{w}0"),
    "fadd": ("vaddpd %{w}1,%{w}2,%{w}{n}", "vaddpd %{w}1,%{w}0,%{w}0"),
    "fmul": ("vmulpd %{w}1,%{w}2,%{w}{n}", "vmulpd %{w}1,%{w}0,%{w}0"),
    "shuf": ("vshufpd $5,%{w}1,%{w}2,%{w}{n}", "vshufpd $5,%{w}0,%{w}0,%{w}0"),
}
# The opcode keys a vector probe exercises, by width (LLVM names), and the families
# of keys `apply` treats alike (register and memory forms of the same operation).
_VKEY = {"fma": "VFMADD231PD{W}r", "fadd": "VADDPD{W}rr", "fmul": "VMULPD{W}rr",
         "shuf": "VSHUFPD{W}rri"}
_VFAMILY = {"fma": r"VFN?M(ADD|SUB|ADDSUB|SUBADD)(132|213|231)P[SD]{W}[rm]",
            "fadd": r"V(ADD|SUB)P[SD]{W}r[rm]", "fmul": r"VMULP[SD]{W}r[rm]",
            "shuf": r"VSHUFP[SD]{W}r[rm]i"}
_WLETTER = {"xmm": "", "ymm": "Y", "zmm": "Z"}
_NEEDS = {"xmm": "avx", "ymm": "avx", "zmm": "avx512f"}


def _all_probes() -> list[Probe]:
  ps = [
      # Six short instructions: past ~20 bytes an iteration, the unrolled code outgrows
      # what the front end delivers at full rate (Zen 4: 12 zero idioms run 5.4 a
      # cycle, 6 of them 5.9), and nops are no probe (Zen 4 runs 10 a cycle).
      Probe("dispatch.zero", _lines(*(f"xorl %{r},%{r}" for r in _R32)), 6,
            "6 zero idioms: no execution unit, so the rename/dispatch width binds"),
      Probe("dispatch.mix", _lines(
          "addl $1,%ebx", "addl $1,%ecx", "movl (%rax),%edi", "movl 8(%rax),%ebp",
          "vpaddd %xmm1,%xmm2,%xmm3", "vpaddd %xmm1,%xmm2,%xmm4"),
            6, "2 adds, 2 loads, 2 vector adds: no one unit binds"),
      Probe("alu.add", _lines(*(f"addq %rax,%{r}" for r in _GPRS)), 12,
            "12 independent register adds: integer ALUs"),
      Probe("alu.addi", _lines(*(f"addq $1,%{r}" for r in _GPRS)), 12,
            "12 independent immediate adds: integer ALUs (cross-check)"),
      Probe("mul.units", _lines(*(f"imulq %rax,%{r}" for r in _GPRS)), 12,
            "12 multiply chains: integer multipliers"),
      Probe("mul.lat", "imulq %rbx,%rax", 1, "a multiply chain: imul latency"),
      Probe("load.units", _lines(*(f"movq {8 * i}(%rax),%{r}" for i, r in enumerate(_GPRS))),
            12, "12 loads of distinct words (two lines): load pipes"),
      Probe("load.lat", "movq (%rax),%rax", 1, "pointer chasing: a load's latency"),
      Probe("load.same", _lines(*(f"movq (%rax),%{r}" for r in _GPRS)), 12,
            "12 loads of one address: load pipes, or the L1 bank limit"),
      Probe("store.line", _lines(*(f"movq %rbx,{8 * i}(%rax)" for i in range(8))), 8,
            "8 stores to one 64-byte line: store pipes"),
      Probe("store.lines", _lines(*(f"movq %rbx,{64 * i}(%rax)" for i in range(8))), 8,
            "8 stores to 8 lines: store pipes, or one commit a cycle per line"),
  ]
  for w in WIDTHS:
    for kind, (indep, chain) in _VECTOR.items():
      # An FMA reads its accumulator: 15 chains (all 16 VEX registers but the source)
      # keep 3.75 a cycle in flight at latency 4; the others are independent.
      regs = range(1, 16) if kind == "fma" else range(4, 16)
      body = [indep.format(w=w, n=n) for n in regs]
      ps.append(Probe(f"{kind}.units@{w}", _lines(*body), len(body),
                      f"{len(body)} independent {kind} on {w}: its units (and splitting)"))
      ps.append(Probe(f"{kind}.lat@{w}", chain.format(w=w), 1, f"a {kind} chain on {w}: latency"))
  ps += [
      Probe("stack.block", _lines("pushq %rbx", "pushq %rcx", "pushq %rdx", "pushq %rsi",
                                  "popq %r8", "popq %r9", "popq %r10", "popq %r11"), 8,
            "4 pushes then 4 pops: 8 rsp updates, a chain without a stack engine"),
      Probe("stack.pairs", _lines("pushq %rbx", "popq %r8", "pushq %rcx", "popq %r9",
                                  "pushq %rdx", "popq %r10", "pushq %rsi", "popq %r11"), 8,
            "push/pop pairs: 8 rsp updates (cross-check)"),
      Probe("move.elim", _lines("movq %rax,%rbx", "movq %rbx,%rax"), 2,
            "a chain of register moves: 0 latency when eliminated"),
      Probe("move.elim32", _lines("movl %eax,%ebx", "movl %ebx,%eax"), 2,
            "a chain of 32-bit moves (cross-check)"),
      Probe("zero.xor", _lines("imulq %rax,%rax", "xorl %eax,%eax"), 1,
            "imul then xor-zero: 1 cycle when the idiom breaks the chain, imul+1 if not"),
      Probe("zero.vxor", _lines("vmulpd %xmm0,%xmm0,%xmm0", "vxorpd %xmm0,%xmm0,%xmm0"), 1,
            "vmulpd then vxorpd-zero (cross-check)"),
      Probe("forward.index", _lines("xorl %esi,%esi", "movq %rbx,8(%rcx)",
                                    "movq 8(%rdx,%rsi),%rbx"), 1,
            "store then an indexed load of its bytes: forwarding round trip (never renamed)"),
      Probe("forward.base", _lines("movq %rbx,8(%rcx)", "movq 8(%rdx),%rbx"), 1,
            "store then a load of its bytes through another base: forwarded or renamed"),
      Probe("forward.same", _lines("movq %rbx,8(%rcx)", "movq 8(%rcx),%rbx"), 1,
            "store then a load of the same operand: forwarded or renamed"),
      Probe("div.lat@32", _lines("cltd", "idivl %ecx"), 1, "a 32-bit divide chain (plus cltd)"),
      Probe("div.lat@64", _lines("cqto", "idivq %rcx"), 1, "a 64-bit divide chain (plus cqto)"),
      Probe("div.thr@32", _lines("movl %edi,%eax", "cltd", "idivl %esi"), 1,
            "independent 32-bit divides: the divider's occupancy"),
      Probe("div.thr@64", _lines("movq %rdi,%rax", "cqto", "idivq %rsi"), 1,
            "independent 64-bit divides: the divider's occupancy"),
  ]
  return ps


def _cpu_flags() -> set[str]:
  """This CPU's feature flags, from /proc/cpuinfo (empty when unreadable)."""
  try:
    with open("/proc/cpuinfo") as f:
      for line in f:
        if line.startswith("flags"):
          return set(line.partition(":")[2].split())
  except OSError:
    pass
  return set()


def probes(cpu_flags: set[str] | None = None) -> list[Probe]:
  """The probes this CPU can run: vector ones need avx (xmm and ymm, VEX-encoded), the
  FMA ones fma, zmm ones avx512f. `cpu_flags` defaults to /proc/cpuinfo's."""
  flags = _cpu_flags() if cpu_flags is None else set(cpu_flags)
  out = []
  for p in _all_probes():
    w = p.name.rpartition("@")[2] if "@" in p.name else None
    if p.name.startswith(("fma", "fadd", "fmul", "shuf")):
      if _NEEDS[w] not in flags or (p.name.startswith("fma") and "fma" not in flags):
        continue
    if p.name in ("dispatch.mix", "zero.vxor") and "avx" not in flags:
      continue
    out.append(p)
  return out


def probe_hexes(ps: Iterable[Probe]) -> list[str]:
  """Each probe's bytes as hex, in order (assembled by llvm-mc: `diffsim.isa.parse_asm`)."""
  from diffsim.isa import parse_asm  # pylint: disable=import-outside-toplevel

  return [parse_asm(p.asm).hex for p in ps]


# ----------------------------------------------------------------------------------------
# Verdicts


def _rate(per: int, cycles: float) -> float:
  return per / cycles


def _whole(x: float) -> float | int:
  """x as an integer when it is within `_EPS` of one, else to 2 decimals."""
  return int(round(x)) if abs(x - round(x)) <= _EPS and round(x) > 0 else round(x, 2)


def _up(x: float) -> int:
  """x to the nearest integer, halves up (a divide chain alternating 9 and 10 is 10)."""
  return int(math.floor(float(x) + 0.5))


def _ev(m: Mapping[str, float], *names: str, per: Mapping[str, int]) -> dict:
  ev = {}
  for n in names:
    if m.get(n) is not None:
      ev[n] = round(float(m[n]), 3)
      if per.get(n, 1) != 1:
        ev[n + "/instr"] = round(float(m[n]) / per[n], 3)
  return ev


def verdicts(measured: Mapping[str, float | None]) -> list[Verdict]:
  """The structure the probes' cycles per iteration show (`measured`: probe name ->
  cycles per iteration; missing or None probes are skipped, with what needs them)."""
  per = {p.name: p.per for p in _all_probes()}
  m = {k: float(v) for k, v in measured.items() if v is not None and v > 0}
  out: list[Verdict] = []

  def have(*names: str) -> bool:
    return all(n in m for n in names)

  def rate(n: str) -> float:
    return _rate(per[n], m[n])

  # Dispatch: no real CPU runs faster than its width, so the fastest probe bounds it.
  disp = [n for n in ("dispatch.zero", "dispatch.mix") if n in m]
  width = None
  if disp:
    best = max(rate(n) for n in disp)
    width = int(round(best))
    ev = _ev(m, *disp, per=per)
    ev.update(rate=round(best, 2), agree=sum(abs(rate(n) - best) <= _EPS * best for n in disp))
    out.append(Verdict("dispatch_width", width, ev))

  def units(field: str, main: str, check: str | None = None, chain: str | None = None
            ) -> float | None:
    """A units verdict; `chain`: the latency probe of the chains `main` runs side by
    side, which caps its rate at chains / latency (then the value is a minimum)."""
    if main not in m:
      return None
    r = rate(main)
    ev = _ev(m, main, *([check] if check and check in m else []), per=per)
    ev["rate"] = round(r, 3)
    if check and check in m:
      ev["agree"] = abs(rate(check) - r) <= 0.1 * r
    if width and r >= width - _EPS:
      ev["bound_by_dispatch"] = True  # at least this many
    if chain and chain in m and r >= per[main] / m[chain] * (1 - 0.05):
      ev["bound_by_latency"] = True  # at least this many
    out.append(Verdict(field, _whole(r), ev))
    return r

  def latency(field: str, name: str, minus: float = 0.0) -> None:
    if name in m:
      ev = _ev(m, name, per=per)
      if minus:
        ev["chain_rest"] = minus
      out.append(Verdict(field, _whole(m[name] / per[name] - minus), ev))

  if have("alu.add") and have("alu.addi"):
    # The faster of the two: an immediate form may cost more on some models.
    main, check = ("alu.add", "alu.addi") if rate("alu.add") >= rate("alu.addi") else \
        ("alu.addi", "alu.add")
    units("alu_units", main, check)
  else:
    units("alu_units", "alu.add") if have("alu.add") else units("alu_units", "alu.addi")
  units("mul_units", "mul.units", chain="mul.lat")
  latency("mul_latency", "mul.lat")

  loads = units("load_units", "load.units", None)
  latency("load_latency", "load.lat")
  if loads is not None and have("load.same"):
    same = rate("load.same")
    bank = _whole(same) if same < loads * (1 - 0.1) else 0
    out.append(Verdict("l1_bank_loads", bank, dict(_ev(m, "load.same", "load.units", per=per),
                                                    rate=round(same, 3))))
  if have("store.line") or have("store.lines"):
    names = [n for n in ("store.line", "store.lines") if n in m]
    best = max(rate(n) for n in names)
    ev = _ev(m, *names, per=per)
    ev["rate"] = round(best, 3)
    out.append(Verdict("store_units", _whole(best), ev))
    if have("store.line", "store.lines"):
      line, lines = rate("store.line"), rate("store.lines")
      rule = _whole(line) if lines < line * 0.9 else 0
      out.append(Verdict("l1_line_stores", rule, dict(ev, line_rate=round(line, 3),
                                                      lines_rate=round(lines, 3))))

  vec_rate: dict[tuple[str, str], float] = {}
  for w in WIDTHS:
    for kind in _VECTOR:
      r = units(f"{kind}_units@{w}", f"{kind}.units@{w}",
                chain=f"{kind}.lat@{w}" if kind == "fma" else None)
      if r is not None:
        vec_rate[kind, w] = r
      latency(f"{kind}_latency@{w}", f"{kind}.lat@{w}")
  for w, narrow in (("ymm", "xmm"), ("zmm", "ymm")):
    pairs = [(k, vec_rate[k, w], vec_rate[k, narrow]) for k in ("fma", "fadd", "fmul")
             if (k, w) in vec_rate and (k, narrow) in vec_rate]
    if pairs:
      votes = [wide < 0.75 * nar for _, wide, nar in pairs]
      ev = {f"{k}.units@{x}": round(m[f"{k}.units@{x}"], 3) for k, _, _ in pairs for x in (narrow, w)}
      ev["agree"] = all(v == votes[0] for v in votes)
      out.append(Verdict(f"split@{w}", sum(votes) * 2 > len(votes), ev))

  def switch(field: str, names: tuple[str, ...], says_yes) -> None:
    """A yes/no verdict from one or two probes (the first decides; `agree` says
    whether the second read the same)."""
    names = tuple(n for n in names if n in m)
    if names:
      votes = [says_yes(n) for n in names]
      ev = _ev(m, *names, per=per)
      ev["agree"] = all(v == votes[0] for v in votes)
      out.append(Verdict(field, votes[0], ev))

  # Without a stack engine the 8 rsp updates chain at 1 cycle or more each.
  switch("stack_engine", ("stack.block", "stack.pairs"), lambda n: m[n] / per[n] < 0.75)
  switch("move_elimination", ("move.elim", "move.elim32"), lambda n: m[n] / per[n] < 0.5)
  # Unbroken, the chain costs the multiply plus the xor: 3 + 1 cycles or more.
  switch("zero_idiom", ("zero.xor", "zero.vxor"), lambda n: m[n] < 2.5)

  if "forward.index" in m:
    fwd = m["forward.index"]
    deps = fwd >= 2.5  # independent, a store and a load take well under 2 cycles
    ev = _ev(m, "forward.index", "forward.base", "forward.same", per=per)
    out.append(Verdict("memory_dependences", deps, ev))
    if deps:
      out.append(Verdict("forward_latency", _whole(fwd), dict(ev)))
      if "forward.same" in m:
        out.append(Verdict("memory_renaming", m["forward.same"] < fwd - 2, dict(ev)))
        if "forward.base" in m and m["forward.same"] < fwd - 2:
          out.append(Verdict("renaming_by_address", m["forward.base"] < fwd - 2, dict(ev)))

  for bits in (32, 64):
    latency(f"div_latency@{bits}", f"div.lat@{bits}", minus=1.0)  # cltd/cqto: 1 cycle
    if f"div.thr@{bits}" in m:
      out.append(Verdict(f"div_cycles@{bits}", _whole(m[f"div.thr@{bits}"]),
                         _ev(m, f"div.thr@{bits}", per=per)))
  return out


def probe_report(vs: Sequence[Verdict]) -> str:
  """A table a person reads: field, value, the evidence in cycles per iteration."""
  lines = [f"{'field':22} {'value':>7}  evidence (cycles per iteration)"]
  for v in vs:
    val = ("yes" if v.value else "no") if isinstance(v.value, bool) else f"{v.value}"
    ev = ", ".join(f"{k} {x}" for k, x in v.evidence.items())
    lines.append(f"{v.field:22} {val:>7}  {ev}")
  return "\n".join(lines)


# ----------------------------------------------------------------------------------------
# Applying verdicts to a table


class _Doc:
  """A table's JSON dict with the resource arithmetic `apply` needs.

  An opcode's resource entries are its `kept` list (exported tables: [name, cycles,
  need, reserved]) when it has one, else its `resources` ([name, cycles])."""

  def __init__(self, doc: dict):
    self.d = doc
    self.ops: dict = doc["opcodes"]
    self.log: list[str] = []

  def res(self) -> dict[str, dict]:
    return {r["name"]: r for r in self.d["resources"]}

  def cap(self, name: str) -> int:
    r = self.res()[name]
    if "members" in r:
      return sum(self.cap(x) for x in r["members"])
    return int(r.get("units", 1))

  def units_of(self, name: str) -> set[str]:
    r = self.res()[name]
    return set().union(*(self.units_of(x) for x in r["members"])) if "members" in r else {name}

  @staticmethod
  def entries(op: dict) -> list[list]:
    return op["kept"] if "kept" in op else op.setdefault("resources", [])

  def rate(self, key: str) -> float:
    """Copies of `key` a cycle its resources and the dispatch width allow."""
    op = self.ops[key]
    r = [self.cap(e[0]) / e[1] for e in self.entries(op) if e[1] > 0]
    r.append(self.d["global"]["dispatch_width"] / max(op.get("uops", 1), 1))
    return min(r)

  def scope(self, key: str, family: str | None, entry: tuple) -> list[str]:
    """`key` and the keys of its family (a regex) that hold the same entry (name and
    cycles): the keys a per-opcode change applies to."""
    keys = [key]
    if family:
      pat = re.compile(family + "$")
      keys += [k for k, op in self.ops.items() if k != key and pat.match(k.split("@")[0])
               and (not entry[0] or any(tuple(e[:2]) == entry for e in self.entries(op)))]
    return keys

  def set_cycles(self, keys: list[str], name: str, old: float, new: int) -> None:
    for k in keys:
      for e in self.entries(self.ops[k]):
        if e[0] == name and e[1] == old:
          e[1] = new

  def new_unit(self, base: str, joins: Iterable[str]) -> str:
    """A new single-unit kind named after `base` (`export.grow`'s `<base>+<j>`), member
    of `joins` and of every buffered group (a scheduler queue) holding all of `joins`'
    units."""
    res = self.res()
    j = 0
    while f"{base}+{j}" in res:
      j += 1
    name = f"{base}+{j}"
    units = [r for r in self.d["resources"] if "members" not in r]
    groups = [r for r in self.d["resources"] if "members" in r]
    units.append({"name": name, "units": 1, "buffer": -1})
    inner = set().union(*(self.units_of(g) for g in joins)) if joins else set()
    for g in groups:
      if g["name"] in joins or (g.get("buffer", -1) != -1 and inner
                                and inner <= self.units_of(g["name"])):
        g["members"] = g["members"] + [name]
    self.d["resources"] = units + groups
    return name

  def add_group(self, name: str, members: list[str]) -> str:
    while name in self.res():
      name += "'"
    self.d["resources"].append({"name": name, "members": members, "buffer": -1})
    return name

  def replace(self, keys: list[str], old: str, cycles: float, new: str) -> None:
    for k in keys:
      for e in self.entries(self.ops[k]):
        if e[0] == old and e[1] == cycles:
          e[0] = new

  def wider(self, name: str, need: int) -> str | None:
    """An unbuffered group of `need` units holding all of `name`'s (the smallest name
    first), or None."""
    inner = self.units_of(name)
    for r in sorted(self.d["resources"], key=lambda r: r["name"]):
      if "members" in r and r.get("buffer", -1) == -1 and r["name"] != name \
          and self.cap(r["name"]) == need and inner <= self.units_of(r["name"]):
        return r["name"]
    return None

  def n_units(self) -> int:
    return sum(int(r.get("units", 1)) for r in self.d["resources"] if "members" not in r)

  def room(self, n: int, label: str) -> bool:
    """Whether `n` more units fit the simulator's unit masks (`MAX_UNITS`)."""
    if self.n_units() + n <= MAX_UNITS:
      return True
    self.log.append(f"{label}: no room for {n} more units ({self.n_units()} of {MAX_UNITS})")
    return False

  def set_rate(self, key: str, target: float, family: str | None, label: str,
               grow: bool = True, at_least: bool = False) -> None:
    """Makes `key` run `target` copies a cycle (resource limits only) with the least
    structure changed:
    - an entry that binds below the target first gives up cycles beyond one, in `key`
      and its family (a per-opcode change); then its resource grows: a group gets new
      units (`<group>+<j>`, also in the buffered groups around it), a multi-unit kind
      more units, a single unit becomes a group of itself and new units for the
      family's keys (other users of the unit keep it alone);
    - when nothing binds and the fastest entry allows more than the target, that entry
      takes more cycles in `key` and its family where the ratio is whole, else the
      family moves to a group of the first members (groups) or the kind shrinks.
    An opcode whose micro-ops the dispatch width cannot pass at the target gets fewer
    (in its family, where they have as many). With `grow=False` only cycles change (zmm keys that share the ymm keys' groups);
    with `at_least` (a rate that dispatch or latency capped) nothing slows down."""
    before = self.rate(key)
    if abs(before - target) <= 0.05 * target or (at_least and before >= target * 0.95):
      self.log.append(f"{label}: {key} {before:g} a cycle (kept)")
      return
    for e in list(self.entries(self.ops[key])):
      name, c = e[0], e[1]
      if c <= 0:
        continue
      cap = self.cap(name)
      if cap / c >= target - 0.05 * target:
        continue
      keys = self.scope(key, family, (name, c))
      c2 = max(1, int(math.floor(cap / target + 1e-6)))
      if c2 < c:
        self.set_cycles(keys, name, c, c2)
        self.log.append(f"{label}: {name} cycles {c:g} -> {c2} in {len(keys)} keys")
        if cap / c2 >= target * 0.95:
          continue
        c = c2
      if not grow:
        continue
      need = int(math.ceil(target * c - 1e-6))
      r = self.res()[name]
      wider = self.wider(name, need) if family else None
      if wider:  # pipes the model already has: the family moves onto them
        self.replace(keys, name, c, wider)
        self.log.append(f"{label}: {name} -> {wider} ({need} units) in {len(keys)} keys")
        continue
      if not self.room(need - cap, label):
        continue
      if "members" in r:
        for _ in range(need - cap):
          self.new_unit(name, [name])
        self.log.append(f"{label}: {name}: {cap} -> {need} units")
      elif cap > 1:
        r["units"] = need
        self.log.append(f"{label}: {name}: {cap} -> {need} units")
      else:
        grp = f"{name}x{need}"  # another width's probe may have made it already
        if grp not in self.res():
          added = [self.new_unit(name, []) for _ in range(need - cap)]
          for a in added:  # the new units sit in the buffered groups around `name`
            for g in self.d["resources"]:
              if "members" in g and g.get("buffer", -1) != -1 \
                  and name in self.units_of(g["name"]) and a not in g["members"]:
                g["members"] = g["members"] + [a]
          grp = self.add_group(grp, [name] + added)
        self.replace(keys, name, c, grp)
        self.log.append(f"{label}: {name} -> {grp} ({need} units) in {len(keys)} keys")
    op = self.ops[key]
    width = self.d["global"]["dispatch_width"]
    if width / max(op.get("uops", 1), 1) < target * 0.95:  # too many micro-ops to keep up
      uops = max(1, int(math.floor(width / target + 1e-6)))
      keys = [k for k in self.scope(key, family, ("", 0))
              if self.ops[k].get("uops") == op.get("uops")]
      for k in keys:
        self.ops[k]["uops"] = uops
      self.log.append(f"{label}: {key} uops -> {uops} ({len(keys)} keys)")
    after = self.rate(key)
    if after > target * 1.05:  # too fast: slow the fastest binding entry down
      ents = [e for e in self.entries(self.ops[key]) if e[1] > 0]
      if not ents:
        self.log.append(f"{label}: {key} has no resources to slow down ({after:g} a cycle)")
        return
      e = min(ents, key=lambda x: self.cap(x[0]) / x[1])
      name, c = e[0], e[1]
      cap = self.cap(name)
      keys = self.scope(key, family, (name, c))
      c2 = cap / target
      if abs(c2 - round(c2)) < 0.1 or not grow:
        c2 = max(1, int(round(c2)))
        self.set_cycles(keys, name, c, c2)
        self.log.append(f"{label}: {name} cycles {c:g} -> {c2} in {len(keys)} keys")
      else:
        n = max(1, int(round(target * c)))
        r = self.res()[name]
        if "members" in r and not family:  # structural (the ALUs): the group shrinks
          dropped = r["members"][n:]
          r["members"] = list(r["members"][:n])
          self.log.append(f"{label}: {name}: {cap} -> {n} units (without {', '.join(dropped)})")
        elif "members" in r:
          grp = self.add_group(f"{name}_{n}", list(r["members"])[:n])
          self.replace(keys, name, c, grp)
          self.log.append(f"{label}: {name} -> {grp} (first {n} members) in {len(keys)} keys")
        else:
          r["units"] = n
          self.log.append(f"{label}: {name}: {cap} -> {n} units")
    self.log.append(f"{label}: {key} {before:g} -> {self.rate(key):g} a cycle")

  def chain_latency(self, key: str) -> float:
    """What one link of a register chain through `key` costs: its first operand's write
    latency less the largest explicit read-advance."""
    op = self.ops[key]
    wl = op.get("write_latency", {}).get("op0", op.get("latency", 1))
    ra = [v for k, v in op.get("read_advance", {}).items() if re.fullmatch(r"op\d?", k)]
    return wl - max(ra, default=0)

  def set_latency(self, key: str, target: int, family: str | None, label: str) -> None:
    """Shifts the latency and every register write latency of `key` and its family
    (memory forms too) so that a chain through `key` costs `target` a link."""
    if key not in self.ops:
      self.log.append(f"{label}: {key} not in the table")
      return
    delta = target - self.chain_latency(key)
    if abs(delta) < 0.5:
      self.log.append(f"{label}: {key} latency {self.chain_latency(key):g} (kept)")
      return
    pat = re.compile((family or re.escape(key)) + "$")
    keys = [k for k in self.ops if k == key or pat.match(k.split("@")[0])]
    for k in keys:
      op = self.ops[k]
      op["latency"] = max(0, op.get("latency", 1) + delta)
      wl = op.get("write_latency", {})
      for role in wl:
        if role not in ("RSP", "MEM"):
          wl[role] = max(0, wl[role] + delta)
    self.log.append(f"{label}: {key} latency {target - delta:g} -> {target} "
                    f"({len(keys)} keys)")


# Families `apply` changes alike, by the probed key (regexes over keys without "@...").
_ALU_FAMILY = None  # group-level changes only
_MUL_FAMILY = r"IMUL(16|32|64)rr|IMUL(16|32|64)rri(8|32)?|IMUL(16|32|64)rm|MUL(32|64)r"
_MUL_LAT_FAMILY = r"IMUL(32|64)rr"
_LOAD_FAMILY = r"MOV(8|16|32|64)rm|MOV(ZX|SX)\w*rm\d*|POP(16|32|64)r"
_STORE_FAMILY = r"MOV(8|16|32|64)m[ri]\d*|PUSH(16|32|64)(r|i8|i16|i32)"
_ZERO_IDIOMS = tuple(f"{op}@same" for op in (
    "XOR32rr", "XOR64rr", "VXORPSrr", "VXORPDrr", "VPXORrr", "VXORPSYrr", "VXORPDYrr", "VPXORYrr",
    "XORPSrr", "XORPDrr", "PXORrr"))
_STACK = ("PUSH", "POP", "CALL", "RET")


def _vkey(kind: str, w: str) -> str:
  return _VKEY[kind].format(W=_WLETTER[w])


def _vfamily(kind: str, w: str) -> str:
  return _VFAMILY[kind].format(W=_WLETTER[w])


def _zmm_keys(doc: _Doc, kinds: Iterable[str]) -> list[str]:
  """Adds the zmm forms of the probed vector families as copies of their ymm forms
  (shipped tables hold no AVX-512 keys); returns the keys added."""
  added = []
  for kind in kinds:
    pat = re.compile(_vfamily(kind, "ymm") + "$")
    for k in list(doc.ops):
      base, _, var = k.partition("@")
      if not pat.match(base):
        continue
      i = base.rfind("Y")
      z = base[:i] + "Z" + base[i + 1:] + (f"@{var}" if var else "")
      if z not in doc.ops:
        doc.ops[z] = copy.deepcopy(doc.ops[k])
        doc.ops[z].pop("sched_class", None)
        doc.ops[z]["evidence"] = f"zmm form added by calibrate probes from {k}"
        added.append(z)
  return added


def apply(table: Mapping, vs: Sequence[Verdict]) -> tuple[dict, list[str]]:
  """A new table (deep copy of the llvm-mca-format JSON dict `table`) with the verdicts
  written in, and one line per change.

  Rules (generic over resource names: each verdict acts on the resources its probed
  opcode uses in this table):
  - widths: `dispatch_width` global;
  - units (`alu_units` via ADD64rr, `mul_units` IMUL64rr, `load_units` MOV64rm,
    `store_units` MOV64mr, `<kind>_units@<w>` the vector keys): `_Doc.set_rate`;
    growth of a group reaches every opcode that uses it (they share the pipes);
    cycles and single-unit replacements reach the probed opcode's family only;
  - zmm (`_units@zmm`, `split@zmm`): the zmm keys are added as copies of the ymm keys,
    and only their cycles change (a split 512-bit op holds a 256-bit pipe twice);
  - latencies: `_Doc.set_latency` shifts the probed opcode's family;
  - `l1_bank_loads`, `l1_line_stores`, `memory_dependences`: globals; `memory_renaming`
    / `renaming_by_address` choose the renaming policy; `forward_latency`: every load's
    `read_advance.mem` is minus (round trip - the load's latency);
  - `stack_engine`: rsp written by push/pop/call/ret at latency 0 (or not);
  - `move_elimination`: MOV32rr/MOV64rr eliminated (0 latency, no unit; a register file
    with a move budget is added where the table has none), or on an ALU;
  - `zero_idiom`: XOR32rr@same / XOR64rr@same ignore their sources;
  - `div_latency@<bits>`: IDIV/DIV of that width; `div_cycles@<bits>`: the divider
    entry's cycles (an entry on a `*Div*` unit, else the single unit with the most
    cycles; a microcoded list of ports becomes the table's divider unit)."""
  doc = _Doc(copy.deepcopy(dict(table)))
  g = doc.d["global"]
  v = {x.field: x.value for x in vs}
  least = {x.field for x in vs if x.evidence.get("bound_by_dispatch")
           or x.evidence.get("bound_by_latency")}

  if "dispatch_width" in v:
    old = g.get("dispatch_width")
    g["dispatch_width"] = int(v["dispatch_width"])
    doc.log.append(f"dispatch_width {old} -> {g['dispatch_width']}"
                   + (" (kept)" if old == g["dispatch_width"] else ""))

  for field, key, family in (("alu_units", "ADD64rr", _ALU_FAMILY),
                             ("mul_units", "IMUL64rr", _MUL_FAMILY),
                             ("load_units", "MOV64rm", _LOAD_FAMILY),
                             ("store_units", "MOV64mr", _STORE_FAMILY)):
    if field in v and key in doc.ops:
      doc.set_rate(key, float(v[field]), family, field, at_least=field in least)
  if "mul_latency" in v:
    doc.set_latency("IMUL64rr", _up(v["mul_latency"]), _MUL_LAT_FAMILY, "mul_latency")

  if "load_latency" in v and "MOV64rm" in doc.ops:
    doc.set_latency("MOV64rm", _up(v["load_latency"]), _LOAD_FAMILY, "load_latency")

  for field, name in (("l1_bank_loads", "l1_bank_loads"), ("l1_line_stores", "l1_line_stores")):
    if field in v:
      old = g.get(name, 0)
      g[name] = int(v[field])
      doc.log.append(f"{name} {old} -> {g[name]}" + (" (kept)" if old == g[name] else ""))

  for w in ("xmm", "ymm"):
    for kind in _VECTOR:
      key, fam = _vkey(kind, w), _vfamily(kind, w)
      if f"{kind}_units@{w}" in v and key in doc.ops:
        f = f"{kind}_units@{w}"
        doc.set_rate(key, float(v[f]), fam, f, at_least=f in least)
      if f"{kind}_latency@{w}" in v:
        doc.set_latency(key, _up(v[f"{kind}_latency@{w}"]), fam, f"{kind}_latency@{w}")
  zkinds = [k for k in _VECTOR if f"{k}_units@zmm" in v or f"{k}_latency@zmm" in v]
  if zkinds:
    added = _zmm_keys(doc, zkinds)
    doc.log.append(f"zmm: {len(added)} keys added from their ymm forms"
                   + (f" (split@zmm: {v['split@zmm']})" if "split@zmm" in v else ""))
    for kind in zkinds:
      key, fam = _vkey(kind, "zmm"), _vfamily(kind, "zmm")
      if f"{kind}_units@zmm" in v and key in doc.ops:
        f = f"{kind}_units@zmm"
        doc.set_rate(key, float(v[f]), fam, f, grow=False, at_least=f in least)
      if f"{kind}_latency@zmm" in v:
        doc.set_latency(key, _up(v[f"{kind}_latency@zmm"]), fam, f"{kind}_latency@zmm")

  if "memory_dependences" in v:
    old = bool(g.get("memory_dependences", False))
    g["memory_dependences"] = bool(v["memory_dependences"])
    doc.log.append(f"memory_dependences {old} -> {g['memory_dependences']}")
  if v.get("memory_renaming"):
    old = g.get("memory_renaming", "operand")
    g["memory_renaming"] = "address" if v.get("renaming_by_address") else "operand"
    doc.log.append(f"memory_renaming {old} -> {g['memory_renaming']}")
  elif "memory_renaming" in v:
    doc.log.append("memory_renaming: none seen; no policy renames nothing (kept "
                   f"{g.get('memory_renaming', 'operand')})")
  if "forward_latency" in v and "MOV64rm" in doc.ops:
    # The round trip is the load's latency, the forwarding cost, and whatever of the
    # store's MEM write latency its data's read-advance does not hide.
    load = doc.ops["MOV64rm"]
    lat = load.get("write_latency", {}).get("op0", load.get("latency", 5))
    store = doc.ops.get("MOV64mr", {})
    mem = store.get("write_latency", {}).get("MEM", store.get("latency", 1))
    ra = max([x for k, x in store.get("read_advance", {}).items() if re.fullmatch(r"op\d?", k)],
             default=0)
    lat += max(0, mem - ra)
    extra = _up(v["forward_latency"] - lat)
    n = 0
    for op in doc.ops.values():
      if op.get("may_load"):
        op.setdefault("read_advance", {})["mem"] = -extra
        n += 1
    doc.log.append(f"forward_latency {v['forward_latency']}: loads' mem read-advance "
                   f"{-extra} ({n} keys; load and store {lat:g})")

  if "stack_engine" in v:
    n = 0
    for k, op in doc.ops.items():
      base = k.split("@")[0]
      if base.startswith(_STACK) and not base.startswith("POPCNT"):
        wl = op.setdefault("write_latency", {})
        if v["stack_engine"]:
          wl["RSP"] = 0
        elif wl.get("RSP") == 0:
          wl["RSP"] = max(1, op.get("latency", 1))
        n += 1
    doc.log.append(f"stack_engine {v['stack_engine']}: rsp write latency "
                   f"{0 if v['stack_engine'] else 'kept >= 1'} in {n} keys")

  if "move_elimination" in v:
    _moves(doc, bool(v["move_elimination"]))
  if "zero_idiom" in v:
    for k in _ZERO_IDIOMS:
      base = doc.ops.get(k) or doc.ops.get(k.split("@")[0])
      if base is None:
        continue
      op = doc.ops.setdefault(k, copy.deepcopy(base))
      op["zero_idiom"] = bool(v["zero_idiom"])
      if v["zero_idiom"]:
        op.update(latency=0)
        op.pop("write_latency", None)
      else:
        op["latency"] = max(1, op.get("latency", 1))
    doc.log.append(f"zero_idiom {v['zero_idiom']}: {', '.join(k for k in _ZERO_IDIOMS if k in doc.ops)}")

  for bits in (32, 64):
    keys = [k for k in (f"IDIV{bits}r", f"DIV{bits}r") if k in doc.ops]
    if f"div_latency@{bits}" in v:
      lat = _up(v[f"div_latency@{bits}"])
      for k in keys:
        doc.set_latency(k, lat, None, f"div_latency@{bits}")
    if f"div_cycles@{bits}" in v:
      for k in keys:
        _divider(doc, k, _up(v[f"div_cycles@{bits}"]), f"div_cycles@{bits}")
  return doc.d, doc.log


def _moves(doc: _Doc, on: bool) -> None:
  keys = [k for k in ("MOV64rr", "MOV32rr", "MOV64rr_REV", "MOV32rr_REV") if k in doc.ops]
  g = doc.d["global"]
  if on:
    files = g.setdefault("register_files", [])
    gpr = [f for f in files if "gpr" in f.get("classes", ())]
    if not gpr:
      files.append({"name": "CalibrateIntegerPRF", "size": 0, "classes": ["gpr", "flags"],
                    "max_moves_per_cycle": int(g["dispatch_width"]), "zero_moves_only": False})
    elif not any(f.get("max_moves_per_cycle", 0) > 0 for f in gpr):
      gpr[0]["max_moves_per_cycle"] = int(g["dispatch_width"])
      gpr[0]["zero_moves_only"] = False
    for k in keys:
      op = doc.ops[k]
      op.update(move_elim=True, latency=0)
      op.pop("write_latency", None)
      if "kept" in op:
        op.update(kept=[], touched=[], buffers=[])
      else:
        op["resources"] = []
  else:
    alu = doc.entries(doc.ops["ADD64rr"]) if "ADD64rr" in doc.ops else []
    for k in keys:
      op = doc.ops[k]
      op.update(move_elim=False, latency=max(1, op.get("latency", 0)))
      if not doc.entries(op) and alu:
        if "kept" in op:
          op["kept"] = copy.deepcopy(alu)
          for f in ("touched", "buffers"):
            op[f] = list(doc.ops["ADD64rr"].get(f, []))
        else:
          op["resources"] = copy.deepcopy(alu)
  doc.log.append(f"move_elimination {on}: {', '.join(keys)}")


def _divider(doc: _Doc, key: str, cycles: int, label: str) -> None:
  """The divider's occupancy for `key` (see `apply`)."""
  op = doc.ops[key]
  ents = doc.entries(op)
  res = doc.res()
  div = [e for e in ents if "div" in e[0].lower() and "fp" not in e[0].lower()]
  if div:
    old = div[0][1]
    div[0][1] = cycles
    doc.log.append(f"{label}: {key} {div[0][0]} cycles {old:g} -> {cycles}")
    return
  units = [n for n, r in res.items() if "members" not in r and "div" in n.lower()
           and "fp" not in n.lower()]
  if units and op.get("uops", 1) > doc.d["global"]["dispatch_width"]:
    alu = doc.entries(doc.ops["ADD64rr"]) if "ADD64rr" in doc.ops else []
    new = [[units[0], cycles] + ([1, False] if "kept" in op else [])]
    new += [list(e) for e in alu[:1]]
    if "kept" in op:
      op["kept"] = new
    else:
      op["resources"] = new
    old = op.get("uops")
    op["uops"] = 2
    doc.log.append(f"{label}: {key} microcoded ({old} uops) -> 2 uops on {units[0]} for "
                   f"{cycles} cycles")
    return
  singles = [e for e in ents if "members" not in res[e[0]] and doc.cap(e[0]) == 1]
  if singles:
    e = max(singles, key=lambda x: x[1])
    old = e[1]
    e[1] = cycles
    doc.log.append(f"{label}: {key} {e[0]} cycles {old:g} -> {cycles}")
    return
  doc.log.append(f"{label}: {key} has no divider entry (kept)")
