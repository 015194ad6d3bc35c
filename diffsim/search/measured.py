"""Search on the CPU at hand (`diffsim search TASK --measure`): configurations timed
with `diffsim measure`'s harness.

A configuration's cost is what `evaluate` simulates, measured instead: its loop body
(the same bytes the simulator sees, `codegen.lower_many`) timed by
`diffsim.measure.measure_hexes` in core cycles per 100 iterations, divided by 100 and
by the iteration's useful flops. The harness's rules apply unchanged: blocks it
rejects (too many pages, a fault) and configurations that do not compile, or whose
ISA the blueprint's table lacks, are invalid evaluations with a reason; its canaries
and repeated passes set disturbed timings aside.

The kernels advance their pointers, and the harness runs each block unrolled up to
200 times from the same registers, so a timed block walks its panels from the start
again on each repeat: what is measured is the loop streaming from L1 (a block whose
walk touches more than `MeasureConfig.max_pages` pages is rejected, as any block is).

Only the ISAs of the blueprint's table are searched: Glimpse's models and the validity
ensemble know a CPU through its table, and no shipped table has AVX-512 opcodes (their
keys come from the BHive corpus), so AVX-512 configurations are invalid here even on a
CPU that runs them.

`measure_space` times every valid configuration (the exhaustive measured run) and
caches it per CPU and task, so that a search can say how far its pick is from the best
measured. Nothing here simulates; the blueprint that guides Glimpse comes from a table
(`table_for_cpu` picks a shipped one, or the user names one, fitted or not).
"""

from __future__ import annotations

import dataclasses
import json
import re
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from diffsim.measure.config import MeasureConfig
from diffsim.measure.cpu import cpu_identity, same_model
from diffsim.measure.harness import measure_hexes
from diffsim.search.codegen import lower_many
from diffsim.search.evaluate import Costs, Logged, cache_dir
from diffsim.search.space import Task

# Shipped tables fitted to measurements of a CPU family (vendor, family) -> table. Cloud
# VMs often mask the model number (a Xeon 6 here reports model 167), so the family is
# what can be trusted; anything else falls back to the vendor's llvm-mca model. A model
# number that names a core with a shipped table of its own comes first: Zen 4 (family
# 25, models 0x10-0x1f, 0x60-0x7f, 0xa0-0xaf; the rest of family 25 is Zen 3) has the
# table `diffsim calibrate` fitted on one, and Ice Lake (client 125/126, server
# 106/108) llvm-mca's icelake-client, nearer to it than the Granite Rapids fit.
_MODELS = {**{("AuthenticAMD", 25, m): "zen4"
              for m in (*range(0x10, 0x20), *range(0x60, 0x80), *range(0xA0, 0xB0))},
           **{("GenuineIntel", 6, m): "icelake-client" for m in (106, 108, 125, 126)}}
_FITTED = {("GenuineIntel", 6): "graniterapids", ("AuthenticAMD", 26): "zen5",
           ("AuthenticAMD", 25): "znver3"}
_VENDOR = {"GenuineIntel": "skylake", "AuthenticAMD": "znver3"}


def table_for_cpu(identity: dict) -> str:
  """The shipped table closest to the CPU `identity` (`diffsim.measure.cpu_identity`):
  by model where one has its own table, else by family, else the vendor's llvm-mca
  model, and skylake for an unknown vendor.

  >>> table_for_cpu({"vendor": "GenuineIntel", "family": 6, "model": 173})
  'graniterapids'
  """
  vendor, family = identity.get("vendor"), identity.get("family")
  return (_MODELS.get((vendor, family, identity.get("model")))
          or _FITTED.get((vendor, family)) or _VENDOR.get(vendor, "skylake"))


def cpu_key(identity: dict) -> str:
  """A file-name-safe name for a CPU model: `GenuineIntel-6-167-1`."""
  parts = [identity.get(k) for k in ("vendor", "family", "model", "stepping")]
  return re.sub(r"[^A-Za-z0-9_.-]", "_", "-".join(str(p) for p in parts))


def _space_path(task: Task, identity: dict) -> Path:
  return cache_dir() / "measured" / f"{task.name}-{cpu_key(identity)}.json"


class MeasuredObjective(Logged):
  """`evaluate.Objective`'s interface, with costs measured on this CPU.

  Args:
    task: the task.
    isas: the ISAs a configuration may use (those of the blueprint's table: a search
      guided by a table cannot reason about instructions the table lacks).
    config: the harness's settings (`MeasureConfig`; `quick()` by default).

  Each call measures its configurations together (one runner, one sweep of passes);
  `seconds` adds up the time spent measuring.
  """

  def __init__(self, task: Task, *, isas: Sequence[str], config=None):
    self.task, self.isas = task, tuple(isas)
    self.config = MeasureConfig.quick() if config is None else config
    self.history: list[tuple[int, float]] = []
    self.errors: dict[int, str] = {}
    self.cycles: dict[int, float] = {}  # cycles per 100 iterations of each measured index
    self.seconds = 0.0

  def __call__(self, indices) -> np.ndarray:
    indices = [int(i) for i in indices]
    out = np.full(len(indices), np.nan)
    todo = []
    for n, i in enumerate(indices):
      c = self.task.configs[i]
      err = self.task.static_error(c)
      if err is None and c[0] not in self.isas:
        err = f"target lacks it: the table has no {c[0]} instructions"
      if err:
        self.errors[i] = err
      else:
        todo.append(n)
    if todo:
      ids = [indices[n] for n in todo]
      cost, errs, cycles = _measure(self.task, ids, self.config)
      self.seconds += cycles.pop("seconds")
      for n, i, c, e in zip(todo, ids, cost, errs):
        out[n] = c
        if e:
          self.errors[i] = e
        else:
          self.cycles[i] = cycles[i]
    self.history += list(zip(indices, out.tolist()))
    return out


def _measure(task: Task, ids: Sequence[int], config) -> tuple[np.ndarray, list, dict]:
  """Costs [n] (nan: rejected), reasons, and {index: cycles per 100} plus "seconds"."""
  blocks = lower_many(task, [task.configs[i] for i in ids])
  t0 = time.perf_counter()
  results, _ = measure_hexes([b.hex for b in blocks], config)
  cost = np.full(len(ids), np.nan)
  errs: list = [None] * len(ids)
  cycles: dict = {"seconds": time.perf_counter() - t0}
  for n, (i, r) in enumerate(zip(ids, results)):
    if r.cycles is None:
      errs[n] = f"measure rejected it: {r.error}"
    else:
      cycles[i] = r.cycles
      cost[n] = r.cycles / 100.0 / task.useful_ops(task.configs[i])
  return cost, errs, cycles


@dataclasses.dataclass(frozen=True)
class MeasuredSpace:
  """An exhaustive measured run of one task on one CPU."""

  costs: Costs           # [C] measured cycles per flop, nan where invalid or rejected
  cpu: dict              # `cpu_identity()` of the machine
  isas: tuple[str, ...]  # the ISAs measured
  date: str
  seconds: float         # time spent measuring

  def to_json(self, task: Task) -> dict:
    return {"task": task.name, "cpu": self.cpu, "isas": list(self.isas), "date": self.date,
            "seconds": self.seconds,
            "cost": [None if not np.isfinite(c) else float(c) for c in self.costs.cost],
            "errors": list(self.costs.errors)}

  @classmethod
  def from_json(cls, doc: dict) -> MeasuredSpace:
    cost = np.array([np.nan if c is None else c for c in doc["cost"]])
    return cls(Costs(cost, tuple(doc["errors"])), doc["cpu"], tuple(doc["isas"]), doc["date"],
               doc["seconds"])


def measure_space(task: Task, *, isas: Sequence[str], config=None, cache: bool = True,
                  path: Path | None = None) -> MeasuredSpace:
  """Measures every valid configuration of `task` on this CPU (cached per CPU and task).

  Args:
    task: the task; isas: the ISAs measured (the others are invalid).
    config: the harness's settings (`MeasureConfig.quick()` by default).
    cache: reuse a cached run of this CPU model and task with the same ISAs.
    path: where the run is cached (default: `cached_space`'s file).
  """
  ident = cpu_identity()
  path = path or _space_path(task, ident)
  if cache and path.exists():
    hit = MeasuredSpace.from_json(json.loads(path.read_text()))
    if (tuple(hit.isas) == tuple(isas) and len(hit.costs.cost) == task.size
        and same_model(hit.cpu, ident)):
      return hit
  obj = MeasuredObjective(task, isas=isas, config=config)
  obj(range(task.size))
  errors = tuple(obj.errors.get(i) for i in range(task.size))
  cost = np.array([c for _, c in obj.history])
  space = MeasuredSpace(Costs(cost, errors), ident, tuple(isas),
                        time.strftime("%Y-%m-%d %H:%M UTC", time.gmtime()), obj.seconds)
  if cache:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(space.to_json(task)))
    tmp.replace(path)
  return space


def cached_space(task: Task, identity: dict | None = None) -> MeasuredSpace | None:
  """The cached exhaustive measured run of `task` on this CPU model, if there is one."""
  if identity is None:
    identity = cpu_identity()
  path = _space_path(task, identity)
  if not path.exists():
    return None
  return MeasuredSpace.from_json(json.loads(path.read_text()))
