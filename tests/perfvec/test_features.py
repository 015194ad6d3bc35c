"""PerfVec's inputs: looped sequences from the Block IR, and layout-free table summaries."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from diffsim.isa import parse_asm
from diffsim.params.sample import sample_params
from diffsim.params.table import load_table
from diffsim.perfvec.features import (FEATURE_NAMES, encode_sequences, instruction_features,
                                      opcode_id, seq_bucket, vocabulary)
from diffsim.perfvec.uarch import (GLOBALS, GLOBALS_WIDTH, MAX_RESOURCES, PER_OPCODE,
                                   PER_OPCODE_WIDTH, RESOURCE_FEATURES, uarch_features)

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
  assert ph.shape == pz.shape == (len(vocabulary()), PER_OPCODE_WIDTH)
  assert gh.shape == gz.shape == (GLOBALS_WIDTH,)
  present = ph[:, len(PER_OPCODE) - 1]
  assert present.sum() > 900 and ph[0].sum() == 0  # present opcodes; unknown row empty
  assert gh[0] == pytest.approx(np.log1p(4)) and gz[0] == pytest.approx(np.log1p(6))
  stacked = sample_params(hsw, 3, seed=0)
  ps, gs = uarch_features(hsw, stacked)
  assert ps.shape == (3,) + ph.shape and gs.shape == (3,) + gh.shape
  np.testing.assert_allclose(gs[:, 0], np.log1p(np.asarray(stacked.dispatch_width)))
  assert not np.allclose(ps[0], ph)


def test_port_structure_says_which_opcodes_share_a_resource():
  """A sampled table that halves one resource (factor 2 on its cycles) moves the
  structure columns of exactly the opcodes that occupy it, and that resource's row."""
  hsw = load_table("haswell")
  P, G, F = len(PER_OPCODE), len(GLOBALS), len(RESOURCE_FEATURES)
  per, glob = uarch_features(hsw)
  incidence = per[:, P:]  # [V, MAX_RESOURCES] log1p(cycles / units)
  R = hsw.params.res_cycles.shape[1]
  assert np.all(incidence[:, R:] == 0) and np.all(glob[G + R * F:] == 0)
  assert R <= MAX_RESOURCES and (incidence[:, :R] > 0).any(0).sum() >= R // 2
  r = int(np.argmax((incidence > 0).sum(0)))  # the most shared resource
  rc = np.array(hsw.params.res_cycles)
  rc[:, r] *= 2
  per2, glob2 = uarch_features(hsw, hsw.params._replace(res_cycles=rc)
                               if hasattr(hsw.params, "_replace")
                               else dataclasses.replace(hsw.params, res_cycles=rc))
  users = incidence[:, r] > 0
  changed = np.any(per2[:, P:] != incidence, -1)
  np.testing.assert_array_equal(changed, users)
  res_rows = glob2[G:].reshape(MAX_RESOURCES, F) != glob[G:].reshape(MAX_RESOURCES, F)
  assert res_rows.any(-1).nonzero()[0].tolist() == [r]
