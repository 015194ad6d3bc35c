"""The sweep-label cache key: what it must cover so that a cached label is never read
for a table it was not computed on."""

from __future__ import annotations

from diffsim.isa import parse_asm
from diffsim.perfvec.data import Uarch, _digest, uarch_params


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
