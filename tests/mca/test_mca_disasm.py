"""llvm-mc disassembly: exact blocks come back as text, broken ones as error rows."""

from __future__ import annotations

import pytest

from diffsim.mca import Disassembly, disassemble

pytestmark = pytest.mark.mca


def test_blocks_and_errors(llvm_mca):
  got = disassemble([
    "01c8",                # addl %ecx, %eax
    "0f0b01c8",            # holds a ud2 itself: disassembled alone
    "01c848",              # ends in a bare REX prefix: not a whole instruction
    "4b8b0cf44885c978",    # cut in the middle of an instruction
    "F00FB10A",            # lock cmpxchg, upper case
    "zz",
    "",
  ])
  assert got[0] == Disassembly("addl\t%ecx, %eax", None)
  assert got[1] == Disassembly("ud2\naddl\t%ecx, %eax", None)
  assert got[2].text is None and "invalid instruction encoding at byte 2" in got[2].error
  assert got[3].text is None and "invalid instruction encoding" in got[3].error
  assert got[4] == Disassembly("lock\ncmpxchgl\t%ecx, (%rdx)", None)
  assert got[5].error and got[6].error


def test_neighbours_unaffected_by_a_broken_block(llvm_mca):
  alone = [disassemble([h])[0] for h in ("01c8", "4801c8", "c5f459c2")]
  together = disassemble(["01c8", "01c848", "4801c8", "4b8b0c", "c5f459c2"], jobs=1)
  assert [together[0], together[2], together[4]] == alone
  assert together[1].error and together[3].error
