"""What llvm-mc (LLVM 14, the same LLVM as the reference llvm-mca) says about each
instruction: its AT&T text and its opcode key.

Each distinct instruction is disassembled on its own by `llvm-mc --disassemble
-show-inst`, which gives its AT&T text (so `66 90` is `nop`, not iced's `xchg
%ax,%ax`). llvm-mca re-assembles that text, and its assembler picks canonical
encodings, so the text is assembled again with `llvm-mc -show-inst` and the key is
the opcode of *that* MCInst: `68 51 00 00 00` disassembles to PUSH64i32 but its text
`pushq $81` is PUSH64i8 to llvm-mca (another latency), `33 c0` (XOR32rr_REV) is
XOR32rr, `05 01 00 00 00` (ADD32i32) is ADD32ri8 (~0.5% of BHive's distinct
instructions). The disassembled opcode is kept as `Instr.encoding_opcode`. Hence
bytes and `parse_asm(text)` give the same keys and dataflow. An instruction whose
text llvm-mc cannot read back fails (`llvm-mc-asm`), and so does one whose text
becomes two MCInsts (`llvm-mc-prefix`: `xacquire` is an instruction of its own to
llvm-mca, `lock` and `rep` are not).

Relative branch targets are printed by llvm-mc as offsets (`jne 5`); they carry no
dataflow and llvm-mca ignores them.
"""

from __future__ import annotations

import re
import subprocess
from typing import NamedTuple

from diffsim.isa import idioms
from diffsim.isa.ir import DecodeError
from diffsim.llvmtools import run_tool

DIAG = re.compile(r"^<stdin>:(\d+):(\d+): (warning|error): (.*)$", re.MULTILINE)
_DISASM = ["--disassemble", "-triple=x86_64", "-show-inst"]
# Separator between instructions in one llvm-mc disassembly run: each instruction is
# its own `[...]` atomic group (llvm-mc decodes it in isolation and never resyncs into
# the next one), followed by this `movabsq $MAGIC, %rax`, whose text marks the end of
# the group's output. Instructions that contain the magic immediate are disassembled
# alone, so a separator line is never ambiguous.
SEP_IMM = bytes.fromhex("ed5eced10df0ad0b")
_SEP_GROUP = "[" + " ".join(f"0x{b:02x}" for b in b"\x48\xb8" + SEP_IMM) + "]"
_sep_text: str | None = None


def run(args: list[str], stdin: str) -> subprocess.CompletedProcess:
  """llvm-mc on `stdin`, through temporary files rather than pipes (`run_tool`'s
  `files`: decoding runs llvm-mc beside the iced pass)."""
  try:
    return run_tool("llvm-mc", args, stdin, files=True)
  except FileNotFoundError as e:  # an environment problem, not a bad block
    raise RuntimeError(str(e)) from e


def _group_bytes(data: bytes) -> str:
  return "[" + " ".join(f"0x{x:02x}" for x in data) + "]"


# One instruction line of `llvm-mc -show-inst` output: tab, AT&T text, `# <MCInst #N
# OPCODE`. The MCInst's operand lines and llvm-mc's comments (`# xmm0 = ...`) start
# with spaces instead.
_INST_LINE = re.compile(r"^\t([^#\n]*)#[ \t]*<MCInst #\d+ (\w+)", re.MULTILINE)


def _inst_lines(stdout: str) -> list[tuple[str, str]]:
  """(text, MCInst opcode) of each instruction line of `llvm-mc -show-inst` output."""
  return [(" ".join(text.split()), opcode) for text, opcode in _INST_LINE.findall(stdout)]


def _separator_text() -> str:
  global _sep_text
  if _sep_text is None:
    out = run(_DISASM, _SEP_GROUP + "\n")
    lines = list(_inst_lines(out.stdout))
    if len(lines) != 1:
      raise RuntimeError(f"unexpected llvm-mc output for the separator: {out.stdout!r}")
    _sep_text = lines[0][0]
  return _sep_text


def fold_prefixes(lines: list[tuple[str, str]], what: str) -> tuple[str, str] | DecodeError:
  """(opcode, text) of one instruction's disassembly lines, or a DecodeError.

  llvm-mc decodes some prefixes (`lock`, `xacquire`, a stray `rex64`...) as MCInsts
  of their own, printed on their own line; they are folded into the text of the
  instruction that follows (`lock cmpxchgl %ecx, (%rdx)`), which is how llvm-mca
  must see them to treat them as one instruction.
  """
  prefixes, real = [], []
  for text, opcode in lines:
    (prefixes if opcode.endswith("_PREFIX") and not real else real).append((text, opcode))
  if len(real) == 1:
    text, opcode = real[0]
    return opcode, " ".join([t for t, _ in prefixes] + [text])
  if not real:
    return DecodeError("llvm-mc-mismatch",
                       f"{what}: llvm-mc decodes only prefixes {[t for t, _ in prefixes]}")
  return DecodeError("llvm-mc-mismatch", f"{what}: llvm-mc splits it into {len(real)} "
                     f"instructions {[t for t, _ in real]}")


def _disassemble(instrs: list[bytes]) -> list[tuple[str, str] | DecodeError]:
  """(MCInst opcode, AT&T text) of each instruction, decoded in isolation."""
  out: list[tuple[str, str] | DecodeError | None] = [None] * len(instrs)
  batch = []
  for k, b in enumerate(instrs):
    if SEP_IMM in b:  # could print like the separator: disassemble it alone
      res = run(_DISASM, _group_bytes(b) + "\n")
      bad = [m.group(4) for m in DIAG.finditer(res.stderr) if "invalid" in m.group(4)]
      out[k] = (DecodeError("llvm-mc-invalid", f"{b.hex()}: {bad[0]}") if bad else
                fold_prefixes(list(_inst_lines(res.stdout)), b.hex()))
    else:
      batch.append(k)
  if not batch:
    return out
  sep = _separator_text()
  parts = []
  for k in batch:
    parts.append(_group_bytes(instrs[k]))
    parts.append(_SEP_GROUP)
  res = run(_DISASM, "\n".join(parts) + "\n")
  # Group j sits on input line 2j+1, its separator on 2j+2.
  failed: dict[int, str] = {}
  for m in DIAG.finditer(res.stderr):
    line, msg = int(m.group(1)), m.group(4)
    if m.group(3) == "warning" and "potentially undefined" in msg:
      continue  # SoftFail: llvm-mc still prints the instruction, llvm-mca accepts it
    failed.setdefault((line - 1) // 2, msg)
  groups: list[list[tuple[str, str]]] = [[]]
  for item in _inst_lines(res.stdout):
    if item[0] == sep:
      groups.append([])
    else:
      groups[-1].append(item)
  if len(groups) != len(batch) + 1 or groups[-1]:
    raise RuntimeError(f"llvm-mc produced {len(groups) - 1} groups for {len(batch)} "
                       f"instructions; stderr: {res.stderr[:500]}")
  for j, k in enumerate(batch):
    what = instrs[k].hex()
    if j in failed:
      out[k] = DecodeError("llvm-mc-invalid", f"{what}: {failed[j]}")
    else:
      out[k] = fold_prefixes(groups[j], what)
  return out


class Asm(NamedTuple):
  """The MCInst that llvm-mc's assembler, as llvm-mca's parser, builds from a text."""

  opcode: str
  n_regs: int  # its register operands (the "no register" 0 of an address included)
  # The last two register operands' numbers, for an idiom candidate (`@same`); else ().
  sources: tuple[int, ...]


# `llvm-mc -show-inst` prints `# <MCInst #N OPCODE` after each instruction's text,
# then one `<MCOperand Reg:N>` (or Imm, Expr) line per operand.
_MCINST_HEAD = "<MCInst #"
_MCINST_OPCODE = re.compile(r"<MCInst #\d+ (\w+)")
_REG_OPERAND = re.compile(r"<MCOperand Reg:(\d+)>")
# Text -> its assembled MCInst, or why llvm-mca could not take it as one instruction
# (a DecodeError without the bytes in its detail).
ASM_CACHE: dict[str, Asm | DecodeError] = {}


def _assemble(texts: list[str]) -> list[Asm | DecodeError]:
  """Assembles each text as llvm-mca will; one llvm-mc run for all of them.

  A text must become exactly one MCInst: an error is `llvm-mc-asm`, and a prefix that
  the assembler emits as an instruction of its own (`xacquire`, `rex64`), which
  llvm-mca would simulate as a second instruction, is `llvm-mc-prefix`. When the
  output cannot be matched to the input lines, the list is split in halves until it
  can.
  """
  if not texts:
    return []
  res = run(["-triple=x86_64", "-show-inst"], "\n".join(texts) + "\n")
  failed: dict[int, str] = {}
  for m in DIAG.finditer(res.stderr):
    if m.group(3) == "error":
      failed.setdefault(int(m.group(1)) - 1, m.group(4))
  groups: list[tuple[list[str], str, int, tuple[int, ...]]] = []
  pending: list[str] = []
  # Each piece after a MCInst head holds that MCInst's operands (and the next
  # instruction's text, which has no `Reg:`); C-level findall, split and count keep
  # this fast, and register numbers are parsed only where `@same` needs them.
  opcodes = _MCINST_OPCODE.findall(res.stdout)
  pieces = res.stdout.split(_MCINST_HEAD)[1:]
  for opcode, piece in zip(opcodes, pieces):
    if opcode.endswith("_PREFIX"):
      pending.append(opcode)
      continue
    sources = ()
    if idioms.is_idiom_candidate(opcode):
      sources = tuple(map(int, _REG_OPERAND.findall(piece)[-2:]))
    groups.append((pending, opcode, piece.count("Reg:"), sources))
    pending = []
  ok = [k for k in range(len(texts)) if k not in failed]
  if pending or len(groups) != len(ok) or len(opcodes) != len(pieces):
    if len(texts) == 1:
      return [DecodeError("llvm-mc-asm", f"{texts[0]!r}: llvm-mc assembles it to "
                          f"{len(groups)} instructions")]
    mid = len(texts) // 2
    return _assemble(texts[:mid]) + _assemble(texts[mid:])
  out: list[Asm | DecodeError] = [
      DecodeError("llvm-mc-asm", f"{texts[k]!r}: {failed[k]}") if k in failed else None
      for k in range(len(texts))]
  for k, (prefixes, opcode, n_regs, sources) in zip(ok, groups):
    if prefixes:
      out[k] = DecodeError("llvm-mc-prefix", f"{texts[k]!r}: llvm-mca reads it as "
                           f"{' + '.join(prefixes + [opcode])}")
    else:
      out[k] = Asm(opcode, n_regs, sources)
  return out


def opcodes(instrs: list[bytes]) -> list[tuple[str, str, Asm] | DecodeError]:
  """(disassembled opcode, text, re-assembled MCInst) of each instruction.

  The text is re-assembled, as llvm-mca will: that catches text that llvm-mc prints
  but cannot read back (`63 c4` prints as `movslq %esp, %eax`), and gives the
  opcode llvm-mca simulates, which differs from the disassembled one for
  non-canonical encodings (`PUSH64i32` -> `PUSH64i8`, `XOR32rr_REV` -> `XOR32rr`).
  """
  dis = _disassemble(instrs)
  todo = list(dict.fromkeys(x[1] for x in dis
                            if not isinstance(x, DecodeError) and x[1] not in ASM_CACHE))
  for t, a in zip(todo, _assemble(todo)):
    ASM_CACHE[t] = a
  out: list[tuple[str, str, Asm] | DecodeError] = []
  for b, x in zip(instrs, dis):
    if isinstance(x, DecodeError):
      out.append(x)
      continue
    a = ASM_CACHE[x[1]]
    out.append(DecodeError(a.reason, f"{b.hex()}: {a.detail}") if isinstance(a, DecodeError)
               else (x[0], x[1], a))
  return out
