"""PerfVec's two representations and their product, as flax modules.

- `ProgramEncoder`: instruction representations from a 2-layer LSTM over the looped
  block (`features.Sequences`); the program vector is their sum over one iteration.
  Each step also sees its opcode's costs in the training bases' tables
  (`uarch.reference_costs`), so that rare opcodes do not depend on their embedding alone.
- `UarchEncoder`: a microarchitecture vector from a table's layout-free summary
  (`uarch.uarch_features`), for tables never trained on. Each opcode's numbers are
  projected and weighted by a learned opcode embedding, so that a program vector can
  pick out the opcodes its block uses. With `ModelConfig.structure` > 0 it also reads
  the port structure: opcodes (learned keys) pooled into the resources they occupy,
  weighted by how heavily, then resources pooled back into each opcode, one round of
  message passing on the opcode-resource graph; an opcode's numbers then say which
  other opcodes compete with it, and a pooled vector of all resources joins the
  globals.
- Training tables also get a free vector each (`PerfVec.uarch_table`), PerfVec's own
  form; the encoder learns to produce such vectors.
- Time is softplus(program . uarch) cycles per iteration: positive, and close to the
  plain dot product PerfVec uses (a program's time is the sum of its instructions').
"""

from __future__ import annotations

import dataclasses

import flax.linen as nn
import jax
import jax.numpy as jnp

from diffsim.perfvec.features import NUM_FEATURES, Sequences, vocabulary
from diffsim.perfvec.uarch import (GLOBALS, GLOBALS_WIDTH, MAX_RESOURCES, PER_OPCODE,
                                   PER_OPCODE_WIDTH, RESOURCE_FEATURES, reference_costs)


@dataclasses.dataclass(frozen=True)
class ModelConfig:
  """Sizes of the model (static; saved beside every checkpoint)."""

  dim: int = 256  # representation width (PerfVec: 256)
  layers: int = 2  # LSTM layers (PerfVec: 2)
  embed: int = 64  # opcode embedding width
  vocab: int = len(vocabulary())
  num_features: int = NUM_FEATURES
  train_tables: int = 1  # free uarch vectors
  references: tuple[str, ...] = ()  # tables whose opcode costs the program encoder sees
  structure: int = 16  # width of the port-structure messages (0: the encoder ignores it)


class ProgramEncoder(nn.Module):
  """Looped block -> [dim] program vector (and [S, dim] instruction vectors)."""

  cfg: ModelConfig

  @nn.compact
  def __call__(self, seq: Sequences) -> tuple[jax.Array, jax.Array]:
    c = self.cfg
    parts = [nn.Embed(c.vocab, c.embed, name="opcode")(seq.opcode),
             nn.Dense(c.embed, name="numbers")(seq.features)]
    if c.references:
      costs = jnp.asarray(reference_costs(c.references))[seq.opcode]
      parts.append(nn.Dense(c.embed, name="reference")(costs))
    x = jnp.concatenate(parts, -1)
    x = nn.gelu(x)
    lengths = seq.valid.sum(-1).astype(jnp.int32)
    for i in range(c.layers):
      x = nn.RNN(nn.OptimizedLSTMCell(c.dim), name=f"lstm{i}")(x, seq_lengths=lengths)
    instr = nn.Dense(c.dim, name="instruction")(x) * seq.counted[..., None]
    return instr.sum(-2), instr


class _KeyedSum(nn.Module):
  """sum over v of Dense(per_opcode[v]) * key[v], without the [..., V, dim] projections
  (hundreds of MB for a few hundred tables): the sum is taken before the projection."""

  dim: int

  @nn.compact
  def __call__(self, per_opcode: jax.Array, key: jax.Array) -> jax.Array:
    kernel = self.param("kernel", nn.initializers.lecun_normal(),
                        (per_opcode.shape[-1], self.dim))
    bias = self.param("bias", nn.initializers.zeros_init(), (self.dim,))
    keyed = jnp.einsum("...vf,vd->...fd", per_opcode, key)
    out = jnp.einsum("...fd,fd->...d", keyed, kernel)
    return out + jnp.broadcast_to(bias * key.sum(0), out.shape)


class UarchEncoder(nn.Module):
  """Table summary -> [dim] uarch vector."""

  cfg: ModelConfig

  @nn.compact
  def __call__(self, per_opcode: jax.Array, glob: jax.Array) -> jax.Array:
    c = self.cfg
    assert per_opcode.shape[-1] == PER_OPCODE_WIDTH and glob.shape[-1] == GLOBALS_WIDTH
    P, G = len(PER_OPCODE), len(GLOBALS)
    per, g = per_opcode[..., :P], glob[..., :G]
    if c.structure:
      msg, pooled_res = _PortStructure(c.vocab, c.structure, name="structure")(per_opcode, glob)
      per = jnp.concatenate([per, msg], -1)
    key = self.param("opcode", nn.initializers.normal(1.0), (c.vocab, c.dim))
    pooled = _KeyedSum(c.dim, name="per_opcode")(per, key) / jnp.sqrt(c.vocab)
    parts = [pooled, nn.Dense(c.dim, name="globals")(g)]
    if c.structure:
      parts.append(nn.Dense(c.dim, name="resources")(pooled_res))
    h = jnp.concatenate(parts, -1)
    h = nn.gelu(nn.Dense(c.dim, name="hidden")(h))
    return nn.Dense(c.dim, name="out")(h)


class _PortStructure(nn.Module):
  """One round of message passing on a table's opcode-resource graph.

  Returns ([..., V, width] per-opcode messages, [..., width] mean over resources).
  """

  vocab: int
  width: int

  @nn.compact
  def __call__(self, per_opcode: jax.Array, glob: jax.Array):
    P, G, R = len(PER_OPCODE), len(GLOBALS), MAX_RESOURCES
    lead = per_opcode.shape[:-2]
    incidence = per_opcode[..., P:].reshape((-1, self.vocab, R))  # log1p(cycles / units)
    res = glob[..., G:].reshape((-1, R, len(RESOURCE_FEATURES)))
    valid = res[..., :1] > 0  # a real resource has at least one unit
    key = self.param("key", nn.initializers.normal(1.0), (self.vocab, self.width))
    into = jnp.einsum("tvr,vw->trw", incidence, key) / jnp.sqrt(self.vocab)
    h = nn.gelu(nn.Dense(self.width, name="resource")(jnp.concatenate([into, res], -1)))
    h = jnp.where(valid, h, 0.0)
    msg = nn.Dense(self.width, name="opcode")(jnp.einsum("tvr,trw->tvw", incidence, h))
    pooled = h.sum(-2) / jnp.maximum(valid.sum(-2), 1)
    return (msg.reshape(lead + (self.vocab, self.width)),
            pooled.reshape(lead + (self.width,)))


class PerfVec(nn.Module):
  """Both encoders and the training tables' vectors, under one parameter tree."""

  cfg: ModelConfig

  def setup(self):
    self.program = ProgramEncoder(self.cfg)
    self.uarch = UarchEncoder(self.cfg)
    self.uarch_table = self.param("uarch_table", nn.initializers.normal(0.1),
                                  (self.cfg.train_tables, self.cfg.dim))

  def __call__(self, seq: Sequences, per_opcode: jax.Array, glob: jax.Array):
    """(program vectors [B, dim], encoded uarch vectors [T, dim], table vectors)."""
    return self.program(seq)[0], self.uarch(per_opcode, glob), self.uarch_table

  def embed(self, seq: Sequences) -> jax.Array:
    return self.program(seq)[0]

  def encode_uarch(self, per_opcode: jax.Array, glob: jax.Array) -> jax.Array:
    return self.uarch(per_opcode, glob)


def predict(program: jax.Array, uarch: jax.Array) -> jax.Array:
  """[B, T] cycles per iteration of B programs on T microarchitectures."""
  return jax.nn.softplus(program @ uarch.T)


def log_predict(program: jax.Array, uarch: jax.Array) -> jax.Array:
  """[B, T] log of `predict`, computed so that a prediction far too small keeps its
  gradient (log softplus(z) -> z as z -> -inf; a clamp there would leave it stuck)."""
  z = program @ uarch.T
  return jnp.where(z < -15.0, z, jnp.log(jax.nn.softplus(jnp.maximum(z, -15.0))))


def smooth_abs(x: jax.Array) -> jax.Array:
  """|x|, rounded off within about 0.01 of 0 so that its gradient is defined there."""
  return jnp.sqrt(x**2 + 1e-4)


def _log_ratio(log_pred: jax.Array, y: jax.Array, mask: jax.Array) -> jax.Array:
  return jnp.where(mask, log_pred - jnp.log(jnp.where(mask, y, 1.0)), 0.0)


def log_error(log_pred: jax.Array, y: jax.Array, mask: jax.Array) -> jax.Array:
  """Mean squared log ratio over the labelled entries (scale-free, like MAPE)."""
  return jnp.sum(_log_ratio(log_pred, y, mask) ** 2) / jnp.maximum(jnp.sum(mask), 1)


def log_abs_error(log_pred: jax.Array, y: jax.Array, mask: jax.Array) -> jax.Array:
  """Mean absolute log ratio (smoothed at 0): a miss counts in proportion to its size
  rather than its square, so the few entries a fit cannot reach do not rule it."""
  err = smooth_abs(_log_ratio(log_pred, y, mask))
  return jnp.sum(jnp.where(mask, err, 0.0)) / jnp.maximum(jnp.sum(mask), 1)
