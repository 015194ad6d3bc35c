"""Writes a table back to its JSON form, and grows a CPU's resources.

A fitted table is only of use outside one Python session as a file that `load_table`
reads, and llvm-mca's own tables are integers, so `to_json` rounds the numbers.
Resource cycles are fitted after llvm-mca's normalisation (diffsim/sim/MODEL.md#resource-lists),
which cannot be undone in general, so each opcode is written in the normalised form
(`"kept"`, `"touched"`, `"buffers"`: SCHEMA.md) rather than as a `WriteProcRes` list.

`grow` and `grow_table` answer "what if this CPU had more of that unit" by editing
the resource model and keeping every opcode's use of it.
"""

from __future__ import annotations

import copy
import dataclasses
from collections.abc import Mapping
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from diffsim.params.table import (
  FORMAT,
  READ_CLASSES,
  WRITE_ROLES,
  Layout,
  Params,
  Table,
  expand_units,
  from_json,
  natural_key,
)

# Unit masks are int32 bitmasks with one bit per unit; the sign bit stays clear.
MAX_UNITS = 31

# Per-opcode flags written as they are held in `Structure` (dep_breaking is derived).
_FLAGS = ("may_load", "may_store", "load_barrier", "store_barrier", "zero_idiom", "move_elim",
          "begin_group", "end_group")


def _round(x, lo: int | None = None) -> int:
  v = int(np.rint(float(x)))
  return v if lo is None else max(lo, v)


def _res_names(layout: Layout) -> list[str]:
  """Column names of `res_cycles`: a single-unit kind's unit is named as the kind."""
  return list(layout.units) + list(layout.groups)


def _resources_from_layout(layout: Layout) -> list[dict]:
  """A resource list for a table without its source document (units `X#i` -> kind X)."""
  kind_of, count = {}, {}
  for u in layout.units:
    base, sep, i = u.rpartition("#")
    kind_of[u] = base if sep and i.isdigit() else u
    count[kind_of[u]] = count.get(kind_of[u], 0) + 1
  out = [{"name": n, "units": c, "buffer": -1} for n, c in count.items()]
  for name, mask in zip(layout.groups, layout.group_members):
    if name in count:  # a multi-unit kind is a group of its own units
      continue
    members = {kind_of[u] for b, u in enumerate(layout.units) if mask >> b & 1}
    out.append({"name": name, "members": sorted(members, key=natural_key), "buffer": -1})
  return out


def to_json(table: Table, params: Params | None = None, *, cpu: str | None = None,
            source: str | None = None) -> dict:
  """The JSON document of `table` with `params`' numbers rounded to integers.

  Args:
    table: the table whose structure, layout and source document are written.
    params: the numbers to write (default `table.params`), e.g. a fit's result.
    cpu: the document's "cpu" name (default the table's).
    source: the document's "source" note (default: says it was exported and from what).

  Returns:
    A document that `from_json` loads; opcodes carry their normalised resource lists.
  """
  p = table.params if params is None else params
  st, lay, src = table.structure, table.layout, table.source
  a = np.asarray  # jax or numpy leaves
  uops, lat, ra, cyc = a(p.uops), a(p.latency), a(p.read_advance), a(p.res_cycles)
  need, reserved, touched, buffers = a(st.res_need), a(st.reserved), a(st.touched), a(st.buffers)
  flags = {f: a(getattr(st, f)) for f in _FLAGS}
  flags["dep_breaking"] = a(st.ignores_reads) & ~flags["zero_idiom"]
  supported = a(st.supported)
  names = _res_names(lay)
  reasons = dict(lay.unsupported)

  opcodes = {}
  for k, key in enumerate(lay.keys):
    lats = [_round(x, 0) for x in lat[k]]
    op: dict[str, Any] = {"uops": _round(uops[k], 1), "latency": max(lats)}
    write = {role: v for role, v in zip(WRITE_ROLES, lats) if v != op["latency"]}
    if write:
      op["write_latency"] = write
    advance = {c: _round(v) for c, v in zip(READ_CLASSES, ra[k]) if _round(v) != 0}
    if advance:
      op["read_advance"] = advance
    op["kept"] = [[names[r], _round(cyc[k, r], 1), int(need[k, r]), bool(reserved[k, r])]
                  for r in np.flatnonzero(cyc[k] > 0)]
    op["touched"] = [names[r] for r in np.flatnonzero(touched[k])]
    op["buffers"] = [names[r] for r in np.flatnonzero(buffers[k])]
    op.update({f: True for f, v in flags.items() if v[k]})
    if not supported[k]:
      op["unsupported"] = reasons.get(key, "unsupported")
    opcodes[key] = op

  g = copy.deepcopy(dict(src["global"])) if "global" in src else {}
  g.update(dispatch_width=_round(p.dispatch_width, 1), rob_size=_round(p.rob_size, 1),
           retire_width=_round(p.retire_width, 0), load_queue=_round(p.load_queue, 0),
           store_queue=_round(p.store_queue, 0))
  files = g.get("register_files") or [{"name": f"RegisterFile{i}", "classes": list(kinds)}
                                      for i, kinds in enumerate(lay.file_kinds)]
  prf, moves = a(p.prf_size).reshape(-1), a(p.move_elim_per_cycle).reshape(-1)
  if len(files) != len(prf):
    raise ValueError(f"{len(files)} register files in the source but {len(prf)} in params")
  g["register_files"] = [
      {**f, "size": _round(prf[i], 0), "max_moves_per_cycle": _round(moves[i], 0)}
      for i, f in enumerate(files)]

  resources = (copy.deepcopy(list(src["resources"])) if "resources" in src
               else _resources_from_layout(lay))
  col = {n: i for i, n in enumerate(names)}
  size = a(p.buffer_size)
  for r in resources:
    # Whether a resource is buffered is structure; its size is a number.
    v, was = _round(size[col[r["name"]]], 0), int(r.get("buffer", -1))
    r["buffer"] = v if v > 0 else (was if was <= 0 else -1)

  return {
      "format": src.get("format") or FORMAT,
      "cpu": cpu or lay.cpu,
      "source": source or ("diffsim.params.export.to_json, rounded; from "
                           f"{src.get('source') or src.get('cpu') or lay.cpu}"),
      "global": g,
      "resources": resources,
      "unsupported": reasons,
      "opcodes": opcodes,
  }


def grow(doc: Mapping[str, Any], resource: str, extra: int) -> dict:
  """A copy of the JSON document where `resource` has `extra` more units.

  A kind (no "members") gets more units; a group gets `extra` new single-unit kinds
  `f"{resource}+{j}"` (with its first member's buffer) as members of that group only.
  Opcodes keep naming the same resources.

  Raises:
    ValueError: no such resource, a negative `extra`, or more than 31 units in all.
  """
  if extra < 0:
    raise ValueError(f"cannot grow {resource!r} by {extra} units")
  out = copy.deepcopy(dict(doc))
  res = out["resources"]
  entry = next((r for r in res if r["name"] == resource), None)
  if entry is None:
    raise ValueError(f"no resource {resource!r} in the table: it has "
                     f"{', '.join(r['name'] for r in res)}")
  if "members" in entry:
    first = next(r for r in res if r["name"] == entry["members"][0])
    new = [f"{resource}+{j}" for j in range(1, extra + 1)]
    taken = [n for n in new if any(r["name"] == n for r in res)]
    if taken:
      raise ValueError(f"cannot grow {resource!r}: {taken[0]!r} already exists")
    at = max((i + 1 for i, r in enumerate(res) if "members" not in r), default=0)
    res[at:at] = [{"name": n, "units": 1, "buffer": first.get("buffer", -1)} for n in new]
    entry["members"] = list(entry["members"]) + new
  else:
    entry["units"] = int(entry.get("units", 1)) + extra
  units = expand_units(res)[0]
  if len(units) > MAX_UNITS:
    raise ValueError(f"growing {resource!r} by {extra} gives {len(units)} units; unit masks "
                     f"hold at most {MAX_UNITS}")
  return out


def grow_table(table: Table, params: Params | None, resource: str,
               extra: int = 1) -> tuple[Table, Params]:
  """`grow` on a Table, keeping `params`' unrounded numbers.

  The grown table's structure and layout come from the rounded document; the numbers
  are then copied over by name (opcode keys are unchanged; resource columns and buffer
  sizes by unit or group name, zero for new units).

  Returns:
    The grown table (holding the copied numbers) and those numbers.
  """
  p = table.params if params is None else params
  new = from_json(grow(to_json(table, p), resource, extra))
  assert new.layout.keys == table.layout.keys
  old_col = {n: i for i, n in enumerate(_res_names(table.layout))}
  src = [old_col.get(n, -1) for n in _res_names(new.layout)]

  def by_name(old):
    """Resource columns (last axis) moved to the grown table's order."""
    x = np.asarray(old)
    y = np.zeros(x.shape[:-1] + (len(src),), x.dtype)
    for j, i in enumerate(src):
      if i >= 0:
        y[..., j] = x[..., i]
    return jnp.asarray(y) if isinstance(old, jax.Array) else y

  q = p.replace(res_cycles=by_name(p.res_cycles), buffer_size=by_name(p.buffer_size))
  return dataclasses.replace(new, params=q), q
