"""Soft mode: the hard schedule replayed with differentiable cycle numbers."""

import csv
import dataclasses

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
  # The add is on the chain too: its latency costs a cycle an iteration as well.
  add = table.layout.index[block.instrs[0].key]
  assert float(jnp.sum(g.latency[add])) == pytest.approx(100.0, rel=0.02)


def _with(table, params):
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
  cycles, _, traces = _record(table, batch)
  for st in (False, True):
    g = jax.grad(lambda p: jnp.mean(_soft(table, batch, traces, tau, p, st)[1]))(table.params)
    assert all(bool(jnp.all(jnp.isfinite(x))) for x in jax.tree.leaves(g))
  # Straight through, the forward value is the exact max at any temperature: the hard
  # cycles (float32 carries these small integers exactly).
  total = _soft(table, batch, traces, tau, straight_through=True)[0]
  np.testing.assert_array_equal(np.asarray(total), np.asarray(cycles, np.float32))


def _steady_hard(table, batch):
  """The hard simulator's own steady cycles per 100 iterations [B], read off its trace's
  retirement cycles as the replay defines steady (`soft.throughputs`), and its traces."""
  from diffsim.sim.state import RETIRE

  _, _, traces = _record(table, batch)
  n = np.asarray(batch.valid).sum(-1)
  r = np.asarray(traces)[:, :, RETIRE].astype(np.float64)
  rows = np.arange(len(n))
  return 100 * (r[rows, n * ITS - 1] - r[rows, n * (ITS // 2) - 1]) / (ITS - ITS // 2), traces


def _steady_grad(table, batch, traces, j):
  """The gradient of block j's steady cycles at tau = 0."""
  return jax.grad(lambda p: _soft(table, batch, traces, 0.0, p)[1][j])(table.params)


def test_tau0_gradients_are_the_hard_simulators_unit_steps(blocks):
  """Wherever the hard simulator's Total Cycles move linearly with one opcode's latency
  or resource cycles (adding 1 to its used entries: the steps from -1 to +2 equal), the
  replay's gradient at tau = 0 along that bump is the hard step, exactly.

  All but one of the ~50 linear cases: where the replay's max ties, JAX splits the
  gradient between the tied constraints, which may lie on paths of different slope. Block
  4, a chain of three dependent loads (MOV64rm), gets 3.95 against the hard 3.
  """
  table = load_table("haswell")
  batch = encode(table, blocks[:16], length=8)
  cycles, _, traces = _record(table, batch)
  grads = jax.jacrev(lambda p: _soft(table, batch, traces, 0.0, p)[0])(table.params)
  opcodes = np.asarray(batch.opcode)[np.asarray(batch.valid)]
  compared, misses = {}, []
  for kind in ("latency", "res_cycles"):
    numbers = np.asarray(getattr(table.params, kind))
    compared[kind] = 0
    for k in np.unique(opcodes):
      bump = (numbers[k] > 0).astype(numbers.dtype)  # the entries the opcode uses
      if not bump.any():
        continue
      hard = []
      for step in (-1, 1, 2):
        moved = numbers.copy()
        moved[k] += step * bump
        hard.append(_record(_with(table, table.params.replace(**{kind: moved})), batch)[0])
      steps = np.diff(np.stack([hard[0], cycles, hard[1], hard[2]]), axis=0)
      uses = (np.asarray(batch.opcode) == k).any(-1)
      linear = uses & (steps == steps[0]).all(0)
      ad = np.asarray(getattr(grads, kind)[:, k]) @ bump
      compared[kind] += int(linear.sum())
      for j in np.flatnonzero(linear & (np.abs(ad - steps[0]) > 1e-3)):
        misses.append((kind, table.layout.keys[k], int(j), int(steps[0, j]), float(ad[j])))
  assert min(compared.values()) >= 15, compared
  assert [m[:3] for m in misses] == [("latency", "MOV64rm", 4)], (compared, misses)


def _nudged(table, **globals_):
  return _with(table, table.params.replace(**{k: np.float32(v) for k, v in globals_.items()}))


def test_width_gradient_is_the_slope_of_the_hard_dispatch_bound():
  """Eight nops a 4-wide machine dispatches in 2 cycles: at the widths that divide the
  64 uops of 8 iterations the hard simulator is exactly 800 / width cycles per 100
  iterations, and at width 4 the gradient is that curve's slope, -800 / 16. A block
  bound by its 4 ALU ports (six adds) is flat in the width past 4, and so is its
  gradient."""
  table = load_table("haswell")  # 4-wide, 4 ALU ports
  blocks = [parse_asm("; ".join(["nop"] * 8)),
            parse_asm("; ".join(f"addl $1, %{r}" for r in ("eax", "ebx", "ecx", "edx", "esi",
                                                            "edi")))]
  batch = encode(table, blocks, length=8)
  hard = {w: _steady_hard(_nudged(table, dispatch_width=w), batch) for w in (2, 4, 5, 6, 7, 8)}
  for w in (2, 4, 8):
    assert hard[w][0][0] == 800 / w
  assert hard[5][0][0] == 162.5  # 64 uops at 5 a cycle take 13 cycles, not 12.8
  assert [hard[w][0][1] for w in (5, 6, 7)] == [150.0] * 3  # 1.5 cycles on 4 ports
  for w, want in ((2, -200.0), (4, -50.0), (8, -12.5)):
    g = _steady_grad(_nudged(table, dispatch_width=w), batch, hard[w][1], 0)
    assert float(g.dispatch_width) == pytest.approx(want, rel=1e-5, abs=1e-4), w
  g = _steady_grad(_nudged(table, dispatch_width=6), batch, hard[6][1], 1)
  assert float(g.dispatch_width) == pytest.approx(0.0, abs=1e-4)  # float32 rounding


def test_uop_gradient_is_the_hard_simulators_step_on_a_dispatch_bound_block():
  """On a 12-wide machine six nops of u uops take u / 2 cycles an iteration for u = 1..4
  (12 is a multiple of each u): the hard simulator steps by 50 cycles per 100 iterations
  for every uop added, and the gradient at u = 2 is that step."""
  table = _nudged(load_table("haswell"), dispatch_width=12)
  block = parse_asm("; ".join(["nop"] * 6))
  batch = encode(table, [block], length=8)
  k = table.layout.index[block.instrs[0].key]

  def with_uops(u):
    uops = np.asarray(table.params.uops).copy()
    uops[k] = u
    return _with(table, table.params.replace(uops=uops))

  hard = {u: _steady_hard(with_uops(u), batch) for u in (1, 2, 3, 4)}
  assert [hard[u][0][0] for u in (1, 2, 3, 4)] == [50.0, 100.0, 150.0, 200.0]
  g = _steady_grad(with_uops(2), batch, hard[2][1], 0)
  assert float(g.uops[k]) == pytest.approx(50.0, rel=1e-5)
  assert float(g.dispatch_width) == pytest.approx(-100.0 / 12, rel=1e-5)  # -u n 100 / w^2


# A load chain whose every iteration starts afresh from %rax's last load, then seven
# nops, on haswell retiring one instruction a cycle: with a ROB of R < 8 entries the
# next load dispatches only when the nop R places before it retires, so each entry
# more saves a cycle an iteration.
ROB_BLOCK = "movq (%rax), %rax" + "; nop" * 7


def _rob_table(rob_size):
  return _nudged(load_table("haswell"), rob_size=rob_size, retire_width=1)


def test_rob_size_gradient_is_the_hard_simulators_step():
  """The hard simulator's steady cycles fall by 100 per ROB entry from 4 to 7 entries
  and not at all from 9 on; the gradient at tau = 0 is that slope, on both sides.

  Not yet everywhere: at 4 entries (nops wait for the ROB too) it is -300, and at 8,
  where the hard cycles are flat, -50."""
  block = parse_asm(ROB_BLOCK)
  table = _rob_table(5)
  batch = encode(table, [block], length=8)
  hard = {r: _steady_hard(_rob_table(r), batch) for r in range(4, 12)}
  steady = [hard[r][0][0] for r in range(4, 12)]
  assert steady == [1100.0, 1000.0, 900.0, 800.0, 800.0, 800.0, 800.0, 800.0]
  for r, want in ((5, -100.0), (6, -100.0), (10, 0.0)):
    g = _steady_grad(_rob_table(r), batch, hard[r][1], 0)
    assert float(g.rob_size) == pytest.approx(want, abs=1e-4), r


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
  # ... and its gradient is the replay's (default tau 0.5), leaf by leaf.
  _, _, traces = _record(table, batch)
  want = jax.grad(lambda p: _soft(table, batch, traces, 0.5, p)[1].mean())(table.params)
  for f in dataclasses.fields(g):
    np.testing.assert_allclose(np.asarray(getattr(g, f.name)), np.asarray(getattr(want, f.name)),
                               rtol=1e-6, atol=1e-6, err_msg=f.name)
  assert float(jnp.abs(g.latency).sum()) > 10  # and not all zero (it is about 50)


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
  v = np.zeros(np.shape(table.params.latency))
  v[:, mem] = np.random.default_rng(0).normal(size=v.shape[0])
  _latency_gradient_is_central_differences(
      table, lambda p: jnp.mean(_soft(table, batch, traces, 0.7, p)[1]), v)


def _latency_gradient_is_central_differences(table, f, v):
  """Autodiff of f (a scalar of the parameters) along latency direction v agrees with
  float64 central differences around the table's numbers plus 0.1, and is not zero."""
  with jax.enable_x64(True):
    p64 = jax.tree.map(lambda x: jnp.asarray(x, jnp.float64) + 0.1, table.params)
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


def _xeon(**fields):
  """graniterapids-facts with global `fields` changed (an L1 limit off: 0)."""
  from diffsim.params.table import from_json, load_json

  doc = load_json("graniterapids-facts")
  doc["global"].update(fields)
  return from_json(doc)


def _exact_replay_and_gradient(table, blocks):
  """The replay of `table`'s schedules is exact at tau = 0 and its latency gradient
  matches central differences at tau = 0.7."""
  batch = encode(table, blocks, length=8)
  cycles, _, traces = _record(table, batch)
  total, _, min_slack = _soft(table, batch, traces, 0.0)
  assert float(jnp.min(min_slack)) >= 0
  np.testing.assert_array_equal(np.asarray(total), np.asarray(cycles, np.float32))
  _latency_gradient_is_central_differences(
      table, lambda p: _soft(table, batch, traces, 0.7, p)[1][-1],
      np.random.default_rng(1).normal(size=np.shape(table.params.latency)))


# The Xeon 6's L1 limits, each an edge of fixed weight (measured with `diffsim measure`, cycles
# per 100 iterations, against the ports' rates without the limit); the last block of each
# puts a latency chain beside the edges.
L1_LIMITS = {
    # A load waits n cycles after its own instance two iterations back when its L1 banks
    # take n loads an iteration (`memory.bank_edges`): measured 49, 101, 73.
    "l1_bank_loads": (["movq 8(%rbx), %rax", "movq 8(%rbx), %rax\nmovq 72(%rbx), %rcx",
                       "movl 8(%rbx), %eax\nmovl 12(%rbx), %ecx",
                       "movq 8(%rbx), %rax\naddq %rax, %rcx\nimulq %rcx, %rcx\nmovq 8(%rcx), %rdx"],
                      [50, 100, 67], [33, 67, 67]),
    # Stores commit in order, two a cycle to one 64-byte line and one a cycle otherwise
    # (`memory.commit_edges`): measured 100, 200, 400.
    "l1_line_stores": (["movq $1, (%rbx)\nmovq $2, 8(%rbx)", "movq $1, (%rbx)\nmovq $2, 64(%rbx)",
                        "movq $1, (%rbx)\nmovq $1, 64(%rbx)\nmovq $2, 8(%rbx)\nmovq $2, 72(%rbx)",
                        "addq %rax, %rcx\nmovq %rcx, (%rbx)\nmovq %rcx, 64(%rbx)\nmovq %rcx, 128(%rbx)"],
                       [100, 200, 400], [100, 100, 200]),
}


@pytest.mark.parametrize("field", sorted(L1_LIMITS))
def test_xeon_l1_limits_match_the_cpu_soft_equals_hard_and_gradients_are_right(field):
  """Each limit on (2) gives the Xeon 6's measured cycles and off (0) the ports' rates;
  the replay stays exact at tau = 0 and its gradient right where latencies meet it."""
  from diffsim.sim import simulate_blocks

  asm, measured, ports = L1_LIMITS[field]
  blocks = [parse_asm(a) for a in asm]
  on, off = _xeon(**{field: 2}), _xeon(**{field: 0})
  steady = lambda t: [p.cycles for p in simulate_blocks(t, blocks[:3], throughput="steady")]  # noqa: E731
  assert steady(on) == measured
  assert steady(off) == ports
  _exact_replay_and_gradient(on, blocks)
