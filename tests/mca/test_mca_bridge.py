"""The batch bridge agrees with direct single-block llvm-mca runs and isolates errors."""

from __future__ import annotations

import pytest

from diffsim.mca import McaError, McaResult, run_mca

pytestmark = pytest.mark.mca

# diffsim/sim/MODEL.md#worked-examples: (asm, Total Cycles for N = 1, 10, 100) on haswell.
WORKED = {
  "ex1_chain": ("addl %ecx, %eax\nimull %eax, %eax", (7, 43, 403)),
  "ex2_ports": (
    "vpor %ymm1, %ymm2, %ymm8\nvmulps %ymm1, %ymm2, %ymm9\nmovl $1, %r10d", (8, 15, 82)),
  "ex3_priority": (
    "vaddps %ymm1, %ymm2, %ymm3\nvaddps %ymm1, %ymm2, %ymm4\nvaddps %ymm1, %ymm2, %ymm5\n"
    "imull %eax, %eax\naddl %eax, %ebx\naddl %eax, %ecx", (9, 45, 405)),
  "ex4_dispatch": (
    "movl $1, %eax\nmovl $2, %ebx\nmovl $3, %ecx\nmovl (%rdi), %edx\nmovl 4(%rdi), %esi",
    (9, 20, 132)),
  "ex5_rob": (
    "vmovaps %ymm1, %ymm0\n.rept 16\nvmulps %ymm0, %ymm0, %ymm0\n.endr\n.rept 32\nnop\n.endr",
    (84, 225, 1881)),
  "ex6_zero": ("imull %eax, %eax\nxorl %eax, %eax", (6, 15, 105)),
  "ex7_load": (
    "movq (%rdi,%rbx), %rax\naddq %rax, %rbx\naddq (%rsi), %rbx", (14, 113, 1103)),
  "ex8_store": ("movl %ecx, (%rdi)\nmovl (%rsi), %eax\naddl %eax, %ecx", (9, 18, 108)),
  "ex9_div": ("vdivsd %xmm1, %xmm2, %xmm3", (23, 149, 1409)),
  "ex10_carry": ("vzeroall\naddl %esi, %eax", (11, 65, 605)),
}
EX8_NOALIAS_FALSE = (10, 73, 703)


@pytest.mark.parametrize("iterations", [100, 200])
@pytest.mark.parametrize("mcpu", ["haswell", "znver3"])
def test_batch_matches_direct_runs(real_blocks, direct_mca, mcpu, iterations):
  texts = [text for _, text, _ in real_blocks]
  got = run_mca(texts, mcpu, iterations=iterations, jobs=2)
  want = [direct_mca(t, mcpu, iterations) for t in texts]
  assert [r.cycles for r in got] == want
  assert all(r.error is None for r in got)
  # The shipped labels were made the same way, so they must agree too.
  assert want == [int(labels[f"{mcpu}_{iterations}"]) for _, _, labels in real_blocks]


@pytest.mark.parametrize("n_index, n", [(0, 1), (1, 10), (2, 100)])
def test_worked_examples(llvm_mca, n_index, n):
  names = list(WORKED)
  got = run_mca([WORKED[k][0] for k in names], "haswell", iterations=n)
  assert {k: r.cycles for k, r in zip(names, got)} == {k: WORKED[k][1][n_index] for k in names}
  ex8 = run_mca([WORKED["ex8_store"][0]], "haswell", iterations=n, extra_args=["-noalias=false"])
  assert ex8[0] == McaResult(EX8_NOALIAS_FALSE[n_index], None)


def test_parse_error_is_isolated(real_blocks, direct_mca):
  good = [text for _, text, _ in real_blocks[:4]]
  texts = [good[0], "foo %eax", good[1], good[2] + "\nbar %ecx, %edx", good[3], "  \n# c\n"]
  got = run_mca(texts, "haswell", jobs=1)
  assert got[0].cycles == direct_mca(good[0], "haswell", 100)
  assert got[2].cycles == direct_mca(good[1], "haswell", 100)
  assert got[4].cycles == direct_mca(good[3], "haswell", 100)
  assert got[1].cycles is None and "invalid instruction mnemonic 'foo'" in got[1].error
  assert "foo %eax" in got[1].error
  # The bad line is the block's last: llvm-mca would simulate the rest without it.
  assert got[3].cycles is None and "'bar'" in got[3].error
  assert got[5].cycles is None and "empty block" in got[5].error


def test_rejected_file_is_isolated(llvm_mca, direct_mca):
  # btver2 has no AVX-512 model: llvm-mca rejects the whole file (exit status 1) and
  # names the instruction but no line.
  ok = ["addl %ecx, %eax\nimull %eax, %eax", "vdivsd %xmm1, %xmm2, %xmm3", "nop"]
  texts = [
    ok[0], "vpaddd %zmm0, %zmm1, %zmm2", ok[1], "addl %ecx,%eax\nvpaddd %zmm3,%zmm3,%zmm3", ok[2],
  ]
  got = run_mca(texts, "btver2", jobs=1)
  assert [r.cycles for r in (got[0], got[2], got[4])] == [direct_mca(t, "btver2", 100) for t in ok]
  for bad in (got[1], got[3]):
    assert bad.cycles is None
    assert "unsupported instruction" in bad.error and "vpaddd" in bad.error


def test_chunks_and_jobs_do_not_change_results(real_blocks):
  texts = [text for _, text, _ in real_blocks] + ["foo"] + [WORKED["ex5_rob"][0]]
  one = run_mca(texts, "znver3", chunk=10_000, jobs=1)
  many = run_mca(texts, "znver3", chunk=3, jobs=4)
  assert one == many
  assert one[-1].cycles is not None and one[-2].error is not None


def test_bad_cpu_and_arguments_raise(llvm_mca):
  with pytest.raises(McaError, match="notacpu"):
    run_mca(["nop"], "notacpu")
  with pytest.raises(McaError):
    run_mca(["nop"], "i386")  # listed by -mcpu=help, but without a scheduling model
  with pytest.raises(ValueError):
    run_mca(["nop"], "haswell", iterations=0)
  assert run_mca([], "haswell") == []
  assert run_mca([""], "notacpu")[0].error  # nothing to run: no llvm-mca call


def test_unattributed_errors_fall_back_to_bisection(llvm_mca, direct_mca, monkeypatch):
  # Hide llvm-mca's "note: instruction: ..." lines from the parser, so the rejected file
  # cannot be blamed on a block by text and the chunk must be split in halves instead.
  import diffsim.mca.bridge as bridge

  monkeypatch.setattr(bridge, "_NOTE_INSTR", bridge.re.compile(r"^(?!)"))
  ok = ["addl %ecx, %eax", "imull %eax, %eax", "vdivsd %xmm1, %xmm2, %xmm3", "nop", "pushq %rax"]
  texts = ok[:2] + ["vpaddd %zmm0, %zmm1, %zmm2"] + ok[2:]
  got = run_mca(texts, "btver2", jobs=1)
  assert [r.cycles for r in got[:2] + got[3:]] == [direct_mca(t, "btver2", 100) for t in ok]
  assert got[2].cycles is None and "unsupported instruction" in got[2].error


def test_directives_and_labels_run_alone(llvm_mca, direct_mca):
  texts = [
    "addl %ecx, %eax",
    ".rept 3\naddl %ecx, %eax",  # unterminated: would swallow the next regions' markers
    "imull %eax, %eax",
    "top:\naddl %eax, %eax\njmp top",
    "addl %ecx, %eax ; imull %eax, %eax  # two statements, one comment",
  ]
  got = run_mca(texts, "haswell", jobs=1)
  assert got[0].cycles == direct_mca(texts[0], "haswell", 100)
  assert got[1].cycles is None and ".endr" in got[1].error
  assert got[2].cycles == direct_mca(texts[2], "haswell", 100)
  assert got[3].cycles == direct_mca(texts[3], "haswell", 100)
  assert got[4].cycles == direct_mca("addl %ecx, %eax\nimull %eax, %eax", "haswell", 100)
