"""The sweep-label cache: what its key must cover so that a cached label is never read
for a table it was not computed on, and what it reuses."""

from __future__ import annotations

import numpy as np

from diffsim.isa import parse_asm
from diffsim.perfvec.data import Uarch, _digest, sweep_labels, uarch_params
from diffsim.sim import programs


def test_label_cache_key_covers_the_tables_values_not_just_their_names():
  blocks = [parse_asm("addq $1, %rax\nimulq %rax, %rbx")]
  uarchs = [Uarch("haswell", 0, 0), Uarch("haswell", 1, 0)]
  table, params = uarch_params(uarchs)
  key = _digest(blocks, uarchs, 20, (params, table.structure))
  assert key == _digest(blocks, uarchs, 20, (params, table.structure))
  # The same names over other values (a changed sampler, a rebuilt table): another key.
  slower = params.replace(latency=params.latency + 1)
  assert key != _digest(blocks, uarchs, 20, (slower, table.structure))
  flags = table.structure.replace(move_elim=~table.structure.move_elim)
  assert key != _digest(blocks, uarchs, 20, (params, flags))
  assert key != _digest(blocks, uarchs, 40, (params, table.structure))
  assert key != _digest(blocks[:0], uarchs, 20, (params, table.structure))


def test_label_cache_key_covers_the_simulator_source(monkeypatch):
  # A corrected decoder, table loader or simulator relabels (the labels are its output).
  blocks = [parse_asm("addq $1, %rax")]
  uarchs = [Uarch("haswell", 0, 0)]
  table, params = uarch_params(uarchs)
  key = _digest(blocks, uarchs, 20, (params, table.structure))
  monkeypatch.setattr(programs, "source_digest", lambda *packages: "edited")
  assert key != _digest(blocks, uarchs, 20, (params, table.structure))


def test_a_sweep_with_more_tables_reuses_the_chunks_it_shares(tmp_path):
  """Chunks are cached by their own tables: adding samples labels only the new chunk,
  and the shared chunks' labels are those of the first sweep."""
  blocks = [parse_asm("addq $1, %rax\nimulq %rax, %rbx"), parse_asm("movq (%rdi), %rdi")]
  first = [Uarch("haswell")] + [Uarch("haswell", i, 0) for i in range(3)]
  said = []
  a = sweep_labels(blocks, first, tmp_path, chunk=2, progress=False, log=said.append)
  more = first + [Uarch("haswell", i, 0) for i in range(3, 5)]
  b = sweep_labels(blocks, more, tmp_path, chunk=2, progress=False, log=said.append)
  assert said[0].startswith("labelled 8 ") and said[1].startswith("labelled 4 ")
  assert np.isfinite(b).all() and np.array_equal(a, b[:4])
