"""Variant keys (`OPCODE@<suffix>`, SCHEMA.md): one opcode whose cost depends on its
operands, measured on rewritten examples and kept only where the cost differs.

LLVM 14's models resolve some classes from operands the opcode does not name: the
condition of SETcc/CMOVcc (Intel), the address form of LEA (Zen 3) and a zero
immediate (Haswell's `adc`/`sbb`). `expand` adds the variants' examples before
extraction, `collapse` drops those that cost what the plain key costs.
"""

from __future__ import annotations

import json
import re

from diffsim.isa import idioms
from diffsim.params import mctools

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
LEA_VARIANTS = (idioms.LEA_3OP, idioms.LEA_SCALE)


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


def expand(keys: dict) -> dict:
  """Every key of `keys` plus its condition-code, LEA-address and zero-immediate
  variants, with examples made from the corpus example."""
  return imm_variants(lea_variants(cc_variants(keys)))


def collapse(opcodes: dict) -> None:
  """Keeps only the variant entries that cost something else than their plain key."""
  collapse_cc(opcodes)
  collapse_variants(opcodes, LEA_VARIANTS, "address forms that cost more")
  collapse_variants(opcodes, (idioms.IMM_ZERO,), "a zero immediate costs otherwise")
