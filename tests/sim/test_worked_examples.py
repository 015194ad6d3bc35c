"""The ten worked examples of diffsim/sim/MODEL.md#worked-examples, cycle-exact.

Total Cycles for 1, 10 and 100 iterations under llvm-mca 14's haswell model, as that
section gives them (each was produced by llvm-mca 14.0.6). The haswell table is the
shipped one, extracted from llvm-mca itself, so these check the simulator and the
extraction together.
"""

import numpy as np
import pytest

from diffsim.isa import parse_asm
from diffsim.params.table import load_table
from diffsim.sim import encode, simulate

EXAMPLES = {
    "ex1_chain": ("addl %ecx, %eax; imull %eax, %eax", (7, 43, 403)),
    "ex2_ports": ("vpor %ymm1, %ymm2, %ymm8; vmulps %ymm1, %ymm2, %ymm9; movl $1, %r10d",
                  (8, 15, 82)),
    "ex3_priority": ("vaddps %ymm1, %ymm2, %ymm3; vaddps %ymm1, %ymm2, %ymm4; "
                     "vaddps %ymm1, %ymm2, %ymm5; imull %eax, %eax; addl %eax, %ebx; "
                     "addl %eax, %ecx", (9, 45, 405)),
    "ex4_dispatch": ("movl $1, %eax; movl $2, %ebx; movl $3, %ecx; movl (%rdi), %edx; "
                     "movl 4(%rdi), %esi", (9, 20, 132)),
    "ex5_rob": ("vmovaps %ymm1, %ymm0; " + "vmulps %ymm0, %ymm0, %ymm0; " * 16
                + "; ".join(["nop"] * 32), (84, 225, 1881)),
    "ex6_zero": ("imull %eax, %eax; xorl %eax, %eax", (6, 15, 105)),
    "ex7_load": ("movq (%rdi,%rbx), %rax; addq %rax, %rbx; addq (%rsi), %rbx", (14, 113, 1103)),
    "ex8_store": ("movl %ecx, (%rdi); movl (%rsi), %eax; addl %eax, %ecx", (9, 18, 108)),
    "ex9_div": ("vdivsd %xmm1, %xmm2, %xmm3", (23, 149, 1409)),
    "ex10_carry": ("vzeroall; addl %esi, %eax", (11, 65, 605)),
}


@pytest.fixture(scope="module")
def haswell():
  return load_table("haswell")


@pytest.fixture(scope="module")
def batch(haswell):
  blocks = [parse_asm(asm) for asm, _ in EXAMPLES.values()]
  return encode(haswell, blocks)


@pytest.mark.parametrize("fast_forward", [False, True])
@pytest.mark.parametrize("column,iterations", [(0, 1), (1, 10), (2, 100)])
def test_total_cycles_match_llvm_mca(haswell, batch, column, iterations, fast_forward):
  cycles, codes = simulate(haswell, batch, iterations=iterations, fast_forward=fast_forward)
  expected = np.array([want[column] for _, want in EXAMPLES.values()])
  assert not codes.any()
  np.testing.assert_array_equal(cycles, expected, err_msg=str(list(EXAMPLES)))
