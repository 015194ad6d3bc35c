"""Shared checks for the simulator tests."""

import numpy as np
import pytest


@pytest.fixture(scope="session")
def assert_timeline_is_llvm_mcas(llvm14):
  """Checks one block's hard timeline against llvm-mca 14's, cycle by cycle: the Total
  Cycles and every instruction's dispatch, issue and retire cycle."""
  from diffsim.isa import parse_asm
  from diffsim.mca import timeline as mca_timeline
  from diffsim.sim.api import timeline

  def check(table, asm: str, iterations: int = 6):
    block = parse_asm(asm)
    cycles, ours = timeline(table, block, iterations)
    ref = mca_timeline(block.text, table.layout.cpu, iterations)
    assert cycles == ref.total_cycles, asm
    np.testing.assert_array_equal(ours[..., 0], ref.dispatched, err_msg=asm)
    np.testing.assert_array_equal(ours[..., 1], ref.issued, err_msg=asm)
    np.testing.assert_array_equal(ours[..., 2], ref.retired, err_msg=asm)
  return check
