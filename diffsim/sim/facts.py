"""Per-block facts: the parameter table gathered onto one block's instructions.

Everything the cycle loop needs about static instruction c (c < L) is looked up once
per block here, so the loop itself never indexes the K-row table. Dependency edges
become dynamic-index offsets: the producer of edge (c, d) for dynamic instruction i
is i - dep_off[c, d], and the consumer of use (c, e) is i + use_off[c, e].

Hard mode rounds every parameter to an integer, as llvm-mca's tables are.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from flax import struct

from diffsim.isa.encode import ALWAYS, BlockBatch
from diffsim.isa.roles import FIXED_ROLE
from diffsim.params.table import READ_CLASSES, Layout, Params, Structure

BIG = 1 << 28  # "never": a cycle no simulation reaches


@struct.dataclass
class Facts:
  """One block's static facts. L instructions, D deps, C uses, U units, G groups."""

  n: jax.Array  # [] int32: block length
  uops: jax.Array  # [L] int32
  rob_cost: jax.Array  # [L] int32: ROB entries taken, max(1, min(uops, ROB))
  max_latency: jax.Array  # [L] int32: cycles from issue to executed
  zero_latency: jax.Array  # [L] bool: latency 0 and no resource: issues at dispatch
  dep_off: jax.Array  # [L, D] int32: dynamic distance back to the producer
  dep_w: jax.Array  # [L, D] int32: producer's write latency minus read-advance, >= 0
  #                   (for a write-after-write edge: see `gather`)
  dep_on: jax.Array  # [L, D] bool
  dep_first: jax.Array  # [L, D] int32: the edge holds for the consumer's iterations
  dep_last: jax.Array  # [L, D] int32:   dep_first <= k < dep_last (encode.ALWAYS: no end)
  use_off: jax.Array  # [L, C] int32: dynamic distance forward to the consumer
  use_dst: jax.Array  # [L, C] int32: the consumer's static index
  use_it: jax.Array  # [L, C] int32: iterations forward to the consumer
  use_w: jax.Array  # [L, C] int32: the edge's weight, as dep_w
  use_on: jax.Array  # [L, C] bool
  use_first: jax.Array  # [L, C] int32: the edge's dep_first / dep_last
  use_last: jax.Array  # [L, C] int32
  settle: jax.Array  # [] int32: first iteration from which every edge holds as in all
  #                    later ones (iterations before it must not seed a fast-forward)
  horizon: jax.Array  # [L] int32: cycles after its issue past which an instruction's issue
  #                     cycle no longer matters: it has executed and any reader that
  #                     dispatches later finds the operand ready (period.fingerprint)
  rr_groups: jax.Array  # [G] bool: groups some instruction picks a unit from, whose
  #                       round-robin state can matter (period.fingerprint)
  unit_cycles: jax.Array  # [L, U] int32: cycles each unit is used directly
  unit_mask: jax.Array  # [L] int32: bitmask of units that must be free (direct, implied)
  dunit: jax.Array  # [L, DU] int32: the units used directly, in bit order
  dunit_cycles: jax.Array  # [L, DU] int32
  dunit_on: jax.Array  # [L, DU] bool
  grp: jax.Array  # [L, Q] int32: kept groups, in llvm-mca's allocation order
  grp_cycles: jax.Array  # [L, Q] int32
  grp_need: jax.Array  # [L, Q] int32: free members the group must have
  grp_reserved: jax.Array  # [L, Q] bool: reserve the whole group instead of one unit
  grp_on: jax.Array  # [L, Q] bool
  grp_members: jax.Array  # [L, Q] int32: bitmask of each kept group's units (0 if off)
  blocked_by: jax.Array  # [L, G] bool: kept or touched groups; blocked while reserved
  buffers: jax.Array  # [L, R] bool: scheduler buffers taken from dispatch to issue
  may_load: jax.Array  # [L] bool
  may_store: jax.Array  # [L] bool
  ordered_store: jax.Array  # [L] bool: a store that waits until every older load and
  #                   store has issued (llvm-mca's LSUnit); none with memory dependences,
  #                   whose edges order only what really aliases
  load_barrier: jax.Array  # [L] bool: younger loads wait until it has executed
  store_barrier: jax.Array  # [L] bool: younger stores wait until it has executed
  zero_use: jax.Array  # [L] bool: some reader may issue in the same cycle as this one
  prf_cost: jax.Array  # [L, F] int32: physical registers taken in each file
  prf_need: jax.Array  # [L, F] int32: free registers each file must have to dispatch
  begin_group: jax.Array  # [L] bool
  end_group: jax.Array  # [L] bool


def group_order(layout: Layout):
  """[G] rank of each group in llvm-mca's (bits in mask, mask) order."""
  import numpy as np

  pop = np.array([bin(m).count("1") for m in layout.group_members], np.int64)
  return np.argsort(np.argsort(pop * 4096 + np.arange(len(pop)), kind="stable"), kind="stable")


def timing(params: Params, blocks: BlockBatch, hard: bool) -> dict:
  """The table's numbers on ONE block's instructions and dependency edges.

  The single definition of every cycle count the schedule adds up, shared by the
  hard simulator (`hard`: integers, as llvm-mca's tables are; a resource in use
  holds at least one cycle) and the soft mode (floats, differentiable).
  """
  rnd = jnp.round if hard else (lambda x: x)
  op = blocks.opcode
  # An eliminated move is done at dispatch: no latency, no resources, no reads (its
  # readers were linked to its source's writer by `encode`).
  elim = blocks.eliminated
  lat = rnd(params.latency[op])  # [L, E]
  raw = params.res_cycles[op]  # [L, R]
  cyc = jnp.where(raw > 0, jnp.maximum(rnd(raw), 1) if hard else raw, 0)
  # Edge weights: the producer's latency for that write minus the reader's advance.
  prod_lat = jnp.take_along_axis(rnd(params.latency[op[blocks.dep_src]]),
                                 jnp.minimum(blocks.dep_role, FIXED_ROLE - 1)[..., None],
                                 axis=-1)[..., 0]
  adv = jnp.take_along_axis(rnd(params.read_advance[op]), blocks.dep_class, axis=-1)
  fixed = blocks.dep_role - FIXED_ROLE  # an edge of fixed weight (`roles.FIXED_ROLE`)
  dep_w = jnp.where(fixed >= 0, fixed, jnp.maximum(prod_lat - adv, 0))
  # A partial write that waits for the write it merges into (llvm-mca's
  # WriteState::isReady) may issue once that write has fewer cycles left than the
  # partial write's own latency, or none at all.
  own_lat = jnp.take_along_axis(lat, jnp.maximum(blocks.dep_waw, 0), axis=-1)
  dep_w = jnp.where(blocks.dep_waw >= 0, jnp.maximum(prod_lat - jnp.maximum(own_lat, 1) + 1, 0),
                    dep_w)
  return dict(uops=rnd(params.uops[op]), max_latency=jnp.where(elim, 0, jnp.max(lat, axis=-1)),
              res_cycles=jnp.where(elim[:, None], 0, cyc), dep_w=dep_w)


def gather(params: Params, structure: Structure, layout: Layout, blocks: BlockBatch) -> Facts:
  """Facts for ONE block (vmap over blocks). All shapes follow the batch."""
  params, structure = jax.tree.map(jnp.asarray, (params, structure))
  op = blocks.opcode
  n = blocks.length.astype(jnp.int32)
  U = len(layout.units)
  nums = jax.tree.map(lambda x: x.astype(jnp.int32), timing(params, blocks, hard=True))
  uops = nums["uops"]
  rob = jnp.round(params.rob_size).astype(jnp.int32)
  elim = blocks.eliminated
  max_latency = nums["max_latency"]
  cyc = nums["res_cycles"]
  unit_cycles = cyc[:, :U]
  grp_cycles_all = cyc[:, U:]
  any_res = jnp.any(cyc > 0, axis=-1)
  zero_latency = (max_latency == 0) & ~any_res
  ignore = structure.ignores_reads[op]  # [L]
  src = blocks.dep_src
  dep_w = nums["dep_w"]
  waw = blocks.dep_waw >= 0
  c = jnp.arange(op.shape[0], dtype=jnp.int32)
  dep_off = c[:, None] - src + blocks.dep_dist * n
  # Idioms ignore their explicit register sources (llvm-mca's InstrBuilder marks only
  # those independent: `sbb %eax,%eax` still waits for EFLAGS), not the ordering of
  # their partial writes.
  explicit = (blocks.dep_class < READ_CLASSES.index("flags")) & ~waw
  dep_on = blocks.dep_valid & ~(ignore[:, None] & explicit) & ~elim[:, None]
  bounds = jnp.maximum(blocks.dep_first, jnp.where(blocks.dep_last < ALWAYS, blocks.dep_last, 0))
  settle = jnp.max(jnp.where(blocks.dep_valid, bounds, 0)).astype(jnp.int32)
  dst = blocks.use_dst
  use_w = dep_w[dst, blocks.use_edge]
  use_off = dst - c[:, None] + blocks.use_dist * n
  use_on = blocks.use_valid & dep_on[dst, blocks.use_edge]

  bits = (1 << jnp.arange(U, dtype=jnp.int32))
  # Units that must be free to issue: those it takes directly and llvm-mca's implied ones.
  unit_mask = (jnp.sum(jnp.where(unit_cycles > 0, bits, 0), axis=-1).astype(jnp.int32)
               | jnp.where(elim, 0, structure.implied[op]))
  DU = min(layout.max_direct_units, U)
  dunit = jnp.argsort(jnp.where(unit_cycles > 0, jnp.arange(U), U + 1), axis=-1)[:, :DU]
  dunit = dunit.astype(jnp.int32)
  dunit_cycles = jnp.take_along_axis(unit_cycles, dunit, axis=-1)
  rank = jnp.asarray(group_order(layout), jnp.int32)
  order_key = jnp.where(grp_cycles_all > 0, rank[None, :], 1 << 20)
  G = grp_cycles_all.shape[-1]
  Q = layout.max_kept_groups
  qn = min(Q, G)
  grp = jnp.argsort(order_key, axis=-1)[:, :qn].astype(jnp.int32)
  grp_cycles = jnp.take_along_axis(grp_cycles_all, grp, axis=-1)
  grp_need = jnp.take_along_axis(structure.res_need[op][:, U:], grp, axis=-1)
  grp_reserved = jnp.take_along_axis(structure.reserved[op][:, U:], grp, axis=-1)
  grp_on = grp_cycles > 0
  # Each producer's latest edge weight; padding rows count too (more only hashes more).
  edge_w = jnp.zeros_like(max_latency).at[src].max(jnp.where(dep_on, dep_w, 0))
  horizon = jnp.maximum(max_latency + 1, edge_w) + 1
  picks = (grp_on & ~grp_reserved)[..., None] & (grp[..., None] == jnp.arange(G)[None, None, :])
  rr_groups = jnp.any(picks, axis=(0, 1))
  if qn < Q:  # tiny layouts: pad to Q columns
    pad = lambda x: jnp.pad(x, ((0, 0), (0, Q - qn)))  # noqa: E731
    grp, grp_cycles, grp_need, grp_reserved, grp_on = map(
        pad, (grp, grp_cycles, grp_need, grp_reserved, grp_on))
  blocked_by = (structure.touched[op][:, U:] | (grp_cycles_all > 0))

  kinds = blocks.write_kind  # [L, MAX_WRITES]
  F = params.prf_size.shape[0]
  if F:
    file_of_kind = jnp.asarray(_file_of_kind(layout), jnp.int32)  # [num kinds] -> file
    f = jnp.where(kinds >= 0, file_of_kind[jnp.maximum(kinds, 0)], -1)
    in_file = f[:, :, None] == jnp.arange(F)[None, None, :]  # [L, 8, F]
    # Dispatch checks a register for every write (DispatchStage::checkPRF); zero
    # idioms, eliminated moves and partial GPR writes then take none.
    regs = jnp.where(in_file, blocks.write_cost[:, :, None], 0)
    prf_need = jnp.sum(regs, axis=1).astype(jnp.int32)
    prf_cost = jnp.sum(jnp.where(blocks.write_alloc[:, :, None], regs, 0), axis=1
                       ).astype(jnp.int32)
    prf_cost = jnp.where((structure.zero_idiom[op] | elim)[:, None], 0, prf_cost)
  else:
    prf_need = prf_cost = jnp.zeros((op.shape[0], 0), jnp.int32)
  return Facts(
      n=n, uops=uops, rob_cost=jnp.maximum(1, jnp.minimum(uops, rob)),
      max_latency=max_latency, zero_latency=zero_latency,
      dep_off=dep_off, dep_w=dep_w, dep_on=dep_on, use_off=use_off, use_w=use_w, use_on=use_on,
      use_dst=dst, use_it=blocks.use_dist,
      dep_first=blocks.dep_first, dep_last=blocks.dep_last, settle=settle,
      horizon=horizon.astype(jnp.int32), rr_groups=rr_groups,
      use_first=blocks.dep_first[dst, blocks.use_edge],
      use_last=blocks.dep_last[dst, blocks.use_edge],
      unit_cycles=unit_cycles, unit_mask=unit_mask, dunit=dunit, dunit_cycles=dunit_cycles,
      dunit_on=dunit_cycles > 0, grp=grp, grp_cycles=grp_cycles,
      grp_need=grp_need, grp_reserved=grp_reserved, grp_on=grp_on,
      grp_members=jnp.where(grp_on, jnp.asarray(layout.group_members, jnp.int32)[grp], 0),
      blocked_by=blocked_by,
      buffers=structure.buffers[op] & ~elim[:, None], may_load=structure.may_load[op],
      may_store=structure.may_store[op],
      ordered_store=structure.may_store[op] & (not layout.memory_dependences),
      load_barrier=structure.load_barrier[op],
      store_barrier=structure.store_barrier[op],
      zero_use=jnp.any(use_on & (use_w == 0), axis=-1), prf_cost=prf_cost, prf_need=prf_need,
      begin_group=structure.begin_group[op], end_group=structure.end_group[op])


def _file_of_kind(layout: Layout):
  from diffsim.params.table import REG_KINDS

  out = []
  for kind in REG_KINDS:
    f = [i for i, kinds in enumerate(layout.file_kinds) if kind in kinds]
    out.append(f[0] if f else -1)
  return out
