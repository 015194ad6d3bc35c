"""Exact fast-forward over repeating iterations.

A looped block soon settles into a repeating pattern: the machine state at the end of
some cycle, seen relative to that cycle and to the next instruction to dispatch,
equals the state one or more iterations earlier. The model is deterministic and
depends on absolute positions only through the number of instructions left to
dispatch, so from then on it repeats exactly. When that happens we jump ahead by
whole periods, shifting every absolute cycle and index, and simulate only the rest:
the pipeline's drain at the end is simulated for real, so Total Cycles stays exact.

States are compared by two independent 32-bit hashes of the relative state, taken
at the end of each cycle in which dispatch crossed an iteration boundary; the last
`SLOTS` such fingerprints are kept. Blocks that never settle simply run to the end.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct

from diffsim.sim.facts import BIG
from diffsim.sim.state import State

SLOTS = 16  # fingerprints remembered: periods up to 16 boundary crossings
PAST = -512  # issue cycles further back than any latency compare equal


@struct.dataclass
class Memory:
  """Fingerprints of recent iteration boundaries."""

  hash: jax.Array  # [SLOTS, 2] uint32
  t: jax.Array  # [SLOTS] int32: cycle of each fingerprint
  next: jax.Array  # [SLOTS] int32: next-to-dispatch index at each fingerprint
  count: jax.Array  # [] int32: fingerprints taken
  jumped: jax.Array  # [] bool: fast-forward already done


def init_memory() -> Memory:
  return Memory(hash=jnp.zeros((SLOTS, 2), jnp.uint32), t=jnp.zeros(SLOTS, jnp.int32),
                next=jnp.full(SLOTS, -1, jnp.int32), count=jnp.zeros((), jnp.int32),
                jumped=jnp.zeros((), bool))


def _weights(size: int, seed: int) -> np.ndarray:
  rng = np.random.default_rng(seed)
  return (rng.integers(1, 2**32, size=size, dtype=np.uint64) | 1).astype(np.uint32)


def fingerprint(state: State, phase) -> jax.Array:
  """[2] uint32: hashes of the state relative to its cycle and dispatch position."""
  W = state.issue_t.shape[0]
  t = state.t
  pos = jnp.arange(W, dtype=jnp.int32)
  idx = jnp.mod(state.head + pos, W)  # window in age order, oldest first
  live = pos < state.next - state.head
  issue_t = state.issue_t[idx]
  issued = issue_t < BIG
  rel_issue = jnp.where(issued, jnp.maximum(issue_t - t, PAST), BIG)
  rel_ready = jnp.where(issued, 0, jnp.maximum(state.ready_t[idx] - t, 0))
  window = jnp.stack([
      jnp.where(live, rel_issue, 7), jnp.where(live, rel_ready, 7),
      jnp.where(live & ~issued, state.pending[idx], 7),
      jnp.where(live & ~issued, state.users[idx], 7)], axis=-1).reshape(-1)
  scalars = jnp.concatenate([
      jnp.stack([state.next - state.head, phase, state.carry, state.rob_used, state.lq_used,
                 state.sq_used]),
      state.rs_used, state.prf_used, jnp.maximum(state.busy_until - t, 0),
      jnp.maximum(state.reserved_until - t, 0), state.seq, state.skip]).astype(jnp.int32)
  values = jnp.concatenate([window, scalars]).astype(jnp.uint32)
  hashes = []
  for seed in (1, 2):
    w = jnp.asarray(_weights(values.shape[0], seed))
    h = jnp.sum(values * w, dtype=jnp.uint32)
    h = h ^ (h >> 15)
    hashes.append(h * jnp.uint32(2246822519))
  return jnp.stack(hashes)


def shift(state: State, periods, dt, di) -> State:
  """The state `periods` periods of (dt cycles, di instructions) later."""
  W = state.issue_t.shape[0]
  ddyn = periods * di
  dcyc = periods * dt
  roll = lambda x: jnp.roll(x, jnp.mod(ddyn, W))  # noqa: E731 (slot = dyn % W)
  later = lambda x: jnp.where(x >= BIG, x, x + dcyc)  # noqa: E731
  return state.replace(
      t=state.t + dcyc, head=state.head + ddyn, next=state.next + ddyn,
      last_retire=state.last_retire + dcyc,
      busy_until=state.busy_until + dcyc, reserved_until=state.reserved_until + dcyc,
      issue_t=roll(later(state.issue_t)), ready_t=roll(state.ready_t + dcyc),
      pending=roll(state.pending), users=roll(state.users))


def fast_forward(state: State, memory: Memory, before_next, n):
  """Records a fingerprint at iteration boundaries and jumps when one repeats."""
  crossed = (state.next // n) > (before_next // n)
  look = crossed & ~memory.jumped
  h = fingerprint(state, jnp.mod(state.next, n))
  same = jnp.all(memory.hash == h[None, :], axis=-1) & (memory.next >= 0)
  same &= jnp.mod(state.next - memory.next, n) == 0
  hit = look & jnp.any(same)
  j = jnp.argmax(same)  # any match: equal states repeat with every period between them
  dt = state.t - memory.t[j]
  di = state.next - memory.next[j]
  periods = jnp.where(hit & (di > 0), (state.total - state.next) // jnp.maximum(di, 1), 0)
  jumped_state = shift(state, periods, dt, di)
  state = jax.tree.map(lambda a, b: jnp.where(periods > 0, a, b), jumped_state, state)
  slot = jnp.mod(memory.count, SLOTS)
  record = look & ~hit
  memory = Memory(
      hash=memory.hash.at[slot].set(jnp.where(record, h, memory.hash[slot])),
      t=memory.t.at[slot].set(jnp.where(record, state.t, memory.t[slot])),
      next=memory.next.at[slot].set(jnp.where(record, state.next, memory.next[slot])),
      count=memory.count + record.astype(jnp.int32),
      jumped=memory.jumped | hit)
  return state, memory
