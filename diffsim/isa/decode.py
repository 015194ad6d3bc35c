"""x86-64 machine code (hex) and assembly text to the Block IR.

What this models: for every instruction of a basic block, the facts the simulator
needs (see `ir.Instr`): the opcode key and AT&T text that llvm-mca sees, and the
register, flag and memory dataflow, explicit and implicit.

Two decoders are combined, each for what it does best:

* iced-x86 splits blocks into instructions and supplies the dataflow: registers read
  and written with their access kinds (explicit operands, address registers, implicit
  operands), RFLAGS bits, memory operands, prefixes, zero idioms.
* llvm-mc (LLVM 14, the same LLVM as the reference llvm-mca) supplies the text and the
  key. Each distinct instruction is disassembled on its own by `llvm-mc --disassemble
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

Simplifications, chosen on purpose:

* Registers are folded into their full architectural register (EAX, AX, AL, AH ->
  RAX; XMMn, YMMn -> ZMMn). `Write.merge` says whether the old value survives:
  8/16-bit GPR writes and legacy-SSE XMM writes merge, 32/64-bit GPR writes and
  VEX/EVEX writes do not (iced reports the written register at that width). `width`
  keeps the bits accessed, from iced's register as used (`%ah`: 8; an implicit
  32-bit GPR write, which iced reports as the 64-bit register it zero-extends: 64).
* A conditional write (COND_WRITE) also reads the register, since the old value may
  survive, as for `cmpxchg`'s RAX and `rep movs`'s RSI/RDI. An explicit operand is
  read only when LLVM ties it to a source, which shows as one more register operand
  in the MCInst than iced's operands account for: `cmovq` (CMOV64rr: dst, src1, src2)
  and merge-masked AVX-512 destinations read it, `bsf`/`bsr` (BSR32rr: dst, src) do
  not.
* Zero idioms (`xor %eax,%eax`, which iced recognises) keep their source reads in the
  IR: whether a CPU ignores them is its parameter table's business (XOR8rr@same is no
  idiom on Haswell).
* A `rep` prefix is no operand in LLVM: RCX is neither read nor written.
* x87: LLVM's x87 instructions define no ST register (the stack is implicit), so no
  x87 instruction waits on another through the stack and the IR lists no ST register.
  LLVM models the status word `ir.FPSW` (written by every x87 instruction and `wait`,
  read by `fnstsw`, `fnstenv`, `fnsave`, `fxsave`) and the control word `ir.FPCW`
  (written by `fldcw`, `fninit`, `fldenv`, `fnstenv`, `fxrstor`; read by whatever
  rounds or converts); `fcmov` does not read EFLAGS there. These facts were measured
  with llvm-mca timelines (`test_x87_state_matches_llvm_mca` checks them).
* RFLAGS is one pseudo-register (`ir.FLAGS`) built from the six status flags (OF SF
  ZF AF CF PF) only: LLVM models DF separately from EFLAGS, and the x87 condition
  codes live in the FPU status word, so `cld`, `movs` or `fadd` do not touch
  `ir.FLAGS` (their bits are still listed in `flags_read` / `flags_written`). Flag
  writes never merge, as in llvm-mca, although `inc` keeps CF.
* RIP and segment registers are not dataflow (an FS/GS override is kept in
  `Mem.segment`).
* Operand roles: explicit register operands `op0, op1, ...` by iced's (Intel) operand
  index, the EVEX opmask `mask`, address registers `base`/`index` (also of hint nops
  such as `nopl (%rax)`, which iced says access nothing), everything else
  `implicit` (sorted by register name), then `flags`. Implicit operands are found by
  subtracting the explicit ones from iced's register list, counting multiplicity,
  so `div %eax` still has its implicit RAX read and `push %rsp` its implicit RSP
  read and write. So every instance of a key lists the same roles, except that an
  absent base or index register has no read, and iced knows that a shift or rotate
  by an immediate 0 leaves the flags alone.
* `rep` is set only for string instructions (`rep ret`, `pause` are not repeats).
* Relative branch targets are printed by llvm-mc as offsets (`jne 5`); they carry no
  dataflow and llvm-mca ignores them.

Speed: instructions repeat a lot across a corpus (BHive: ~808k instructions, ~135k
distinct), so every distinct instruction is decoded once and cached by its bytes
(and its re-assembly by its text). llvm-mc runs in two concurrent chunks (one per
core) while the Python side computes iced facts.
"""

from __future__ import annotations

import collections
import concurrent.futures
import os
import re
import subprocess
import sys
import tempfile
from collections.abc import Sequence
from typing import NamedTuple

import iced_x86 as ix

from diffsim.isa import idioms
from diffsim.isa.heap import collector_paused
from diffsim.isa.ir import FLAGS, FPCW, FPSW, Block, DecodeError, Instr, Mem, Read, Write

__all__ = [
    "REASONS",
    "block_from_json",
    "block_to_json",
    "clear_cache",
    "decode_block",
    "decode_blocks",
    "parse_asm",
    "summarize",
]

def llvm_mc() -> str:
  """LLVM 14's llvm-mc: $DIFFSIM_LLVM_MC (for a non-Debian install), else wherever
  Debian's packages put it; looked up at each use, not at import."""
  if os.environ.get("DIFFSIM_LLVM_MC"):
    return os.environ["DIFFSIM_LLVM_MC"]
  from diffsim.mca.tools import find_llvm_tool

  try:
    return find_llvm_tool("llvm-mc")
  except FileNotFoundError:
    return "llvm-mc"  # the error below names it


# Failure categories (`DecodeError.reason`), stable across releases.
REASONS = {
    "empty": "no bytes (empty hex string or assembly without instructions)",
    "odd-length-hex": "the hex string has an odd number of digits",
    "bad-hex": "the hex string has a character that is not a hex digit",
    "invalid-instruction": "iced-x86 cannot decode the bytes at this offset",
    "truncated": "the block ends in the middle of an instruction",
    "llvm-mc-invalid": "llvm-mc cannot disassemble an instruction iced-x86 decodes",
    "llvm-mc-mismatch": "llvm-mc splits an instruction's bytes differently from iced-x86",
    "llvm-mc-asm": "llvm-mc cannot re-assemble its own disassembly (llvm-mca would reject it)",
    "llvm-mc-prefix": ("llvm-mc re-assembles the text as a prefix instruction plus the "
                       "instruction (xacquire, rex64): llvm-mca would simulate two"),
    "asm-error": "parse_asm: llvm-mc rejects a line of the assembly text",
}

Result = Block | DecodeError

# ---------------------------------------------------------------------------------
# iced-x86 tables, built once. Lookups are by iced's integer enums.

_R = ix.Register
_A = ix.OpAccess


def _enum_names(enum) -> dict[int, str]:
  return {v: k for k, v in vars(enum).items() if not k.startswith("_") and isinstance(v, int)}


_MNEMONIC = {v: k.lower() for v, k in _enum_names(ix.Mnemonic).items()}
# Full architectural register name per iced register; None for what is not dataflow
# (no register, RIP/EIP, segment registers).
_FULL: dict[int, str | None] = {}
# True when the register is a strict part of its full register (AL, AX, XMM0 of ZMM0):
# a write at that width keeps the rest.
_IS_SUB: dict[int, bool] = {}
_REG_NAME = _enum_names(_R)
for _reg in _REG_NAME:
  _FULL[_reg] = None
  if not (_reg == _R.NONE or ix.RegisterExt.is_segment_register(_reg)
          or ix.RegisterExt.is_ip(_reg)):
    _FULL[_reg] = _REG_NAME[ix.RegisterExt.full_register(_reg)]
  _IS_SUB[_reg] = ix.RegisterExt.full_register(_reg) != _reg

# (bit, name) of every single RFLAGS bit iced knows (`cf`, `df`, `c0`...), by bit.
_FLAG_BITS = tuple(sorted(
    (v, k.lower()) for v, k in _enum_names(ix.RflagsBits).items() if v and (v & (v - 1)) == 0))
# The flags LLVM's EFLAGS register stands for (DF is a separate LLVM register).
_STATUS_FLAGS = (
    ix.RflagsBits.OF | ix.RflagsBits.SF | ix.RflagsBits.ZF | ix.RflagsBits.AF | ix.RflagsBits.CF
    | ix.RflagsBits.PF
)

# Access kind -> (reads, writes). A conditional write also reads (the old value may
# survive), except an explicit operand that LLVM does not tie to a source (see
# `_RegFacts.cond_roles`).
_RW = {
    _A.NONE: (False, False), _A.NO_MEM_ACCESS: (False, False),
    _A.READ: (True, False), _A.COND_READ: (True, False),
    _A.WRITE: (False, True), _A.COND_WRITE: (True, True),
    _A.READ_WRITE: (True, True), _A.READ_COND_WRITE: (True, True),
}
# Memory access kind -> (load, store); a conditional access still occupies the unit.
_MEM_LS = {
    _A.READ: (True, False), _A.COND_READ: (True, False),
    _A.WRITE: (False, True), _A.COND_WRITE: (False, True),
    _A.READ_WRITE: (True, True), _A.READ_COND_WRITE: (True, True),
}
_OPK_REGISTER = ix.OpKind.REGISTER
_OPK_MEMORY = ix.OpKind.MEMORY
_CODE_INVALID = ix.Code.INVALID
_NONE = _R.NONE
_FS_GS = {_R.FS: "FS", _R.GS: "GS"}
_OP_ROLES = tuple(f"op{i}" for i in range(8))
# Bits accessed per iced register (AH: 8, XMM0: 128, ST0: 80).
_WIDTH = {r: 8 * ix.RegisterExt.size(r) for r in _REG_NAME}
_FLAGS_WIDTH = 32  # EFLAGS
_X87_WORD_WIDTH = 16  # FPSW, FPCW

# x87 dataflow as LLVM 14 defines it (measured with llvm-mca timelines; the check
# is `tests/isa/test_decode.py::test_x87_state_matches_llvm_mca`). No x87 instruction
# defines an ST register in LLVM's MC layer (the stack is implicit), so nothing ever
# waits on one: the IR lists no ST reads or writes. What LLVM does model is the status
# word FPSW, written by every x87 instruction and read by the instructions that store
# it, and the control word FPCW, written by the instructions that load it and read by
# everything that rounds. `fcmov` does not read EFLAGS in LLVM 14.
_X87_FEATURES = {getattr(ix.CpuidFeature, n) for n in (
    "FPU", "FPU287", "FPU287XL_ONLY", "FPU387", "FPU387SL_ONLY", "CYRIX_FPU")}
_X87_BY_CODE: dict[int, bool] = {}  # iced Code -> x87 (memo of the test below)
# Instructions outside those CPUID features that touch the x87 state words.
_X87_OTHER = {"wait", "fxsave", "fxsave64", "fxrstor", "fxrstor64"}
_X87_READS_FPSW = {"fnstsw", "fstsw", "fnstenv", "fstenv", "fnsave", "fsave", "fxsave",
                   "fxsave64"}
_X87_KEEPS_FPSW = {"fxsave", "fxsave64"}
_X87_WRITES_FPCW = {"fldcw", "fninit", "finit", "fldenv", "fnstenv", "fstenv", "fxrstor",
                    "fxrstor64"}
_X87_IGNORES_FPCW = {"fabs", "fchs", "fxam", "ffree", "ffreep", "fincstp", "fdecstp",
                     "fnop", "fninit", "finit", "fnclex", "fclex", "fldcw", "fldenv",
                     "fnstsw", "fstsw",
                     "frstor", "wait", "fxrstor", "fxrstor64", "fcmovb", "fcmove",
                     "fcmovbe", "fcmovu", "fcmovnb", "fcmovne", "fcmovnbe", "fcmovnu"}
_X87_NO_EFLAGS_READ = {"fcmovb", "fcmove", "fcmovbe", "fcmovu", "fcmovnb", "fcmovne",
                       "fcmovnbe", "fcmovnu"}

# Sign-splitting instructions (`cltd`: EDX:EAX = sext(EAX)) and the width of the
# accumulator LLVM says they define.
_SIGN_SPLIT = {"cwd": 16, "cdq": 32, "cqo": 64}

# Interned IR atoms: the same (reg, role, width) recurs hundreds of thousands of times.
_read_pool: dict[tuple[str, str, int], Read] = {}
_write_pool: dict[tuple[str, str, bool, int], Write] = {}
_flag_pool: dict[int, tuple[str, ...]] = {}


def _read(reg: str, role: str, width: int = 0) -> Read:
  r = _read_pool.get((reg, role, width))
  if r is None:
    r = _read_pool[(reg, role, width)] = Read(reg, role, width)
  return r


def _write(reg: str, role: str, merge: bool, width: int = 0) -> Write:
  w = _write_pool.get((reg, role, merge, width))
  if w is None:
    w = _write_pool[(reg, role, merge, width)] = Write(reg, role, merge, width)
  return w


def _flag_names(bits: int) -> tuple[str, ...]:
  names = _flag_pool.get(bits)
  if names is None:
    names = _flag_pool[bits] = tuple(name for bit, name in _FLAG_BITS if bits & bit)
  return names


_FACTORY = ix.InstructionInfoFactory()
class _RegFacts(NamedTuple):
  """iced's register-level facts about one instruction (see `_register_facts`).

  Attributes:
    mnemonic, reads, writes, flags_read, flags_written, stack, lock, rep: as in Instr.
    cond_roles: roles of explicit conditionally written operands that `reads` lists
      as read (`cmovne %rcx,%rax`, `bsr %ecx,%eax`): the read stays only if LLVM ties
      the destination to a source, which shows as an extra register operand of the
      MCInst (more than `operand_regs`).
    operand_regs: the register operands an MCInst of this instruction has when nothing
      is tied: explicit registers, the opmask, and three per memory operand (base,
      index, segment).
    idiom_reads: when iced ignores explicit sources (it knows `xor %eax,%eax` is a
      zero idiom), the reads the instruction has with distinct sources; else None.
  """

  mnemonic: str
  reads: tuple[Read, ...]
  writes: tuple[Write, ...]
  flags_read: tuple[str, ...]
  flags_written: tuple[str, ...]
  stack: bool
  lock: bool
  rep: bool
  cond_roles: tuple[str, ...]
  operand_regs: int
  idiom_reads: tuple[Read, ...] | None = None


# Register-level facts by instruction bytes with the displacement zeroed: they do not
# depend on it (it only moves the memory operand), and it halves the distinct
# instructions of a corpus.
_SHAPES: dict[bytes, _RegFacts] = {}


def _register_facts(ins, info, idioms_too: bool = True) -> _RegFacts:
  """iced's register facts of one instruction; see the module docstring for the rules.

  `idioms_too`: also work out `idiom_reads` (off for the copy that does so).
  """
  mnemonic = _MNEMONIC[ins.mnemonic]
  rep = ins.is_string_instruction and (ins.has_rep_prefix or ins.has_repne_prefix)
  x87 = _X87_BY_CODE.get(ins.code)
  if x87 is None:
    x87 = _X87_BY_CODE[ins.code] = (
        mnemonic in _X87_OTHER or not _X87_FEATURES.isdisjoint(ins.cpuid_features()))
  # What iced says is read and written, per full register, with multiplicity and
  # the widest access; the explicit and address operands are subtracted below, and
  # the rest is implicit.
  r_left: dict[str, int] = {}
  w_left: dict[str, int] = {}
  r_width: dict[str, int] = {}
  w_width: dict[str, int] = {}
  full_width: dict[str, bool] = {}  # full reg -> some write replaces all of it
  for u in info.used_registers():
    reg = u.register
    full = _FULL[reg]
    if full is None:
      continue
    if rep and full == "RCX":
      # A rep prefix is no operand in LLVM: llvm-mca neither reads nor writes RCX.
      continue
    r, w = _RW[u.access]
    if r:
      r_left[full] = r_left.get(full, 0) + 1
      r_width[full] = max(r_width.get(full, 0), _WIDTH[reg])
    if w:
      w_left[full] = w_left.get(full, 0) + 1
      w_width[full] = max(w_width.get(full, 0), _WIDTH[reg])
      full_width[full] = full_width.get(full, False) or not _IS_SUB[reg]

  reads: list[Read] = []
  writes: list[Write] = []
  cond_roles: list[str] = []
  n_mem = n_regs = 0
  has_mem = False
  ignored: list[int] = []  # explicit register operands iced says are not accessed
  n = ins.op_count
  for i in range(n):
    kind = ins.op_kind(i)
    if kind == _OPK_REGISTER:
      n_regs += 1
      reg = ins.op_register(i)
      full = _FULL[reg]
      if full is None:
        continue
      access = info.op_access(i)
      if access == _A.NONE:
        ignored.append(i)
      r, w = _RW[access]
      if r:
        reads.append(_read(full, _OP_ROLES[i], _WIDTH[reg]))
        r_left[full] = r_left.get(full, 0) - 1
        if access == _A.COND_WRITE:
          cond_roles.append(_OP_ROLES[i])
      if w:
        # Merge unless iced reports some write at the full register's width.
        writes.append(_write(full, _OP_ROLES[i], not full_width.get(full, True), _WIDTH[reg]))
        w_left[full] = w_left.get(full, 0) - 1
    elif kind == _OPK_MEMORY:
      n_mem += 1
      has_mem = has_mem or info.op_access(i) != _A.NONE
  if ins.op_mask != _NONE:
    n_regs += 1
    full = _FULL[ins.op_mask]
    reads.append(_read(full, "mask", _WIDTH[ins.op_mask]))
    r_left[full] = r_left.get(full, 0) - 1
  # Address registers: also for `lea` (its access is NO_MEM_ACCESS) and for `nopl
  # (%rax)`: iced marks that operand unused and lists no register for it, but LLVM's
  # memory operands are register uses, so llvm-mca makes the nop wait for them.
  if has_mem:
    for reg, role in ((ins.memory_base, "base"), (ins.memory_index, "index")):
      full = _FULL[reg]
      if full is not None and r_left.get(full, 0) > 0:
        reads.append(_read(full, role, _WIDTH[reg]))
        r_left[full] -= 1
  elif n_mem:
    for reg, role in ((ins.memory_base, "base"), (ins.memory_index, "index")):
      full = _FULL[reg]
      if full is not None:
        reads.append(_read(full, role, _WIDTH[reg]))
  implicit_r = {r: r_width[r] for r, c in r_left.items() if c > 0}
  implicit_w = {r: w_width[r] for r, c in w_left.items() if c > 0}
  if mnemonic == "leave":
    # LLVM's LEAVE64 uses RSP as well as RBP (iced lists only RBP, since the old
    # RSP is overwritten); llvm-mca makes `leave` wait for the last RSP writer.
    implicit_r.setdefault("RSP", 64)
  elif mnemonic in ("vzeroupper", "vzeroall"):
    if mnemonic == "vzeroupper":
      # LLVM's VZEROUPPER only defines YMM0-15 (iced: reads and writes them, as the
      # lower halves survive), so llvm-mca never makes it wait.
      implicit_r = {r: w for r, w in implicit_r.items() if not r.startswith(("ZMM", "YMM"))}
    # LLVM defines YMM0-15 (iced: ZMM0-15): a register file that renames a YMM as two
    # halves takes two registers for each (Zen 1/2).
    implicit_w = {r: 256 if r.startswith("ZMM") else w for r, w in implicit_w.items()}
  elif mnemonic in _SIGN_SPLIT and "RAX" not in implicit_w:
    # LLVM's CWD/CDQ/CQO define the accumulator as well as RDX (iced: RDX only), so
    # its readers wait for them.
    implicit_w["RAX"] = _SIGN_SPLIT[mnemonic]
    full_width["RAX"] = _SIGN_SPLIT[mnemonic] >= 32

  fr, fw = ins.rflags_read, ins.rflags_modified
  flags_read = bool(fr & _STATUS_FLAGS)
  if x87:
    reads = [r for r in reads if not r.reg.startswith("ST")]
    writes = [w for w in writes if not w.reg.startswith("ST")]
    for d in (implicit_r, implicit_w):
      for reg in [r for r in d if r.startswith("ST")]:
        del d[reg]
    if mnemonic in _X87_READS_FPSW:
      implicit_r[FPSW] = _X87_WORD_WIDTH
    if mnemonic not in _X87_IGNORES_FPCW:
      implicit_r[FPCW] = _X87_WORD_WIDTH
    if mnemonic not in _X87_KEEPS_FPSW:
      implicit_w[FPSW] = _X87_WORD_WIDTH
    if mnemonic in _X87_WRITES_FPCW:
      implicit_w[FPCW] = _X87_WORD_WIDTH
    flags_read = flags_read and mnemonic not in _X87_NO_EFLAGS_READ
  for full in sorted(implicit_r):
    reads.append(_read(full, "implicit", implicit_r[full]))
  for full in sorted(implicit_w):
    writes.append(_write(full, "implicit", not full_width.get(full, True), implicit_w[full]))
  if flags_read:
    reads.append(_read(FLAGS, "flags", _FLAGS_WIDTH))
  if fw & _STATUS_FLAGS:
    writes.append(_write(FLAGS, "flags", False, _FLAGS_WIDTH))

  return _RegFacts(mnemonic, tuple(reads), tuple(writes), _flag_names(fr),
                   _flag_names(fw), ins.is_stack_instruction, ins.has_lock_prefix, rep,
                   tuple(cond_roles), n_regs + 3 * n_mem,
                   _idiom_reads(ins, ignored) if idioms_too else None)


def _idiom_reads(ins, ignored: list[int]) -> tuple[Read, ...] | None:
  """The reads of a zero idiom as if its sources differed, or None (see `_RegFacts`).

  Whether a CPU treats `OPCODE@same` as an idiom is the parameter table's business
  (XOR8rr@same is none on Haswell), so the IR keeps its sources. iced gives no
  accesses for sources it knows to be ignored, so they are read off a copy of the
  instruction whose last operand names another register of the same class.
  """
  last = ins.op_count - 1
  if not ignored or ins.op_kind(last) != _OPK_REGISTER:
    return None
  reg = ins.op_register(last)
  other = ix.RegisterExt.base(reg) + (ix.RegisterExt.number(reg) + 1) % 8
  alt = ins.copy()
  alt.set_op_register(last, other)
  alt_info = _FACTORY.info(alt)
  if any(alt_info.op_access(i) == _A.NONE for i in ignored):
    return None  # not an idiom: the operand is never accessed (`nopl %eax`)
  facts = _register_facts(alt, alt_info, idioms_too=False)
  names = {_OP_ROLES[i]: ins.op_register(i) for i in range(ins.op_count)
           if ins.op_kind(i) == _OPK_REGISTER}
  return tuple(_read(_FULL[names[r.role]], r.role, _WIDTH[names[r.role]])
               if r.role in names else r for r in facts.reads)


def _memory_facts(ins, info) -> tuple[Mem, ...]:
  """Memory operands that access memory, explicit and implicit (stack, strings)."""
  mems = []
  for m in info.used_memory():
    ls = _MEM_LS.get(m.access)
    if ls is None:  # `lea`, `nop`: no access
      continue
    base, disp = _FULL[m.base], m.displacement_i64
    if (m.base == _NONE and m.index == _NONE and ins.is_ip_rel_memory_operand
        and m.displacement == ins.memory_displacement):
      # iced resolves RIP-relative operands to an absolute address (here relative to
      # address 0); keep the encoded displacement instead, which is position-free.
      base = "RIP"
      disp = (ins.memory_displacement - ins.next_ip) & ((1 << 64) - 1)
      if disp >= 1 << 63:
        disp -= 1 << 64
    mems.append(Mem(base=base, index=_FULL[m.index], scale=m.scale, disp=disp,
                    size=ix.MemorySizeExt.size(m.memory_size), load=ls[0], store=ls[1],
                    segment=_FS_GS.get(m.segment)))
  return tuple(mems)


def _iced_facts(data: bytes) -> tuple | DecodeError:
  """iced's facts about the single instruction `data`, decoded alone at address 0.

  Args:
    data: the instruction's bytes (exactly one instruction, as iced split the block).

  Returns:
    (register facts as `_register_facts` returns them, memory operands), or a
    DecodeError when iced cannot decode the bytes alone.
  """
  dec = ix.Decoder(64, data)
  ins = dec.decode()
  if ins.code == _CODE_INVALID or ins.len != len(data):
    return DecodeError("invalid-instruction", f"iced-x86 cannot decode {data.hex()}")
  info = _FACTORY.info(ins)
  shape = data
  if ins.memory_displ_size:
    co = dec.get_constant_offsets(ins)
    if co.has_displacement:
      k, size = co.displacement_offset, co.displacement_size
      shape = data[:k] + bytes(size) + data[k + size:]
  regs = _SHAPES.get(shape)
  if regs is None:
    regs = _SHAPES[shape] = _register_facts(ins, info)
  return regs, (_memory_facts(ins, info) if info.used_memory() else ())


# ---------------------------------------------------------------------------------
# llvm-mc.

_DIAG = re.compile(r"^<stdin>:(\d+):(\d+): (warning|error): (.*)$", re.MULTILINE)
_DISASM = ["--disassemble", "-triple=x86_64", "-show-inst"]
# Separator between instructions in one llvm-mc disassembly run: each instruction is
# its own `[...]` atomic group (llvm-mc decodes it in isolation and never resyncs into
# the next one), followed by this `movabsq $MAGIC, %rax`, whose text marks the end of
# the group's output. Instructions that contain the magic immediate are disassembled
# alone, so a separator line is never ambiguous.
_SEP_IMM = bytes.fromhex("ed5eced10df0ad0b")
_SEP_GROUP = "[" + " ".join(f"0x{b:02x}" for b in b"\x48\xb8" + _SEP_IMM) + "]"
_sep_text: str | None = None


def _run_llvm_mc(args: list[str], stdin: str) -> subprocess.CompletedProcess:
  """llvm-mc on `stdin`, through temporary files rather than pipes.

  Pipes are pumped by a Python thread that needs the GIL for every 64 KiB, and while
  another thread computes (decoding runs llvm-mc beside the iced pass) each of those
  waits for a switch: llvm-mc then took 3 s instead of 0.7 s. With files, llvm-mc runs
  on its own and the thread only waits for it, without the GIL.
  """
  with tempfile.TemporaryFile() as fin, tempfile.TemporaryFile() as fout, \
      tempfile.TemporaryFile() as ferr:
    fin.write(stdin.encode())
    fin.seek(0)
    exe = llvm_mc()
    try:
      proc = subprocess.run([exe, *args], stdin=fin, stdout=fout, stderr=ferr, check=False)
    except FileNotFoundError as e:  # an environment problem, not a bad block
      raise RuntimeError(f"{exe} not found: diffsim.isa.decode needs LLVM 14's llvm-mc "
                         "on PATH (or DIFFSIM_LLVM_MC)") from e
    fout.seek(0)
    ferr.seek(0)
    return subprocess.CompletedProcess(proc.args, proc.returncode,
                                       fout.read().decode(errors="replace"),
                                       ferr.read().decode(errors="replace"))


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
    out = _run_llvm_mc(_DISASM, _SEP_GROUP + "\n")
    lines = list(_inst_lines(out.stdout))
    if len(lines) != 1:
      raise RuntimeError(f"unexpected llvm-mc output for the separator: {out.stdout!r}")
    _sep_text = lines[0][0]
  return _sep_text


def _fold_prefixes(lines: list[tuple[str, str]], what: str) -> tuple[str, str] | DecodeError:
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


def _llvm_disassemble(instrs: list[bytes]) -> list[tuple[str, str] | DecodeError]:
  """(MCInst opcode, AT&T text) of each instruction, decoded in isolation."""
  out: list[tuple[str, str] | DecodeError | None] = [None] * len(instrs)
  batch = []
  for k, b in enumerate(instrs):
    if _SEP_IMM in b:  # could print like the separator: disassemble it alone
      res = _run_llvm_mc(_DISASM, _group_bytes(b) + "\n")
      bad = [m.group(4) for m in _DIAG.finditer(res.stderr) if "invalid" in m.group(4)]
      out[k] = (DecodeError("llvm-mc-invalid", f"{b.hex()}: {bad[0]}") if bad else
                _fold_prefixes(list(_inst_lines(res.stdout)), b.hex()))
    else:
      batch.append(k)
  if not batch:
    return out
  sep = _separator_text()
  parts = []
  for k in batch:
    parts.append(_group_bytes(instrs[k]))
    parts.append(_SEP_GROUP)
  res = _run_llvm_mc(_DISASM, "\n".join(parts) + "\n")
  # Group j sits on input line 2j+1, its separator on 2j+2.
  failed: dict[int, str] = {}
  for m in _DIAG.finditer(res.stderr):
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
      out[k] = _fold_prefixes(groups[j], what)
  return out


class _Asm(NamedTuple):
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
_ASM_CACHE: dict[str, _Asm | DecodeError] = {}


def _llvm_assemble(texts: list[str]) -> list[_Asm | DecodeError]:
  """Assembles each text as llvm-mca will; one llvm-mc run for all of them.

  A text must become exactly one MCInst: an error is `llvm-mc-asm`, and a prefix that
  the assembler emits as an instruction of its own (`xacquire`, `rex64`), which
  llvm-mca would simulate as a second instruction, is `llvm-mc-prefix`. When the
  output cannot be matched to the input lines, the list is split in halves until it
  can.
  """
  if not texts:
    return []
  res = _run_llvm_mc(["-triple=x86_64", "-show-inst"], "\n".join(texts) + "\n")
  failed: dict[int, str] = {}
  for m in _DIAG.finditer(res.stderr):
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
    return _llvm_assemble(texts[:mid]) + _llvm_assemble(texts[mid:])
  out: list[_Asm | DecodeError] = [
      DecodeError("llvm-mc-asm", f"{texts[k]!r}: {failed[k]}") if k in failed else None
      for k in range(len(texts))]
  for k, (prefixes, opcode, n_regs, sources) in zip(ok, groups):
    if prefixes:
      out[k] = DecodeError("llvm-mc-prefix", f"{texts[k]!r}: llvm-mca reads it as "
                           f"{' + '.join(prefixes + [opcode])}")
    else:
      out[k] = _Asm(opcode, n_regs, sources)
  return out


def _llvm_opcodes(instrs: list[bytes]) -> list[tuple[str, str, _Asm] | DecodeError]:
  """(disassembled opcode, text, re-assembled MCInst) of each instruction.

  The text is re-assembled, as llvm-mca will: that catches text that llvm-mc prints
  but cannot read back (`63 c4` prints as `movslq %esp, %eax`), and gives the
  opcode llvm-mca simulates, which differs from the disassembled one for
  non-canonical encodings (`PUSH64i32` -> `PUSH64i8`, `XOR32rr_REV` -> `XOR32rr`).
  """
  dis = _llvm_disassemble(instrs)
  todo = list(dict.fromkeys(x[1] for x in dis
                            if not isinstance(x, DecodeError) and x[1] not in _ASM_CACHE))
  for t, a in zip(todo, _llvm_assemble(todo)):
    _ASM_CACHE[t] = a
  out: list[tuple[str, str, _Asm] | DecodeError] = []
  for b, x in zip(instrs, dis):
    if isinstance(x, DecodeError):
      out.append(x)
      continue
    a = _ASM_CACHE[x[1]]
    out.append(DecodeError(a.reason, f"{b.hex()}: {a.detail}") if isinstance(a, DecodeError)
               else (x[0], x[1], a))
  return out


# ---------------------------------------------------------------------------------
# Instructions and blocks.

# bytes of one instruction -> its Instr, or the DecodeError that it causes.
_CACHE: dict[bytes, Instr | DecodeError] = {}
# The keys of `_CACHE` whose value is a DecodeError.
_FAILED: set[bytes] = set()


def clear_cache() -> None:
  """Forgets every decoded instruction (the cache only grows otherwise)."""
  _CACHE.clear()
  _FAILED.clear()
  _SHAPES.clear()
  _ASM_CACHE.clear()


def _resolve(new: list[bytes], progress: bool = False) -> None:
  """Decodes the distinct, not yet cached instructions `new` into `_CACHE`."""
  if not new:
    return
  # Two llvm-mc chunks run concurrently (their subprocesses use the second core)
  # while this thread computes iced facts.
  n_chunks = 2 if len(new) >= 2000 else 1
  size = -(-len(new) // n_chunks)
  chunks = [new[i:i + size] for i in range(0, len(new), size)]
  with concurrent.futures.ThreadPoolExecutor(len(chunks)) as pool:
    futures = [pool.submit(_llvm_opcodes, c) for c in chunks]
    it = new
    if progress:
      it = _tqdm(new, "iced facts")
    facts = [_iced_facts(b) for b in it]
    llvm = [x for f in futures for x in f.result()]
  for b, f, lk in zip(new, facts, llvm):
    if isinstance(f, DecodeError) or isinstance(lk, DecodeError):
      _CACHE[b] = f if isinstance(f, DecodeError) else lk
      _FAILED.add(b)
      continue
    rf, mem = f
    encoding_opcode, text, asm = lk
    reads = rf.reads
    if rf.cond_roles and asm.n_regs <= rf.operand_regs:
      # No register operand of the MCInst is tied to the conditional destination
      # (`bsr`; `cmov` has one): LLVM does not read it, so neither does the IR.
      reads = tuple(r for r in reads if r.role not in rf.cond_roles)
    # The two sources an idiom compares are the MCInst's last two register operands
    # (`xor %ecx,%eax`: EAX, ECX; `vpxor`: the two after the destination); LLVM's
    # register numbers tell AH and AL apart.
    key = idioms.variant_key(asm.opcode, list(asm.sources))
    same = key.endswith(idioms.SAME)
    # iced knows the zero idioms (`xor %eax,%eax`) and drops their sources; the IR
    # keeps them, since each CPU's parameter table says whether it ignores them. An
    # `@same` form whose reads iced keeps (`pcmpeqd`, `sbb`) can at most break the
    # dependency, again if the CPU says so.
    zero = same and rf.idiom_reads is not None
    if rf.idiom_reads is not None:  # also where LLVM sees no idiom at all
      reads = rf.idiom_reads
    _CACHE[b] = Instr(
        key=key, text=text, hex=b.hex(), mnemonic=rf.mnemonic, reads=reads,
        writes=rf.writes, flags_read=rf.flags_read, flags_written=rf.flags_written, mem=mem,
        loads=any(m.load for m in mem), stores=any(m.store for m in mem), stack=rf.stack,
        zero_idiom=zero, dep_breaking=same and not zero, lock=rf.lock, rep=rf.rep,
        encoding_opcode=encoding_opcode)


def _tqdm(it, desc):
  try:
    from tqdm import tqdm
  except ImportError:  # progress is a nicety
    return it
  return tqdm(it, desc=desc, file=sys.stderr, mininterval=0.5)


def _split(h: str) -> tuple[str, list[bytes]] | DecodeError:
  """Hex string -> (normalised hex, instruction byte strings), as iced splits it."""
  if not isinstance(h, str):
    return DecodeError("bad-hex", f"not a string: {type(h).__name__}")
  s = "".join(h.split()).lower()
  if not s:
    return DecodeError("empty", "no bytes")
  if len(s) % 2:
    return DecodeError("odd-length-hex", f"{len(s)} hex digits")
  try:
    data = bytes.fromhex(s)
  except ValueError:
    bad = next((k for k, c in enumerate(s) if c not in "0123456789abcdef"), 0)
    return DecodeError("bad-hex", f"character {s[bad]!r} at position {bad}")
  parts = []
  pos = 0
  for k, ins in enumerate(ix.Decoder(64, data)):
    n = ins.len
    if ins.code == _CODE_INVALID:
      # Truncated when the bytes start a valid instruction that needs more bytes than
      # the block has (iced's NO_MORE_BYTES alone also fires for `06`, an opcode that
      # is invalid in 64-bit mode whatever follows).
      rest = data[pos:]
      padded = ix.Decoder(64, rest + bytes(15)).decode()
      reason = ("truncated" if padded.code != _CODE_INVALID and padded.len > len(rest)
                else "invalid-instruction")
      return DecodeError(reason, f"instruction {k} at byte {pos}: "
                         f"{data[pos:pos + 15].hex()}")
    parts.append(data[pos:pos + n])
    pos += n
  return s, parts


@collector_paused()
def decode_blocks(hexes: Sequence[str], *, progress: bool = False) -> list[Result]:
  """Decodes many blocks; never raises for a bad block.

  Args:
    hexes: [N] blocks as hex strings (case and whitespace are ignored).
    progress: show progress bars on stderr.

  Returns:
    [N] results in input order: a `Block`, or the block's `DecodeError` (reason one of
    `REASONS`; the detail names the instruction index, byte offset and bytes).

  Raises:
    RuntimeError: llvm-mc is missing or misbehaves (an environment problem).
  """
  split: list[tuple[str, list[bytes]] | DecodeError] = []
  new: dict[bytes, None] = {}
  it = _tqdm(hexes, "split") if progress else hexes
  cache = _CACHE
  for h in it:
    sp = _split(h)
    split.append(sp)
    if not isinstance(sp, DecodeError):
      for p in sp[1]:
        if p not in cache:
          new[p] = None
  _resolve(list(new), progress)
  bad = _FAILED
  out: list[Result] = []
  for sp in split:
    if isinstance(sp, DecodeError):
      out.append(sp)
      continue
    s, parts = sp
    if bad and not bad.isdisjoint(parts):
      pos = 0
      for k, p in enumerate(parts):
        x = cache[p]
        if isinstance(x, DecodeError):
          out.append(DecodeError(x.reason, f"instruction {k} at byte {pos}: {x.detail}"))
          break
        pos += len(p)
      continue
    out.append(Block(hex=s, instrs=tuple([cache[p] for p in parts])))
  return out


def decode_block(hex: str) -> Block:  # pylint: disable=redefined-builtin
  """Decodes one block.

  Args:
    hex: the block's machine code as a hex string.

  Returns:
    The Block.

  Raises:
    DecodeError: the block cannot be decoded (see `REASONS`).
  """
  res = decode_blocks([hex])[0]
  if isinstance(res, DecodeError):
    raise res
  return res


# ---------------------------------------------------------------------------------
# Assembly text.

_ENCODING = re.compile(r"encoding: \[([^\]]*)\]")


def _encoding_bytes(field: str) -> bytes:
  """`0x48,0x01,A` -> bytes; fixup placeholders (branch targets, labels) become 0."""
  out = bytearray()
  for tok in field.split(","):
    tok = tok.strip()
    if tok.startswith("0x"):
      out.append(int(tok, 16))
    elif tok.startswith("0b"):  # partly known byte, e.g. 0b0100A000
      out.append(int("".join(c if c in "01" else "0" for c in tok[2:]), 2))
    elif tok:
      out.append(0)
  return bytes(out)


def parse_asm(text: str, *, syntax: str = "att") -> Block:
  """Assembles `text` with llvm-mc and decodes the bytes, like the hex path.

  Args:
    text: x86-64 assembly, one instruction per line or `;`-separated; `#` starts a
      comment. Branches may name labels or absolute targets (their displacement is
      encoded as 0; dataflow does not depend on it).
    syntax: "att" (default) or "intel" (GNU `.intel_syntax noprefix`).

  Returns:
    The Block of the assembled bytes (same keys and dataflow as decoding them).

  Raises:
    DecodeError: `asm-error` naming the first rejected line, `empty` for text
      without instructions, or any reason of `decode_block`.
    ValueError: unknown `syntax`.
  """
  if syntax not in ("att", "intel"):
    raise ValueError(f"syntax must be 'att' or 'intel', not {syntax!r}")
  stmts: list[tuple[int, str]] = []
  for n, raw in enumerate(text.splitlines(), 1):
    for stmt in raw.split("#", 1)[0].split(";"):
      stmt = stmt.strip()
      if stmt:
        stmts.append((n, stmt))
  if not stmts:
    raise DecodeError("empty", "no instructions in the assembly text")
  head = [".intel_syntax noprefix"] if syntax == "intel" else []
  res = _run_llvm_mc(["-triple=x86_64", "-show-encoding"],
                     "\n".join(head + [s for _, s in stmts]) + "\n")
  for m in _DIAG.finditer(res.stderr):
    if m.group(3) == "error":
      k = int(m.group(1)) - 1 - len(head)
      n, stmt = stmts[k] if 0 <= k < len(stmts) else (0, "?")
      raise DecodeError("asm-error", f"line {n}: {stmt!r}: {m.group(4)}")
  data = b"".join(_encoding_bytes(m.group(1)) for m in _ENCODING.finditer(res.stdout))
  if not data:
    raise DecodeError("empty", "the assembly text encodes no bytes")
  return decode_block(data.hex())


# ---------------------------------------------------------------------------------
# JSON and summaries.


def _instr_to_json(i: Instr) -> dict:
  return {
      "key": i.key, "text": i.text, "hex": i.hex, "mnemonic": i.mnemonic,
      "reads": [[r.reg, r.role, r.width] for r in i.reads],
      "writes": [[w.reg, w.role, w.merge, w.width] for w in i.writes],
      "flags_read": list(i.flags_read), "flags_written": list(i.flags_written),
      "mem": [{"base": m.base, "index": m.index, "scale": m.scale, "disp": m.disp,
               "size": m.size, "load": m.load, "store": m.store, "segment": m.segment}
              for m in i.mem],
      "loads": i.loads, "stores": i.stores, "stack": i.stack,
      "zero_idiom": i.zero_idiom, "dep_breaking": i.dep_breaking,
      "lock": i.lock, "rep": i.rep, "encoding_opcode": i.encoding_opcode,
  }


def block_to_json(block: Block) -> dict:
  """A JSON-ready dict: `{"hex": ..., "instrs": [...]}` with every Instr field.

  Reads are `[reg, role, width]`, writes `[reg, role, merge, width]`, memory
  operands objects.
  """
  return {"hex": block.hex, "instrs": [_instr_to_json(i) for i in block.instrs]}


def block_from_json(d: dict) -> Block:
  """Inverse of `block_to_json` (also reads the older `[reg, role]` and
  `[reg, role, merge]` lists, as width 0)."""
  instrs = []
  for j in d["instrs"]:
    instrs.append(Instr(
        key=j["key"], text=j["text"], hex=j["hex"], mnemonic=j["mnemonic"],
        reads=tuple(_read(r[0], r[1], int(r[2]) if len(r) > 2 else 0) for r in j["reads"]),
        writes=tuple(_write(w[0], w[1], bool(w[2]), int(w[3]) if len(w) > 3 else 0)
                     for w in j["writes"]),
        flags_read=tuple(j.get("flags_read", ())),
        flags_written=tuple(j.get("flags_written", ())),
        mem=tuple(Mem(**m) for m in j.get("mem", ())),
        loads=j.get("loads", False), stores=j.get("stores", False),
        stack=j.get("stack", False), zero_idiom=j.get("zero_idiom", False),
        dep_breaking=j.get("dep_breaking", False), lock=j.get("lock", False),
        rep=j.get("rep", False), encoding_opcode=j.get("encoding_opcode", "")))
  return Block(hex=d["hex"], instrs=tuple(instrs))


def summarize(results: Sequence[Result]) -> dict:
  """Counts of a `decode_blocks` result.

  Returns:
    {"blocks": N, "decoded": n, "failed": N - n, "instructions": instructions in the
    decoded blocks, "keys": distinct opcode keys, "by_reason": {reason: count}
    (most frequent first), "examples": {reason: the first failure's detail}}.
  """
  by_reason: collections.Counter = collections.Counter()
  examples: dict[str, str] = {}
  keys: set[str] = set()
  n_instr = 0
  for r in results:
    if isinstance(r, DecodeError):
      by_reason[r.reason] += 1
      examples.setdefault(r.reason, r.detail)
    else:
      n_instr += len(r.instrs)
      keys.update(i.key for i in r.instrs)
  failed = sum(by_reason.values())
  return {
      "blocks": len(results), "decoded": len(results) - failed, "failed": failed,
      "instructions": n_instr, "keys": len(keys), "by_reason": dict(by_reason.most_common()),
      "examples": examples,
  }
