"""The CPUs that search meta-trains on and is evaluated on.

Meta-training sees two llvm-mca models (haswell, znver3), tables sampled around each
(`diffsim.params.sample`), and each base changed in what binds (`VARIANTS`). Held out
from it: llvm-mca's skylake model and the `zen5` table learned from real Zen 5
measurements, each as shipped and changed in the same ways, and tables sampled around
both with other seeds. Each group is one base table and a stack of parameter sets of
its layout, so a group is enumerated by one `simulate_sweep`.

The variants are what a CPU designer changes and a tuner must notice, each a change of
parameters at the base's layout (the simulator's port count enters only as a unit's
cycles, so halving units doubles their cycles, as `sample_params` does):
- `fp-half`: half the vector floating-point units (FMA, multiply, add take twice
  their cycles on the units they use);
- `load-half`: half the load units (every opcode's cycles on the units a scalar load
  uses doubled);
- `split256`: no 256-bit datapath (every 256-bit opcode issues twice the micro-ops
  and holds its units twice as long, as on Zen 1);
- `fma-lat2x`: FP math latency doubled (a deeper FMA pipeline: more independent
  accumulators needed);
- `narrow`: dispatch and retire 2 wide;
- `small-rob`: reorder buffer, schedulers and queues a quarter of the base's.
"""

from __future__ import annotations

import dataclasses
import re

import jax
import numpy as np

_FP_MATH = re.compile(r"^V?(FN?M(ADD|SUB)\w*P[SD]|MULP[SD]|ADDP[SD]|SUBP[SD])")
_WIDE = re.compile(r"^V\w*Y(r|m)")
VARIANTS = ("fp-half", "load-half", "split256", "fma-lat2x", "narrow", "small-rob")


@dataclasses.dataclass(frozen=True)
class CpuGroup:
  """Parameter sets sharing one layout: `names[i]` is `table_at(base, stacked, i)`."""

  names: tuple[str, ...]
  base: object  # Table
  stacked: object  # Params with a leading axis [P]

  def tables(self) -> list:
    from diffsim.params.sample import table_at

    return [table_at(self.base, self.stacked, i) for i in range(len(self.names))]


def _units_of(table, key: str) -> np.ndarray:
  """[R] bool: the resource columns opcode `key` uses."""
  return np.asarray(table.params.res_cycles)[table.layout.index[key]] > 0


def variant_params(table, kind: str):
  """`table`'s parameters changed as variant `kind` says (numpy leaves; see the module
  docstring). Every value stays integral, as in llvm-mca's own tables.

  >>> from diffsim.params.table import load_table
  >>> hsw = load_table("haswell")
  >>> k = hsw.layout.index["VFMADD231PSYr"]
  >>> float(variant_params(hsw, "fma-lat2x").latency[k, 0])
  10.0
  """
  p = jax.tree.map(lambda x: np.array(x, np.float32), table.params)
  keys = table.layout.keys
  rows = lambda rx: np.array([bool(rx.match(k)) for k in keys])  # noqa: E731
  if kind == "fp-half":
    cols = _units_of(table, "VFMADD231PSYr")
    p = dataclasses.replace(p, res_cycles=np.where(rows(_FP_MATH)[:, None] & cols[None],
                                                   2 * p.res_cycles, p.res_cycles))
  elif kind == "load-half":
    cols = _units_of(table, "MOV64rm")
    p = dataclasses.replace(p, res_cycles=np.where(cols[None], 2 * p.res_cycles, p.res_cycles))
  elif kind == "split256":
    wide = rows(_WIDE)
    p = dataclasses.replace(p, uops=np.where(wide, 2 * p.uops, p.uops),
                            res_cycles=np.where(wide[:, None], 2 * p.res_cycles, p.res_cycles))
  elif kind == "fma-lat2x":
    p = dataclasses.replace(p, latency=np.where(rows(_FP_MATH)[:, None], 2 * p.latency,
                                                p.latency))
  elif kind == "narrow":
    p = dataclasses.replace(p, dispatch_width=np.float32(2.0),
                            retire_width=np.float32(2.0 if float(p.retire_width) > 0 else 0.0))
  elif kind == "small-rob":
    quarter = lambda x: np.where(x > 0, np.maximum(8.0, np.round(x / 4)), 0.0).astype(np.float32)  # noqa: E731
    p = dataclasses.replace(p, rob_size=quarter(p.rob_size), buffer_size=quarter(p.buffer_size),
                            load_queue=quarter(p.load_queue), store_queue=quarter(p.store_queue))
  else:
    raise ValueError(f"unknown variant {kind!r}: choose from {', '.join(VARIANTS)}")
  return p


def _group(cpu: str, samples: int, seed: int, *, with_base: bool,
           variants: tuple[str, ...] = ()) -> CpuGroup:
  from diffsim.params.sample import sample_params
  from diffsim.params.table import load_table

  base = load_table(cpu)
  sets, names = [], []
  if with_base:
    sets.append(jax.tree.map(np.asarray, base.params))
    names.append(cpu)
  for kind in variants:
    sets.append(variant_params(base, kind))
    names.append(f"{cpu}/{kind}")
  if samples:
    stacked = sample_params(base, samples, seed)
    sets += [jax.tree.map(lambda x, i=i: np.asarray(x)[i], stacked) for i in range(samples)]
    names += [f"{cpu}~s{seed}.{i}" for i in range(samples)]
  return CpuGroup(tuple(names), base, jax.tree.map(lambda *x: np.stack(x), *sets))


def training_groups(samples: int = 7, *, variants: bool = True) -> list[CpuGroup]:
  """haswell and znver3, each with its `VARIANTS` (unless `variants=False`) and
  `samples` tables sampled around it."""
  kinds = VARIANTS if variants else ()
  return [_group("haswell", samples, 11, with_base=True, variants=kinds),
          _group("znver3", samples, 12, with_base=True, variants=kinds)]


@dataclasses.dataclass(frozen=True)
class TrainingSet:
  """What Glimpse meta-trains on, one row per training table."""

  blueprints: np.ndarray  # [T, D]
  costs: np.ndarray  # [T, C] enumerated cycles per flop, nan where invalid
  families: tuple[str, ...]  # [T] each table's base CPU (its group's first name)
  rooflines: np.ndarray | None  # [T, C] each table's `roofline.roofline` (None: unused)


def training_set(task, groups: list[CpuGroup] | None = None, *, extra=None,
                 log=None) -> TrainingSet:
  """`task` enumerated on every table of `groups` (default `training_groups()`; cached),
  with each table's Blueprint, family and roofline. `extra`: per group, [P, E] vectors
  appended to its tables' Blueprints (a PerfVec uarch vector, say)."""
  from diffsim.search.blueprint import blueprint
  from diffsim.search.evaluate import enumerate_costs_stack
  from diffsim.search.roofline import roofline

  groups = training_groups() if groups is None else groups
  bps, costs, families, roofs = [], [], [], []
  for j, g in enumerate(groups):
    if log:
      log(f"enumerating {task.name} on {g.names[0]} and the {len(g.names) - 1} tables "
          "changed or sampled around it")
    for i, (t, c) in enumerate(zip(g.tables(), enumerate_costs_stack(g.base, g.stacked, task))):
      bp = blueprint(t)
      bps.append(bp if extra is None else np.concatenate([bp, extra[j][i]]))
      costs.append(c.cost)
      families.append(g.names[0])
      roofs.append(roofline(task, t))
  return TrainingSet(np.stack(bps).astype(np.float32), np.stack(costs), tuple(families),
                     np.stack(roofs))


def heldout_groups(samples: int = 4, *, variants: bool = True) -> list[CpuGroup]:
  """skylake and zen5 (never seen in meta-training), each with its `VARIANTS`, then
  tables sampled around them."""
  kinds = VARIANTS if variants else ()
  return [_group("skylake", 0, 0, with_base=True, variants=kinds),
          _group("zen5", 0, 0, with_base=True, variants=kinds),
          _group("skylake", samples, 21, with_base=False),
          _group("zen5", samples, 22, with_base=False)]


def load_cpu(name: str):
  """A shipped table, a JSON table file, or `BASE/VARIANT` (a shipped table changed as
  `variant_params` says: `zen5/narrow`).

  >>> float(load_cpu("haswell/narrow").params.dispatch_width)
  2.0
  """
  from pathlib import Path

  from diffsim.params.table import Table, load_table

  base, _, kind = name.rpartition("/")
  if kind in VARIANTS and base and not Path(name).exists():
    table = load_table(base)
    return Table(variant_params(table, kind), table.structure, table.layout,
                 {**table.source, "variant": kind})
  return load_table(name)
