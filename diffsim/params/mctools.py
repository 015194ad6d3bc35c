"""Thin wrappers around the LLVM 14 command-line tools that the extractor reads.

The parameter extractor never parses LLVM's TableGen sources: every number comes
from running `llvm-mc`, `llvm-mca` or `llvm-exegesis` and reading their output.
This module holds the parts shared by all readers:

* running a tool and checking its stderr (llvm-mca reports invalid input on stderr
  with exit status 0);
* parsing `llvm-mc -show-inst` output into (text, opcode, operands) records;
* the map from LLVM's register numbers (as `-show-inst` prints them) to register
  names (as llvm-exegesis accepts them). LLVM numbers registers by an internal enum
  that is not printed anywhere, so the map is learned by assembling a small file in
  which every line names one new register (`register_names`).
"""

from __future__ import annotations

import dataclasses
import functools
import re
import subprocess
from collections.abc import Iterable

from diffsim.isa.roles import GPR_NAMES, HIGH_BYTES
from diffsim.llvmtools import LlvmError, find_llvm_tool, run_tool

TRIPLE = "x86_64-unknown-linux-gnu"


class ToolError(LlvmError):
  """An LLVM tool failed or reported an error on stderr."""


def run(args: list[str], stdin: str | None = None, *, check_stderr: bool = False,
        check_status: bool = True, timeout: float = 600) -> subprocess.CompletedProcess:
  """Runs a tool and returns the completed process.

  Args:
    args: command line.
    stdin: text fed to the tool's standard input.
    check_stderr: raise when stderr mentions an error (llvm-mca exits 0 on some bad input).
    check_status: raise on a non-zero exit status (False: the caller reads stderr).
    timeout: seconds.

  Raises:
    ToolError: non-zero exit status, or an error on stderr when `check_stderr`.
  """
  p = run_tool(args[0], args[1:], stdin or "", timeout=timeout)
  if (check_status and p.returncode != 0) or (check_stderr and "error:" in p.stderr):
    raise ToolError(f"{args[0]} failed ({p.returncode}): {p.stderr[:2000]}")
  return p


# ----------------------------------------------------------------------------------------
# llvm-mc -show-inst


@dataclasses.dataclass(frozen=True)
class McInst:
  """One instruction as `llvm-mc -show-inst` prints it.

  Attributes:
    text: the AT&T text llvm-mc printed (tabs kept, as llvm-mc prints them).
    opcode: LLVM's opcode name (`ADD64rm`).
    operands: the MCInst operands: ("reg", number) or ("imm", value) or
      ("other", raw text) for expressions and FP immediates.
  """

  text: str
  opcode: str
  operands: tuple[tuple[str, object], ...]

  def reg_numbers(self) -> list[int]:
    """The register operands' numbers, 0 (no register) included, in operand order."""
    return [v for k, v in self.operands if k == "reg"]


_INST_HEAD = re.compile(r"^\t(?P<text>.*?)\s*# <MCInst #\d+ (?P<op>\w+)(?P<close>>?)\s*$")
_OPERAND = re.compile(r"^\s*#\s+<MCOperand (?P<kind>\w+):(?P<val>[^>]*)>(?P<close>>?)\s*$")


def parse_show_inst(out: str) -> list[McInst]:
  """Parses `llvm-mc -show-inst` output (assembler or disassembler mode).

  Args:
    out: llvm-mc's stdout.

  Returns:
    The instructions in output order.
  """
  insts: list[McInst] = []
  cur = None
  for line in out.splitlines():
    m = _INST_HEAD.match(line)
    if m:
      cur = (m.group("text").strip(), m.group("op"), [])
      if m.group("close"):
        insts.append(McInst(cur[0], cur[1], ()))
        cur = None
      continue
    if cur is None:
      continue
    m = _OPERAND.match(line)
    if not m:
      continue
    kind, val = m.group("kind"), m.group("val")
    if kind == "Reg":
      cur[2].append(("reg", int(val)))
    elif kind == "Imm":
      cur[2].append(("imm", int(val)))
    else:
      cur[2].append(("other", val))
    if m.group("close"):
      insts.append(McInst(cur[0], cur[1], tuple(cur[2])))
      cur = None
  return insts


def disassemble(hex_blocks: Iterable[str]) -> list[list[McInst]]:
  """Disassembles blocks of machine code in one llvm-mc run.

  Blocks are joined with `ud2` (0f 0b) between them, and the output is split at the
  TRAP instructions again: one process for many blocks keeps this fast.

  Args:
    hex_blocks: lower-case hex strings, one per block; none may contain ud2.

  Returns:
    One list of instructions per block.
  """
  toks: list[str] = []
  for h in hex_blocks:
    toks.extend("0x" + h[i:i + 2] for i in range(0, len(h), 2))
    toks.extend(("0x0f", "0x0b"))
  p = run([find_llvm_tool("llvm-mc"), "--disassemble", f"-triple={TRIPLE}", "-show-inst"],
          " ".join(toks))
  blocks: list[list[McInst]] = [[]]
  for inst in parse_show_inst(p.stdout):
    if inst.opcode == "TRAP":
      blocks.append([])
    else:
      blocks[-1].append(inst)
  return [merge_prefixes(b) for b in blocks[:-1]]


def disassemble_checked(hex_blocks: list[str]) -> list[list[McInst]]:
  """`disassemble`, robust against blocks that swallow the separator.

  A block whose last instruction is truncated takes the following `ud2` bytes as its
  own, merging two blocks. When the count of blocks that come back is off, the list
  is split in halves until the culprit stands alone, and a lone block is taken as
  llvm-mc decodes it.
  """
  blocks = disassemble(hex_blocks)
  if len(blocks) == len(hex_blocks):
    return blocks
  if len(hex_blocks) == 1:
    return [[i for b in blocks for i in b]]
  mid = len(hex_blocks) // 2
  return disassemble_checked(hex_blocks[:mid]) + disassemble_checked(hex_blocks[mid:])


def merge_prefixes(insts: list[McInst]) -> list[McInst]:
  """Folds llvm-mc's stand-alone prefix pseudo-instructions into the next instruction.

  The disassembler prints `lock`, `rep`, `repne` on a line of their own
  (LOCK_PREFIX...). Given to llvm-mca that way, the prefix becomes a separate
  instruction with latency 100; written on one line with its instruction, it is a
  flag of that MCInst. So the text is joined, and the opcode is the instruction's.
  """
  out: list[McInst] = []
  pending: list[str] = []
  for inst in insts:
    if inst.opcode.endswith("_PREFIX"):
      pending.append(inst.text)
      continue
    if pending:
      inst = McInst("\t\t".join(pending + [inst.text]), inst.opcode, inst.operands)
      pending = []
    out.append(inst)
  out.extend(McInst(t, "PREFIX", ()) for t in pending)  # a prefix that ends the block
  return out


def assemble(asm: str) -> list[McInst]:
  """Assembles AT&T text with `llvm-mc -show-inst` and returns its MCInsts."""
  p = run([find_llvm_tool("llvm-mc"), f"-triple={TRIPLE}", "-show-inst"], asm, check_stderr=True)
  return parse_show_inst(p.stdout)


# ----------------------------------------------------------------------------------------
# Register numbers -> names


def _register_probe_lines() -> list[str]:
  """Assembly lines that each introduce registers of one kind, in an order such
  that every line names at most one register not named by an earlier line."""
  gpr8 = GPR_NAMES[8][:8] + HIGH_BYTES + GPR_NAMES[8][8:]
  lines = [f"pushq %{r}" for r in GPR_NAMES[64]]
  lines += [f"incl %{r}" for r in GPR_NAMES[32]]
  lines += [f"incw %{r}" for r in GPR_NAMES[16]]
  lines += [f"incb %{r}" for r in gpr8]
  for w in ("xmm", "ymm", "zmm"):
    lines += [f"vmovaps %{w}{i}, %{w}{i}" for i in range(32)]
  lines += [f"kmovw %k{i}, %k{i}" for i in range(8)]
  lines += [f"movq %mm{i}, %mm{i}" for i in range(8)]
  lines += [f"fld %st({i})" for i in range(8)]
  lines += [f"movw %{s}, %ax" for s in ("cs", "ds", "es", "fs", "gs", "ss")]
  lines += ["leaq (%rip), %rax", "leal (%eip), %eax"]
  lines += [f"movq %cr{i}, %rax" for i in (0, 2, 3, 4, 8)]
  lines += [f"movq %dr{i}, %rax" for i in range(8)]
  return lines


_REG_IN_TEXT = re.compile(r"%([a-z][a-z0-9]*(?:\(\d\))?)")


def text_register_names(text: str) -> set[str]:
  """The registers an AT&T line names, spelled as LLVM's register definitions
  (`%st(1)` -> `ST1`, `%st` -> `ST0`, `%xmm3` -> `XMM3`)."""
  names = set()
  for r in _REG_IN_TEXT.findall(text):
    if r.startswith("st"):
      r = "st" + (r[3] if "(" in r else "0")
    names.add(r.upper())
  return names


def learn_register_names(insts: Iterable[McInst], known: dict[int, str] | None = None
                         ) -> dict[int, str]:
  """Pairs register numbers with names by elimination over instruction lines.

  A line whose text names exactly one register not yet mapped, and whose operands hold
  exactly one number not yet mapped, fixes that pair. Lines are revisited until nothing
  changes.

  Args:
    insts: instructions with their text.
    known: a map to extend.

  Returns:
    number -> name (upper case, LLVM's spelling).
  """
  mapping = dict(known or {})
  todo = [(text_register_names(i.text), {n for n in i.reg_numbers() if n}) for i in insts]
  changed = True
  while changed and todo:
    changed = False
    rest = []
    for names, nums in todo:
      names = names - set(mapping.values())
      nums = nums - set(mapping)
      if len(names) == 1 and len(nums) == 1:
        mapping[nums.pop()] = names.pop()
        changed = True
      elif nums:
        rest.append((names, nums))
    todo = rest
  return mapping


@functools.lru_cache(maxsize=1)
def register_names() -> dict[int, str]:
  """LLVM 14's register number -> name map for x86, learned with llvm-mc."""
  return learn_register_names(assemble("\n".join(_register_probe_lines()) + "\n"))


def exegesis_operand(kind: str, value, names: dict[int, str]) -> str:
  """One MCInst operand as llvm-exegesis 14 spells it in a benchmark file.

  Registers are named (`ECX`); immediates are `i_0x<hex>` (`i_0x-8` for -8). The
  "no register" operand 0 has no spelling that llvm-exegesis 14 reads back, so it is
  written as the immediate 0: a release build reads a register operand's number from
  the same storage, so scheduling predicates see register 0 as intended.
  """
  if kind == "reg":
    return names[value] if value else "i_0x0"
  if kind == "imm":
    # llvm-exegesis 14 reads `i_0x` + a signed hex number into an int64_t, so a
    # negative value needs its sign; two's complement would overflow.
    return f"i_0x{value:x}" if value >= 0 else f"i_0x-{-value:x}"
  return "i_0x0"  # expressions (branch targets) do not influence scheduling classes


def encode(lines: list[str]) -> list[str | None]:
  """Each AT&T line's machine code as hex (llvm-mc -show-encoding), None on failure."""
  p = run([find_llvm_tool("llvm-mc"), f"-triple={TRIPLE}", "-show-encoding"],
          "\n".join(lines) + "\n")
  out = [m.group(1) for m in re.finditer(r"# encoding: \[([^\]]*)\]", p.stdout)]
  if len(out) != len(lines):
    return [None] * len(lines)
  return ["".join(b[2:] for b in e.split(",")) for e in out]
