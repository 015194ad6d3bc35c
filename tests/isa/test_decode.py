"""Hand-checked decoding facts for diffsim.isa's decoder (needs LLVM 14's llvm-mc)."""

from __future__ import annotations

import csv
import json
import os
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from diffsim.isa import (FLAGS, REASONS, Block, DecodeError, Write, block_from_json,
                         block_to_json, decode_block, decode_blocks, llvmmc, parse_asm,
                         summarize)
from diffsim.llvmtools import available

pytestmark = pytest.mark.skipif(not available("llvm-mc"), reason="no LLVM 14 llvm-mc")

# Real BHive blocks (MIT licence), chosen for variety: lock, stack, zero idioms, sbb,
# VEX, x87, FS, partial writes, legacy SSE, div, cmov, address indexes.
BHIVE = [
    "4c8b6c24084c8b3424b8fffffffff0410fc144242483f801",
    "b9ffffffff498d7d08f00fc10f",
    "4b8d442401498945004883c4085b415c415d5d",
    "4881c49001000031c05b5d415c415d415e415f",
    "29476001c1894f5c31c0",
    "4889431048896b1831c04c89632048c7432800000000",
    "4519ff4183e7fa4183c753",
    "3d00010000668944242819d2488344245804f7d283c210",
    "c5fa108c242c010000c5f82ec1",
    "c5f957c0c4c1792e0424",
    "d9ee31dbdfe9",
    "41db6d004883c3014d01f5db3c24",
    "488b45f8644833042528000000",
    "31c0488b4c24486448330c2528000000",
    "4c8b04244c89f9b00184c0",
    "0fae5c24108b44241089c28944244c80e69f39d089542420",
    "660f3a0bc001",
    "0f28f2f30f59c5f30f5cf10f28cef30f59ccf30f5ccdf30f5ccaf30f5cc1",
    "4489f04183c6029941f7ff48984d8944c508453b742440",
    "4889ce488b461831d2488b0e48f7f34d8d04d6498b384885ff",
    "89c14429c139ca0f4eca89d64401c183c601894b18",
    "440fb69d80656100443a9b80656100410f47d20f47c6",
    "49f7d7498d742eff4923f74889df",
    "014304488bbd50fcffff",
    "01570c",
]

# Hand-written instructions, decoded once (one llvm-mc batch) for the whole module.
HAND = {
    "div_ecx": "f7f1", "div_eax": "f7f0", "mul_rcx": "48f7e1", "cqo": "4899",
    "rep_movsq": "f348a5", "movb_al": "b001", "movl_eax": "b801000000",
    "movw_ax": "66b80100", "mov_ah_al": "88e0", "addps": "0f58c1", "vaddps": "c5f058c1",
    "vaddps_y": "c5f458c1", "xor32": "31c0", "xor32_rev": "33c0", "xor16": "6631c0",
    "xor8_ah_al": "30e0", "xor32_diff": "31c8", "vpxor": "c5f1efc1", "pxor": "660fefc0",
    "pcmpeqd": "660f76c9", "sbb": "19c0", "push_rbx": "53", "push_rsp": "54",
    "pop_rbx": "5b", "call": "e800000000", "ret": "c3", "lock_cmpxchg": "f00fb10a",
    "lea": "488d0424", "lea_idx": "488d04c8", "nopl": "0f1f4000", "nop66": "6690",
    "add64rr": "4801d8", "add64rm": "480303", "add64mr": "480118", "add32ri8": "83c001",
    "add32ri": "81c178563412",
    "add32i32": "0578563412", "add32ri8_long": "0501000000", "rip": "488b0510000000",
    "fs": "64488b042528000000",
    "cmov64": "480f45c1", "ud2": "0f0b", "cld": "fc", "faddp": "dec1",
    "evex_mask": "62f17c4958c1", "push_i32": "6851000000", "push_i8": "6a51",
    "bsr32": "0fbdc1", "bsf64": "480fbcd1", "bsr64_mem": "480fbd01", "cmov64_mem": "480f4f4108",
    "cmov16": "660f45c1", "cmov32": "0f44c1", "fstp_st0": "ddd8", "fldcw": "d96c243e",
    "fnstsw_ax": "dfe0", "fistpl": "db5c2470", "fxch": "d9c9", "fcmovb": "dac2",
    "movsd_load": "f20f100e", "mov_ah": "b401",
}


@pytest.fixture(scope="module")
def hand() -> dict[str, Block]:
  res = decode_blocks(list(HAND.values()))
  out = {}
  for name, r in zip(HAND, res):
    assert isinstance(r, Block), (name, r)
    out[name] = r
  return out


def one(hand, name):
  (i,) = hand[name].instrs
  return i


def rr(instr):
  return [(r.reg, r.role) for r in instr.reads]


def ww(instr):
  return [(w.reg, w.role, w.merge) for w in instr.writes]


# --- implicit operands -----------------------------------------------------------


def test_div_implicit(hand):
  i = one(hand, "div_ecx")
  assert i.key == "DIV32r" and i.text == "divl %ecx" and i.mnemonic == "div"
  assert rr(i) == [("RCX", "op0"), ("RAX", "implicit"), ("RDX", "implicit")]
  assert ww(i) == [("RAX", "implicit", False), ("RDX", "implicit", False),
                   (FLAGS, "flags", False)]


def test_div_by_implicit_register_keeps_role_sequence(hand):
  # The explicit source is RAX too, but the implicit RAX read is still listed.
  assert [r.role for r in one(hand, "div_eax").reads] == [
      r.role for r in one(hand, "div_ecx").reads]
  assert rr(one(hand, "div_eax"))[:2] == [("RAX", "op0"), ("RAX", "implicit")]


def test_mul_cqo(hand):
  i = one(hand, "mul_rcx")
  assert i.key == "MUL64r"
  assert rr(i) == [("RCX", "op0"), ("RAX", "implicit")]
  assert ww(i) == [("RAX", "implicit", False), ("RDX", "implicit", False),
                   (FLAGS, "flags", False)]
  i = one(hand, "cqo")
  assert (i.key, i.text) == ("CQO", "cqto")
  # LLVM's CQO defines RAX as well as RDX (llvm-mca's readers of RAX wait for it).
  assert rr(i) == [("RAX", "implicit")]
  assert ww(i) == [("RAX", "implicit", False), ("RDX", "implicit", False)]


def test_rep_movs(hand):
  i = one(hand, "rep_movsq")
  assert i.key == "MOVSQ" and i.text == "rep movsq (%rsi), %es:(%rdi)"
  assert i.rep and i.loads and i.stores and not i.stack
  # The rep prefix is no operand in LLVM: llvm-mca neither reads nor writes RCX.
  assert rr(i) == [("RDI", "implicit"), ("RSI", "implicit")]
  assert [w.reg for w in i.writes] == ["RDI", "RSI"]
  # DF is read, but DF is not part of LLVM's EFLAGS.
  assert "df" in i.flags_read and FLAGS not in [r.reg for r in i.reads]


def test_cld_and_x87_do_not_touch_eflags(hand):
  i = one(hand, "cld")
  assert i.flags_written == ("df",) and i.writes == ()
  i = one(hand, "faddp")
  assert FLAGS not in [r.reg for r in i.reads + i.writes]


# --- x87 -------------------------------------------------------------------------


def test_x87_has_no_stack_register_dataflow(hand):
  # LLVM's x87 instructions define no ST register, so llvm-mca never makes one wait
  # on another through the stack (`fstp %st(0)` alone: 53 cycles for 100 iterations
  # on Haswell, not a 1-cycle chain). What LLVM models are FPSW and FPCW.
  i = one(hand, "faddp")
  assert i.key == "ADD_FPrST0"
  assert rr(i) == [("FPCW", "implicit")] and ww(i) == [("FPSW", "implicit", False)]
  i = one(hand, "fstp_st0")
  assert (i.key, i.text) == ("ST_FPrr", "fstp %st(0)")
  assert rr(i) == [("FPCW", "implicit")] and ww(i) == [("FPSW", "implicit", False)]
  i = one(hand, "fxch")
  assert rr(i) == [("FPCW", "implicit")] and ww(i) == [("FPSW", "implicit", False)]
  assert not any(r.reg.startswith("ST") for b in decode_blocks(BHIVE) if isinstance(b, Block)
                 for j in b.instrs for r in j.reads + j.writes)


def test_x87_control_and_status_words(hand):
  i = one(hand, "fldcw")
  assert rr(i) == [("RSP", "base")]
  assert ww(i) == [("FPCW", "implicit", False), ("FPSW", "implicit", False)]
  i = one(hand, "fistpl")
  assert rr(i) == [("RSP", "base"), ("FPCW", "implicit")]
  i = one(hand, "fnstsw_ax")
  assert rr(i) == [("FPSW", "implicit")]
  assert ww(i) == [("RAX", "op0", True), ("FPSW", "implicit", False)]
  assert i.writes[0].width == 16
  # fcmov does not read EFLAGS in LLVM 14 (iced says it does).
  i = one(hand, "fcmovb")
  assert rr(i) == [] and "cf" in i.flags_read


_X87_PROBES = ["fld %st(2)", "fldl (%rdi)", "fstp %st(2)", "fstpl (%rdi)", "fildll (%rdi)",
               "fistpl (%rdi)", "fisttpll (%rdi)", "fadd %st(2), %st", "faddp %st, %st(2)",
               "fmull (%rdi)", "fdivrp %st, %st(2)", "fucomip %st(2), %st", "fcompp", "fxam",
               "fchs", "fabs", "fld1", "fldz", "fsqrt", "fxch %st(2)", "fcmovb %st(2), %st",
               "fninit", "fnclex", "fldcw (%rdi)", "fnstcw (%rdi)", "fnstsw %ax",
               "fnstsw (%rdi)", "wait", "frndint", "fprem"]


@pytest.mark.mca
@pytest.mark.skipif(not available("llvm-mca"), reason="no LLVM 14 llvm-mca")
@pytest.mark.parametrize("text", _X87_PROBES)
def test_x87_state_matches_llvm_mca(text):
  # For each x87 state word, whether llvm-mca makes the instruction wait on an
  # earlier writer (reads) or a later reader wait on it (writes), from timelines.
  from diffsim.mca.timeline import timeline  # pylint: disable=import-outside-toplevel

  def waits(body, k):
    t = timeline(body, "haswell", 1)
    return int(t.ready[0, k] - t.dispatched[0, k])

  i = parse_asm(text).instrs[0]
  reads = {r.reg for r in i.reads}
  writes = {w.reg for w in i.writes}
  # fsqrt writes FPSW late (24 cycles); fldcw writes FPCW late, fabs then FPSW early.
  assert (waits(f"fsqrt\n{text}", 1) >= 4) == ("FPSW" in reads)
  assert (waits(f"fldcw (%rsi)\nfabs\n{text}", 2) >= 4) == ("FPCW" in reads)
  t = timeline(f"fsqrt\n{text}\nfnstsw %ax", "haswell", 1)
  waits_on_fsqrt = t.ready[0, 2] == t.executed[0, 0] != t.executed[0, 1]
  assert (not waits_on_fsqrt) == ("FPSW" in writes)
  assert (waits(f"{text}\nfadd %st(1), %st", 1) > 0) == ("FPCW" in writes)
  assert (waits(f"imulq %rax, %rax\n{text}", 1) > 0) == (FLAGS in reads)


# --- partial writes --------------------------------------------------------------


@pytest.mark.parametrize("name,key,reg,merge,width", [
    ("movb_al", "MOV8ri", "RAX", True, 8),
    ("mov_ah", "MOV8ri", "RAX", True, 8),
    ("movl_eax", "MOV32ri", "RAX", False, 32),
    ("movw_ax", "MOV16ri", "RAX", True, 16),
    ("mov_ah_al", "MOV8rr", "RAX", True, 8),
    ("addps", "ADDPSrr", "ZMM0", True, 128),
    ("movsd_load", "MOVSDrm", "ZMM1", True, 128),
    ("vaddps", "VADDPSrr", "ZMM0", False, 128),
    ("vaddps_y", "VADDPSYrr", "ZMM0", False, 256),
])
def test_partial_writes(hand, name, key, reg, merge, width):
  i = one(hand, name)
  assert i.key == key
  assert i.writes[0] == Write(reg, "op0", merge, width)


def test_widths(hand):
  def widths(instr):
    return ([(r.reg, r.width) for r in instr.reads], [(w.reg, w.width) for w in instr.writes])
  assert widths(one(hand, "div_ecx")) == (
      [("RCX", 32), ("RAX", 32), ("RDX", 32)], [("RAX", 64), ("RDX", 64), (FLAGS, 32)])
  assert widths(one(hand, "mov_ah_al")) == ([("RAX", 8)], [("RAX", 8)])
  assert widths(one(hand, "vaddps_y")) == ([("ZMM1", 256), ("ZMM1", 256)], [("ZMM0", 256)])
  assert widths(one(hand, "evex_mask"))[0] == [
      ("ZMM0", 512), ("ZMM0", 512), ("ZMM1", 512), ("K1", 64)]
  assert widths(one(hand, "lea_idx"))[0] == [("RAX", 64), ("RCX", 64)]
  assert widths(one(hand, "fnstsw_ax"))[0] == [("FPSW", 16)]


def test_vex_three_operand_roles(hand):
  assert rr(one(hand, "vaddps")) == [("ZMM1", "op1"), ("ZMM1", "op2")]
  assert rr(one(hand, "addps")) == [("ZMM0", "op0"), ("ZMM1", "op1")]


def test_evex_mask(hand):
  i = one(hand, "evex_mask")
  assert i.key == "VADDPSZrrk"
  assert rr(i) == [("ZMM0", "op0"), ("ZMM0", "op1"), ("ZMM1", "op2"), ("K1", "mask")]


def test_cmov64_conditional_write_reads_destination(hand):
  i = one(hand, "cmov64")
  assert i.key == "CMOV64rr"
  assert rr(i) == [("RAX", "op0"), ("RCX", "op1"), (FLAGS, "flags")]
  assert ww(i) == [("RAX", "op0", False)]


@pytest.mark.parametrize("name,key,reads_dest", [
    # LLVM ties cmov's destination to a source (an extra MCInst register operand)...
    ("cmov64", "CMOV64rr", True), ("cmov64_mem", "CMOV64rm", True),
    ("cmov16", "CMOV16rr", True), ("cmov32", "CMOV32rr", True),
    ("evex_mask", "VADDPSZrrk", True),
    # ... but not bsf/bsr's, although the destination survives a zero source.
    ("bsr32", "BSR32rr", False), ("bsf64", "BSF64rr", False), ("bsr64_mem", "BSR64rm", False),
])
def test_conditional_write_reads_only_tied_destinations(hand, name, key, reads_dest):
  i = one(hand, name)
  assert i.key == key
  assert ("op0" in [r.role for r in i.reads]) == reads_dest
  assert i.writes[0].role == "op0"


@pytest.mark.mca
@pytest.mark.skipif(not available("llvm-mca"), reason="no LLVM 14 llvm-mca")
@pytest.mark.parametrize("text", ["bsrl %ecx, %eax", "bsfq (%rcx), %rax",
                                  "cmovel %ecx, %eax", "cmovgq 8(%rcx), %rax"])
def test_conditional_write_matches_llvm_mca(text):
  # The destination is read iff llvm-mca makes it wait for a slow producer of it.
  from diffsim.mca.timeline import timeline  # pylint: disable=import-outside-toplevel
  t = timeline(f"imulq %rax, %rax\n{text}", "haswell", 1)
  waits = t.ready[0, 1] > t.dispatched[0, 1]
  i = parse_asm(text).instrs[0]
  assert waits == ("op0" in [r.role for r in i.reads])


# --- idioms ----------------------------------------------------------------------


def test_xor_zero_idiom(hand):
  i = one(hand, "xor32")
  assert (i.key, i.text) == ("XOR32rr@same", "xorl %eax, %eax")
  assert i.zero_idiom and not i.dep_breaking
  # The sources stay: each CPU's table says whether it ignores them.
  assert rr(i) == [("RAX", "op0"), ("RAX", "op1")]
  assert ww(i) == [("RAX", "op0", False), (FLAGS, "flags", False)]
  assert i.opcode == "XOR32rr"


@pytest.mark.mca
@pytest.mark.skipif(not available("llvm-mca"), reason="no LLVM 14 llvm-mca")
def test_zero_idiom_sources_matter_where_the_cpu_says_so():
  # XOR8rr@same is no zero idiom on Haswell: llvm-mca waits for the producer of %dl,
  # so the IR must list the read although iced calls the instruction a zero idiom.
  from diffsim.mca.timeline import timeline  # pylint: disable=import-outside-toplevel
  t = timeline("imulq %rdx, %rdx\nxorb %dl, %dl", "haswell", 1)
  assert t.ready[0, 1] > t.dispatched[0, 1]
  i = parse_asm("xorb %dl, %dl").instrs[0]
  assert i.key == "XOR8rr@same" and i.zero_idiom
  assert [(r.reg, r.width) for r in i.reads] == [("RDX", 8), ("RDX", 8)]


def test_keys_are_the_opcodes_llvm_mca_assembles(hand):
  # 33 c0 disassembles to XOR32rr_REV; its text `xorl %eax, %eax` is what llvm-mca
  # reads, and the assembler makes XOR32rr of it (31 c0): that is the key.
  i = one(hand, "xor32_rev")
  assert (i.key, i.text, i.hex) == ("XOR32rr@same", "xorl %eax, %eax", "33c0")
  assert i.encoding_opcode == "XOR32rr_REV" and i.opcode == "XOR32rr"
  assert i.zero_idiom and rr(i) == [("RAX", "op0"), ("RAX", "op1")]
  j = parse_asm(i.text).instrs[0]
  assert (j.key, j.hex, j.encoding_opcode) == ("XOR32rr@same", "31c0", "XOR32rr")
  assert (j.reads, j.writes) == (i.reads, i.writes)
  # 68 51 00 00 00 (PUSH64i32) prints as `pushq $81`, which llvm-mca assembles to
  # PUSH64i8, whose latency differs (Haswell: 1, not 2).
  i, j = one(hand, "push_i32"), one(hand, "push_i8")
  assert (i.key, i.encoding_opcode, i.text) == ("PUSH64i8", "PUSH64i32", "pushq $81")
  assert (j.key, j.encoding_opcode, j.text) == ("PUSH64i8", "PUSH64i8", "pushq $81")


def test_other_zero_idioms(hand):
  i = one(hand, "xor16")
  assert i.key == "XOR16rr@same" and i.zero_idiom
  assert rr(i) == [("RAX", "op0"), ("RAX", "op1")]
  assert i.writes[0].merge  # a 16-bit write keeps RAX[63:16]
  i = one(hand, "vpxor")
  assert i.key == "VPXORrr@same" and i.zero_idiom
  assert rr(i) == [("ZMM1", "op1"), ("ZMM1", "op2")]  # vpxor %xmm1, %xmm1, %xmm0
  assert ww(i) == [("ZMM0", "op0", False)]
  i = one(hand, "pxor")
  assert i.key == "PXORrr@same" and i.zero_idiom
  assert rr(i) == [("ZMM0", "op0"), ("ZMM0", "op1")]
  # An unused operand is no ignored source; its address registers are still read.
  assert all(r.role in ("base", "index") for r in one(hand, "nopl").reads)


def test_not_same_register(hand):
  assert one(hand, "xor32_diff").key == "XOR32rr"
  # AH and AL are one full register but two sources.
  i = one(hand, "xor8_ah_al")
  assert i.key == "XOR8rr" and not i.zero_idiom
  assert rr(i) == [("RAX", "op0"), ("RAX", "op1")]


def test_dep_breaking(hand):
  i = one(hand, "pcmpeqd")
  assert i.key == "PCMPEQDrr@same" and i.dep_breaking and not i.zero_idiom
  assert rr(i) == [("ZMM1", "op0"), ("ZMM1", "op1")]
  i = one(hand, "sbb")
  assert i.key == "SBB32rr@same" and i.dep_breaking
  assert rr(i) == [("RAX", "op0"), ("RAX", "op1"), (FLAGS, "flags")]


# --- stack, lock, memory ---------------------------------------------------------


def test_push_pop_call_ret(hand):
  i = one(hand, "push_rbx")
  assert i.key == "PUSH64r" and i.stack and i.stores and not i.loads
  assert rr(i) == [("RBX", "op0"), ("RSP", "implicit")]
  assert ww(i) == [("RSP", "implicit", False)]
  (m,) = i.mem
  assert (m.base, m.disp, m.size, m.store) == ("RSP", -8, 8, True)
  i = one(hand, "push_rsp")
  assert rr(i) == [("RSP", "op0"), ("RSP", "implicit")]
  assert ww(i) == [("RSP", "implicit", False)]
  i = one(hand, "pop_rbx")
  assert i.key == "POP64r" and i.stack and i.loads and not i.stores
  assert rr(i) == [("RSP", "implicit")]
  assert ww(i) == [("RBX", "op0", False), ("RSP", "implicit", False)]
  i = one(hand, "call")
  assert i.key == "CALL64pcrel32" and i.stack and i.stores
  assert rr(i) == [("RSP", "implicit")] and ww(i) == [("RSP", "implicit", False)]
  i = one(hand, "ret")
  assert (i.key, i.text) == ("RET64", "retq") and i.stack and i.loads


def test_lock_cmpxchg(hand):
  i = one(hand, "lock_cmpxchg")
  assert i.key == "CMPXCHG32rm" and i.text == "lock cmpxchgl %ecx, (%rdx)"
  assert i.lock and i.loads and i.stores and not i.stack
  assert rr(i) == [("RCX", "op1"), ("RDX", "base"), ("RAX", "implicit")]
  assert ww(i) == [("RAX", "implicit", False), (FLAGS, "flags", False)]
  (m,) = i.mem
  assert (m.base, m.size, m.load, m.store) == ("RDX", 4, True, True)


def test_lea_is_not_a_load(hand):
  i = one(hand, "lea")
  assert i.key == "LEA64r" and not i.loads and not i.stores and i.mem == ()
  assert rr(i) == [("RSP", "base")]
  assert rr(one(hand, "lea_idx")) == [("RAX", "base"), ("RCX", "index")]


def test_nops(hand):
  i = one(hand, "nopl")
  assert i.key == "NOOPL" and i.mem == () and not i.loads
  # LLVM's memory operands are register uses, so llvm-mca makes `nopl (%rax)` wait
  # for RAX (measured with llvm-mca 14 timelines on haswell and znver3).
  assert [r.role for r in i.reads] in (["base"], ["base", "index"])
  i = one(hand, "nop66")  # iced would print `xchg %ax,%ax`
  assert (i.key, i.text, i.writes) == ("NOOP", "nop", ())


def test_rip_and_fs(hand):
  i = one(hand, "rip")
  assert i.text == "movq 16(%rip), %rax" and i.reads == ()
  (m,) = i.mem
  assert (m.base, m.disp, m.load) == ("RIP", 16, True)
  i = one(hand, "fs")
  (m,) = i.mem
  assert (m.base, m.disp, m.segment) == (None, 40, "FS")


def test_keys_distinguish_forms(hand):
  names = ("add64rr", "add64rm", "add64mr", "add32ri8", "add32ri", "add32i32",
           "add32ri8_long")
  keys = {n: one(hand, n).key for n in names}
  assert keys == {"add64rr": "ADD64rr", "add64rm": "ADD64rm", "add64mr": "ADD64mr",
                  "add32ri8": "ADD32ri8", "add32ri": "ADD32ri", "add32i32": "ADD32i32",
                  "add32ri8_long": "ADD32ri8"}  # 05 01000000: `addl $1, %eax`


def test_ud2_inside_a_block():
  b = decode_block("4801d80f0b4801d8")
  assert [i.key for i in b.instrs] == ["ADD64rr", "TRAP", "ADD64rr"]


# --- failures --------------------------------------------------------------------


@pytest.mark.parametrize("hex_,reason", [
    ("", "empty"),
    ("  ", "empty"),
    ("4801d", "odd-length-hex"),
    ("48zz", "bad-hex"),
    ("06", "invalid-instruction"),  # push %es: invalid in 64-bit mode
    ("ffff", "invalid-instruction"),
    ("48", "truncated"),
    ("4801d848", "truncated"),
    ("0f18c0", "llvm-mc-invalid"),  # reserved NOP that LLVM 14 does not decode
    ("63c4", "llvm-mc-asm"),  # llvm-mc prints `movslq %esp, %eax`, then rejects it
])
def test_bad_blocks(hex_, reason):
  assert reason in REASONS
  with pytest.raises(DecodeError) as e:
    decode_block(hex_)
  assert e.value.reason == reason


def test_failure_detail_names_the_instruction():
  with pytest.raises(DecodeError) as e:
    decode_block("4801d8ffff")
  assert e.value.detail.startswith("instruction 1 at byte 3")


def test_bad_blocks_do_not_affect_neighbours():
  hexes = ["4801d8", "06", "", "4801d", "4801d8ffff", "31c0", "48", "0f0b"]
  res = decode_blocks(hexes)
  assert [r.reason if isinstance(r, DecodeError) else r.instrs[0].key for r in res] == [
      "ADD64rr", "invalid-instruction", "empty", "odd-length-hex", "invalid-instruction",
      "XOR32rr@same", "truncated", "TRAP"]
  s = summarize(res)
  assert (s["blocks"], s["decoded"], s["failed"]) == (8, 3, 5)
  assert s["by_reason"]["invalid-instruction"] == 2


def test_decoding_in_background_is_decoding_here():
  """The child process gives every chunk exactly what `decode_blocks` gives, errors
  included, in order."""
  from diffsim.isa.background import decode_in_background

  hexes = BHIVE[:6] + ["06", "", "4801d"] + BHIVE[6:9]
  with decode_in_background(hexes, chunk=4) as chunks:
    got = [r for chunk in chunks for r in chunk]
  here = decode_blocks(hexes)
  assert len(got) == len(here) == len(hexes)
  for a, b in zip(got, here):
    if isinstance(b, DecodeError):
      assert isinstance(a, DecodeError) and (a.reason, a.detail) == (b.reason, b.detail)
    else:
      assert block_to_json(a) == block_to_json(b)


def test_background_decoder_reports_a_missing_llvm_mc(monkeypatch):
  from diffsim.isa.background import decode_in_background

  monkeypatch.setenv("DIFFSIM_LLVM_BIN", "/nonexistent")  # read by the fresh child
  with decode_in_background(BHIVE[:3], chunk=2) as chunks:
    with pytest.raises(RuntimeError, match="apt-get install llvm-14"):
      list(chunks)


def test_prefix_lines_fold_into_the_instruction():
  fold = llvmmc.fold_prefixes
  assert fold([("lock", "LOCK_PREFIX"), ("addq %rcx, (%rax)", "ADD64mr")], "x") == (
      "ADD64mr", "lock addq %rcx, (%rax)")
  assert fold([("xacquire", "XACQUIRE_PREFIX"), ("lock", "LOCK_PREFIX"),
               ("addq %rcx, (%rax)", "ADD64mr")], "x") == (
                   "ADD64mr", "xacquire lock addq %rcx, (%rax)")
  err = fold([("addl %eax, %esp", "ADD32rr"), ("nop", "NOOP")], "x")
  assert isinstance(err, DecodeError) and err.reason == "llvm-mc-mismatch"
  err = fold([("lock", "LOCK_PREFIX")], "x")
  assert isinstance(err, DecodeError) and err.reason == "llvm-mc-mismatch"


def test_xacquire_is_a_separate_instruction_for_llvm_mca():
  # llvm-mc folds `lock` into the MCInst, but assembles `xacquire` as an instruction
  # of its own: llvm-mca would simulate two, the IR has one.
  assert "llvm-mc-prefix" in REASONS
  with pytest.raises(DecodeError) as e:
    decode_block("f2f00fb10a")
  assert e.value.reason == "llvm-mc-prefix"
  b = decode_block("f00fb10a")
  assert [(i.key, i.text, i.lock) for i in b.instrs] == [
      ("CMPXCHG32rm", "lock cmpxchgl %ecx, (%rdx)", True)]


def test_magic_separator_inside_a_block():
  # The very instruction used as llvm-mc's separator must still decode.
  sep = "48b8" + llvmmc.SEP_IMM.hex()
  b = decode_block("4801d8" + sep + "4801d8")
  assert [i.key for i in b.instrs] == ["ADD64rr", "MOV64ri", "ADD64rr"]


# --- text, JSON ------------------------------------------------------------------


def test_parse_asm_att_and_intel():
  att = parse_asm("xorl %eax, %eax; addq (%rbx), %rax\nlock cmpxchgl %ecx, (%rdx)")
  intel = parse_asm("xor eax, eax\nadd rax, qword ptr [rbx]  # comment\n"
                    "lock cmpxchg dword ptr [rdx], ecx", syntax="intel")
  assert [i.key for i in att.instrs] == ["XOR32rr@same", "ADD64rm", "CMPXCHG32rm"]
  assert att == intel
  assert att.hex == "31c0480303f00fb10a"


def test_parse_asm_branches_and_errors():
  b = parse_asm("cmpl $1, %eax\njne 5\nloop: decl %ecx\njne loop")
  assert [i.key for i in b.instrs] == ["CMP32ri8", "JCC_1", "DEC32r", "JCC_1"]
  with pytest.raises(DecodeError) as e:
    parse_asm("addq %rbx, %rax\n  bogus %eax")
  assert e.value.reason == "asm-error" and "line 2" in e.value.detail
  with pytest.raises(DecodeError) as e:
    parse_asm("# nothing\n")
  assert e.value.reason == "empty"
  with pytest.raises(ValueError):
    parse_asm("nop", syntax="masm")


def test_json_round_trip(hand):
  blocks = list(hand.values()) + [b for b in decode_blocks(BHIVE)]
  for b in blocks:
    d = json.loads(json.dumps(block_to_json(b)))
    assert block_from_json(d) == b
  d = block_to_json(hand["movb_al"])
  assert d["instrs"][0]["writes"] == [["RAX", "op0", True, 8]]
  # Lists written before widths existed still load, as width 0.
  d["instrs"][0]["writes"] = [["RAX", "op0", True]]
  assert block_from_json(d).instrs[0].writes[0] == Write("RAX", "op0", True)


def test_real_blocks_decode():
  res = decode_blocks(BHIVE)
  assert all(isinstance(r, Block) for r in res)
  assert [r.hex for r in res] == BHIVE
  for r in res:
    assert "".join(i.hex for i in r.instrs) == r.hex


@settings(max_examples=20, deadline=None, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(st.sampled_from(BHIVE))
def test_text_round_trip(hex_):
  b = decode_block(hex_)
  c = parse_asm(b.text)
  assert [(i.key, i.text, i.reads, i.writes, i.mem, i.zero_idiom,
           i.dep_breaking) for i in b.instrs] == [
              (i.key, i.text, i.reads, i.writes, i.mem, i.zero_idiom,
               i.dep_breaking) for i in c.instrs]
  assert parse_asm(c.text) == c  # canonical text and bytes are a fixed point


# --- corpus (needs ../shared) ----------------------------------------------------


def _corpus_path() -> Path:
  env = os.environ.get("DIFFSIM_SHARED")
  base = Path(env) if env else Path(__file__).resolve().parents[3] / "shared"
  return (base / "data" if (base / "data").is_dir() else base) / "bhive" / "blocks.csv"


@pytest.mark.slow
def test_corpus_coverage():
  path = _corpus_path()
  if not path.is_file():
    pytest.skip(f"{path} not found")
  with path.open(newline="") as f:
    hexes = [row["hex"] for row in csv.DictReader(f)]
  s = summarize(decode_blocks(hexes))
  assert s["decoded"] / s["blocks"] >= 0.995, s["by_reason"]
