"""Search spaces: the code-generation knobs a compiler would tune for three x86-64 kernels.

Each task is a loop body that `diffsim.search.codegen` lowers to AT&T assembly, one
basic block per configuration (BHive-style: the loop's body without its branch). A
configuration is a tuple of knob values in the task's knob order. It can be invalid
for reasons a compiler would meet:
- it needs more live vector registers than the ISA has (16 for SSE and AVX2, 32 for
  AVX-512);
- its tile or unroll does not divide the problem size;
- its accumulator count does not divide its unroll;
- its instructions are missing from the target's table (an ISA the target lacks; found
  by `diffsim.search.evaluate`, since it depends on the target).
The first three are target-independent (`Task.static_error`); the search methods never
call it directly: they see invalidity only as a failed evaluation, as a tuner would.

Cost is simulated steady-state cycles per iteration divided by the useful floating-point
operations of one iteration (cycles per flop, lower is better).
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
from typing import Any

import numpy as np

# Vector ISAs: register width in bits, float32 lanes, architectural vector registers.
ISAS: dict[str, tuple[int, int, int]] = {
  "sse": (128, 4, 16),
  "avx2": (256, 8, 16),
  "avx512": (512, 16, 32),
}

Config = tuple  # knob values, in the task's knob order


@dataclasses.dataclass(frozen=True)
class Knob:
  """One tuning dimension: its name and its candidate values (numbers or labels)."""

  name: str
  values: tuple

  @property
  def numeric(self) -> bool:
    return all(isinstance(v, (int, float)) for v in self.values)


@dataclasses.dataclass(frozen=True)
class Task:
  """A kernel family: its knobs and the problem size the tiles must divide."""

  name: str
  description: str
  knobs: tuple[Knob, ...]
  problem: tuple[tuple[str, int], ...]  # (dimension, size)
  # What an untuned compiler emits (gcc -O3 -mavx2 -mfma on the plain C loop: one
  # vector per step, one accumulator, the load folded into the FMA): the baseline a
  # tuned configuration's speedup is measured against.
  default: Config = ()

  @property
  def knob_names(self) -> tuple[str, ...]:
    return tuple(k.name for k in self.knobs)

  @property
  def size(self) -> int:
    return int(np.prod([len(k.values) for k in self.knobs]))

  @functools.cached_property
  def configs(self) -> tuple[Config, ...]:
    """Every configuration, in a fixed order (the index used everywhere else)."""
    return tuple(itertools.product(*(k.values for k in self.knobs)))

  @functools.cached_property
  def value_index(self) -> np.ndarray:
    """[C, num_knobs] int: each configuration's value index per knob."""
    pos = [{v: i for i, v in enumerate(k.values)} for k in self.knobs]
    return np.array([[p[v] for p, v in zip(pos, c)] for c in self.configs], np.int32)

  def as_dict(self, config: Config) -> dict[str, Any]:
    return dict(zip(self.knob_names, config))

  def dims(self) -> dict[str, int]:
    return dict(self.problem)

  def live_vector_registers(self, config: Config) -> int:
    return _LIVE[self.name](self.as_dict(config))

  def useful_ops(self, config: Config) -> int:
    """Floating-point operations one loop iteration performs (an FMA counts 2)."""
    return _FLOPS[self.name](self.as_dict(config))

  def static_error(self, config: Config) -> str | None:
    """Why `config` cannot be compiled for any target (None: it can)."""
    c = self.as_dict(config)
    _, lanes, regs = ISAS[c["isa"]]
    live = self.live_vector_registers(config)
    if live > regs:
      return f"needs {live} live vector registers; {c['isa']} has {regs}"
    return _DIVIDES[self.name](c, lanes, self.dims())

  @functools.cached_property
  def features(self) -> np.ndarray:
    """[C, F] float32 features of every configuration for the learned models.

    Every knob enters one-hot, numeric knobs also scaled to [0, 1] (so that models can
    both interpolate and learn per-value effects such as divisibility); then a few
    quantities a compiler writer would compute from the knobs (log2 lanes, live
    registers / 32, log2 flops per iteration). Every model-based method gets the same.
    """
    cols = []
    for j, k in enumerate(self.knobs):
      idx = self.value_index[:, j]
      if k.numeric:
        v = np.asarray(k.values, np.float64)[idx]
        lo, hi = min(k.values), max(k.values)
        cols.append(((v - lo) / max(hi - lo, 1))[:, None])
      cols.append(np.eye(len(k.values))[idx])
    derived = np.array([[np.log2(ISAS[self.as_dict(c)["isa"]][1]) / 4.0,
                         self.live_vector_registers(c) / 32.0,
                         np.log2(self.useful_ops(c)) / 12.0] for c in self.configs])
    return np.concatenate(cols + [derived], axis=1).astype(np.float32)


def _gemm_live(c) -> int:
  acc = c["mr"] * c["nr"] * c["acc_sets"]
  a_regs = c["mr"] if c["form"] == "broadcast" else 0
  b_regs = c["nr"] if c["order"] == "grouped" else 1
  return acc + a_regs + b_regs + (1 if c["isa"] == "sse" else 0)


def _gemm_divides(c, lanes, dims) -> str | None:
  m = c["mr"] * lanes
  if dims["M"] % m:
    return f"tile rows {m} do not divide M={dims['M']}"
  if dims["N"] % c["nr"]:
    return f"tile columns {c['nr']} do not divide N={dims['N']}"
  if c["k_unroll"] % c["acc_sets"]:
    return f"{c['acc_sets']} accumulator sets do not divide k_unroll={c['k_unroll']}"
  if dims["K"] % c["k_unroll"]:
    return f"k_unroll {c['k_unroll']} does not divide K={dims['K']}"
  return None


def _dot_live(c) -> int:
  per = 2 if c["form"] == "load" else 1
  return c["accumulators"] + per * (c["unroll"] if c["order"] == "grouped" else 1)


def _dot_divides(c, lanes, dims) -> str | None:
  if c["unroll"] % c["accumulators"]:
    return f"{c['accumulators']} accumulators do not divide unroll={c['unroll']}"
  step = c["unroll"] * lanes
  if dims["N"] % step:
    return f"unroll x lanes = {step} does not divide N={dims['N']}"
  return None


def _axpy_live(c) -> int:
  per = 2 if c["form"] == "load" else 1
  return 1 + per * (c["unroll"] if c["order"] == "grouped" else 1)


def _axpy_divides(c, lanes, dims) -> str | None:
  step = c["unroll"] * lanes
  if dims["N"] % step:
    return f"unroll x lanes = {step} does not divide N={dims['N']}"
  return None


_LIVE = {"gemm": _gemm_live, "dot": _dot_live, "axpy": _axpy_live}
_DIVIDES = {"gemm": _gemm_divides, "dot": _dot_divides, "axpy": _axpy_divides}
_FLOPS = {
  "gemm": lambda c: 2 * c["mr"] * ISAS[c["isa"]][1] * c["nr"] * c["k_unroll"],
  "dot": lambda c: 2 * ISAS[c["isa"]][1] * c["unroll"],
  "axpy": lambda c: 2 * ISAS[c["isa"]][1] * c["unroll"],
}

_ISA_KNOB = Knob("isa", ("sse", "avx2", "avx512"))

TASKS: dict[str, Task] = {
  "gemm": Task(
    "gemm",
    "GEMM micro-kernel C[mr*lanes, nr] += A-panel x B-panel, accumulators in registers",
    (_ISA_KNOB,
     Knob("mr", (1, 2, 3, 4)),            # A vectors per k step (tile rows = mr x lanes)
     Knob("nr", (1, 2, 3, 4, 5, 6, 7, 8)),  # B columns per k step (broadcast values)
     Knob("k_unroll", (1, 2, 4)),
     Knob("acc_sets", (1, 2)),            # independent accumulator copies (k steps alternate)
     Knob("form", ("broadcast", "loadop")),  # A in registers, or A as the FMA's memory operand
     Knob("order", ("grouped", "interleaved"))),  # loads all first, or next to their FMAs
    (("M", 96), ("N", 24), ("K", 256)),
    ("avx2", 1, 1, 1, 1, "loadop", "interleaved")),
  "dot": Task(
    "dot",
    "dot product s += x[i] * y[i], vector accumulators",
    (_ISA_KNOB,
     Knob("unroll", (1, 2, 3, 4, 5, 6, 7, 8)),
     Knob("accumulators", (1, 2, 4, 8)),
     Knob("form", ("loadop", "load")),       # y as the FMA's memory operand, or loaded
     Knob("order", ("grouped", "interleaved"))),
    (("N", 2400),),
    ("avx2", 1, 1, "loadop", "interleaved")),
  "axpy": Task(
    "axpy",
    "streaming y[i] += a * x[i]",
    (_ISA_KNOB,
     Knob("unroll", (1, 2, 3, 4, 5, 6, 8, 10, 12, 16)),
     Knob("form", ("loadop", "load")),
     Knob("order", ("grouped", "interleaved"))),
    (("N", 2400),),
    ("avx2", 1, "load", "interleaved")),
}


def get_task(name: str) -> Task:
  """The task called `name`; a ValueError names the known tasks otherwise."""
  if name not in TASKS:
    raise ValueError(f"unknown task {name!r}: choose one of {', '.join(TASKS)}")
  return TASKS[name]
