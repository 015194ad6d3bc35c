"""Soft mode: the hard schedule replayed with differentiable cycle numbers."""

import csv

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from diffsim.data import shipped
from diffsim.isa import decode_blocks, parse_asm
from diffsim.params.table import READ_CLASSES, WRITE_ROLES, load_table
from diffsim.sim import encode, simulate, soft
from diffsim.sim.api import record_schedules

ITS = 16


def _record(table, batch, iterations=ITS):
  """Hard runs that keep their schedules: (cycles [B], status [B], traces [B, T, C]).

  `record_schedules` passes the table's numbers as arguments: tables of one layout and
  window share one compiled program.
  """
  return record_schedules(table, batch, iterations=iterations)


def _soft(table, batch, traces, tau, params=None, straight_through=False):
  params = table.params if params is None else params
  f = lambda b, t: soft.block_throughputs(params, table.structure, table.layout, b, t, ITS,
                                          tau, straight_through)
  return jax.vmap(f)(batch, traces)


@pytest.fixture(scope="module")
def blocks():
  with open(shipped("mca-small.csv")) as f:
    rows = list(csv.DictReader(f))
  decoded = decode_blocks([r["hex"] for r in rows[:200]])
  return [b for b in decoded if not isinstance(b, Exception) and len(b.instrs) <= 8][:64]


# skylake's table shares haswell's layout and most of its numbers, and haswell's layout
# is replayed by the gradient tests below: both in the slow suite only.
@pytest.mark.parametrize("cpu", [pytest.param("haswell", marks=pytest.mark.slow),
                                 pytest.param("skylake", marks=pytest.mark.slow), "znver3"])
def test_replay_at_zero_temperature_is_the_hard_simulator(cpu, blocks):
  """Every modelled constraint is a true lower bound of the hard schedule (no negative
  slack), and at tau = 0 the replay gives the hard cycle counts exactly."""
  table = load_table(cpu)
  batch = encode(table, blocks, length=8)
  cycles, _, traces = _record(table, batch)
  plain, _ = simulate(table, batch, iterations=ITS)
  np.testing.assert_array_equal(cycles, plain)  # tracing changes nothing
  total, _, min_slack = _soft(table, batch, traces, 0.0)
  assert float(jnp.min(min_slack)) >= 0
  np.testing.assert_array_equal(np.asarray(total), np.asarray(cycles, np.float32))


def test_soft_tends_to_hard_as_temperature_falls(blocks):
  table = load_table("haswell")
  batch = encode(table, blocks, length=8)
  cycles, _, traces = _record(table, batch)
  gaps = []
  for tau in (3.0, 1.0, 0.3, 0.1, 0.01):
    total = np.asarray(_soft(table, batch, traces, tau)[0])
    gaps.append(float(np.mean(np.abs(total - cycles) / cycles)))
  assert gaps[0] > 0.001  # a real relaxation at high temperature
  assert all(a >= b for a, b in zip(gaps, gaps[1:])), gaps
  assert gaps[-1] < 1e-4, gaps


def _chain_batch(table, asm):
  block = parse_asm(asm)
  return block, encode(table, [block], length=8)


def test_straight_through_gradient_predicts_the_hard_simulator():
  """On a latency-bound chain, d(steady)/d(latency) is what the hard simulator does
  when that latency grows by one cycle: 100 cycles per 100 iterations."""
  table = load_table("haswell")
  block, batch = _chain_batch(table, "addq %rbx, %rax; imulq %rax, %rax")
  cycles, _, traces = _record(table, batch)
  k = table.layout.index[block.instrs[1].key]

  def steady(params):
    return _soft(table, batch, traces, 0.3, params, straight_through=True)[1][0]

  g = jax.grad(steady)(table.params)
  grad = float(jnp.max(g.latency[k]))
  bumped = table.params.replace(latency=np.asarray(table.params.latency).copy())
  bumped.latency[k] += 1
  _, _, traces2 = _record(_with(table, bumped), batch)
  before = float(_soft(table, batch, traces, 0.0)[1][0])
  after = float(_soft(_with(table, bumped), batch, traces2, 0.0)[1][0])
  assert after - before == pytest.approx(100.0)
  assert grad == pytest.approx(100.0, rel=0.02)
  # The read-advance of the chain's reads and the adds' latency count too.
  assert float(jnp.sum(g.latency[table.layout.index[block.instrs[0].key]])) > 0


def _with(table, params):
  import dataclasses

  return dataclasses.replace(table, params=params)


def test_gradients_match_central_differences_in_float64(blocks):
  """Where the relaxed model is smooth (tau > 0), autodiff agrees with central finite
  differences of the same replay, along random directions over every parameter."""
  table = load_table("znver3")
  batch = encode(table, blocks[:16], length=8)
  _, _, traces = _record(table, batch)
  with jax.enable_x64(True):
    # Off the integer grid: there ties (a max over equal latencies) are kinks.
    rng = np.random.default_rng(0)
    # Resources in use stay in use, unused ones unused.
    p64 = jax.tree.map(lambda x: jnp.asarray(x, jnp.float64)
                       + 0.1 * rng.uniform(size=np.shape(x)), table.params)
    p64 = p64.replace(res_cycles=jnp.where(np.asarray(table.params.res_cycles) > 0,
                                           p64.res_cycles, 0.0))

    def f(params):
      return jnp.mean(_soft(table, batch, traces, 0.7, params)[1])

    grad = jax.grad(f)(p64)
    # (uops and the widths move the schedule only straight through: see the next test)
    for name in ("latency", "read_advance", "res_cycles"):
      v = rng.normal(size=np.shape(getattr(p64, name)))
      if name == "res_cycles":
        v = v * (np.asarray(table.params.res_cycles) > 0)  # unused stay unused
      v = v / np.linalg.norm(v)
      direction = jax.tree.map(jnp.zeros_like, p64).replace(**{name: jnp.asarray(v)})
      eps = 1e-6
      plus = jax.tree.map(lambda a, d: a + eps * d, p64, direction)
      minus = jax.tree.map(lambda a, d: a - eps * d, p64, direction)
      fd = (f(plus) - f(minus)) / (2 * eps)
      ad = float(jnp.sum(getattr(grad, name) * v))
      assert abs(fd) > 1e-4, name  # the direction matters
      assert ad == pytest.approx(float(fd), rel=1e-5, abs=1e-6), name


# The two extreme temperatures by default; those between in the slow suite.
@pytest.mark.parametrize("tau", [0.0, pytest.param(0.05, marks=pytest.mark.slow),
                                 pytest.param(1.0, marks=pytest.mark.slow), 10.0])
def test_no_nan_or_inf_in_gradients(tau, blocks):
  table = load_table("skylake")
  batch = encode(table, blocks, length=8)
  _, _, traces = _record(table, batch)
  for st in (False, True):
    g = jax.grad(lambda p: jnp.mean(_soft(table, batch, traces, tau, p, st)[1]))(table.params)
    assert all(bool(jnp.all(jnp.isfinite(x))) for x in jax.tree.leaves(g))


def test_width_and_uop_gradients_follow_the_dispatch_bound():
  """A dispatch-bound block takes n * uops / width cycles per iteration; the straight-
  through gradients are those of that fluid bound, and the hard simulator agrees."""
  table = load_table("haswell")  # 4-wide
  block, batch = _chain_batch(table, "; ".join(["nop"] * 8))
  _, _, traces = _record(table, batch)
  steady = lambda p: _soft(table, batch, traces, 0.0, p)[1][0]
  assert float(steady(table.params)) == pytest.approx(200.0)
  g = jax.grad(steady)(table.params)
  assert float(g.dispatch_width) == pytest.approx(-8 * 100 / 16, rel=0.05)
  assert float(g.uops[table.layout.index[block.instrs[0].key]]) == pytest.approx(200, rel=0.05)
  wider = _with(table, table.params.replace(dispatch_width=np.float32(5)))
  _, _, traces5 = _record(wider, batch)
  assert float(_soft(wider, batch, traces5, 0.0)[1][0]) < 200  # and the hard run agrees


def test_simulate_soft_is_the_public_differentiable_entry_point(blocks):
  from diffsim.sim import simulate_soft

  table = load_table("haswell")
  batch = encode(table, blocks[:12], length=8)
  total, _, codes = simulate_soft(table, batch, iterations=ITS, tau=0.0)
  hard, _ = simulate(table, batch, iterations=ITS)
  np.testing.assert_array_equal(np.asarray(total), hard.astype(np.float32))
  assert not np.asarray(codes).any()

  def per_100(p):
    return simulate_soft(table, batch, params=p, iterations=ITS).per_100.mean()

  g = jax.grad(per_100)(table.params)
  assert float(jnp.abs(g.latency).sum()) > 0


def test_a_failed_hard_run_is_never_replayed_silently(blocks):
  """Past the cycle budget, beyond the trace, or with a ROB wider than the window:
  `record_schedules` returns the codes, and `simulate_soft` raises naming the blocks
  (also under jit) or, with throw=False, returns them."""
  from diffsim.sim import SimulationError, simulate_soft, status

  table = load_table("haswell")
  batch = encode(table, blocks[:4], length=8)
  short = record_schedules(table, batch, iterations=ITS, dynamic=8, max_cycles=8)
  np.testing.assert_array_equal(short.status, [status.CYCLE_BUDGET | status.TRACE_LENGTH] * 4)
  with pytest.raises(SimulationError, match=r"simulate_soft: 4 of 4 blocks failed(.|\n)*"
                                            r"block 3: did not finish within the cycle budget"):
    simulate_soft(table, batch, iterations=ITS, max_cycles=8)
  wide = table.params.replace(rob_size=np.float32(1000))  # the ring has the table's 192 slots
  out = simulate_soft(table, batch, params=wide, iterations=ITS, max_cycles=8, throw=False)
  np.testing.assert_array_equal(out.status, [status.CYCLE_BUDGET | status.WINDOW] * 4)
  replay = jax.jit(lambda p: simulate_soft(table, batch, params=p, iterations=ITS,
                                           max_cycles=8).per_100)
  with pytest.raises(Exception, match="did not finish within the cycle budget"):
    jax.block_until_ready(replay(table.params))


def _memory_table(on: bool = True):
  """zen5-facts with memory dependences on (its default) or off."""
  from diffsim.params.table import from_json, load_json

  doc = load_json("zen5-facts")
  doc["global"]["memory_dependences"] = on
  return from_json(doc)


# Chains through memory that renaming does not shortcut: the address is written
# through another register, or through one the block rewrites.
MEMORY_CHAINS = ["addl $1, 8(%rdi); movq (%rdi), %rdi",  # read-modify-write, forwarded
                 "movq (%rsi), %rax; addq $3, %rax; movq %rax, (%rdi)",
                 "movq %rax, 8(%rdi); movq 8(%rsi), %rbx; imulq %rbx, %rax"]


def test_memory_dependences_soft_equals_hard_and_gradients_are_right():
  """The store -> load edges (a `MEM` write role, a `mem` read class) are ordinary edges
  of the replay: at tau = 0 it is the hard simulator, the chain's cost follows each
  store's MEM latency one for one, and autodiff agrees with finite differences."""
  table = _memory_table()
  plain = _memory_table(on=False)
  blocks = [parse_asm(a) for a in MEMORY_CHAINS]
  batch = encode(table, blocks, length=8)
  # The store, and for a store of a register what produced its data: 1 + 2 + 2 edges.
  assert np.asarray(batch.dep_class == READ_CLASSES.index("mem"))[batch.dep_valid].sum() == 5
  cycles, _, traces = _record(table, batch)
  total, steady, min_slack = _soft(table, batch, traces, 0.0)
  assert float(jnp.min(min_slack)) >= 0
  np.testing.assert_array_equal(np.asarray(total), np.asarray(cycles, np.float32))
  # Without memory dependences the same blocks are much faster: the edges bind.
  plain_batch = encode(plain, blocks, length=8)
  assert (simulate(plain, plain_batch, iterations=ITS)[0] < cycles).all()
  mem = WRITE_ROLES.index("MEM")
  g = jax.grad(lambda p: _soft(table, batch, traces, 0.0, p)[1][0])(table.params)
  k = table.layout.index[blocks[0].instrs[0].key]
  assert float(g.latency[k, mem]) == pytest.approx(100.0, rel=0.02)  # one cycle an iteration
  bumped = table.params.replace(latency=np.asarray(table.params.latency).copy())
  bumped.latency[k, mem] += 1
  _, _, traces2 = _record(_with(table, bumped), batch)
  after = float(_soft(_with(table, bumped), batch, traces2, 0.0)[1][0])
  assert after - float(steady[0]) == pytest.approx(100.0)
  with jax.enable_x64(True):
    p64 = jax.tree.map(lambda x: jnp.asarray(x, jnp.float64) + 0.1, table.params)
    f = lambda p: jnp.mean(_soft(table, batch, traces, 0.7, p)[1])  # noqa: E731
    v = np.zeros(np.shape(p64.latency))
    v[:, mem] = np.random.default_rng(0).normal(size=v.shape[0])
    d = jax.tree.map(jnp.zeros_like, p64).replace(latency=jnp.asarray(v))
    eps = 1e-6
    fd = (f(jax.tree.map(lambda a, b: a + eps * b, p64, d))
          - f(jax.tree.map(lambda a, b: a - eps * b, p64, d))) / (2 * eps)
    ad = float(jnp.sum(jax.grad(f)(p64).latency * v))
    assert abs(float(fd)) > 1e-3
    assert ad == pytest.approx(float(fd), rel=1e-5, abs=1e-6)


def test_memory_dependences_are_off_in_llvm_mca_tables():
  """llvm-mca compares no addresses: its tables never get memory edges, so the
  fidelity to llvm-mca cannot change."""
  table = load_table("znver3")
  assert not table.layout.memory_dependences
  batch = encode(table, [parse_asm(MEMORY_CHAINS[0])], length=8)
  assert not (np.asarray(batch.dep_class) == READ_CLASSES.index("mem"))[batch.dep_valid].any()


def _banked(loads_per_bank: int):
  """graniterapids-facts with the L1 bank limit as measured (2) or off (0)."""
  from diffsim.params.table import from_json, load_json

  doc = load_json("graniterapids-facts")
  doc["global"]["l1_bank_loads"] = loads_per_bank
  return from_json(doc)


def test_l1_bank_limit_matches_the_xeon_soft_equals_hard_and_gradients_are_right():
  """A load waits n cycles after its own instance two iterations back when its L1
  banks take n loads an iteration (an edge of fixed weight): the Xeon 6's cycles per 100 iterations (`diffsim measure`: 49, 101, 73) against 3
  load ports' 33, 67, 67 without the limit; the replay stays exact at tau = 0 and its
  gradient right where latencies meet the bank edges."""
  from diffsim.sim import simulate_blocks

  asm = ["movq 8(%rbx), %rax", "movq 8(%rbx), %rax\nmovq 72(%rbx), %rcx",
         "movl 8(%rbx), %eax\nmovl 12(%rbx), %ecx",
         "movq 8(%rbx), %rax\naddq %rax, %rcx\nimulq %rcx, %rcx\nmovq 8(%rcx), %rdx"]
  blocks = [parse_asm(a) for a in asm]
  on, off = _banked(2), _banked(0)
  steady = lambda t: [p.cycles for p in simulate_blocks(t, blocks[:3], throughput="steady")]  # noqa: E731
  assert steady(on) == [50, 100, 67]
  assert steady(off) == [33, 67, 67]
  batch = encode(on, blocks, length=8)
  cycles, _, traces = _record(on, batch)
  total, _, min_slack = _soft(on, batch, traces, 0.0)
  assert float(jnp.min(min_slack)) >= 0
  np.testing.assert_array_equal(np.asarray(total), np.asarray(cycles, np.float32))
  with jax.enable_x64(True):
    p64 = jax.tree.map(lambda x: jnp.asarray(x, jnp.float64) + 0.1, on.params)
    f = lambda p: _soft(on, batch, traces, 0.7, p)[1][3]  # noqa: E731
    v = np.random.default_rng(1).normal(size=np.shape(p64.latency))
    d = jax.tree.map(jnp.zeros_like, p64).replace(latency=jnp.asarray(v))
    eps = 1e-6
    fd = (f(jax.tree.map(lambda a, b: a + eps * b, p64, d))
          - f(jax.tree.map(lambda a, b: a - eps * b, p64, d))) / (2 * eps)
    ad = float(jnp.sum(jax.grad(f)(p64).latency * v))
    assert abs(float(fd)) > 1e-3
    assert ad == pytest.approx(float(fd), rel=1e-5, abs=1e-6)
