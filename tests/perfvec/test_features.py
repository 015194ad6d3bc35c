"""PerfVec's inputs: looped sequences from the Block IR, and layout-free table summaries."""

from __future__ import annotations

import numpy as np
import pytest

from diffsim.isa import parse_asm
from diffsim.params.sample import sample_params
from diffsim.params.table import load_table
from diffsim.perfvec.features import (FEATURE_NAMES, encode_sequences, instruction_features,
                                      opcode_id, seq_bucket, vocabulary)
from diffsim.perfvec.uarch import GLOBALS, PER_OPCODE, uarch_features

COL = {n: i for i, n in enumerate(FEATURE_NAMES)}


def test_looped_sequence_counts_the_second_copy_only():
  block = parse_asm("addq $1, %rax\nimulq %rax, %rbx\nmovq (%rbx), %rcx")
  seq = encode_sequences([block], 16)
  ids = [opcode_id(i.key) for i in block.instrs]
  assert seq.opcode[0, :6].tolist() == ids * 2 and not seq.opcode[0, 6:].any()
  assert seq.valid[0].tolist() == [True] * 6 + [False] * 10
  assert seq.counted[0].tolist() == [False] * 3 + [True] * 3 + [False] * 10
  assert all(i > 0 for i in ids)  # all three opcodes are in the corpus vocabulary


def test_dependency_distances_follow_the_loop():
  block = parse_asm("addq $1, %rax\nimulq %rax, %rbx\nmovq (%rbx), %rcx")
  f = instruction_features(block)
  # add reads rax, written by itself one iteration back: 3 instructions back.
  assert f[0, COL["src0_dist"]] == pytest.approx(1 / 3)
  assert f[0, COL["carried"]] == 1
  # imul reads rbx (itself, 3 back) and rax (add, 1 back).
  assert sorted(f[1, [COL["src0_dist"], COL["src1_dist"]]]) == pytest.approx([1 / 3, 1.0])
  # the load's address register rbx comes from imul, one back, in the same iteration.
  assert f[2, COL["addr_dist"]] == 1.0 and f[2, COL["loads"]] == 1
  assert f[2, COL["carried"]] == 0


def test_unknown_opcode_and_bad_blocks():
  assert opcode_id("NOT_AN_OPCODE") == 0 and vocabulary()[0] == "<unknown>"
  assert opcode_id("XOR32rr@same") > 0
  assert seq_bucket(8) == 16 and seq_bucket(9) == 32
  with pytest.raises(ValueError, match="at most 256"):
    seq_bucket(300)
  long_block = parse_asm("\n".join(["addq $1, %rax"] * 10))
  with pytest.raises(ValueError, match="block 0 has 10 instructions"):
    encode_sequences([long_block], 16)


def test_uarch_features_are_layout_free_and_track_the_table():
  hsw, zn3 = load_table("haswell"), load_table("znver3")
  ph, gh = uarch_features(hsw)
  pz, gz = uarch_features(zn3)
  assert ph.shape == pz.shape == (len(vocabulary()), len(PER_OPCODE))
  assert gh.shape == gz.shape == (len(GLOBALS),)
  assert ph[:, -1].sum() > 900 and ph[0].sum() == 0  # present opcodes; unknown row empty
  assert gh[0] == pytest.approx(np.log1p(4)) and gz[0] == pytest.approx(np.log1p(6))
  stacked = sample_params(hsw, 3, seed=0)
  ps, gs = uarch_features(hsw, stacked)
  assert ps.shape == (3,) + ph.shape and gs.shape == (3,) + gh.shape
  np.testing.assert_allclose(gs[:, 0], np.log1p(np.asarray(stacked.dispatch_width)))
  assert not np.allclose(ps[0], ph)
