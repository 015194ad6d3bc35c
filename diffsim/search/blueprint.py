"""The Blueprint: a fixed-length embedding of a CPU's specification, read from its table.

Glimpse (DAC'22) embeds a GPU's datasheet; here the datasheet is the parameter table.
For each operation class the kernels use (FMA, multiply, add, load, store, broadcast,
shuffle, register move, integer add) it records whether the target supports it,
its latency, micro-ops, reciprocal throughput and how many ports can execute it; then
the dispatch and retire widths, the buffer sizes, the widest vector ISA the table
supports and its architectural vector register count. Every entry is scaled to about
[0, 1] so that the learned models see comparable inputs.

Simplifications: reciprocal throughput is the busiest resource's cycles over its units
(what llvm-mca's `-instruction-info` prints), ignoring contention between classes.
`benchmarks/search_eval.py --perfvec` appends the PerfVec table encoder's uarch vector
(an option, measured in benchmarks/RESULTS.md).
"""

from __future__ import annotations

import numpy as np

from diffsim.search.space import ISAS

# Operation class -> opcode key whose cost stands for it.
OP_CLASSES: tuple[tuple[str, str], ...] = (
  ("fma256", "VFMADD231PSYr"),
  ("fma256_load", "VFMADD231PSYm"),
  ("fma512", "VFMADD231PSZr"),
  ("mul128", "MULPSrr"),
  ("add128", "ADDPSrr"),
  ("load128", "MOVUPSrm"),
  ("load256", "VMOVUPSYrm"),
  ("store128", "MOVUPSmr"),
  ("store256", "VMOVUPSYmr"),
  ("broadcast256", "VBROADCASTSSYrm"),
  ("shuffle128", "SHUFPSrri"),
  ("move128", "MOVAPSrr"),
  ("int_add", "ADD64ri8"),
)
OP_FIELDS = ("supported", "latency", "uops", "rthroughput", "ports")
GLOBAL_FIELDS = ("dispatch_width", "retire_width", "log_rob", "log_scheduler", "log_load_queue",
                 "log_store_queue", "vector_bits", "vector_registers", "has_sse", "has_avx2",
                 "has_avx512")
NAMES: tuple[str, ...] = tuple(f"{c}.{f}" for c, _ in OP_CLASSES for f in OP_FIELDS) + GLOBAL_FIELDS
# Scale per op field, so that typical values land in [0, 1].
_OP_SCALE = np.array([1.0, 8.0, 4.0, 4.0, 8.0])


def _op_row(table, key: str) -> np.ndarray:
  idx = table.layout.index
  if key not in idx or not bool(np.asarray(table.structure.supported)[idx[key]]):
    return np.zeros(len(OP_FIELDS))
  k = idx[key]
  p = table.params
  U = len(table.layout.units)
  cycles = np.asarray(p.res_cycles)[k]
  need = np.asarray(table.structure.res_need)[k]
  members = [1 << u for u in range(U)] + list(table.layout.group_members)
  used = np.flatnonzero(cycles > 0)
  width = np.array([bin(members[r]).count("1") for r in used])
  rthru = float(np.max(cycles[used] * need[used] / width)) if len(used) else 0.0
  mask = 0
  for r in used:
    mask |= members[r]
  return np.array([1.0, float(np.asarray(p.latency)[k, 0]), float(np.asarray(p.uops)[k]),
                   rthru, float(bin(mask).count("1"))])


def supported_isas(table) -> tuple[str, ...]:
  """The vector ISAs whose FMA-or-multiply key the table supports."""
  idx, sup = table.layout.index, np.asarray(table.structure.supported)
  has = lambda key: key in idx and bool(sup[idx[key]])  # noqa: E731
  isas = []
  if has("MULPSrr"):
    isas.append("sse")
  if has("VFMADD231PSYr"):
    isas.append("avx2")
  if has("VFMADD231PSZr"):
    isas.append("avx512")
  return tuple(isas)


def blueprint(table) -> np.ndarray:
  """The Blueprint of `table`: [D] float32, entries named by `NAMES`.

  >>> from diffsim.params.table import load_table
  >>> blueprint(load_table("haswell")).shape == (len(NAMES),)
  True
  """
  ops = np.concatenate([_op_row(table, key) / _OP_SCALE for _, key in OP_CLASSES])
  p = table.params
  buffers = np.asarray(p.buffer_size)
  isas = supported_isas(table)
  widest = max(isas, key=lambda i: ISAS[i][0]) if isas else None
  glob = np.array([
    float(p.dispatch_width) / 8.0,
    float(p.retire_width) / 8.0,
    np.log2(max(float(p.rob_size), 1.0)) / 9.0,
    np.log2(max(float(buffers[buffers > 0].mean()) if (buffers > 0).any() else 1.0, 1.0)) / 7.0,
    np.log2(max(float(p.load_queue), 1.0)) / 7.0,
    np.log2(max(float(p.store_queue), 1.0)) / 7.0,
    (ISAS[widest][0] / 512.0) if widest else 0.0,
    (ISAS[widest][2] / 32.0) if widest else 0.0,
    float("sse" in isas), float("avx2" in isas), float("avx512" in isas)])
  return np.concatenate([ops, glob]).astype(np.float32)
