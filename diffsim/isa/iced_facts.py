"""What iced-x86 says about x86-64 machine code: where instructions end, and each
one's register, flag and memory dataflow, explicit and implicit.

iced supplies registers read and written with their access kinds (explicit operands,
address registers, implicit operands), RFLAGS bits, memory operands, prefixes and zero
idioms; this module turns them into the IR's `Read`/`Write`/`Mem` atoms the way LLVM 14
models them, since llvm-mca is the reference (`decode` pairs these facts with
llvm-mc's text and key).

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
"""

from __future__ import annotations

from typing import NamedTuple

import iced_x86 as ix

from diffsim.isa.ir import (FLAGS, FPCW, FPSW, DecodeError, Mem, Read, Write, shared_read,
                            shared_write)

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
# `RegFacts.cond_roles`).
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

# Flag-name tuples by RFLAGS bits, shared like the IR atoms (`ir.shared_read`).
_flag_pool: dict[int, tuple[str, ...]] = {}


def _flag_names(bits: int) -> tuple[str, ...]:
  names = _flag_pool.get(bits)
  if names is None:
    names = _flag_pool[bits] = tuple(name for bit, name in _FLAG_BITS if bits & bit)
  return names


_FACTORY = ix.InstructionInfoFactory()


class RegFacts(NamedTuple):
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
SHAPES: dict[bytes, RegFacts] = {}


def _register_facts(ins, info, idioms_too: bool = True) -> RegFacts:
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
        reads.append(shared_read(full, _OP_ROLES[i], _WIDTH[reg]))
        r_left[full] = r_left.get(full, 0) - 1
        if access == _A.COND_WRITE:
          cond_roles.append(_OP_ROLES[i])
      if w:
        # Merge unless iced reports some write at the full register's width.
        writes.append(shared_write(full, _OP_ROLES[i], not full_width.get(full, True), _WIDTH[reg]))
        w_left[full] = w_left.get(full, 0) - 1
    elif kind == _OPK_MEMORY:
      n_mem += 1
      has_mem = has_mem or info.op_access(i) != _A.NONE
  if ins.op_mask != _NONE:
    n_regs += 1
    full = _FULL[ins.op_mask]
    reads.append(shared_read(full, "mask", _WIDTH[ins.op_mask]))
    r_left[full] = r_left.get(full, 0) - 1
  # Address registers: also for `lea` (its access is NO_MEM_ACCESS) and for `nopl
  # (%rax)`: iced marks that operand unused and lists no register for it, but LLVM's
  # memory operands are register uses, so llvm-mca makes the nop wait for them.
  if has_mem:
    for reg, role in ((ins.memory_base, "base"), (ins.memory_index, "index")):
      full = _FULL[reg]
      if full is not None and r_left.get(full, 0) > 0:
        reads.append(shared_read(full, role, _WIDTH[reg]))
        r_left[full] -= 1
  elif n_mem:
    for reg, role in ((ins.memory_base, "base"), (ins.memory_index, "index")):
      full = _FULL[reg]
      if full is not None:
        reads.append(shared_read(full, role, _WIDTH[reg]))
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
    reads.append(shared_read(full, "implicit", implicit_r[full]))
  for full in sorted(implicit_w):
    writes.append(shared_write(full, "implicit", not full_width.get(full, True), implicit_w[full]))
  if flags_read:
    reads.append(shared_read(FLAGS, "flags", _FLAGS_WIDTH))
  if fw & _STATUS_FLAGS:
    writes.append(shared_write(FLAGS, "flags", False, _FLAGS_WIDTH))

  return RegFacts(mnemonic, tuple(reads), tuple(writes), _flag_names(fr),
                   _flag_names(fw), ins.is_stack_instruction, ins.has_lock_prefix, rep,
                   tuple(cond_roles), n_regs + 3 * n_mem,
                   _idiom_reads(ins, ignored) if idioms_too else None)


def _idiom_reads(ins, ignored: list[int]) -> tuple[Read, ...] | None:
  """The reads of a zero idiom as if its sources differed, or None (see `RegFacts`).

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
  return tuple(shared_read(_FULL[names[r.role]], r.role, _WIDTH[names[r.role]])
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


def facts(data: bytes) -> tuple | DecodeError:
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
  regs = SHAPES.get(shape)
  if regs is None:
    regs = SHAPES[shape] = _register_facts(ins, info)
  return regs, (_memory_facts(ins, info) if info.used_memory() else ())


def split_hex(h: str) -> tuple[str, list[bytes]] | DecodeError:
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
