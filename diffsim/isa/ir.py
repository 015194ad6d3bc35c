"""The Block IR: immutable, decoder-independent facts about x86-64 basic blocks.

Everything the simulator needs to know about an instruction's *dataflow* lives here
(registers and flags read and written, memory operands, idioms); everything about its
*timing* (latency, micro-ops, ports) lives in the parameter table, keyed by
`Instr.key`. Register names are iced-x86's full architectural names (`RAX`, `XMM3`,
`ZMM3`, `K1`, ...): sub-registers are folded into the register that contains them,
`Write.merge` records whether the old value survives (8/16-bit GPR writes,
legacy-SSE xmm writes) or is cleared (32/64-bit GPR writes, VEX/EVEX writes), and
`width` keeps the bits the operand accesses (`%al` 8, `%xmm1` 128), which llvm-mca's
partial-write rule needs. Besides the architectural registers there are the
pseudo-registers `EFLAGS` (`FLAGS`), and `FPSW`/`FPCW`, the x87 status and control
words that LLVM's x87 instructions read and write.
"""

from __future__ import annotations

import dataclasses
from typing import Optional

# Pseudo-register that stands for all of RFLAGS: LLVM's x86 models treat EFLAGS as one
# register, so the simulator does too.
FLAGS = "EFLAGS"
# The x87 status word (written by almost every x87 instruction, read by `fnstsw`) and
# control word (written by `fldcw`, read by rounding operations), as LLVM names them.
FPSW = "FPSW"
FPCW = "FPCW"


@dataclasses.dataclass(frozen=True)
class Read:
  """One register source of an instruction.

  `role` names the operand stably across all instances of one opcode key, so that
  per-operand parameters (read-advance) can be keyed on it:
  `op0`, `op1`, ... explicit register operands in Intel operand order;
  `mask`           the EVEX opmask register (`{%k1}`);
  `base`, `index`  address registers of the memory operand;
  `implicit`       an implicit register use (then `reg` tells which);
  `flags`          the EFLAGS read.

  `width` is the number of bits read (8, 16, 32, 64, 80, 128, 256, 512; 8 for
  `%ah`), of the register as the instruction names it before folding (`%ecx` in
  `addl %ecx,%eax` is 32 although `reg` is RCX); 0 when unknown. A read wider than
  the last (merging) partial write of its register also waits for the writer before
  it, as in llvm-mca (a read of `%eax` after `movb $1,%al`, of `%ymm1` after the
  legacy-SSE `movsd (%rcx),%xmm1`); a read at most as wide waits for that write only.
  """

  reg: str
  role: str
  width: int = 0


@dataclasses.dataclass(frozen=True)
class Write:
  """One register destination.

  `merge`: the write keeps the rest of the old value (it writes `width` bits of the
  full register `reg`). `width`: bits written, as for `Read.width`.
  """

  reg: str
  role: str
  merge: bool = False
  width: int = 0


# Interned IR atoms: the same (reg, role, width) recurs hundreds of thousands of times
# in a corpus, so the decoder and the JSON reader share one instance of each.
_read_pool: dict[tuple[str, str, int], Read] = {}
_write_pool: dict[tuple[str, str, bool, int], Write] = {}


def shared_read(reg: str, role: str, width: int = 0) -> Read:
  """`Read(reg, role, width)`, the one instance of it."""
  r = _read_pool.get((reg, role, width))
  if r is None:
    r = _read_pool[(reg, role, width)] = Read(reg, role, width)
  return r


def shared_write(reg: str, role: str, merge: bool, width: int = 0) -> Write:
  """`Write(reg, role, merge, width)`, the one instance of it."""
  w = _write_pool.get((reg, role, merge, width))
  if w is None:
    w = _write_pool[(reg, role, merge, width)] = Write(reg, role, merge, width)
  return w


@dataclasses.dataclass(frozen=True)
class Mem:
  """One memory operand (not `lea`'s, which accesses no memory)."""

  base: Optional[str]
  index: Optional[str]
  scale: int
  disp: int
  size: int  # bytes accessed, 0 when unknown
  load: bool
  store: bool
  segment: Optional[str] = None


@dataclasses.dataclass(frozen=True)
class Instr:
  """One decoded instruction.

  Attributes:
    key: the opcode key that parameter tables key on: the opcode of the MCInst that
      llvm-mc's assembler (hence llvm-mca) builds from `text` (`ADD64rm`,
      `VPXORYrr`), which distinguishes register, memory and immediate forms and
      operand widths; `@same` is appended when the instruction's register sources are
      one register (`xor %eax,%eax`), the form in which CPU models resolve zero
      idioms and dependency-breaking instructions. The assembler picks canonical
      encodings, so the key of `68 51 00 00 00` is PUSH64i8 (its text `pushq $81`),
      and of `33 c0` XOR32rr@same.
    text: AT&T assembly text, from llvm-mc's disassembly, that llvm-mca accepts.
    hex: the instruction's bytes, lower-case hex.
    mnemonic: iced-x86's mnemonic, lower-case (`add`).
    reads, writes: register dataflow, explicit then address then implicit then flags.
    flags_read, flags_written: the individual RFLAGS bits (iced names, `cf`, `zf`...).
    mem: memory operands that access memory.
    loads, stores: the instruction reads / writes memory (explicitly or implicitly,
      as `push`, `pop`, `call`, `ret`, string instructions do).
    stack: the instruction accesses the stack implicitly (push, pop, call, ret...).
    zero_idiom: the result does not depend on the sources (`xor %eax,%eax`), as iced
      knows; `reads` still lists them, since whether a CPU ignores them is its
      parameter table's business (XOR8rr@same is no idiom on Haswell).
    dep_breaking: the sources are ignored though the result is not zero
      (`pcmpeqd %xmm1,%xmm1`, `sbb %eax,%eax` on some CPUs); `reads` keeps them, the
      parameter table decides whether a CPU honours it.
    lock, rep: prefixes.
    encoding_opcode: the opcode llvm-mc disassembles the bytes to (`PUSH64i32`,
      `XOR32rr_REV`); differs from `opcode` for non-canonical encodings only.
  """

  key: str
  text: str
  hex: str
  mnemonic: str
  reads: tuple[Read, ...]
  writes: tuple[Write, ...]
  flags_read: tuple[str, ...] = ()
  flags_written: tuple[str, ...] = ()
  mem: tuple[Mem, ...] = ()
  loads: bool = False
  stores: bool = False
  stack: bool = False
  zero_idiom: bool = False
  dep_breaking: bool = False
  lock: bool = False
  rep: bool = False
  encoding_opcode: str = ""

  @property
  def opcode(self) -> str:
    """LLVM's opcode name without the variant suffix."""
    return self.key.split("@", 1)[0]


@dataclasses.dataclass(frozen=True)
class Block:
  """A basic block: its bytes and its instructions in program order."""

  hex: str
  instrs: tuple[Instr, ...]

  def __len__(self) -> int:
    return len(self.instrs)

  @property
  def text(self) -> str:
    """Assembly for llvm-mca, one instruction per line."""
    return "\n".join(i.text for i in self.instrs)


class DecodeError(ValueError):
  """A block that cannot be decoded; `reason` is a short, stable category."""

  def __init__(self, reason: str, detail: str = ""):
    super().__init__(f"{reason}: {detail}" if detail else reason)
    self.reason = reason
    self.detail = detail

  def __reduce__(self):
    # Pickle by (reason, detail), not by the formatted message (multiprocessing).
    return (type(self), (self.reason, self.detail))
