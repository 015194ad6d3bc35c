"""Timeline probes: what llvm-mca never prints, read off its per-instruction cycles.

llvm-mca does not print ReadAdvance, per-definition latencies, idiom flags or group
flags (diffsim/sim/MODEL.md#what-llvm-mca-prints). They show in the JSON timeline of tiny regions
(`-iterations=1 -json -timeline`), where llvm-mca reports for each instruction the
cycle it was dispatched, became ready (all register operands available), issued,
executed and retired. All probes of one CPU run as regions of a few llvm-mca
processes.

* **Read-advance** of a source register R of key K: region `P(R); K`, where the
  producer P writes R with a known latency L. K becomes ready at
  `issue(P) + L - RA`, so `RA = issue(P) + L - ready(K)`. Valid only when K became
  ready after its dispatch cycle (otherwise the read was satisfied early: either
  RA >= L, or the read is ignored). Producers (long latency, no other register
  written that K could read): `crc32q (%rsp), R64` for integer registers,
  `imulq (%rsp), SCRATCH` for EFLAGS, `vsqrtpd %ymmS, %ymmR` for vector registers,
  `pmuludq (%rsp), %mmR` for MMX. Their latency L is measured the same way with a
  plain register-register consumer and checked against `-instruction-info`.
* **Per-write latency** of a register W written by K: region `K; C(W)`, where the
  consumer C reads W (register-register form, no read-advance). `lat = ready(C) -
  issue(K)`, valid when C became ready after its dispatch.
* **Ignored reads** (zero idioms, dependency-breaking idioms): a source whose
  producer is still running when K becomes ready at dispatch.
* **Move elimination** (CPUs with a register file that eliminates moves): K alone
  under `-register-file-stats`; "Number of optimizable moves" says whether llvm-mca
  treats K as a candidate. Zero idioms are told apart from other dependency breakers
  by whether a following eliminable move counts as a zero move.
* **Group flags**: K after a nop (BeginGroup would start a new dispatch group) and a
  nop after K (EndGroup would end it).

Operands of K are found with iced-x86 on the example's bytes: explicit operands are
keyed `op<i>` by iced's operand index (Intel order), implicit registers by their
name (`RSP`, `RAX`), flags as `EFLAGS` (writes) / `flags` (reads).
"""

from __future__ import annotations

import dataclasses
import sys
import time

from diffsim.params import mcaviews, mctools

_TIMELINE = ["-iterations=1", "-timeline", "-timeline-max-iterations=1",
             "-timeline-max-cycles=0"]


# ----------------------------------------------------------------------------------------
# Operands of an instance (iced-x86)


@dataclasses.dataclass
class Operands:
  """Register dataflow of one example instance.

  Attributes:
    reads: [(role, register)] register sources: explicit (`op<i>`), implicit
      (`implicit`, with the register), not address registers.
    writes: [(role, register)] register destinations: explicit `op<i>`, implicit
      by register name.
    flags_read, flags_written: EFLAGS is read / written.
    used: every full register the instance touches (to pick scratch registers).
    mem: address registers (full names); a source that is also an address register
      cannot be probed apart from it.
  """

  reads: list
  writes: list
  flags_read: bool
  flags_written: bool
  used: set
  mem: set = dataclasses.field(default_factory=set)


def _iced():
  import iced_x86  # pylint: disable=import-outside-toplevel
  return iced_x86


def _reg_names() -> dict:
  ix = _iced()
  return {getattr(ix.Register, n): n for n in dir(ix.Register) if not n.startswith("_")}


def operands(hex_bytes: str) -> Operands | None:
  """Reads one instruction's register operands with iced-x86."""
  ix = _iced()
  names = _reg_names()
  ins = next(iter(ix.Decoder(64, bytes.fromhex(hex_bytes))))
  if ins.code == ix.Code.INVALID:
    return None
  info = ix.InstructionInfoFactory().info(ins)
  full = ix.RegisterExt.full_register
  reads, writes = [], []
  explicit = set()
  read_acc = {ix.OpAccess.READ, ix.OpAccess.READ_WRITE, ix.OpAccess.COND_READ,
              ix.OpAccess.READ_COND_WRITE}
  write_acc = {ix.OpAccess.WRITE, ix.OpAccess.READ_WRITE, ix.OpAccess.COND_WRITE,
               ix.OpAccess.READ_COND_WRITE}
  for i in range(ins.op_count):
    if ins.op_kind(i) != ix.OpKind.REGISTER:
      continue
    reg = ins.op_register(i)
    explicit.add(full(reg))
    acc = info.op_access(i)
    # iced marks the sources of a recognised zero idiom as unused; they are still
    # sources to llvm-mca unless its model says otherwise, so they are probed. So is
    # a conditionally written destination: LLVM ties it to a source for `cmov`
    # (whose read has the load-op read-advance), and for `bsr` the probe finds the
    # read ignored.
    if acc in read_acc or acc in (ix.OpAccess.NONE, ix.OpAccess.COND_WRITE):
      reads.append((f"op{i}", names[reg]))
    if acc in write_acc:
      writes.append((f"op{i}", names[reg]))
  mem = {full(ins.memory_base), full(ins.memory_index)} - {ix.Register.NONE}
  seen_r, seen_w = set(), set()
  for u in info.used_registers():
    f = full(u.register)
    if f in explicit or f in mem or f in (ix.Register.RIP, ix.Register.NONE):
      continue
    name = names[f] if names[f].startswith("R") else names[u.register]
    if u.access in read_acc and f not in seen_r:
      reads.append(("implicit", names[u.register]))
      seen_r.add(f)
    if u.access in write_acc and f not in seen_w:
      writes.append((name, name))
      seen_w.add(f)
  used = {full(u.register) for u in info.used_registers()} | mem | explicit
  return Operands(reads, writes, ins.rflags_read != 0, ins.rflags_modified != 0,
                  {names[r] for r in used}, {names[r] for r in mem})


# ----------------------------------------------------------------------------------------
# Register classes, producers and consumers


def reg_class(name: str) -> str | None:
  """gpr / vec / mmx for registers the probes handle, else None."""
  if name.startswith(("XMM", "YMM")):
    return "vec"
  if name.startswith("MM"):
    return "mmx"
  if name in _GPR64 or name in _GPR_ALIASES:
    return "gpr"
  return None


_GPR64 = ["RAX", "RBX", "RCX", "RDX", "RSI", "RDI", "RBP", "RSP"] + [f"R{i}" for i in range(8, 16)]
_GPR_ALIASES = {}
for _q, _d, _w, _b in zip(
    _GPR64,
    ["EAX", "EBX", "ECX", "EDX", "ESI", "EDI", "EBP", "ESP"] + [f"R{i}D" for i in range(8, 16)],
    ["AX", "BX", "CX", "DX", "SI", "DI", "BP", "SP"] + [f"R{i}W" for i in range(8, 16)],
    ["AL", "BL", "CL", "DL", "SIL", "DIL", "BPL", "SPL"] + [f"R{i}L" for i in range(8, 16)]):
  for _a in (_q, _d, _w, _b):
    _GPR_ALIASES[_a] = _q
for _h, _q in (("AH", "RAX"), ("BH", "RBX"), ("CH", "RCX"), ("DH", "RDX")):
  _GPR_ALIASES[_h] = _q


def _full(name: str) -> str:
  """The register an access to `name` is tracked on: RAX for EAX/AX/AL/AH, YMMn for XMMn."""
  if name in _GPR_ALIASES:
    return _GPR_ALIASES[name]
  if name.startswith("XMM"):
    return "YMM" + name[3:]
  return name


def _att(name: str) -> str:
  return "%" + name.lower()


def _scratch(used: set, kind: str, n: int = 2) -> list[str]:
  """`n` registers of `kind` that the instance does not touch."""
  fulls = {_full(u) for u in used} | {_full(u.replace("ZMM", "XMM")) for u in used}
  if kind == "gpr":
    pool = ["R11", "R10", "R9", "R8", "R15", "R14", "R13", "R12", "RBX", "RSI", "RDI", "RBP"]
  elif kind == "vec":
    pool = [f"YMM{i}" for i in range(15, -1, -1)]
  else:
    pool = [f"MM{i}" for i in range(7, -1, -1)]
  return [r for r in pool if _full(r) not in fulls][:n]


def producer(kind: str, reg: str, used: set) -> str | None:
  """A long-latency instruction that writes `reg` (or EFLAGS) and nothing K reads."""
  if kind == "flags":
    s = _scratch(used, "gpr", 1)
    return f"imulq (%rsp), {_att(s[0])}" if s else None
  if kind == "gpr":
    return f"crc32q (%rsp), {_att(_full(reg))}"
  if kind == "vec":
    s = _scratch(used | {_full(reg)}, "vec", 1)
    return f"vsqrtpd {_att(s[0])}, {_att(_full(reg))}" if s else None
  if kind == "mmx":
    return f"pmuludq (%rsp), {_att(reg)}"
  return None


def consumer(kind: str, reg: str, used: set) -> str | None:
  """A register-register instruction that reads `reg` (or EFLAGS), no read-advance."""
  if kind == "flags":
    s = _scratch(used, "gpr", 1)
    return f"adcq $0, {_att(s[0])}" if s else None
  if kind == "gpr":
    s = _scratch(used | {_full(reg)}, "gpr", 1)
    return f"orq {_att(_full(reg))}, {_att(s[0])}" if s else None
  if kind == "vec":
    s = _scratch(used | {_full(reg)}, "vec", 2)
    return f"vpaddq {_att(_full(reg))}, {_att(s[0])}, {_att(s[1])}" if len(s) == 2 else None
  if kind == "mmx":
    s = _scratch(used | {reg}, "mmx", 1)
    return f"paddq {_att(reg)}, {_att(s[0])}" if s else None
  return None


# ----------------------------------------------------------------------------------------
# Running probes


@dataclasses.dataclass
class Probe:
  key: str
  what: str  # "read" / "write" / "prod"
  role: str
  reg: str
  body: list


def _timeline(region: dict) -> list:
  return region["TimelineView"]["TimelineInfo"]


def measure_producers(cpu: str) -> dict:
  """Latency of each producer template, read with a plain consumer.

  Returns:
    {kind: latency}.
  """
  used = {"RAX", "RBX"}
  cases = {
      "gpr": [producer("gpr", "RAX", used), consumer("gpr", "RAX", used)],
      "flags": [producer("flags", "", used), consumer("flags", "", used | {"R11"})],
      "vec": [producer("vec", "XMM1", used), consumer("vec", "XMM1", used)],
      "mmx": [producer("mmx", "MM1", used), consumer("mmx", "MM1", used)],
  }
  regions = mcaviews.run_regions(cpu, list(cases.values()), _TIMELINE, as_json=True)
  out = {}
  for kind, reg in zip(cases, regions):
    tl = _timeline(reg)
    out[kind] = tl[1]["CycleReady"] - tl[0]["CycleIssued"]
  return out


def apply(cpu: str, table: dict, keys: dict, *, progress: bool = False) -> None:
  """Runs all probes for `cpu` and records the results in `table` (in place).

  Args:
    cpu: -mcpu name.
    table: a table from `extract.build_table` (without probes).
    keys: {key: {"example", "hex", ...}} (corpus_keys.json entries).
    progress: log to stderr.
  """
  t0 = time.time()
  ops = table["opcodes"]
  lat_p = measure_producers(cpu)
  table.setdefault("evidence", {})["probe_producers"] = lat_p
  probes: list[Probe] = []
  operand_info = {}
  for k in ops:
    hx = keys.get(k, {}).get("hex")
    text = keys.get(k, {}).get("example")
    if not hx or not text:
      continue
    o = operands(hx)
    if o is None:
      continue
    operand_info[k] = o
    for role, reg in o.reads:
      if _full(reg) in {_full(m) for m in o.mem}:
        continue  # the address read (no read-advance) would hide the source's
      kind = reg_class(reg)
      p = producer(kind, reg, o.used) if kind else None
      if p:
        probes.append(Probe(k, "read", role, reg, [p, text]))
    if o.flags_read:
      p = producer("flags", "", o.used)
      if p:
        probes.append(Probe(k, "read", "flags", "EFLAGS", [p, text]))
    for role, reg in o.writes:
      kind = reg_class(reg)
      c = consumer(kind, reg, o.used) if kind else None
      if c:
        probes.append(Probe(k, "write", role, reg, [text, c]))
    if o.flags_written:
      c = consumer("flags", "", o.used)
      if c:
        probes.append(Probe(k, "write", "EFLAGS", "EFLAGS", [text, c]))
  regions = _run_tolerant(cpu, [p.body for p in probes], _TIMELINE)
  if progress:
    print(f"  probes: {len(probes)} timeline regions in {time.time() - t0:.1f}s",
          file=sys.stderr)

  reads: dict[str, dict] = {}
  writes: dict[str, dict] = {}
  for p, reg in zip(probes, regions):
    if reg is None:
      continue
    tl = _timeline(reg)
    if p.what == "read":
      pi, ki = tl[0], tl[1]
      kind = "flags" if p.role == "flags" else reg_class(p.reg)
      store_wait = (ops[p.key].get("may_store") and kind in ("gpr", "flags")
                    and ki["CycleReady"] == pi["CycleIssued"])
      if ki["CycleReady"] > ki["CycleDispatched"] and not store_wait:
        ra = pi["CycleIssued"] + lat_p[kind] - ki["CycleReady"]
        reads.setdefault(p.key, {})[(p.role, p.reg)] = ra
      elif store_wait:
        # A store waits for older loads (the producer reads memory) to issue, which
        # hides how early the register itself was ready.
        reads.setdefault(p.key, {})[(p.role, p.reg)] = ("early", 0)
      else:
        # Ready at dispatch although the producer was still running: the read was
        # satisfied early (RA >= what was left of the producer's latency), which
        # with these producers means the read is ignored.
        left = pi["CycleIssued"] + lat_p[kind] - ki["CycleDispatched"]
        reads.setdefault(p.key, {})[(p.role, p.reg)] = ("ignored", left)
    else:
      ki, ci = tl[0], tl[1]
      if ci["CycleReady"] > ci["CycleDispatched"]:
        writes.setdefault(p.key, {})[p.role] = ci["CycleReady"] - ki["CycleIssued"]

  _record(table, operand_info, reads, writes)
  _move_elim(cpu, table, keys)
  _idioms(cpu, table, keys, operand_info, reads)
  _groups(cpu, table, keys)
  if progress:
    print(f"  probes recorded in {time.time() - t0:.1f}s", file=sys.stderr)


def _run_tolerant(cpu: str, bodies: list, args: list, *, as_json: bool = True) -> list:
  """`run_regions`, falling back to smaller batches when some region fails."""
  try:
    return mcaviews.run_regions(cpu, bodies, args, as_json=as_json)
  except mctools.ToolError:
    if len(bodies) == 1:
      return [None]
    mid = len(bodies) // 2
    return (_run_tolerant(cpu, bodies[:mid], args, as_json=as_json)
            + _run_tolerant(cpu, bodies[mid:], args, as_json=as_json))


def _note(e: dict, msg: str) -> None:
  e["evidence"] = (e["evidence"] + "; " + msg) if e.get("evidence") else msg


def _record(table: dict, operand_info: dict, reads: dict, writes: dict) -> None:
  """Turns probe measurements into read_advance / write_latency fields."""
  for k, e in table["opcodes"].items():
    o = operand_info.get(k)
    if o is None:
      continue
    r = reads.get(k, {})
    ra: dict[str, int] = {}
    explicit = {role: v for (role, _), v in r.items() if role.startswith("op")}
    vals = {v for v in explicit.values() if not isinstance(v, tuple)}
    if vals:
      if len(vals) == 1:
        v = vals.pop()
        if v:
          ra["op"] = v
      else:
        for role, v in explicit.items():
          if not isinstance(v, tuple) and v:
            ra[role] = v
    flags = [v for (role, _), v in r.items() if role == "flags" and not isinstance(v, tuple)]
    if flags and flags[0]:
      ra["flags"] = flags[0]
    imp = {reg: v for (role, reg), v in r.items()
           if role == "implicit" and not isinstance(v, tuple)}
    if len(set(imp.values())) == 1:
      v = next(iter(imp.values()))
      if v:
        ra["implicit"] = v
    elif imp:
      for reg, v in imp.items():
        if v:
          ra[reg] = v
    if ra:
      e["read_advance"] = ra
      # llvm-mca's instruction-info adds the largest forwarding delay (a negative
      # read-advance) to the latency it prints; MaxLatency is without it.
      delay = max(0, -min(ra.values()))
      if delay:
        e["latency"] -= delay
        _note(e, f"-instruction-info latency {e['latency'] + delay} includes a "
                 f"forwarding delay of {delay} (negative read-advance)")
    wl = {}
    for role, v in writes.get(k, {}).items():
      if v != e["latency"]:
        wl[role] = v
    if wl:
      e["write_latency"] = wl


def _idioms(cpu: str, table: dict, keys: dict, operand_info: dict, reads: dict) -> None:
  """Marks keys whose explicit register sources llvm-mca ignores; a zero idiom among
  them also takes no physical register (its write is known to be zero)."""
  files = table["global"].get("register_files", [])
  movers = any(f.get("max_moves_per_cycle", 0) > 0 for f in files)
  zero_checks = []
  for k, e in table["opcodes"].items():
    r = reads.get(k, {})
    explicit = [v for (role, _), v in r.items() if role.startswith("op")]
    if not explicit or not all(isinstance(v, tuple) and v[0] == "ignored" for v in explicit):
      continue
    if e.get("move_elim"):
      continue  # an eliminated move is done at dispatch; its reader waits instead
    # The read was ignored although the producer had cycles left: a dependency
    # breaker. Zero idiom: its result is known to be zero too.
    e["dep_breaking"] = True
    o = operand_info[k]
    dst = [reg for role, reg in o.writes if role.startswith("op")]
    kind = reg_class(dst[0]) if dst else None
    if files and kind in ("gpr", "vec"):
      body = [keys[k]["example"]]
      if movers:  # a move of the result after it
        s = _scratch(o.used | {_full(dst[0])}, kind, 1)
        body.append(
            f"movq {_att(_full(dst[0]))}, {_att(s[0])}" if kind == "gpr"
            else f"vmovaps {_att(dst[0] if dst[0].startswith('XMM') else _full(dst[0]))}, "
                 f"{_att(s[0] if dst[0].startswith('YMM') else 'XMM' + s[0][3:])}")
      zero_checks.append((k, body))
    elif e["latency"] == 0 and not e.get("resources"):
      e["zero_idiom"] = True
      e.pop("dep_breaking")
      _note(e, "zero idiom: sources ignored, latency 0, no resources")
  if zero_checks:
    texts = _run_tolerant(cpu, [b for _, b in zero_checks],
                          ["-iterations=1", "-register-file-stats"], as_json=False)
    for (k, _), text in zip(zero_checks, texts):
      e = table["opcodes"][k]
      stats = mcaviews.parse_register_files(text or "")
      if movers:  # a following move of the result counts as a zero move
        zero = any(f.get("Number of zero moves", 0) > 0 for f in stats)
        how = "a following move counts as a zero move"
      else:  # the write took no physical register in any file
        zero = bool(stats) and all(f.get("Total number of mappings created", 1) == 0
                                   for f in stats)
        how = "its writes take no physical register"
      if zero:
        e["zero_idiom"] = True
        e.pop("dep_breaking", None)
        _note(e, "zero idiom: sources ignored, " + how)


def _move_elim(cpu: str, table: dict, keys: dict) -> None:
  """Marks keys llvm-mca treats as optimizable register moves."""
  files = [f for f in table["global"].get("register_files", [])
           if f.get("max_moves_per_cycle", 0) > 0]
  if not files:
    return
  ks = [k for k in table["opcodes"] if keys.get(k, {}).get("example")]
  texts = _run_tolerant(cpu, [[keys[k]["example"]] for k in ks],
                        ["-iterations=1", "-register-file-stats"], as_json=False)
  for k, text in zip(ks, texts):
    stats = mcaviews.parse_register_files(text or "")
    if any(f.get("Number of optimizable moves", 0) > 0 for f in stats):
      e = table["opcodes"][k]
      e["move_elim"] = True
      if not any(f.get("Number of moves eliminated", 0) > 0 for f in stats):
        _note(e, "optimizable move that llvm-mca did not eliminate when alone")


def _groups(cpu: str, table: dict, keys: dict) -> None:
  """Checks every key for BeginGroup/EndGroup behaviour at dispatch."""
  dw = table["global"]["dispatch_width"]
  ks = [k for k, e in table["opcodes"].items()
        if keys.get(k, {}).get("example") and e["uops"] + 1 <= dw]
  bodies = [["nop", keys[k]["example"], "nop"] for k in ks]
  regions = _run_tolerant(cpu, bodies, _TIMELINE)
  found = []
  for k, reg in zip(ks, regions):
    if reg is None:
      continue
    tl = _timeline(reg)
    e = table["opcodes"][k]
    if tl[1]["CycleDispatched"] > tl[0]["CycleDispatched"]:
      e["begin_group"] = True
      found.append(k)
    if tl[2]["CycleDispatched"] > tl[1]["CycleDispatched"] and e["uops"] + 2 <= dw:
      e["end_group"] = True
      found.append(k)
  table.setdefault("evidence", {})["group_flags"] = (
      f"{len(ks)} keys with uops < dispatch width dispatched between two nops; "
      f"{len(found)} started or ended a dispatch group early")
