"""The collector pause around bulk decoding and encoding gives the collector back."""

from __future__ import annotations

import gc

import pytest

from diffsim.isa import decode_blocks
from diffsim.isa.encode import encode
from diffsim.isa.heap import collector_paused


def test_collector_paused_restores_the_state_it_found():
  assert gc.isenabled()
  with collector_paused():
    assert not gc.isenabled()
  assert gc.isenabled()
  gc.disable()
  try:
    with collector_paused():
      pass
    assert not gc.isenabled()  # a caller's own pause outlives ours
  finally:
    gc.enable()


def test_decoding_and_a_failed_encoding_leave_the_collector_on():
  blocks = decode_blocks(["4801d8", "zz"])  # add %rbx,%rax; not hex
  assert gc.isenabled()
  with pytest.raises(KeyError, match="block 0"):
    encode([blocks[0]], {"NOP": 0})
  assert gc.isenabled()
