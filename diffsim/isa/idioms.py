"""Which opcode keys get the `@same` variant.

CPU models resolve some opcodes to a different scheduling class when all their
register operands are one register: zero idioms (`xor %eax,%eax`: latency 0, no
port on Intel cores) and dependency-breaking idioms (`pcmpeqd %xmm1,%xmm1`,
`sbb %eax,%eax` on AMD cores). The decoder gives such instances the key
`OPCODE@same`, and each CPU's parameter table says what that variant costs there.
The candidate list is deliberately generous (every opcode that any LLVM x86 model
treats as an idiom); a variant that a CPU does not special-case simply gets the same
parameters as the plain opcode when its table is built.
"""

from __future__ import annotations

import re

_IDIOM_OPCODE = re.compile(
    r"^(?:"
    r"(?:SUB|XOR|SBB|CMP)(?:8|16|32|64)rr(?:_REV)?"
    r"|(?:MMX_)?V?(?:PXOR|PANDN|XORPS|XORPD|ANDNPS|ANDNPD"
    r"|PSUB[BWDQ]|PSUBS[BW]|PSUBUS[BW]|PCMPEQ[BWDQ]|PCMPGT[BWDQ])(?:Y|Z|Z128|Z256)?rr"
    r"|VPXOR[DQ](?:Z|Z128|Z256)rr|VPANDN[DQ](?:Z|Z128|Z256)rr"
    r")$"
)

SAME = "@same"


def is_idiom_candidate(opcode: str) -> bool:
  """True when `opcode` (an LLVM opcode name) has an `@same` variant."""
  return _IDIOM_OPCODE.match(opcode) is not None


def variant_key(opcode: str, sources: list[str]) -> str:
  """The opcode key: `opcode`, plus `@same` when its two register sources coincide.

  Args:
    opcode: LLVM opcode name, as `llvm-mc -show-inst` prints it.
    sources: the instruction's explicit register *source* operands: for
      `xor %ecx,%eax` (XOR32rr) EAX and ECX; for `vpxor %xmm1,%xmm2,%xmm3` XMM2 and
      XMM1. In an MCInst these are its last two register operands. Any naming
      scheme works as long as one register always has one name.
  """
  if is_idiom_candidate(opcode) and len(sources) == 2 and sources[0] == sources[1]:
    return opcode + SAME
  return opcode



# Operand-dependent LEA classes. Zen 3 resolves LEA to a slower class (2 uops, 2 cycles)
# when the address has a base, an index and a non-zero displacement (LLVM's
# IsThreeOperandsLEAPredicate; its `isGlobal()` alternative is non-portable, hence false
# for an MCInst, so a symbolic displacement does not count) or a scale other than 1
# (Zn3SlowLEAPredicate). Tables key those instances `OPCODE@3op` and `OPCODE@scale`
# (three-operand wins) where they cost something other than the plain opcode.
LEA_3OP = "@3op"
LEA_SCALE = "@scale"
# Any LEA with an index register: Intel's Golden Cove line runs a base + displacement
# LEA at rename (6 a cycle, no latency, measured on the Xeon 6) and an indexed one on
# an ALU (1 cycle), so a table may key the indexed ones `OPCODE@index`.
LEA_INDEX = "@index"
LEA_OPCODES = frozenset({"LEA16r", "LEA32r", "LEA64r", "LEA64_32r"})
_LEA_ADDRESS = re.compile(
    r"^\s*lea[wlq]?\s+(?P<disp>[^(,\s]*)\((?P<base>%[a-z0-9]+)?"
    r"(?:,(?P<index>%[a-z0-9]+)(?:,(?P<scale>\d))?)?\)")


def lea_variant(opcode: str, text: str) -> str:
  """The LEA variant suffix of an instruction: LEA_3OP, LEA_SCALE or "".

  Args:
    opcode: LLVM opcode name (the key without its variant).
    text: the instruction's AT&T text as llvm-mc prints it.
  """
  if opcode not in LEA_OPCODES:
    return ""
  m = _LEA_ADDRESS.match(text)
  if m is None:
    return ""
  if m.group("base") is not None and m.group("index") is not None:
    try:
      if int(m.group("disp") or "0", 0) != 0:
        return LEA_3OP
    except ValueError:  # a symbol: not an immediate operand
      pass
  if m.group("scale") not in (None, "1"):
    return LEA_SCALE
  return ""


def lea_keys(opcode: str, text: str) -> tuple[str, ...]:
  """The LEA variant suffixes a table may know an instruction by, most specific first
  (`lea_variant`, then LEA_INDEX for any indexed address)."""
  if opcode not in LEA_OPCODES:
    return ()
  m = _LEA_ADDRESS.match(text)
  if m is None or m.group("index") is None:
    return ()
  slow = lea_variant(opcode, text)
  return (slow, LEA_INDEX) if slow else (LEA_INDEX,)


# Zero-immediate classes. Haswell resolves `adc`/`sbb` with an immediate of 0 to a
# cheaper class (1 uop, latency 1, against 2 and 2), except on the accumulator
# (%al/%ax/%eax/%rax, which have short encodings of their own). Tables key such
# instances `OPCODE@imm0` where they cost something other than the plain opcode, whose
# entry is measured on a non-zero immediate.
IMM_ZERO = "@imm0"
IMMEDIATE = re.compile(r"\$(?P<value>-?(?:0x[0-9a-fA-F]+|\d+))\b")
ACCUMULATOR = re.compile(r"%(?:al|ax|eax|rax)$")


def imm_variant(text: str) -> str:
  """IMM_ZERO when the instruction's first immediate is zero and its last operand is
  not the accumulator, else "".

  Args:
    text: the instruction's AT&T text as llvm-mc prints it.
  """
  m = IMMEDIATE.search(text)
  if m is None or int(m.group("value"), 0) != 0 or ACCUMULATOR.search(text):
    return ""
  return IMM_ZERO
