"""timeline() returns llvm-mca's per-instruction events, consistent with Total Cycles."""

from __future__ import annotations

import numpy as np
import pytest

from diffsim.mca import McaError, run_mca, timeline

pytestmark = pytest.mark.mca


def test_chain_events(llvm_mca):
  # ex1 of diffsim/sim/MODEL.md#worked-examples: add (1 cycle) feeds imul (3 cycles)
  # feeds the next add.
  t = timeline("addl %ecx, %eax\nimull %eax, %eax", "haswell", 10)
  assert t.total_cycles == 43 and t.iterations == 10 and len(t.instructions) == 2
  for a in (t.dispatched, t.ready, t.issued, t.executed, t.retired):
    assert a.shape == (10, 2) and a.dtype == np.int64
  assert t.retired.max() + 1 == t.total_cycles
  np.testing.assert_array_equal(t.issued[0], [1, 2])
  np.testing.assert_array_equal(t.executed[0], [2, 5])
  np.testing.assert_array_equal(t.retired[0], [3, 6])
  # Steady state: one iteration every 4 cycles (1 + 3 on the chain).
  np.testing.assert_array_equal(np.diff(t.issued[:, 1])[2:], 4)
  assert (t.issued >= t.dispatched).all() and (t.executed >= t.issued).all()
  assert (t.retired > t.executed).all() and (t.issued >= t.ready).all()


def test_timeline_matches_run_mca(llvm_mca):
  text = "movl %ecx, (%rdi)\nmovl (%rsi), %eax\naddl %eax, %ecx"
  for extra, want in (((), 108), (("-noalias=false",), 703)):
    t = timeline(text, "haswell", 100, extra_args=extra)
    assert t.total_cycles == want == run_mca([text], "haswell", extra_args=extra)[0].cycles
    assert t.retired.shape == (100, 3)


def test_timeline_errors(llvm_mca):
  with pytest.raises(McaError, match="foo"):
    timeline("foo %eax", "haswell", 2)
  with pytest.raises(McaError):
    timeline("", "haswell", 2)
