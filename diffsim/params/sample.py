"""Parameter tables sampled around a real one: many plausible CPUs of one family.

PerfVec trains on many microarchitectures and Glimpse meta-trains across hardware;
llvm-mca offers only a handful of x86 models, so both draw more from the neighbourhood
of each. A sample keeps its base table's layout and structure (opcode keys, units,
groups), so a batch of samples stacks into one `Params` with a leading axis that
`simulate_sweep` crosses with a batch of blocks. Every value stays integral, so the
exact simulator runs samples as it runs llvm-mca's own tables.

Ranges, at `scale=1` (a larger scale widens every log-range in proportion):
- latency: one table-wide factor in [0.7, 1.5] (log-uniform) times a per-opcode factor
  exp(N(0, 0.25)), rounded; a latency above 0 stays at least 1, 0 stays 0.
- micro-ops: +1 or -1 on 15% of the opcodes each way, at least 1 where the base has 1+.
- resource cycles: a factor per resource from {0.5, 1, 1, 1, 2} (a unit or group made
  twice as plentiful or half as plentiful: the simulator's port count enters only as
  members / cycles, so this is how a port count changes at a fixed layout), rounded,
  at least 1 where used.
- dispatch width: from {2, 3, 4, 5, 6, 8}; retire width likewise where the base limits
  it (0, unlimited, stays 0).
- reorder buffer, scheduler buffers, load and store queues, register files: factor in
  [0.5, 2] (log-uniform) each, rounded, at least 8 entries (0, unbounded, stays 0).
- read-advance: unchanged (it is a property of forwarding paths that few models vary).
"""

from __future__ import annotations

import jax
import numpy as np

from diffsim.params.table import Params, Table

_WIDTHS = np.array([2.0, 3.0, 4.0, 5.0, 6.0, 8.0], np.float32)
_RES_FACTORS = np.array([0.5, 1.0, 1.0, 1.0, 2.0])


def _log_uniform(rng: np.random.Generator, lo: float, hi: float, scale: float, size=None):
  return np.exp(rng.uniform(np.log(lo) * scale, np.log(hi) * scale, size))


def _one(base: Params, rng: np.random.Generator, scale: float) -> Params:
  """One sampled parameter set (numpy leaves)."""
  f32 = lambda x: np.asarray(x, np.float32)  # noqa: E731
  lat = np.asarray(base.latency, np.float64)
  K = lat.shape[0]
  factor = (_log_uniform(rng, 0.7, 1.5, scale)
            * np.exp(rng.normal(0.0, 0.25 * scale, (K, 1))))
  new_lat = np.where(lat > 0, np.maximum(1.0, np.round(lat * factor)), 0.0)

  uops = np.asarray(base.uops, np.float64)
  step = rng.choice([-1.0, 0.0, 1.0], size=K, p=[0.15, 0.7, 0.15])
  new_uops = np.where(uops >= 1, np.maximum(1.0, uops + step), uops)

  rc = np.asarray(base.res_cycles, np.float64)
  res_factor = rng.choice(_RES_FACTORS, size=rc.shape[1]) ** scale
  new_rc = np.where(rc > 0, np.maximum(1.0, np.round(rc * res_factor)), 0.0)

  def resize(x):
    x = np.asarray(x, np.float64)
    f = _log_uniform(rng, 0.5, 2.0, scale, np.shape(x))
    return np.where(x > 0, np.maximum(8.0, np.round(x * f)), 0.0)

  retire = float(base.retire_width)
  return Params(
    uops=f32(new_uops), latency=f32(new_lat), read_advance=f32(base.read_advance),
    res_cycles=f32(new_rc), dispatch_width=f32(rng.choice(_WIDTHS)),
    rob_size=f32(resize(base.rob_size)),
    retire_width=f32(rng.choice(_WIDTHS) if retire > 0 else 0.0),
    buffer_size=f32(resize(base.buffer_size)), load_queue=f32(resize(base.load_queue)),
    store_queue=f32(resize(base.store_queue)), prf_size=f32(resize(base.prf_size)),
    move_elim_per_cycle=f32(base.move_elim_per_cycle))


def sample_params(base: Table, n: int, seed: int, scale: float = 1.0) -> Params:
  """`n` parameter sets around `base`, stacked on a leading axis [n, ...].

  The same (base, seed, scale) always gives the same tables, and the i-th table does
  not depend on n.
  """
  if n < 1:
    raise ValueError(f"n must be at least 1, not {n}")
  if scale <= 0:
    raise ValueError(f"scale must be positive, not {scale}")
  tables = [_one(base.params, np.random.default_rng([seed, i]), scale) for i in range(n)]
  return jax.tree.map(lambda *xs: np.stack(xs), *tables)


def table_at(base: Table, stacked: Params, i: int) -> Table:
  """The i-th sampled table as a complete `Table`.

  It keeps the base's layout object, name included, because the layout is the static
  argument of every compiled simulator program: all samples of one base share them.
  """
  params = jax.tree.map(lambda x: np.asarray(x)[i], stacked)
  return Table(params, base.structure, base.layout, {**base.source, "sample": i})
