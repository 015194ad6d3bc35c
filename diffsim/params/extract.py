"""Builds a `diffsim-params/1` table (see SCHEMA.md) for one llvm-mca CPU model.

Every value is read from the installed LLVM 14 tools; nothing is copied from LLVM's
TableGen sources. Sources, in order of authority:

1. `llvm-mca -instruction-tables` on the example instance of every key: NumMicroOps,
   MaxLatency, MayLoad/MayStore/HasSideEffects, load/store barriers, and the static
   per-unit pressure that any resource list must reproduce.
2. `llvm-exegesis -mode=analysis` (pipeline-model.md 5.1) on the MCInst llvm-mca
   builds from that same text: the scheduling class, its resource list with group
   names and cycles, and its write-latency entries.
3. `llvm-mca` simulations of small regions: buffer sizes and which buffers each key
   uses (`-scheduler-stats`), globals (summary, `-retire-stats`, `-dispatch-stats`,
   `-register-file-stats`), and timeline probes for read-advance, per-write
   latencies, idioms and move elimination (`probes.py`).

Where llvm-exegesis' list does not reproduce llvm-mca's pressure (it reduces the
expanded list in resource-index order, which goes wrong when a group sorts before
its members), the list is rebuilt from llvm-mca's pressure (`_repair`) and the key
gets an `evidence` note.

Usage: `python -m diffsim.params.extract CPU [-o FILE.json]`.
"""

from __future__ import annotations

import argparse
import datetime
import itertools
import json
import os
import re
import sys
import time

import numpy as np

from diffsim.isa import idioms
from diffsim.params import corpus_keys, exegesis, mcaviews, mctools
from diffsim.params import resources as R

FORMAT = "diffsim-params/1"
TABLES = os.path.join(os.path.dirname(os.path.abspath(__file__)), "tables")
CPUS = ("haswell", "skylake", "znver3", "broadwell", "icelake-client", "znver1", "znver2")


def _log(progress: bool, msg: str, t0: float) -> None:
  if progress:
    print(f"[{time.time() - t0:6.1f}s] {msg}", file=sys.stderr)


# ----------------------------------------------------------------------------------------
# Resource lists


def _repair(model: R.Model, listed: list, want: dict) -> list | None:
  """Rebuilds a kept resource list from llvm-mca's static pressure.

  The candidates are the resources llvm-exegesis named (its names are right even
  when its cycles are not), then those plus one or two other known resources. The
  first candidate set whose pressure vectors are independent and reproduce `want`
  with non-negative integer cycles wins.

  Args:
    model: the resource model.
    listed: llvm-exegesis' [(name, cycles)].
    want: llvm-mca's static pressure {unit: cycles}.

  Returns:
    [(name, cycles)] in mask order, or None.
  """
  cols = list(model.units)
  base = [n for n, _ in listed if n in model.units or n in model.groups]
  others = [n for n in model.order() if n not in base]
  target = np.array([want.get(u, 0.0) for u in cols])

  def vec(name):
    v = np.zeros(len(cols))
    sub = model.subunits(name)
    for u in model.members(name):
      v[cols.index(u)] = model.units[u] / sub
    return v

  def candidates():
    # Fewest changes first: drop up to two of llvm-exegesis' names (cycles it left on
    # an enclosing group) and add up to two other known resources.
    for changes in range(5):
      for drop in range(min(changes, 2, len(base)) + 1):
        add = changes - drop
        if add > 2:
          continue
        for dropped in itertools.combinations(base, drop):
          kept_names = [n for n in base if n not in dropped]
          for extra in itertools.combinations(others, add):
            yield kept_names + list(extra)

  for names in candidates():
    if not names:
      continue
    a = np.stack([vec(n) for n in names], axis=1)
    if np.linalg.matrix_rank(a) < len(names):
      continue
    x, *_ = np.linalg.lstsq(a, target, rcond=None)
    xr = np.round(x)
    if np.any(xr < 0) or np.max(np.abs(x - xr)) > 0.05:
      continue
    kept = [(n, int(c)) for n, c in zip(names, xr) if c > 0]
    if R.pressure_matches(model, want, R.static_pressure(model, kept)):
      return sorted(kept, key=lambda nc: model.mask_rank(nc[0]))
  return None


def resolve_resources(model: R.Model, listed: list, want: dict) -> tuple[list, str | None]:
  """The resource list to publish for one key, and a note when it was inferred.

  The list published is llvm-mca's kept list after its normalisation (3.1) of the
  expansion of llvm-exegesis' list; for ordinary classes that is llvm-exegesis' list
  itself.
  """
  norm = R.normalize(model, R.expand(model, listed))
  if R.pressure_matches(model, want, R.static_pressure(model, norm.kept)):
    kept = [(n, c) for n, c in norm.kept]
    note = None
    if sorted(kept) != sorted((n, c) for n, c in listed if c > 0):
      note = f"normalised from llvm-exegesis' {_fmt(listed)}"
    return kept, note
  fixed = _repair(model, listed, want)
  if fixed is not None:
    return fixed, f"rebuilt from llvm-mca pressure; llvm-exegesis said {_fmt(listed)}"
  return [(n, c) for n, c in listed if c > 0], (
      f"UNVERIFIED: llvm-exegesis' {_fmt(listed)} does not reproduce llvm-mca pressure")


def _fmt(res: list) -> str:
  return " ".join(f"{n}:{c}" for n, c in res) or "(none)"


# ----------------------------------------------------------------------------------------
# Condition-code variants

# LLVM 14 folds the condition into an operand (SETCCr, CMOV64rr, ...), and the Intel
# models resolve a variant class from it: `seta`/`setbe`/`cmova`/`cmovbe` cost more
# than the other conditions. One opcode key cannot hold both, so keys `OPCODE@<cc>`
# carry the conditions that differ from the plain key (SCHEMA.md).
CONDITIONS = ("o", "no", "b", "ae", "e", "ne", "be", "a", "s", "ns", "p", "np", "l", "ge",
              "le", "g")
_CC_TEXT = re.compile(r"^(?P<pre>(?:\S+\t\t)?(?:set|cmov))(?P<cc>[a-z]+?)(?P<sfx>[wlq]?)\t")


def _cc_split(opcode: str, text: str) -> tuple[str, str, str] | None:
  """(prefix, condition, size suffix) of a SETcc/CMOVcc line, or None."""
  if not opcode.startswith(("SETCC", "CMOV")):
    return None
  m = _CC_TEXT.match(text)
  if not m:
    return None
  cc, sfx = m.group("cc"), m.group("sfx")
  if opcode.startswith("SETCC"):
    cc, sfx = cc + sfx, ""  # setl / setle: no size suffix on set
  if cc not in CONDITIONS:
    return None
  return m.group("pre"), cc, sfx


def cc_variants(keys: dict) -> dict:
  """Every key of `keys` plus one `OPCODE@<cc>` key per condition of each
  condition-code opcode, with examples made from the corpus example."""
  out = dict(keys)
  made = {}
  for k, v in keys.items():
    parts = _cc_split(k.split("@")[0], v["example"])
    if parts is None or "@" in k:
      continue
    pre, _, sfx = parts
    rest = v["example"][_CC_TEXT.match(v["example"]).end():]
    for c in CONDITIONS:
      made[f"{k}@{c}"] = f"{pre}{c}{sfx}\t{rest}"
  hexes = mctools.encode(list(made.values())) if made else []
  for (k, text), hx in zip(made.items(), hexes):
    out[k] = {"example": text, "count": 0, "hex": hx}
  return out


def collapse_cc(opcodes: dict) -> None:
  """Keeps `OPCODE@<cc>` entries only where they differ from the plain key, whose
  entry becomes the one most conditions share."""
  bases = {k.split("@")[0] for k in opcodes if "@" in k and k.split("@")[1] in CONDITIONS}
  for base in bases:
    if base not in opcodes:
      continue
    variants = {c: opcodes.pop(f"{base}@{c}") for c in CONDITIONS if f"{base}@{c}" in opcodes}
    def sig(e):
      return json.dumps({f: x for f, x in e.items() if f != "evidence"}, sort_keys=True)
    counts: dict[str, int] = {}
    for e in variants.values():
      counts[sig(e)] = counts.get(sig(e), 0) + 1
    common = max(counts, key=counts.get)
    common_e = next(e for e in variants.values() if sig(e) == common)
    opcodes[base] = dict(common_e)
    odd = [c for c, e in variants.items() if sig(e) != common]
    if odd:
      _add_note(opcodes[base], "conditions " + ",".join(odd) + " differ: see " + base + "@<cc>")
    for c in odd:
      opcodes[f"{base}@{c}"] = variants[c]


# ----------------------------------------------------------------------------------------
# LEA variants

# Zen 3 resolves LEA to a 2-uop, 2-cycle class for a base + index + displacement
# address or a scale other than 1 (`idioms.lea_variant`). Each LEA key gets an
# `OPCODE@3op` and an `OPCODE@scale` key measured on such instances, and the plain key
# an instance that is neither; a variant is kept only where it costs something else
# (collapse_variants).
_LEA_TEXT = re.compile(r"^(?P<mn>lea[wlq])\t(?P<disp>[^(]*)\((?P<base>%[a-z0-9]+)?"
                       r"(?:,(?P<index>%[a-z0-9]+)(?P<scale>,\d)?)?\), (?P<dst>%[a-z0-9]+)$")
_LEA_VARIANTS = (idioms.LEA_3OP, idioms.LEA_SCALE)


def lea_variants(keys: dict) -> dict:
  """Every key of `keys` plus `OPCODE@3op` and `OPCODE@scale` for each LEA key, with
  examples made from the corpus example, whose plain form replaces it when it is a
  variant itself."""
  out = dict(keys)
  made = {}
  for k, v in keys.items():
    m = _LEA_TEXT.match(v["example"])
    if "@" in k or k not in idioms.LEA_OPCODES or m is None:
      continue
    wide = not (m.group("base") or m.group("index") or "%r").startswith("%e")
    base = m.group("base") if m.group("base") not in (None, "%rip") else (
        "%rbx" if wide else "%ebx")
    index = m.group("index") or ("%rcx" if wide else "%ecx")
    mn, dst = m.group("mn"), m.group("dst")
    made[k + idioms.LEA_3OP] = f"{mn}\t1({base},{index}), {dst}"
    made[k + idioms.LEA_SCALE] = f"{mn}\t({base},{index},2), {dst}"
    if idioms.lea_variant(k, v["example"]):
      made[k] = f"{mn}\t({base},{index}), {dst}"
  hexes = mctools.encode(list(made.values())) if made else []
  for (k, text), hx in zip(made.items(), hexes):
    out[k] = {"count": keys.get(k, {}).get("count", 0), "example": text, "hex": hx}
  return out


# ----------------------------------------------------------------------------------------
# Zero-immediate variants

# Haswell resolves `adc`/`sbb` with an immediate of 0 to a cheaper class
# (`idioms.imm_variant`). Each key with an immediate gets an `OPCODE@imm0` key measured
# on its example with the immediate set to 0, and the plain key a non-zero immediate;
# a rewrite that llvm-mc assembles to another opcode (`shl $1` is SHL64r1) is dropped.
_NOT_ACCUMULATOR = {"al": "cl", "ax": "cx", "eax": "ecx", "rax": "rcx"}


def imm_variants(keys: dict) -> dict:
  """Every key of `keys` plus `OPCODE@imm0` for each plain key with an immediate, with
  examples made from the corpus example (off the accumulator), whose non-zero form
  replaces it when it is a variant itself."""
  made = {}
  for k, v in keys.items():
    m = idioms.IMMEDIATE.search(v["example"])
    if "@" in k or m is None:
      continue
    ex = v["example"]
    zero = ex[:m.start()] + "$0" + ex[m.end():]
    made[k + idioms.IMM_ZERO] = idioms.ACCUMULATOR.sub(
        lambda a: "%" + _NOT_ACCUMULATOR[a.group()[1:]], zero)
    if idioms.imm_variant(ex):
      made[k] = ex[:m.start()] + "$2" + ex[m.end():]
  if not made:
    return dict(keys)
  bases = [k.split("@")[0] for k in made]
  lines = [keys[b]["example"] for b in bases] + list(made.values())
  insts = mctools.assemble("\n".join(lines) + "\n")
  if len(insts) != len(lines):
    raise RuntimeError(f"llvm-mc made {len(insts)} instructions of {len(lines)} lines")
  same = {k: insts[i].opcode == insts[len(made) + i].opcode for i, k in enumerate(made)}
  # Both rewrites of a key must keep its opcode, or the two cannot be told apart.
  made = {k: t for k, t in made.items()
          if same[k] and same.get(k.split("@")[0], True)
          and same.get(k.split("@")[0] + idioms.IMM_ZERO, True)}
  out = dict(keys)
  for (k, text), hx in zip(made.items(), mctools.encode(list(made.values()))):
    out[k] = {"count": keys.get(k, {}).get("count", 0), "example": text, "hex": hx}
  return out


def collapse_variants(opcodes: dict, suffixes: tuple[str, ...], note: str) -> None:
  """Drops variant entries (keys ending in `suffixes`) that cost what the plain key
  costs, and notes the kept ones on the plain key."""
  def sig(e):
    return json.dumps({f: x for f, x in e.items() if f not in ("evidence", "sched_class")},
                      sort_keys=True)
  kept: dict[str, list[str]] = {}
  for k in sorted(k for k in opcodes if k.endswith(suffixes)):
    base = k.split("@")[0]
    if base in opcodes and sig(opcodes[k]) == sig(opcodes[base]):
      del opcodes[k]
    elif base in opcodes:
      kept.setdefault(base, []).append(k)
  for base, ks in kept.items():
    _add_note(opcodes[base], note + ": " + ", ".join(ks))


def _add_note(e: dict, msg: str) -> None:
  e["evidence"] = (e["evidence"] + "; " + msg) if e.get("evidence") else msg


# ----------------------------------------------------------------------------------------
# Globals


def read_globals(cpu: str) -> dict:
  """Dispatch width, ROB, retire width, LQ/SQ and register files, from llvm-mca.

  Returns:
    The table's `global` object, plus `_evidence` notes.
  """
  ev = {}
  runs = mcaviews.run_regions(cpu, [
      ["nop"],
      ["divq %rcx"] + ["nop"] * 150,
      ["divq %rcx"] + ["movq (%rdi), %rax"] * 150,
      ["divq %rcx"] + ["movq %rax, (%rdi)"] * 150,
  ], ["-iterations=1", "-retire-stats", "-dispatch-stats", "-register-file-stats"])
  summ = mcaviews.parse_summary(runs[0])
  ret = mcaviews.parse_retire(runs[0])
  g = {"dispatch_width": summ["Dispatch Width"], "rob_size": ret["rob"]}
  # Retire width: 150 executed nops wait behind a divide; when it retires they all
  # go at once unless MaxRetirePerCycle caps the burst.
  burst = max(mcaviews.parse_retire(runs[1])["hist"])
  g["retire_width"] = 0 if burst >= 100 else burst
  ev["retire_width"] = f"largest retire burst behind a divide: {burst} of 150 nops"
  # LQ/SQ: loads/stores executed behind a divide cannot retire; with a queue, dispatch
  # stalls on LQ/SQ and the number dispatched before the divide retires is its size.
  for field, run, kind in (("load_queue", 2, "LQ"), ("store_queue", 3, "SQ")):
    stalls = mcaviews.parse_dispatch_stalls(runs[run])
    if stalls.get(kind, 0) == 0:
      g[field] = 0
      ev[field] = f"no {kind} stall with 150 in flight"
    else:
      g[field] = _queue_size(cpu, run == 2)
      ev[field] = f"{kind} stalls; entries in flight before the divide retires"
  g["register_files"] = _register_files(cpu)
  g["_evidence"] = ev
  return g


def _queue_size(cpu: str, loads: bool) -> int:
  """Loads (or stores) dispatched before a blocking divide retires."""
  op = "movq (%rdi), %rax" if loads else "movq %rax, (%rdi)"
  reg = mcaviews.run_regions(cpu, [["divq %rcx"] + [op] * 200],
                             ["-iterations=1", "-timeline", "-timeline-max-iterations=1",
                              "-timeline-max-cycles=0"], as_json=True)[0]
  tl = reg["TimelineView"]["TimelineInfo"]
  head_retire = tl[0]["CycleRetired"]
  return sum(1 for e in tl[1:] if e["CycleDispatched"] < head_retire)


# Register kinds and one instruction that writes a register of that kind (and
# nothing else that a register file could rename, except where noted).
_KIND_PROBES = {
    "gpr": "movq $1, %rax",
    "flags": "cmpq %rax, %rbx",
    "vec": "vaddps %ymm1, %ymm2, %ymm3",
    "mmx": "paddd %mm1, %mm2",
    "mask": "kmovw %k1, %k2",
    "x87": "fadd %st(1), %st",
}
# One write of each vector width: a file may take more than one register for a wide one
# (llvm-mca's RegisterCost; Zen 1/2 take two for a YMM register).
_COST_PROBES = {
    "xmm": "vaddps %xmm1, %xmm2, %xmm3",
    "ymm": "vaddps %ymm1, %ymm2, %ymm3",
    "zmm": "vaddps %zmm1, %zmm2, %zmm3",
}


def _register_files(cpu: str) -> list:
  """Named register files with their sizes, kinds, costs of wide writes and
  move-elimination limits."""
  kinds = list(_KIND_PROBES)
  bodies = [[_KIND_PROBES[k]] for k in kinds]
  # Eight independent moves per file: the largest number eliminated in one cycle is
  # the per-cycle budget when it is below 8 (dispatch width permitting).
  moves_gpr = [f"movq %r{a}, %r{b}" for a, b in zip(range(8, 16, 2), range(9, 16, 2))] + [
      "movq %rax, %rbx", "movq %rcx, %rdx", "movq %rsi, %rdi", "movq %rbp, %rsp"]
  moves_vec = [f"vmovaps %xmm{a}, %xmm{a + 1}" for a in range(0, 16, 2)]
  bodies += [moves_gpr, moves_vec] + [[_COST_PROBES[f]] for f in _COST_PROBES]
  try:
    runs = mcaviews.run_regions(cpu, bodies, ["-iterations=1", "-register-file-stats"])
  except mctools.ToolError:  # a kind the CPU cannot model (mask registers): probe apart
    runs = []
    for b in bodies:
      try:
        runs.extend(mcaviews.run_regions(cpu, [b], ["-iterations=1", "-register-file-stats"]))
      except mctools.ToolError:
        runs.append("")
  files = {f["name"]: {"name": f["name"], "size": f.get("Number of physical registers", 0),
                       "classes": [], "max_moves_per_cycle": 0, "zero_moves_only": False}
           for f in mcaviews.parse_register_files(runs[0])}
  for kind, text in zip(kinds, runs):
    for f in mcaviews.parse_register_files(text):
      if f.get("Total number of mappings created", 0) > 0:
        files[f["name"]]["classes"].append(kind)
  for family, text in zip(_COST_PROBES, runs[len(kinds) + 2:]):
    for f in mcaviews.parse_register_files(text):
      regs = f.get("Total number of mappings created", 0)
      if regs > 1:
        files[f["name"]].setdefault("costs", {})[family] = regs
  for text in runs[len(kinds):len(kinds) + 2]:
    for f in mcaviews.parse_register_files(text):
      if f.get("Number of optimizable moves", 0) > 0:
        files[f["name"]]["max_moves_per_cycle"] = max(
            files[f["name"]]["max_moves_per_cycle"], f.get("Max moves eliminated per cycle", 0))
        # The probe's moves copy registers not known to be zero: a file that
        # eliminates none of them restricts elimination to zero moves.
        files[f["name"]]["zero_moves_only"] = f.get("Number of moves eliminated", 0) == 0
  return list(files.values())


# ----------------------------------------------------------------------------------------
# The table


def build_table(cpu: str, keys: dict | None = None, *, progress: bool = False,
                probe: bool = True) -> dict:
  """Builds the parameter table of one llvm-mca CPU model.

  Args:
    cpu: llvm-mca `-mcpu` name (`haswell`, `skylake`, `znver3`, ...).
    keys: {key: {"example": AT&T text, ...}} as in corpus_keys.json; the shipped
      corpus_keys.json when None.
    progress: log steps to stderr.
    probe: run the timeline probes (read-advance, per-write latency, idioms, move
      elimination); without them those fields keep their defaults.

  Returns:
    The `diffsim-params/1` JSON object (a dict).
  """
  t0 = time.time()
  if keys is None:
    keys = corpus_keys.load()
  keys = imm_variants(lea_variants(cc_variants(keys)))
  wanted = set(keys)
  # Group membership and buffers are inferred from many classes at once, so a small
  # key set is padded with the corpus examples (if shipped) as evidence.
  if os.path.exists(corpus_keys.DEFAULT_OUT):
    keys = {**corpus_keys.load(), **keys}
  lines = {k: v["example"] for k, v in keys.items()}
  supported, unsupported = mcaviews.filter_supported(cpu, lines)
  _log(progress, f"{len(supported)} keys accepted, {len(unsupported)} refused", t0)

  # The MCInst llvm-mca builds from each line is what its class is resolved from
  # (the assembler may pick another opcode than the decoder: XOR32rr for
  # XOR32rr_REV).
  insts = dict(zip(supported, mctools.assemble("\n".join(supported.values()) + "\n")))
  names = mctools.register_names()
  points = {k: i.opcode + " " + " ".join(mctools.exegesis_operand(kind, v, names)
                                         for kind, v in i.operands)
            for k, i in insts.items()}
  rows, units = mcaviews.instruction_tables(cpu, list(supported.values()))
  info = dict(zip(supported, rows))
  classes, refused = exegesis.read_classes(cpu, points)
  _log(progress, f"instruction tables and exegesis classes read ({len(refused)} refused)", t0)

  ks = [k for k in supported if k in classes and classes[k].valid]
  groups, group_notes = R.infer_listed_groups(
      units.counts, [classes[k].resources for k in ks], [info[k].pressure for k in ks],
      [classes[k].pressure for k in ks])
  model = R.Model(dict(units.counts), groups, {})

  # Resource lists, checked against (or rebuilt from) llvm-mca's static pressure.
  kept_lists, notes = {}, {}
  for k in supported:
    sc = classes.get(k)
    if sc is None or not sc.valid:
      fixed = _repair(model, [], info[k].pressure)
      kept_lists[k] = fixed or []
      notes[k] = [f"no llvm-exegesis class ({refused.get(k, 'invalid class')}); "
                  + ("resources rebuilt from pressure" if fixed is not None
                     else "UNVERIFIED: no resources")]
      continue
    kept_lists[k], note = resolve_resources(model, sc.resources, info[k].pressure)
    notes[k] = [note] if note else []

  # Buffers: which buffered resources each key takes an entry in, simulated alone.
  regions = mcaviews.run_regions(cpu, [[supported[k]] for k in supported],
                                 ["-iterations=1", "-scheduler-stats"])
  usage = {k: {b: q[1] > 0 for b, q in mcaviews.parse_scheduler_queues(r).items()}
           for k, r in zip(supported, regions)}
  sizes = {}
  for r in regions[:1]:
    sizes = {b: q[2] for b, q in mcaviews.parse_scheduler_queues(r).items()}
  model.buffers = dict(sizes)
  # -scheduler-stats counts the load/store queue resources by MayLoad/MayStore, not by
  # the buffer entries taken at dispatch, so they are left out of the checks.
  lsq = {b for b in sizes
         if all(usage[k].get(b, False) == info[k].may_load for k in supported)
         or all(usage[k].get(b, False) == info[k].may_store for k in supported)}
  for b in sizes:
    if b in model.units or b in model.groups:
      continue
    mem, note = R.infer_buffered_group(
        units.counts, groups, [kept_lists[k] for k in supported],
        [usage[k].get(b, False) for k in supported])
    groups[b] = mem
    if note:
      group_notes[b] = note
  _log(progress, f"groups {sorted(groups)}; buffers {sizes}; queues {sorted(lsq)}", t0)

  opcodes = {}
  for k in supported:
    if k not in wanted:
      continue
    inf = info[k]
    sc = classes.get(k)
    e = {"uops": inf.uops, "latency": inf.latency}
    ev = list(notes[k])
    res = kept_lists[k]
    e["resources"] = [[n, c] for n, c in res]
    used = {b for b, u in usage[k].items() if u} - lsq
    implied = R.buffers_used(model, res)
    if used != implied - lsq:
      # llvm-mca's entries stand (a list rebuilt from pressure can drop a buffered
      # resource that llvm-exegesis' class names: Zen 1's x87 loads hold ZnAGU/ZnFPU).
      e["buffers"] = sorted(used | (implied & lsq))
      ev.append(f"buffers {e['buffers']} read from -scheduler-stats; the list implies "
                f"{sorted(implied)}")
    for flag in ("may_load", "may_store", "side_effects", "load_barrier", "store_barrier"):
      if getattr(inf, flag):
        e[flag] = True
    if insts[k].opcode != k.split("@")[0]:
      e["llvm_opcode"] = insts[k].opcode
    if sc is not None and sc.valid:
      e["sched_class"] = sc.name
    if ev:
      e["evidence"] = "; ".join(ev)
    opcodes[k] = e

  glob = read_globals(cpu)
  glob_ev = glob.pop("_evidence")
  _log(progress, "globals read", t0)

  table = {
      "format": FORMAT,
      "cpu": cpu,
      "source": (f"{mctools.tool_versions()}: llvm-mca -instruction-tables/-scheduler-stats/"
                 f"timeline probes and llvm-exegesis analysis, diffsim.params.extract, "
                 f"{datetime.date.today().isoformat()}"),
      "global": glob,
      "resources": _resource_entries(model),
      "opcodes": opcodes,
      "unsupported": dict(sorted((k, v) for k, v in unsupported.items() if k in wanted)),
      "evidence": {"global": glob_ev, "groups": group_notes},
  }
  if probe:
    from diffsim.params import probes  # pylint: disable=import-outside-toplevel
    probes.apply(cpu, table, keys, progress=progress)
    _log(progress, "probes done", t0)
  # Where llvm-exegesis' class still disagrees with llvm-mca (after the probes took
  # forwarding delays out of the printed latency), llvm-mca's values stand.
  for k, e in opcodes.items():
    sc = classes.get(k)
    if sc is not None and sc.valid and (sc.uops != e["uops"] or sc.max_latency != e["latency"]):
      msg = (f"llvm-exegesis class {sc.name} has uops {sc.uops} latency {sc.max_latency}; "
             "llvm-mca's values kept")
      e["evidence"] = msg + ("; " + e["evidence"] if e.get("evidence") else "")
  collapse_cc(opcodes)
  collapse_variants(opcodes, _LEA_VARIANTS, "address forms that cost more")
  collapse_variants(opcodes, (idioms.IMM_ZERO,), "a zero immediate costs otherwise")
  return table


def _resource_entries(model: R.Model) -> list:
  """The `resources` list: units in llvm-mca's order, then groups in mask order."""
  out = []
  for u, n in model.units.items():
    out.append({"name": u, "units": n, "buffer": model.buffers.get(u, -1)})
  for g in sorted(model.groups, key=model.mask_rank):
    members = [u for u in model.units if u in model.groups[g]]
    out.append({"name": g, "members": members, "buffer": model.buffers.get(g, -1)})
  return out


def write_table(table: dict, out_path: str) -> None:
  """Writes a table compactly: one line per opcode, so diffs stay readable."""
  head = {k: v for k, v in table.items() if k != "opcodes"}
  with open(out_path, "w") as f:
    f.write("{\n")
    f.writelines(f"{json.dumps(k)}: {json.dumps(v)},\n" for k, v in head.items())
    f.write('"opcodes": {\n')
    items = sorted(table["opcodes"].items())
    f.writelines(f"{json.dumps(k)}: {json.dumps(v)}{',' if i + 1 < len(items) else ''}\n" for i, (k, v) in enumerate(items))
    f.write("}\n}\n")


def main(cpu: str, out_path: str | None = None, *, progress: bool = True) -> dict:
  """Builds the table of `cpu` and writes it to `out_path` (default tables/CPU.json)."""
  table = build_table(cpu, progress=progress)
  out_path = out_path or os.path.join(TABLES, f"{cpu}.json")
  os.makedirs(os.path.dirname(os.path.abspath(out_path)), exist_ok=True)
  write_table(table, out_path)
  return table


def _cli(argv: list[str] | None = None) -> int:
  ap = argparse.ArgumentParser(description="Build a diffsim parameter table from llvm-mca.")
  ap.add_argument("cpu", nargs="+")
  ap.add_argument("-o", "--out", help="output file (one CPU only)")
  ap.add_argument("--no-probe", action="store_true", help="skip the timeline probes")
  args = ap.parse_args(argv)
  for cpu in args.cpu:
    out = args.out or os.path.join(TABLES, f"{cpu}.json")
    table = build_table(cpu, progress=True, probe=not args.no_probe)
    os.makedirs(os.path.dirname(os.path.abspath(out)), exist_ok=True)
    write_table(table, out)
    print(f"{cpu}: {len(table['opcodes'])} opcodes, {len(table['unsupported'])} unsupported"
          f" -> {out}", file=sys.stderr)
  return 0


if __name__ == "__main__":
  sys.exit(_cli())
