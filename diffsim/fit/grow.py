"""Growing a table's resources where the fit asks for more capacity than it has.

A fit can only round resource cycles to integers, and a resource in use holds at
least one cycle. When the data say a kind of unit is more plentiful than the table
has (Zen 5's six ALUs against Zen 3's four), the soft fit pushes the cycles of every
opcode on that group below one: the group's throughput, members / cycles, is what the
gradient can change. `suggest` reads that off the learned table: a group whose
usage-weighted cycles fell to a fraction r of the initial ones wants members / r
units. `grow` adds them (`diffsim.params.export.grow_table`) and resets those cycles
to their initial integers, so the next fit starts from a table that can express it.
"""

from __future__ import annotations

import numpy as np

from diffsim.params.export import MAX_UNITS, grow_table
from diffsim.params.table import Params, Table


def usage(table: Table, minibatches) -> np.ndarray:
  """[K] how many training instructions have each opcode."""
  counts = np.zeros(len(table.layout.keys))
  for mb in minibatches:
    real = (mb.weight > 0)[:, None] & np.asarray(mb.batch.valid)
    np.add.at(counts, np.asarray(mb.batch.opcode)[real], 1)
  return counts


def suggest(table: Table, learned: Params, init: Params, counts, threshold: float = 0.8,
            min_uses: int = 20) -> dict[str, int]:
  """{group: extra units} for groups whose learned cycles fell below `threshold` x
  the initial ones (weighted by use; groups used fewer than `min_uses` times are
  left alone), at most doubling a group."""
  U = len(table.layout.units)
  lrn = np.asarray(learned.res_cycles)[:, U:]
  ini = np.asarray(init.res_cycles)[:, U:]
  out = {}
  for g, name in enumerate(table.layout.groups):
    used = ini[:, g] > 0
    w = counts * used
    if w.sum() < min_uses:
      continue
    ratio = float(np.sum(w * lrn[:, g]) / np.sum(w * ini[:, g]))
    members = bin(table.layout.group_members[g]).count("1")
    if ratio < threshold:
      out[name] = int(min(members, round(members / max(ratio, 1e-3)) - members))
  return {k: v for k, v in sorted(out.items(), key=lambda kv: -kv[1]) if v > 0}


def grow(table: Table, learned: Params, init: Params, plan: dict[str, int]):
  """Applies `plan` while the table has room for the units (at most MAX_UNITS).

  Returns:
    (grown table, its float params with the grown groups' cycles reset to the
    initial table's, the plan actually applied).
  """
  U = len(table.layout.units)
  params = learned.replace(res_cycles=np.asarray(learned.res_cycles).copy())
  for g, name in enumerate(table.layout.groups):
    if name in plan:
      params.res_cycles[:, U + g] = np.where(np.asarray(init.res_cycles)[:, U + g] > 0,
                                             np.asarray(init.res_cycles)[:, U + g], 0)
  applied = {}
  for name, extra in plan.items():
    extra = min(extra, MAX_UNITS - len(table.layout.units))
    if extra <= 0:
      continue
    table, params = grow_table(table, params, name, extra)
    applied[name] = extra
  return table, params, applied
