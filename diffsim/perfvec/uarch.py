"""What the microarchitecture encoder sees of a parameter table, whatever its layout.

Tables of different CPUs name different units and groups (haswell's HWPort0156 has no
Zen 3 counterpart), so the encoder reads each table through a layout-free summary:
- per vocabulary opcode (`features.vocabulary`): latency (the largest over write
  roles), micro-ops, reciprocal throughput (the busiest resource's cycles divided by
  its unit count), the largest read-advance, and whether the table has the opcode;
- globals: dispatch and retire widths, reorder buffer, load and store queues, total
  scheduler entries, physical registers, units.
- the port structure, which opcodes share which resources: per opcode, its resource-cycle
  vector over the table's resource columns (up to `MAX_RESOURCES`), each entry
  log1p(cycles / units), 0 where unused; per resource (up to `MAX_RESOURCES`), its units, whether
  it is a group, how many opcodes use it and their summed weight. The encoder pools
  opcodes into resources and back (`model.UarchEncoder`), so that a sampled table that
  halves one port group changes every opcode that shares it, and no other.
Sizes enter as log1p, so that a table twice as wide moves every input by the same step.

The same per-opcode summary of fixed reference tables (`reference_costs`) is what the
program encoder knows of each opcode's cost, whatever uarch it later predicts for.
"""

from __future__ import annotations

import functools

import numpy as np

from diffsim.params.table import Params, Table, load_table
from diffsim.perfvec.features import opcode_id, vocabulary

PER_OPCODE = ("latency", "uops", "recip_throughput", "read_advance", "present")
GLOBALS = ("dispatch_width", "retire_width", "rob_size", "load_queue", "store_queue",
           "scheduler_entries", "registers", "units")
MAX_RESOURCES = 48  # resource columns (units + groups) a table may have (zen5: 47)
RESOURCE_FEATURES = ("units", "group", "users", "load")
# Column layout of the encoder's inputs: per opcode, PER_OPCODE then the MAX_RESOURCES
# resource weights; globals, GLOBALS then MAX_RESOURCES x RESOURCE_FEATURES.
PER_OPCODE_WIDTH = len(PER_OPCODE) + MAX_RESOURCES
GLOBALS_WIDTH = len(GLOBALS) + MAX_RESOURCES * len(RESOURCE_FEATURES)


def _units_per_resource(table: Table) -> np.ndarray:
  """[R] units behind each resource column: 1 for a unit, the member count for a group."""
  lay = table.layout
  return np.array([1] * len(lay.units) + [bin(m).count("1") for m in lay.group_members],
                  np.float32)


def uarch_features(table: Table, params: Params | None = None) -> tuple[np.ndarray, np.ndarray]:
  """The encoder's inputs for `table`, or for `params` of its layout stacked on
  leading axes (a sweep's sampled tables).

  Returns:
    (per_opcode [..., V, PER_OPCODE_WIDTH], globals [..., GLOBALS_WIDTH]) float32, in
    the column layout above.

  Raises:
    ValueError: the table has more than MAX_RESOURCES resources.
  """
  p = table.params if params is None else params
  lead = np.shape(p.dispatch_width)
  V = len(vocabulary())
  rows = np.full(V, -1)
  supported = np.asarray(table.structure.supported)
  for k, key in enumerate(table.layout.keys):
    v = opcode_id(key)
    if v and supported[k] and (rows[v] < 0 or key == vocabulary()[v]):
      rows[v] = k
  have = rows >= 0
  take = lambda x: np.asarray(x, np.float32)[..., np.maximum(rows, 0), :]  # noqa: E731
  lat = take(p.latency).max(-1)
  uops = np.asarray(p.uops, np.float32)[..., np.maximum(rows, 0)]
  recip = (take(p.res_cycles) / _units_per_resource(table)).max(-1)
  ra = take(p.read_advance).max(-1)
  per = np.stack([np.log1p(np.maximum(lat, 0)), np.log1p(uops), np.log1p(recip),
                  ra / 8.0, np.ones_like(lat)], -1)
  per = np.where(have[:, None], per, 0.0)

  # Port structure: which resources each opcode occupies, and how heavily (per unit).
  units = _units_per_resource(table)
  R = len(units)
  if R > MAX_RESOURCES:
    raise ValueError(f"{R} resources; the PerfVec encoder reads at most {MAX_RESOURCES}")
  occ = np.where(have[:, None], take(p.res_cycles) / units, 0.0)  # [..., V, R]
  weight = np.log1p(occ)
  pad = np.zeros(weight.shape[:-1] + (MAX_RESOURCES - R,))
  per = np.concatenate([per, weight, pad], -1)
  is_group = np.arange(R) >= len(table.layout.units)
  res = np.stack(np.broadcast_arrays(
    np.log1p(units), is_group.astype(np.float32), np.log1p((occ > 0).sum(-2)),
    np.log1p(np.log1p(occ).sum(-2))), -1)  # [..., R, RESOURCE_FEATURES]
  res = np.concatenate([res, np.zeros(res.shape[:-2] + (MAX_RESOURCES - R, res.shape[-1]))],
                       -2).reshape(res.shape[:-2] + (-1,))

  sum_last = lambda x: np.asarray(x, np.float32).reshape(lead + (-1,)).sum(-1)  # noqa: E731
  glob = np.stack(np.broadcast_arrays(
    np.asarray(p.dispatch_width, np.float32), np.asarray(p.retire_width, np.float32),
    np.asarray(p.rob_size, np.float32), np.asarray(p.load_queue, np.float32),
    np.asarray(p.store_queue, np.float32), sum_last(p.buffer_size), sum_last(p.prf_size),
    np.full(lead, len(table.layout.units), np.float32)), -1)
  glob = np.concatenate([np.log1p(glob), res], -1)
  return per.astype(np.float32), glob.astype(np.float32)


@functools.lru_cache(maxsize=8)
def reference_costs(names: tuple[str, ...]) -> np.ndarray:
  """[V, len(names) * len(PER_OPCODE)] each vocabulary opcode's summary in the named
  tables (the training bases): a rare opcode's cost read from a table rather than learned
  from the few blocks that hold it. Zero for an opcode a table lacks."""
  return np.concatenate([uarch_features(load_table(n))[0][:, :len(PER_OPCODE)]
                         for n in names], -1)
