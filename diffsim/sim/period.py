"""Exact fast-forward over repeating iterations.

A looped block soon settles into a repeating pattern: the machine state at the end of
some cycle, seen relative to that cycle and to the next instruction to dispatch,
equals the state one or more iterations earlier. The model is deterministic and
depends on absolute positions only through the number of instructions left to
dispatch, so from then on it repeats exactly. When that happens we jump ahead by
whole periods, shifting every absolute cycle and index, and simulate only the rest:
the pipeline's drain at the end is simulated for real, so Total Cycles stays exact.

States are compared by two independent 32-bit hashes of the relative state, taken
at the end of each cycle in which dispatch crossed an iteration boundary. The last
`SLOTS` such fingerprints are kept, and one more, an anchor, is set at the SLOTS-th
fingerprint and again each time the count doubles (Brent's cycle finding): a period
of any length is found by the time the count is twice the larger of it and the
transient before it. Blocks that never settle simply run to the end.
The hash leaves out what cannot change the future, so that a repeat shows as soon as
the machine repeats: the issue cycles of instructions long executed (they only wait
to retire, and those dispatched while the ROB was filling were issued at other
distances from now than later ones), and the round-robin state of groups no
instruction of the block picks from.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from flax import struct
from jax import lax

from diffsim.sim.facts import BIG
from diffsim.sim.state import State

SLOTS = 16  # recent fingerprints remembered, besides the anchor
LONG_AGO = -(1 << 20)  # hashed for every issue cycle beyond its instruction's horizon
FIELDS = 4  # per-slot fields hashed


@struct.dataclass
class Memory:
  """Fingerprints of recent iteration boundaries (slot SLOTS: the anchor)."""

  hash: jax.Array  # [SLOTS + 1, 2] uint32
  t: jax.Array  # [SLOTS + 1] int32: cycle of each fingerprint
  next: jax.Array  # [SLOTS + 1] int32: next-to-dispatch index at each fingerprint
  count: jax.Array  # [] int32: fingerprints taken
  jumped: jax.Array  # [] bool: fast-forward already done


def init_memory() -> Memory:
  return Memory(hash=jnp.zeros((SLOTS + 1, 2), jnp.uint32), t=jnp.zeros(SLOTS + 1, jnp.int32),
                next=jnp.full(SLOTS + 1, -1, jnp.int32), count=jnp.zeros((), jnp.int32),
                jumped=jnp.zeros((), bool))


def _mix(x):
  """A 32-bit integer hash (murmur3's finaliser), elementwise."""
  x = x.astype(jnp.uint32)
  x = (x ^ (x >> 16)) * jnp.uint32(0x85EBCA6B)
  x = (x ^ (x >> 13)) * jnp.uint32(0xC2B2AE35)
  return x ^ (x >> 16)


def _weights(W: int):
  """[2W, 2, FIELDS] uint32 odd hash weights per age position, the table written twice.

  Slot s of a window whose head sits in slot h has age position (s - h) mod W, so its
  weights are rows W - h + s of this table: one slice, no per-cycle hashing.
  """
  with jax.ensure_compile_time_eval():  # a constant of the compiled program
    x = (jnp.arange(W, dtype=jnp.int32)[:, None, None] * 8
         + jnp.arange(FIELDS, dtype=jnp.int32)[None, None, :]
         + jnp.array([0x1234567, 0x2345678], jnp.int32)[None, :, None])
    w = _mix(x) | jnp.uint32(1)
    return np.asarray(jnp.concatenate([w, w]))


def fingerprint(state: State, phase, horizon, rr_groups) -> jax.Array:
  """[2] uint32: hashes of the state relative to its cycle and dispatch position.

  Window slots are weighted by their age position, so equal states hash equal
  wherever the ring happens to stand. `horizon`, `rr_groups`: the block's
  (`Facts`); an issue cycle more than its instruction's horizon back is only
  compared to `t` from then on (executed, operands ready), so all such hash alike.
  """
  W = state.issue_t.shape[0]
  t = state.t
  h0 = jnp.mod(state.head, W)
  w = lax.dynamic_slice_in_dim(jnp.asarray(_weights(W)), W - h0, W)  # [W, 2, FIELDS]
  pos = jnp.mod(jnp.arange(W, dtype=jnp.int32) - h0, W)
  live = pos < state.next - state.head
  issued = state.issue_t < BIG
  fields = jnp.stack([
      jnp.where(issued, jnp.where(state.issue_t < t - horizon[state.index], LONG_AGO,
                                  state.issue_t - t),
                BIG),
      jnp.where(issued, 0, jnp.maximum(state.ready_t - t, 0)),
      jnp.where(issued, 0, state.pending),
      jnp.where(issued, 0, state.users)], axis=-1)  # [W, FIELDS]
  fields = jnp.where(live[:, None], fields, 0).astype(jnp.uint32)
  window = jnp.sum(fields[:, None, :] * w, axis=(0, 2), dtype=jnp.uint32)  # [2]
  scalars = jnp.concatenate([
      jnp.stack([state.next - state.head, phase, state.carry, state.rob_used, state.lq_used,
                 state.sq_used]),
      state.rs_used, state.prf_used, jnp.maximum(state.busy_until - t, 0),
      jnp.maximum(state.reserved_until - t, 0), jnp.where(rr_groups, state.seq, 0),
      jnp.where(rr_groups, state.skip, 0)]).astype(jnp.uint32)
  hashes = []
  for j, seed in enumerate((0x1234567, 0x2345678)):
    w = _mix(jnp.arange(scalars.shape[0], dtype=jnp.int32) + seed * 3) | jnp.uint32(1)
    hashes.append(_mix(window[j] + jnp.sum(scalars * w, dtype=jnp.uint32)))
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
      last_user=jnp.where(state.last_user >= 0, state.last_user + ddyn, -1),
      issue_t=roll(later(state.issue_t)), ready_t=roll(state.ready_t + dcyc),
      pending=roll(state.pending), users=roll(state.users), index=roll(state.index),
      latency=roll(state.latency),
      flags=roll(state.flags), rob_cost=roll(state.rob_cost),
      prf_cost=jnp.roll(state.prf_cost, jnp.mod(ddyn, W), axis=0))


def crossed(state: State, before_next, n, memory: Memory, settle) -> jax.Array:
  """[] bool: dispatch just crossed an iteration boundary worth a fingerprint.

  `settle`: the first iteration from which the block's dependency edges are the same
  in every iteration (register renaming can make early iterations differ); states
  before it are never compared, since a jump from there would carry the early edges on.
  """
  return ((state.next // n) > (before_next // n)) & ~memory.jumped & (state.head >= settle * n)


def observe(state: State, memory: Memory, look, n, horizon, rr_groups):
  """Records a fingerprint (when `look`) and plans a jump when one repeats. `n`,
  `horizon`, `rr_groups`: the block's `Facts`.

  Returns (memory, jump): `jump` = (periods, dt, di) for `leap`, periods 0 for none.
  """
  h = fingerprint(state, jnp.mod(state.next, n), horizon, rr_groups)
  same = jnp.all(memory.hash == h[None, :], axis=-1) & (memory.next >= 0)
  same &= jnp.mod(state.next - memory.next, n) == 0
  hit = look & jnp.any(same)
  j = jnp.argmax(same)  # any match: equal states repeat with every period between them
  dt = state.t - memory.t[j]
  di = state.next - memory.next[j]
  periods = jnp.where(hit & (di > 0), (state.total - state.next) // jnp.maximum(di, 1), 0)
  record = look & ~hit
  c = memory.count
  anchor = (c >= SLOTS) & ((c & (c - 1)) == 0)  # SLOTS, then each doubling
  slot = jnp.arange(SLOTS + 1)
  into = record & ((slot == jnp.mod(c, SLOTS)) | ((slot == SLOTS) & anchor))
  memory = Memory(
      hash=jnp.where(into[:, None], h[None, :], memory.hash),
      t=jnp.where(into, state.t, memory.t), next=jnp.where(into, state.next, memory.next),
      count=c + record.astype(jnp.int32), jumped=memory.jumped | hit)
  return memory, (periods.astype(jnp.int32), dt, di)


def leap(state: State, jump) -> State:
  """The state after the planned jump (unchanged when it plans none)."""
  periods, dt, di = jump
  return jax.tree.map(lambda a, b: jnp.where(periods > 0, a, b),
                      shift(state, periods, dt, di), state)
