"""Register files (Zen 3): move elimination, partial writes, aliases; decoder facts
that only llvm-mca's timelines show (nop address reads, `leave`, `cltd`, `vzeroupper`)."""

import pytest

from diffsim.isa import parse_asm
from diffsim.isa.encode import ALWAYS, _ranged_edges, _rename_history, encode, renaming_for
from diffsim.params.table import WRITE_ROLES, load_table
from diffsim.sim import encode as sim_encode

# Each one checked cycle by cycle against llvm-mca 14 (dispatch, issue, retire).
CASES = [
    # A partial (8-bit) write waits for the write it merges into, then a full read
    # waits for the partial write only: 4 cycles per iteration, not 3.
    "imull %eax, %eax; movb $1, %al",
    # The eliminated move makes EAX an alias of ECX, whose writer in the next
    # iteration is the zero idiom: the chain through `sete` is broken.
    "xorl %ecx, %ecx; testl %eax, %eax; sete %cl; movl %ecx, %eax",
    "movl $1, %eax; cmovneq %rsi, %rax; movq %rax, %rsi",
    # Swaps alias both registers to the one llvm-mca reads first.
    "imulq %rdx, %rdx; xchgq %rcx, %rdx; addq %rcx, %rsi; addq %rdx, %rdi",
    "imull %ecx, %ecx; xchgl %ecx, %eax; addq %rcx, %rsi; addq %rax, %rdi",
    # The partial write waits for the register's mapping, not for its alias.
    "imulq %rax, %rax; movl %ebx, %eax; movb $1, %al; addq %rax, %rcx",
    # XMM and YMM are renamed apart: the YMM read still waits for the old writer.
    "vmulpd %ymm2, %ymm2, %ymm2; vmovaps %xmm1, %xmm2; vaddpd %ymm2, %ymm3, %ymm4; "
    "vaddpd %xmm2, %xmm3, %xmm5",
    "vmulpd %ymm1, %ymm1, %ymm1; vmovaps %ymm1, %ymm2; vaddpd %xmm2, %xmm3, %xmm2",
    # An alias names a register, so a younger write of the source is seen.
    "movq %rax, %rbx; addq $1, %rax; imulq %rbx, %rcx",
    "movl %eax, %eax; imull %eax, %eax",
    # Slow LEA forms (scale != 1; base + index + displacement).
    "imulq %r9, %rax; movq -16(%rsp), %rdi; leaq (%rax,%r8,2), %rax; leaq (%rdi,%rax,4), %rax",
    "leaq 1(%rbx,%rax), %rbx",
    # Decoder facts.
    "imulq %rax, %rax; nopl (%rax,%rax)",
    "popq %rbx; popq %r12; leave",
    "imull %eax, %eax; cltd; addl %eax, %ecx",
    "vmulpd %ymm8, %ymm8, %ymm8; vzeroupper; vmulpd %ymm9, %ymm9, %ymm9; "
    "vaddpd %ymm8, %ymm9, %ymm10",
    # A dependency-breaking idiom still reads EFLAGS.
    "imull %eax, %eax; sbbl %ecx, %ecx; addl %ecx, %eax",
]


@pytest.fixture(scope="module")
def znver3():
  return load_table("znver3")


# znver3's register files are the harder case; haswell's in the slow suite (CI's time).
@pytest.mark.parametrize("cpu", ["znver3", pytest.param("haswell", marks=pytest.mark.slow)])
def test_timelines_match_llvm_mca(cpu, assert_timeline_is_llvm_mcas):
  table = load_table(cpu)
  for asm in CASES:
    assert_timeline_is_llvm_mcas(table, asm)


def test_eliminated_moves_and_partial_writes_encode(znver3):
  block = parse_asm("imull %eax, %eax; movb $1, %al; movl %ecx, %ebx; addl %ebx, %edx")
  batch = sim_encode(znver3, [block])  # the table's register files
  assert batch.eliminated[0, :4].tolist() == [False, False, True, False]
  # movb's edge to imul is a write-after-write edge of its op0 write.
  assert batch.dep_waw[0, 1, 0] == WRITE_ROLES.index("op0") and batch.dep_src[0, 1, 0] == 0
  # imul reads only movb (the partial write replaced the whole mapping).
  assert batch.dep_src[0, 0, :int(batch.dep_valid[0, 0].sum())].tolist() == [1, 1]
  # The add links to ECX's writer (none in the block), not to the move.
  assert not batch.dep_valid[0, 3, 0] or batch.dep_src[0, 3, 0] != 2
  # The partial write and the eliminated move take no physical register.
  assert not batch.write_alloc[0, 1, 0] and not batch.write_alloc[0, 2, 0]
  # Without register files nothing changes.
  plain = encode([block], znver3.layout.index)
  assert not plain.eliminated.any() and (plain.dep_waw == -1).all()


def test_first_iteration_edges(znver3):
  # In the first iteration RSI is no alias of RSP yet, so the load does not wait for
  # the subq; from the second on it does.
  block = parse_asm("subq $40, %rsp; movl 16(%rsi), %eax; movq %rsp, %rsi")
  ren = renaming_for(znver3)
  history, _, _ = _rename_history(block, ren, [False, False, True])
  edges = _ranged_edges(history)
  assert edges[1] == [(0, 0, WRITE_ROLES.index("op0"), 7, -1, 1, ALWAYS)]
