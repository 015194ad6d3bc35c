"""The CPUs that search meta-trains on and is evaluated on.

Meta-training sees two llvm-mca models (haswell, znver3) and tables sampled around each
(`diffsim.params.sample`). Held out from it: llvm-mca's skylake model, the `zen5` table
learned from real Zen 5 measurements, and tables sampled around those two with other
seeds. Each group is one base table and a stack of parameter sets of its layout, so a
group is enumerated by one `simulate_sweep`.
"""

from __future__ import annotations

import dataclasses

import jax
import numpy as np


@dataclasses.dataclass(frozen=True)
class CpuGroup:
  """Parameter sets sharing one layout: `names[i]` is `table_at(base, stacked, i)`."""

  names: tuple[str, ...]
  base: object  # Table
  stacked: object  # Params with a leading axis [P]

  def tables(self) -> list:
    from diffsim.params.sample import table_at

    return [table_at(self.base, self.stacked, i) for i in range(len(self.names))]


def _group(cpu: str, samples: int, seed: int, *, with_base: bool) -> CpuGroup:
  from diffsim.params.table import load_table
  from diffsim.params.sample import sample_params

  base = load_table(cpu)
  sets, names = [], []
  if with_base:
    sets.append(jax.tree.map(np.asarray, base.params))
    names.append(cpu)
  if samples:
    stacked = sample_params(base, samples, seed)
    sets += [jax.tree.map(lambda x, i=i: np.asarray(x)[i], stacked) for i in range(samples)]
    names += [f"{cpu}~s{seed}.{i}" for i in range(samples)]
  return CpuGroup(tuple(names), base, jax.tree.map(lambda *x: np.stack(x), *sets))


def training_groups(samples: int = 7) -> list[CpuGroup]:
  """haswell and znver3, each with `samples` tables sampled around it."""
  return [_group("haswell", samples, 11, with_base=True),
          _group("znver3", samples, 12, with_base=True)]


def heldout_groups(samples: int = 4) -> list[CpuGroup]:
  """skylake and zen5 (never seen in meta-training), then tables sampled around them."""
  return [_group("skylake", 0, 0, with_base=True), _group("zen5", 0, 0, with_base=True),
          _group("skylake", samples, 21, with_base=False),
          _group("zen5", samples, 22, with_base=False)]
