"""Anchors: single instructions that pin a table's per-opcode numbers."""

import numpy as np
import pytest

from diffsim.fit.anchors import chained, chains, operand_form, pick
from diffsim.fit.exact import Move, apply
from diffsim.isa import parse_asm
from diffsim.params.table import load_table


@pytest.mark.parametrize("text, want", [
    ("imulq %rcx, %r9", "imulq %r9, %r9"),
    ("vaddpd %ymm1, %ymm2, %ymm0", "vaddpd %ymm0, %ymm2, %ymm0"),
    ("movl 420(%r13), %edx", "movl 420(%rdx), %edx"),  # a pointer chase
    ("leaq 8(%rdi,%rax,4), %rcx", "leaq 8(%rcx,%rax,4), %rcx"),
    ("movzbl %al, %ecx", None),  # no source of the destination's kind, no memory
    ("movb (%rax), %cl", None),  # an 8-bit load cannot chase a pointer
    ("movq %rax, 8(%rbx)", None),  # a store writes no register
])
def test_chained_reads_its_own_destination(text, want):
  assert chained(text) == want


def test_chains_keep_the_opcode_and_read_what_they_write():
  block = parse_asm("imulq $3, %rcx, %r9; addq %rcx, %rax; vmulps %xmm1, %xmm2, %xmm3;"
                    "movq 8(%rbx), %rax; pushq %rbp")
  rows = pick([block])
  got = {key: text for key, _, text in chains(rows)}
  # addq already reads rax; pushq writes only rsp, which it reads: neither is rewritten
  assert got == {"IMUL64rri8": "imulq $3, %r9, %r9", "VMULPSrr": "vmulps %xmm3, %xmm2, %xmm3",
                 "MOV64rm": "movq 8(%rax), %rax"}
  assert operand_form(got["MOV64rm"]) == "movq N(R), R"


@pytest.mark.mca
def test_a_chained_anchor_runs_at_the_latency_under_llvm_mca():
  """The point of chaining: llvm-mca's skylake runs a 3-operand `imulq` alone at one
  a cycle, and its chained form at the 3-cycle latency."""
  from diffsim.cli import mca_predict

  text = "imulq $3, %rcx, %r9"
  blocks = [parse_asm(text), parse_asm(chained(text))]
  (free, _), (chain, _) = mca_predict(blocks, "skylake", 100, "steady", False)
  assert free == pytest.approx(100, abs=2) and chain == pytest.approx(300, abs=2)


def test_long_latencies_and_cycles_move_by_a_sixteenth():
  """A divide 22 cycles off is reachable in a few moves; short rows step by 1."""
  table = load_table("skylake")
  p = {k: np.array(v) for k, v in vars(table.params).items()}
  k_div, k_add = table.layout.index["DIV64r"], table.layout.index["ADD64rr"]
  before = p["latency"][k_div].max()
  assert apply(p, k_div, Move("latency", +1))
  assert p["latency"][k_div].max() == before + before // 16
  lat = p["latency"][k_add].max()
  assert apply(p, k_add, Move("latency", +1)) and p["latency"][k_add].max() == lat + 1
  used = p["res_cycles"][k_div] > 0
  cyc = p["res_cycles"][k_div].copy()
  assert apply(p, k_div, Move("cycles", -1))
  np.testing.assert_array_equal(p["res_cycles"][k_div][used],
                                np.maximum(cyc[used] - max(1, int(cyc.max()) // 16), 1))
