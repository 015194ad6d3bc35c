"""Which loads read an older store's bytes, with every GPR starting at one address."""

from diffsim.isa import decode_block, parse_asm
from diffsim.isa.encode import _through_memory, dependencies
from diffsim.isa.memory import accesses, memory_edges
from diffsim.params.table import READ_CLASSES, WRITE_ROLES


def edges(asm: str):
  return memory_edges(parse_asm(asm))


def test_a_load_after_a_store_to_the_same_bytes_depends_on_it():
  # The same address written the same way, from a register: renamable.
  assert edges("movq %rax, 8(%rdi)\nmovq 8(%rdi), %rcx") == [[], [(0, 0, True)]]


def test_different_registers_alias_because_every_register_holds_the_same_address():
  # The harness points every GPR but rsp at A: 8(%rdi) and 8(%rsi) are the same bytes.
  assert edges("movq %rax, 8(%rdi)\nmovq 8(%rsi), %rcx") == [[], [(0, 0, False)]]
  # ... but 16(%rsi) is not, and neither is a stack slot.
  assert edges("movq %rax, 8(%rdi)\nmovq 16(%rsi), %rcx") == [[], []]
  assert edges("movq %rax, 8(%rdi)\nmovq 8(%rsp), %rcx") == [[], []]


def test_partial_overlap_counts_and_the_youngest_store_wins():
  assert edges("movl %eax, 8(%rdi)\nmovl %ebx, 8(%rdi)\nmovq 4(%rdi), %rcx") == \
      [[], [], [(1, 0, False)]]


def test_read_modify_write_depends_on_the_previous_iteration():
  assert edges("addl $1, 8(%rdi)") == [[(0, 1, True)]]  # the same rdi: renamable
  # The pointer moves 8 bytes an iteration: the 4-byte accesses no longer meet.
  assert edges("addl $1, 8(%rdi)\naddq $8, %rdi") == [[], []]
  # ... but one byte an iteration they do.
  assert edges("addl $1, 8(%rdi)\nincq %rdi") == [[(0, 1, False)], []]  # rdi rewritten


def test_register_values_follow_moves_leas_loads_and_the_stack():
  acc = accesses(parse_asm("leaq 16(%rdi), %rax\nmovq (%rax), %rbx\nmovq 8(%rbx), %rcx"))
  (a1,), (a2,) = acc[0][1], acc[0][2]
  assert a1[0] == (1, 0, 16)  # A + 16
  assert a2[0] == (1, 0, 8)  # a loaded value is A again: memory is filled with A
  # push, pop: the pop reads what the push stored.
  assert memory_edges(decode_block("53415c")) == [[], [(0, 0, True)]]  # push rbx; pop r12


def test_unknown_values_and_rip_relative_addresses_never_alias():
  assert edges("imulq %rsi, %rdi\nmovq %rax, (%rdi)\nmovq (%rdi), %rcx") == [[], [], []]
  assert edges("movq %rax, 8(%rip)\nmovq 8(%rip), %rcx") == [[], []]


def _deps(asm: str):
  block = parse_asm(asm)
  plain = [[(*e, -1, 0, 1 << 30) for e in ds] for ds in dependencies(block)]
  return {(c, p, dist, WRITE_ROLES[role], READ_CLASSES[cls])
          for c, ds in enumerate(_through_memory(block, plain))
          for p, dist, role, cls, *_ in ds}


def test_a_forwarded_load_waits_for_the_stores_data_and_a_renamed_ones_readers_skip_it():
  # Different registers, one address: forwarded. The load (0) waits for the store (1)
  # and for the store's data, its own result of the iteration before.
  fwd = _deps("movq (%r12), %rdi\nmovq %rdi, (%rbx)")
  assert (0, 1, 1, "MEM", "mem") in fwd and (0, 0, 1, "op0", "mem") in fwd
  # The same address written the same way: the and (1) reads the or (2) of the iteration
  # before directly, not the load (0).
  ren = _deps("movl (%r9), %eax\nandl $-4, %eax\norl $1, %eax\nmovl %eax, (%r9)")
  assert not any(c == 0 and cls == "mem" for c, p, dist, role, cls in ren)
  assert not any(c == 1 and p == 0 for c, p, *_ in ren)
  assert any(c == 1 and p == 2 and dist == 1 for c, p, dist, *_ in ren)


def test_pointers_at_different_strides_meet_only_at_the_start():
  # rsi and rdi start at one address, then part: no edge in the steady state.
  assert edges("movq %rax, (%rdi)\nmovq (%rsi), %rax\naddq $8, %rsi\naddq $16, %rdi") == \
      [[], [], [], []]
  assert edges("movq %rax, (%rdi)\nmovq (%rsi), %rax\naddq $8, %rsi\naddq $8, %rdi") == \
      [[], [(0, 0, False)], [], []]


def test_the_simulator_runs_forwarded_chains_renamed_shortcuts_and_unordered_stores():
  """zen5-facts (memory dependences on, forwarding 2 cycles, loads 5): through another
  register the value goes around memory (5 + 2 cycles an iteration); written back to
  the same address, renaming leaves only the ALU chain; and a store no longer waits
  for older loads to issue (llvm-mca's ordering would chain the next iteration's load
  behind this one's pointer chase)."""
  from diffsim.params.table import load_table
  from diffsim.sim import simulate_blocks

  table = load_table("zen5-facts")
  asm = ["movq (%r12), %rdi\nmovq %rdi, (%rbx)",
         "movl (%r9), %eax\naddl $1, %eax\naddl $2, %eax\nmovl %eax, (%r9)",
         "movq %rax, 64(%rbx)\nmovq 64(%r12), %rdx\ncmpq $0, 8(%rdx)"]
  got = [p.cycles for p in simulate_blocks(table, [parse_asm(a) for a in asm], throughput="steady")]
  assert got[0] == 700 and got[1] == 200 and got[2] < 200


def test_intel_renames_by_address_and_forwards_what_it_cannot_rename():
  """`RENAMING["address"]`, as measured on the Xeon 6 (cycles an iteration there)."""
  def renamed(asm: str, policy: str = "address") -> list[bool]:
    return [r for es in memory_edges(parse_asm(asm), policy) for *_, r in es]

  # Another base register, one address: Intel renames (0.6 cycles), Zen 5 forwards.
  assert renamed("movq %rax, 8(%rbx)\nmovq 8(%rcx), %rax") == [True]
  assert renamed("movq %rax, 8(%rbx)\nmovq 8(%rcx), %rax", "operand") == [False]
  # An indexed address: forwarded (5.0), though Zen 5's rule renames it.
  assert renamed("movq %rax, 8(%rbx,%rcx)\nmovq 8(%rbx,%rcx), %rax") == [False]
  assert renamed("movq %rax, 8(%rbx,%rcx)\nmovq 8(%rbx,%rcx), %rax", "operand") == [True]
  # A narrower load renames (0.6); a wider one, 16-bit and vector data do not.
  assert renamed("movq %rax, 8(%rbx)\nmovl 8(%rbx), %eax") == [True]
  assert renamed("movl %eax, 8(%rbx)\nmovq 8(%rbx), %rax") == [False]
  assert renamed("movw %ax, 8(%rbx)\nmovzwl 8(%rbx), %eax") == [False]
  assert renamed("vmovups %xmm0, 8(%rbx)\nvmovups 8(%rbx), %xmm0") == [False]
  # Read-modify-writes: with an immediate renamed (1.0), with a register forwarded (7.4).
  assert renamed("addq $1, 8(%rbx)") == [True]
  assert renamed("addq %rcx, 8(%rbx)") == [False]
  # push then pop through the stack engine: renamed (`push; pop; imul` 3.05).
  assert renamed("pushq %rax\npopq %rcx\nimulq %rcx, %rax") == [True]


def test_the_renaming_policy_is_a_checked_table_field():
  import pytest

  from diffsim.params.table import from_json, load_json

  doc = load_json("graniterapids-facts")
  assert from_json(doc).layout.memory_renaming == "address"
  doc["global"]["memory_renaming"] = "bytes"
  with pytest.raises(ValueError, match="memory_renaming 'bytes'"):
    from_json(doc)


def test_each_load_keeps_its_l1_banks_within_two_loads_a_cycle():
  """`bank_edges` with 2 loads a bank a cycle (the Xeon 6): banks are 4 bytes of a
  64-byte line, so 8 and 72 share one and 8 and 12 do not. A load whose banks take n
  loads an iteration waits n cycles after its own instance two iterations back."""
  from diffsim.isa.memory import bank_edges

  def banks(asm: str):
    return bank_edges(parse_asm(asm), 2)

  assert banks("movq 8(%rbx), %rax") == [[(0, 2, 1)]]
  assert banks("movq 8(%rbx), %rax\nmovq 72(%rbx), %rcx") == [[(0, 2, 2)], [(1, 2, 2)]]
  # An 8-byte load covers two banks, so one at 12 meets one at 8; a 4-byte one does not.
  assert banks("movq 8(%rbx), %rax\nmovq 12(%rbx), %rcx") == [[(0, 2, 2)], [(1, 2, 2)]]
  assert banks("movl 8(%rbx), %eax\nmovl 12(%rbx), %ecx\nmovl 72(%rbx), %edx") == [
      [(0, 2, 2)], [(1, 2, 1)], [(2, 2, 2)]]
  # A pointer that walks the line spreads its loads over the banks: no edge.
  assert banks("movq (%rbx), %rax\naddq $8, %rbx") == [[], []]


def test_stores_commit_two_a_cycle_to_one_line_and_one_to_others():
  """`commit_cycles` over `COMMIT_ITERATIONS` iterations, against the Xeon 6's cycles per
  100 iterations (`diffsim measure`): one store 50, two 8 bytes apart 100 and 64 apart
  200, four to two lines 200 in pairs and 400 alternating, three lines 300, a store
  across a line boundary 200. Registers all start at one address, so 8(%rcx) is in
  (%rbx)'s line; a store of unknown address costs nothing."""
  from diffsim.isa.memory import COMMIT_ITERATIONS, commit_cycles, commit_edges

  def per_100(asm: str) -> float:
    return 100 * commit_cycles(parse_asm(asm), 2) / COMMIT_ITERATIONS

  measured = {"movq $1, (%rbx)": 50, "movq $1, (%rbx); movq $2, 8(%rbx)": 100,
              "movq $1, (%rbx); movq $2, 64(%rbx)": 200,
              "movq $1, (%rbx); movq $2, 8(%rbx); movq $1, 64(%rbx); movq $2, 72(%rbx)": 200,
              "movq $1, (%rbx); movq $1, 64(%rbx); movq $2, 8(%rbx); movq $2, 72(%rbx)": 400,
              "movq $1, (%rbx); movq $2, 64(%rbx); movq $1, 128(%rbx)": 300,
              "movq $1, 60(%rbx)": 200, "movq $1, (%rbx); movq $2, 8(%rcx)": 100}
  assert {a: per_100(a) for a in measured} == measured
  # Three stores to one line: two a cycle at most.
  assert per_100("movq $1, (%rbx); movq $2, 8(%rbx); movq $3, 16(%rbx)") == 150
  # Each store waits for its own instance as few iterations back as the rate allows.
  assert commit_edges(parse_asm("movq $1, (%rbx); addq $1, %rax; movq %rax, 64(%rbx)"), 2) == [
      [(0, 1, 2)], [], [(2, 1, 2)]]
  assert commit_edges(parse_asm("movq $1, (%rbx)"), 2) == [[(0, 2, 1)]]
  assert commit_edges(parse_asm("movq $1, (%rbx); movq $2, 8(%rbx); movq $3, 16(%rbx)"), 2) == [
      [(c, 2, 3)] for c in range(3)]
  # A pointer the tracking cannot follow (a product): its store's address is unknown.
  assert commit_edges(parse_asm("imulq $3, %rbx, %rcx; movq %rax, 8(%rcx)"), 2) == [[], []]
