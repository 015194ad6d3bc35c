"""Fast-forward: what a fingerprint may leave out, and that jumps stay exact."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax import lax

from diffsim.isa import decode_blocks
from diffsim.mca import run_mca
from diffsim.params.table import load_table
from diffsim.sim import encode, period, pipeline, simulate
from diffsim.sim.kernels import window_for
from diffsim.sim.facts import BIG, gather
from diffsim.sim.state import init

# BHive blocks: `subq $8, %rsp; movq 16(%rdi), %rdi` repeats only once the loads
# issued while the ROB was filling have retired, unless their issue cycles, long
# past, are left out of the fingerprint; the `divq` block keeps many loads executed
# and waiting to retire behind its divides.
SHORT = "4883ec08488b7f10"
DIV = "4863410831d2488b3148f7f3498d04d64c8b184d85db"
LONG_PERIOD = "488b8424e00000004883787000"  # movq 224(%rsp), %rax; cmpq $0, 112(%rax)


@pytest.fixture(scope="module")
def haswell():
  return load_table("haswell")


def _setup(table, hex_):
  block = decode_blocks([hex_])[0]
  batch = encode(table, [block])
  facts = gather(table.params, table.structure, table.layout,
                 jax.tree.map(lambda x: jnp.asarray(x[0]), batch))
  return block, batch, facts


def _start(table, facts, iterations):
  members = jnp.asarray(table.layout.group_members, jnp.int32)
  params = table.params
  state = init(facts.n * iterations, facts.unit_cycles.shape[-1], members,
               params.buffer_size.shape[0], params.prf_size.shape[0],
               window_for(params.rob_size))
  return state, members, pipeline.integer_globals(params)


def _until_jump(table, facts, iterations):
  """The fast-forwarding loop of `run_block`, stopped right after its jump (or at
  the end): (state, memory)."""
  state, members, g = _start(table, facts, iterations)
  go = lambda c: pipeline.running(c[0], 1 << 20) & ~c[1].jumped  # noqa: E731
  return jax.jit(lambda s: lax.while_loop(
      go, lambda c: pipeline.advance(*c, facts, members, g, True),
      (s, period.init_memory())))(state)


def test_block_jumps_once_the_long_executed_look_alike_and_stays_exact(haswell):
  block, batch, facts = _setup(haswell, SHORT)
  state, memory = _until_jump(haswell, facts, 100)
  assert bool(memory.jumped)
  assert int(state.next) > 80 * int(facts.n)  # most iterations were jumped over
  fast, _ = simulate(haswell, batch, iterations=100)
  slow, _ = simulate(haswell, batch, iterations=100, fast_forward=False)
  assert fast[0] == slow[0] == run_mca([block.text], "haswell")[0].cycles


def test_fingerprint_leaves_out_only_what_cannot_matter(haswell):
  _, _, facts = _setup(haswell, DIV)
  # A state in the middle of a run, once 12 of 20 iterations have dispatched.
  state, members, g = _start(haswell, facts, 20)
  step = jax.jit(lambda s: pipeline.stride(s, period.init_memory(), facts, members, g)[0])
  while int(state.next) < 12 * int(facts.n):
    state = step(state)
  t = int(state.t)

  def fp(s):
    return np.asarray(period.fingerprint(s, jnp.mod(s.next, facts.n), facts.horizon,
                                         facts.rr_groups))

  W = state.issue_t.shape[0]
  slots = (int(state.head) + np.arange(int(state.next) - int(state.head))) % W
  issue = np.asarray(state.issue_t)[slots]
  horizon = np.asarray(facts.horizon)[np.asarray(state.index)[slots]]
  old = slots[(issue < BIG) & (issue < t - horizon)]
  recent = slots[(issue < BIG) & (issue >= t - horizon)]
  assert len(old) and len(recent)
  moved = lambda s, slot, dt: s.replace(issue_t=s.issue_t.at[slot].add(dt))  # noqa: E731
  np.testing.assert_array_equal(fp(state), fp(moved(state, old[0], -7)))
  assert np.any(fp(state) != fp(moved(state, recent[0], -1)))
  rr = np.asarray(facts.rr_groups)
  assert rr.any() and not rr.all()
  other = lambda g_: state.replace(seq=state.seq.at[g_].set(state.seq[g_] ^ 1))  # noqa: E731
  np.testing.assert_array_equal(fp(state), fp(other(int(np.argmin(rr)))))
  assert np.any(fp(state) != fp(other(int(np.argmax(rr)))))


def test_period_longer_than_the_recent_fingerprints_is_found_through_the_anchor(haswell):
  # Two loads a cycle on two load ports: the machine repeats only every 20 iteration
  # boundaries (the round-robin of the load ports against the retire pattern), more
  # than the `SLOTS` recent fingerprints reach back.
  block, batch, facts = _setup(haswell, LONG_PERIOD)
  state, memory = _until_jump(haswell, facts, 100)
  assert bool(memory.jumped)
  assert int(memory.count) > period.SLOTS  # found beyond the ring, so by the anchor
  assert int(state.next) > 80 * int(facts.n)
  fast, _ = simulate(haswell, batch, iterations=100)
  slow, _ = simulate(haswell, batch, iterations=100, fast_forward=False)
  assert fast[0] == slow[0] == run_mca([block.text], "haswell")[0].cycles
