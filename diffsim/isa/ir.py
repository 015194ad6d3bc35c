"""The Block IR: immutable, decoder-independent facts about x86-64 basic blocks.

Everything the simulator needs to know about an instruction's *dataflow* lives here
(registers and flags read and written, memory operands, idioms); everything about its
*timing* (latency, micro-ops, ports) lives in the parameter table, keyed by
`Instr.key`. Register names are iced-x86's full architectural names (`RAX`, `XMM3`,
`ZMM3`, `K1`, ...): sub-registers are folded into the register that contains them,
and `Write.merge` records whether the old value survives (8/16-bit GPR writes,
legacy-SSE xmm writes) or is cleared (32/64-bit GPR writes, VEX/EVEX writes).
"""

from __future__ import annotations

import dataclasses
from typing import Optional

# Pseudo-register that stands for all of RFLAGS: LLVM's x86 models treat EFLAGS as one
# register, so the simulator does too.
FLAGS = "EFLAGS"


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
  """

  reg: str
  role: str


@dataclasses.dataclass(frozen=True)
class Write:
  """One register destination. `merge`: the write keeps the rest of the old value."""

  reg: str
  role: str
  merge: bool = False


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
    key: the opcode key that parameter tables key on: LLVM's opcode name as llvm-mc
      prints it (`ADD64rm`, `VPXORYrr`), which distinguishes register, memory and
      immediate forms and operand widths; `@same` is appended when the instruction's
      register sources are one register (`xor %eax,%eax`), the form in which CPU
      models resolve zero idioms and dependency-breaking instructions.
    text: AT&T assembly text, from llvm-mc's disassembly, that llvm-mca accepts.
    hex: the instruction's bytes, lower-case hex.
    mnemonic: iced-x86's mnemonic, lower-case (`add`).
    reads, writes: register dataflow, explicit then address then implicit then flags.
    flags_read, flags_written: the individual RFLAGS bits (iced names, `cf`, `zf`...).
    mem: memory operands that access memory.
    loads, stores: the instruction reads / writes memory (explicitly or implicitly,
      as `push`, `pop`, `call`, `ret`, string instructions do).
    stack: the instruction accesses the stack implicitly (push, pop, call, ret...).
    zero_idiom: the result does not depend on the sources (`xor %eax,%eax`); reads
      listed above already exclude the ignored sources.
    dep_breaking: the sources are ignored though the result is not zero
      (`pcmpeqd %xmm1,%xmm1`, `sbb %eax,%eax` on some CPUs); `reads` keeps them, the
      parameter table decides whether a CPU honours it.
    lock, rep: prefixes.
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
