"""Which loads read an older store's bytes, with every GPR starting at one address."""

from diffsim.isa import decode_block, parse_asm
from diffsim.isa.memory import accesses, memory_edges


def edges(asm: str):
  return memory_edges(parse_asm(asm))


def test_a_load_after_a_store_to_the_same_bytes_depends_on_it():
  assert edges("movq %rax, 8(%rdi)\nmovq 8(%rdi), %rcx") == [[], [(0, 0)]]


def test_different_registers_alias_because_every_register_holds_the_same_address():
  # The harness points every GPR but rsp at A: 8(%rdi) and 8(%rsi) are the same bytes.
  assert edges("movq %rax, 8(%rdi)\nmovq 8(%rsi), %rcx") == [[], [(0, 0)]]
  # ... but 16(%rsi) is not, and neither is a stack slot.
  assert edges("movq %rax, 8(%rdi)\nmovq 16(%rsi), %rcx") == [[], []]
  assert edges("movq %rax, 8(%rdi)\nmovq 8(%rsp), %rcx") == [[], []]


def test_partial_overlap_counts_and_the_youngest_store_wins():
  assert edges("movl %eax, 8(%rdi)\nmovl %ebx, 8(%rdi)\nmovq 4(%rdi), %rcx") == \
      [[], [], [(1, 0)]]


def test_read_modify_write_depends_on_the_previous_iteration():
  assert edges("addl $1, 8(%rdi)") == [[(0, 1)]]
  # The pointer moves 8 bytes an iteration: the 4-byte accesses no longer meet.
  assert edges("addl $1, 8(%rdi)\naddq $8, %rdi") == [[], []]
  # ... but one byte an iteration they do.
  assert edges("addl $1, 8(%rdi)\nincq %rdi") == [[(0, 1)], []]


def test_register_values_follow_moves_leas_loads_and_the_stack():
  acc = accesses(parse_asm("leaq 16(%rdi), %rax\nmovq (%rax), %rbx\nmovq 8(%rbx), %rcx"))
  (a1,), (a2,) = acc[0][1], acc[0][2]
  assert a1[0] == (1, 0, 16)  # A + 16
  assert a2[0] == (1, 0, 8)  # a loaded value is A again: memory is filled with A
  # push, pop: the pop reads what the push stored.
  assert memory_edges(decode_block("53415c")) == [[], [(0, 0)]]  # push rbx; pop r12


def test_unknown_values_and_rip_relative_addresses_never_alias():
  assert edges("imulq %rsi, %rdi\nmovq %rax, (%rdi)\nmovq (%rdi), %rcx") == [[], [], []]
  assert edges("movq %rax, 8(%rip)\nmovq 8(%rip), %rcx") == [[], []]
