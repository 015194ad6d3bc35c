"""Training PerfVec on simulator sweeps, evaluating it, and reusing it.

`train` builds the data (blocks, uarchs, sweep labels), fits the model with optax,
checkpoints every epoch with orbax (an interrupted run resumes) and refits the table
encoder on the frozen program vectors; `evaluate` scores it on what training never saw:
test blocks, sampled tables held out, whole llvm-mca models held out, and a BHive
application held out. `load` restores a trained model; `embed` and
`predict_on` use it; `fit_uarch` fits only a new uarch vector from a few labelled
blocks with the program encoder frozen (the foundation-model use).
"""

from __future__ import annotations

import dataclasses
import functools
import time
from pathlib import Path
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax

from diffsim.data import metrics
from diffsim.data.split import split_ids
from diffsim.isa import decode_blocks
from diffsim.isa.ir import Block
from diffsim.params.table import load_table
from diffsim.perfvec.data import Uarch, runnable, sweep_labels, uarch_params
from diffsim.perfvec.features import (NUM_FEATURES, SEQ_BUCKETS, Sequences, encode_sequences,
                                      seq_bucket)
from diffsim.perfvec.model import (ModelConfig, PerfVec, log_abs_error, log_error, log_predict,
                                   predict)
from diffsim.perfvec.uarch import uarch_features


@dataclasses.dataclass(frozen=True)
class Experiment:
  """What to train on and how (saved as DIR/experiment.json)."""

  train_bases: tuple[str, ...] = ("haswell", "znver3")
  heldout_models: tuple[str, ...] = ("skylake",)  # llvm-mca models never trained on
  samples: int = 32  # sampled training tables per base
  heldout_samples: int = 8  # sampled tables per base kept for testing
  # More training blocks, each labelled on the first `extra_tables` training tables of
  # each base only: the program encoder learns from many blocks at a fraction of the cost.
  extra_blocks: int = 0
  extra_tables: int = 8
  max_len: int = 32  # longest block taken (instructions)
  blocks: int = 2000  # blocks drawn for train/val/test
  heldout_app: str = ""  # a BHive application kept out of training ("" = none)
  app_blocks: int = 300  # its blocks drawn for testing
  iterations: int = 20  # N of the steady-state labels
  seed: int = 0
  dim: int = 256
  layers: int = 2
  epochs: int = 30
  batch_size: int = 64
  lr: float = 2e-3
  patience: int = 6
  encoder_steps: int = 2000  # the table encoder's refit on frozen program vectors (0: none)
  # More sampled tables per base for the refit alone, each labelled on `encoder_blocks`
  # training blocks: the encoder learns the map from a table to its vector from the
  # number of tables it sees, and the free vectors need none of them.
  encoder_tables: int = 0
  encoder_blocks: int = 400

  def uarchs(self) -> dict[str, list[Uarch]]:
    """Uarchs by role: train, heldout_sampled, heldout_model, encoder (the refit's)."""
    s, h, e = self.samples, self.heldout_samples, self.encoder_tables
    return dict(
      train=[u for b in self.train_bases
             for u in [Uarch(b)] + [Uarch(b, i, self.seed) for i in range(s)]],
      heldout_sampled=[Uarch(b, i, self.seed) for b in self.train_bases
                       for i in range(s, s + h)],
      heldout_model=[Uarch(b) for b in self.heldout_models],
      encoder=[Uarch(b, i, self.seed) for b in self.train_bases
               for i in range(s + h, s + h + e)])


# ---------------------------------------------------------------------------------
# Data.


@dataclasses.dataclass
class Data:
  """Blocks, their parts and the label matrix over every uarch of the experiment."""

  blocks: list[Block]
  part: np.ndarray  # [N] 0 train, 1 val, 2 test, 3 held-out application
  uarchs: list[Uarch]
  role: list[str]  # per uarch: train, heldout_sampled, heldout_model, encoder
  y: np.ndarray  # [U, N] cycles per 100 iterations (NaN: no label)
  per_opcode: np.ndarray  # [U, V, F] encoder inputs
  glob: np.ndarray  # [U, G]


def _draw(n: int, k: int, seed: int) -> np.ndarray:
  return np.sort(np.random.default_rng(seed).permutation(n)[:k])


def build_data(hexes: Sequence[str], apps: Sequence[str] | None, exp: Experiment,
               cache_dir: Path, *, exclude: Sequence[str] = (),
               label_roles: Sequence[str] | None = None, progress: bool = True,
               log=print) -> Data:
  """Decodes, filters and draws the blocks, then labels them on every uarch.

  Blocks whose hex is in `exclude` are never drawn (for a pretrained model: the blocks
  that measured datasets hold out, so that no evaluation on them sees a block trained
  on). Extra training blocks come from the split's training part only (`split_ids`
  with the experiment's seed), the part that measured data split by the same hash
  also trains on. With `label_roles`, only uarchs of those roles are labelled (the others
  stay NaN): training needs the "train" role alone, so a resumable pipeline can train
  before it labels what it only reports on.
  """
  roles = exp.uarchs()
  bases = sorted({u.base for us in roles.values() for u in us})
  tables = [load_table(b) for b in bases]
  t0 = time.time()
  decoded = decode_blocks(list(hexes), progress=progress)
  ok = runnable(decoded, tables, exp.max_len)
  app = np.array([bool(exp.heldout_app) and exp.heldout_app in (a or "").split(";")
                  for a in (apps or [""] * len(hexes))])
  banned = {h.lower() for h in exclude}
  keep = np.array([h.lower() not in banned for h in hexes], bool)
  pool = np.flatnonzero(ok & ~app & keep)
  main = pool[_draw(len(pool), exp.blocks, exp.seed)]
  held = np.flatnonzero(ok & app & keep)[_draw(int(np.sum(ok & app & keep)), exp.app_blocks,
                                                exp.seed)]
  rest = np.setdiff1d(pool, main)
  rest = rest[split_ids([decoded[i].hex for i in rest], seed=exp.seed) == 0]
  extra = rest[_draw(len(rest), exp.extra_blocks, exp.seed + 2)]
  idx = np.concatenate([main, held, extra])
  blocks = [decoded[i] for i in idx]
  part = np.concatenate([split_ids([b.hex for b in blocks[:len(main)]], seed=exp.seed),
                         np.full(len(held), 3, np.int8), np.zeros(len(extra), np.int8)])
  log(f"{len(hexes)} blocks read, {int(ok.sum())} runnable on {', '.join(bases)} with at "
      f"most {exp.max_len} instructions; drew {len(main)} (+{len(held)} of "
      f"{exp.heldout_app or 'no held-out application'}, +{len(extra)} extra training "
      f"blocks) in {time.time() - t0:.1f} s")
  # Per base table (its samples share its layout), one sweep of its tables over the drawn
  # blocks, one of its first training tables over the extra blocks, and one of the
  # encoder's tables over a seeded draw of the training blocks.
  uarchs = [u for us in roles.values() for u in us]
  role = [r for r, us in roles.items() for _ in us]
  core = np.arange(len(main) + len(held))
  core_train = np.flatnonzero(part[:len(main)] == 0)
  for_encoder = np.sort(core_train[_draw(len(core_train), exp.encoder_blocks, exp.seed + 4)])
  y = np.full((len(uarchs), len(blocks)), np.nan, np.float32)
  per = np.zeros((len(uarchs),) + uarch_features(tables[0])[0].shape, np.float32)
  glob = np.zeros((len(uarchs), uarch_features(tables[0])[1].shape[-1]), np.float32)
  for base in dict.fromkeys(u.base for u in uarchs):
    rows = np.array([i for i, u in enumerate(uarchs) if u.base == base])
    first = np.array([i for i in rows if role[i] == "train"][:exp.extra_tables], int)
    enc = np.array([i for i in rows if role[i] == "encoder"], int)
    rows_core = np.array([i for i in rows if role[i] != "encoder"
                          and (label_roles is None or role[i] in label_roles)], int)
    if label_roles is not None and "encoder" not in label_roles:
      enc = enc[:0]
    if label_roles is not None and "train" not in label_roles:
      first = first[:0]
    # Many tables over few blocks: chunks of 32 tables keep each sweep's jobs full.
    for sub, cols, chunk in ((rows_core, core, 8), (first, np.arange(len(core), len(blocks)), 8),
                             (enc, for_encoder, 32)):
      if len(sub) and len(cols):
        y[np.ix_(sub, cols)] = sweep_labels([blocks[i] for i in cols],
                                            [uarchs[i] for i in sub], cache_dir,
                                            iterations=exp.iterations, chunk=chunk,
                                            progress=progress, log=log)
    per[rows], glob[rows] = uarch_features(*uarch_params([uarchs[i] for i in rows]))
  return Data(blocks, part, uarchs, role, y, per, glob)


def sequences(blocks: Sequence[Block], ids: np.ndarray, batch_size: int, seed: int | None):
  """Minibatches of block positions, each of one sequence bucket (shuffled if seeded)."""
  by: dict[int, list[int]] = {}
  for i in ids:
    by.setdefault(seq_bucket(len(blocks[i].instrs)), []).append(int(i))
  rng = np.random.default_rng(seed) if seed is not None else None
  out = []
  for S, members in sorted(by.items()):
    members = np.array(members)
    if rng is not None:
      members = rng.permutation(members)
    for s in range(0, len(members), batch_size):
      out.append((S, members[s:s + batch_size]))
  if rng is not None:
    out = [out[i] for i in rng.permutation(len(out))]
  return out


def pad_to(ids: np.ndarray, batch_size: int) -> tuple[np.ndarray, np.ndarray]:
  """Positions padded to the batch size (repeating the first) and the real-row mask."""
  real = np.zeros(batch_size, bool)
  real[:len(ids)] = True
  return np.concatenate([ids, np.repeat(ids[:1], batch_size - len(ids))]), real


# ---------------------------------------------------------------------------------
# Training.


def network(cfg: ModelConfig) -> PerfVec:
  """The flax module for `cfg` (training, adapting and ranking all apply it)."""
  return PerfVec(cfg)


def _init(cfg: ModelConfig, per_opcode, glob, seed: int):
  S = SEQ_BUCKETS[0]
  dummy = Sequences(np.zeros((1, S), np.int32), np.zeros((1, S, NUM_FEATURES), np.float32),
                    np.ones((1, S), bool), np.ones((1, S), bool))
  return network(cfg).init(jax.random.key(seed), dummy, per_opcode[:1], glob[:1])


def _loss(variables, cfg, seq, y, mask, per_opcode, glob):
  prog, enc, tab = network(cfg).apply(variables, seq, per_opcode, glob)
  # Labels are cycles per 100 iterations; the model speaks cycles per iteration.
  y = y / 100.0
  return log_error(log_predict(prog, tab), y, mask) + log_error(log_predict(prog, enc), y, mask)


def _make_step(cfg: ModelConfig, opt):
  @jax.jit
  def step(variables, opt_state, seq, y, mask, per_opcode, glob):
    loss, grad = jax.value_and_grad(_loss)(variables, cfg, seq, y, mask, per_opcode, glob)
    updates, opt_state = opt.update(grad, opt_state, variables)
    return optax.apply_updates(variables, updates), opt_state, loss

  return step


@functools.partial(jax.jit, static_argnames="cfg")
def _embed(variables, seq: Sequences, cfg: ModelConfig):
  return network(cfg).apply(variables, seq, method=PerfVec.embed)


@functools.partial(jax.jit, static_argnames="cfg")
def _encode_uarch(variables, per_opcode, glob, cfg: ModelConfig):
  return network(cfg).apply(variables, per_opcode, glob, method=PerfVec.encode_uarch)


def program_vectors(variables, cfg: ModelConfig, blocks: Sequence[Block],
                     batch_size: int = 256) -> np.ndarray:
  """[N, dim] program vectors, computed bucket by bucket."""
  out = np.zeros((len(blocks), cfg.dim), np.float32)
  for S, ids in sequences(blocks, np.arange(len(blocks)), batch_size, None):
    padded, real = pad_to(ids, batch_size)
    seq = encode_sequences([blocks[i] for i in padded], S)
    out[ids] = np.asarray(_embed(variables, seq, cfg))[real]
  return out


def uarch_vectors(variables, cfg: ModelConfig, per_opcode, glob) -> np.ndarray:
  return np.asarray(_encode_uarch(variables, per_opcode, glob, cfg))


def lstm_optimizer(lr: float, n_batches: int, epochs: int) -> optax.GradientTransformation:
  """AdamW, warmed up over half an epoch and cosine-decayed to lr / 20, on clipped
  gradients: a prediction orders of magnitude off (early on) has a log error, and so a
  gradient, that would otherwise throw the LSTM far. Training and `adapt`'s retraining
  both use it."""
  return optax.chain(optax.clip_by_global_norm(1.0), optax.adamw(
      optax.warmup_cosine_decay_schedule(0.0, lr, max(1, n_batches // 2),
                                         max(2, epochs * n_batches), lr * 0.05),
      weight_decay=1e-4))


def with_params(variables: dict, **parts) -> dict:
  """`variables` with the named parameter subtrees (program, uarch, ...) replaced."""
  return {**variables, "params": {**variables["params"], **parts}}


def train(data: Data, exp: Experiment, out_dir: Path, *, progress: bool = True,
          log=print) -> tuple[dict, ModelConfig]:
  """Fits PerfVec on the training uarchs x training blocks; resumable.

  Returns:
    (the best variables by validation error, the model config).
  """

  from diffsim.fit.learn import EpochCheckpoints, _bar

  out = Path(out_dir).absolute()
  out.mkdir(parents=True, exist_ok=True)
  tr_u = np.array([r == "train" for r in data.role])
  cfg = ModelConfig(dim=exp.dim, layers=exp.layers, train_tables=int(tr_u.sum()),
                    references=tuple(exp.train_bases))
  y_tr = data.y[tr_u].T  # [N, T]
  per, glob = data.per_opcode[tr_u], data.glob[tr_u]
  train_ids = np.flatnonzero(data.part == 0)
  val_ids = np.flatnonzero(data.part == 1)
  n_batches = len(sequences(data.blocks, train_ids, exp.batch_size, 0))
  opt = lstm_optimizer(exp.lr, n_batches, exp.epochs)
  variables = _init(cfg, per, glob, exp.seed)
  state = dict(variables=variables, opt=opt.init(variables), best=variables,
               epoch=jnp.int32(0), best_val=jnp.float32(np.inf), bad=jnp.int32(0))
  checkpoints = EpochCheckpoints(out, log)
  state, history = checkpoints.resume(state)
  step = _make_step(cfg, opt)
  log(f"training PerfVec (dim {cfg.dim}, {cfg.layers} LSTM layers) on {len(train_ids)} blocks "
      f"x {cfg.train_tables} uarchs; validating on {len(val_ids)} blocks")
  for epoch in range(int(state["epoch"]), exp.epochs):
    t0 = time.time()
    batches = sequences(data.blocks, train_ids, exp.batch_size, exp.seed * 1000 + epoch)
    bar = _bar(batches, f"epoch {epoch + 1}/{exp.epochs}", progress)
    v, o, losses = state["variables"], state["opt"], []
    for S, ids in bar:
      padded, real = pad_to(ids, exp.batch_size)
      seq = encode_sequences([data.blocks[i] for i in padded], S)
      y = y_tr[padded]
      mask = real[:, None] & np.isfinite(y) & (y > 0)
      v, o, loss = step(v, o, seq, np.nan_to_num(y, nan=1.0), mask, per, glob)
      losses.append(float(loss))
      bar.set_postfix(loss=f"{losses[-1]:.4f}")
    bar.close()
    vecs = program_vectors(v, cfg, [data.blocks[i] for i in val_ids])
    tab = np.asarray(v["params"]["uarch_table"])
    val = metrics.mape(np.asarray(predict(vecs, tab)).T * 100.0, data.y[tr_u][:, val_ids])
    seconds = time.time() - t0
    better = val < float(state["best_val"])
    state = dict(variables=v, opt=o, best=v if better else state["best"],
                 epoch=jnp.int32(epoch + 1),
                 best_val=jnp.float32(val if better else state["best_val"]),
                 bad=jnp.int32(0 if better else int(state["bad"]) + 1))
    history.append(dict(epoch=epoch + 1, train=float(np.mean(losses)), val_mape=float(val),
                        seconds=seconds, blocks_per_s=len(train_ids) / seconds))
    log(f"epoch {epoch + 1}: train loss {np.mean(losses):.4f}, validation MAPE "
        f"{100 * val:.2f}% ({seconds:.0f} s, {len(train_ids) / seconds:.0f} blocks/s)")
    checkpoints.save(epoch + 1, state, history)
    if int(state["bad"]) >= exp.patience:
      log(f"stopping: no better validation error for {exp.patience} epochs")
      break
  checkpoints.close()
  return refit_encoder(state["best"], cfg, data, exp.encoder_steps, seed=exp.seed,
                       progress=progress, log=log), cfg


def refit_encoder(variables, cfg: ModelConfig, data: Data, steps: int, *, lr: float = 3e-3,
                  weight_decay: float = 0.1, tables_per_step: int = 256, chunk: int = 100,
                  seed: int = 0, progress: bool = True, log=print):
  """The table encoder alone, fitted afresh on the (table, block) labels of the training
  and encoder tables with the program vectors frozen (AdamW).

  In joint training the free table vectors absorb what the program encoder learns, and
  the encoder trails them far (29.5% MAPE against 7.8% on the same uarchs: benchmarks/
  RESULTS.md, PerfVec on simulator sweeps) or dies (every hidden unit off, one vector for
  all tables), so it starts again from a fresh initialisation. Its loss is the absolute
  log ratio: the squared one let the few blocks a table's vector cannot reach rule the
  fit, and with many encoder tables it got worse instead of better (768 encoder tables:
  held-out sampled tables 31.1% against 17.3%). Each role's tables are scored on the
  blocks that label them only, and each step takes `tables_per_step` of a role's tables
  at random, so that thousands of encoder tables cost what hundreds did; with weight
  decay against overfitting them (3,072 encoder tables in 202 s where 768 took 784 s;
  held-out sampled tables 16.2% -> 13.1%, skylake 15.2% -> 9.8%).
  """
  if steps <= 0:
    return variables
  from diffsim.fit.learn import _bar

  t0 = time.time()
  train_ids = np.flatnonzero(data.part == 0)
  programs = program_vectors(variables, cfg, [data.blocks[i] for i in train_ids])
  groups = []
  for role in ("train", "encoder"):
    rows = np.flatnonzero(np.asarray(data.role) == role)
    cols = np.flatnonzero(np.isfinite(data.y[np.ix_(rows, train_ids)]).any(0))
    if len(rows) and len(cols):
      y = data.y[np.ix_(rows, train_ids[cols])].T / 100.0  # cycles per iteration
      mask = np.isfinite(y) & (y > 0)
      groups.append((jnp.asarray(programs[cols]), jnp.asarray(np.where(mask, y, 1.0)),
                     jnp.asarray(mask), jnp.asarray(data.per_opcode[rows]),
                     jnp.asarray(data.glob[rows])))
  opt = optax.adamw(optax.cosine_decay_schedule(lr, steps), weight_decay=weight_decay)
  enc = _init(cfg, data.per_opcode[:1], data.glob[:1], seed + 5)["params"]["uarch"]
  opt_state = opt.init(enc)
  key = jax.random.key(seed + 6)
  losses = []
  bar = _bar(range(0, steps, chunk), "table encoder", progress)
  for s in bar:
    key, sub = jax.random.split(key)
    enc, opt_state, loss = _encoder_steps(variables, cfg, enc, opt_state, tuple(groups), sub,
                                          opt, min(chunk, steps - s), tables_per_step)
    losses.append(np.asarray(loss))
    bar.set_postfix(loss=f"{float(loss[-1]):.4f}")
  bar.close()
  losses = np.concatenate(losses)
  log("table encoder refitted on " + " and ".join(
        f"{g[3].shape[0]} uarchs x {g[0].shape[0]} blocks" for g in groups)
      + f", program vectors frozen: loss {losses[0]:.4f} -> {losses[-1]:.4f} in {steps} "
      f"steps ({time.time() - t0:.0f} s)")
  return with_params(variables, uarch=enc)


@functools.partial(jax.jit, static_argnames=("cfg", "opt", "n", "tables_per_step"))
def _encoder_steps(variables, cfg: ModelConfig, enc, opt_state, groups, key, opt, n: int,
                   tables_per_step: int):
  """n steps; each scores `tables_per_step` tables of each group (all of a smaller one),
  the groups weighted by their label counts."""
  counts = [g[2].sum() for g in groups]

  def loss(enc, key):
    v = with_params(variables, uarch=enc)
    total = 0.0
    for (programs, y, mask, per_opcode, glob), count, k in zip(
        groups, counts, jax.random.split(key, len(groups))):
      T = per_opcode.shape[0]
      if T > tables_per_step:
        pick = jax.random.choice(k, T, (tables_per_step,), replace=False)
        y, mask, per_opcode, glob = y[:, pick], mask[:, pick], per_opcode[pick], glob[pick]
      vectors = network(cfg).apply(v, per_opcode, glob, method=PerfVec.encode_uarch)
      total = total + count * log_abs_error(log_predict(programs, vectors), y, mask)
    return total / sum(counts)

  return descend(loss, enc, opt, opt_state, n, key)


def descend(loss, x, opt, opt_state, n: int, key: jax.Array | None = None):
  """n optimiser steps on `loss` from x in one scan: (x, opt_state, [n] losses). With a
  key, `loss(x, k)` gets a fresh key every step (minibatches)."""

  def body(carry, k):
    x, opt_state = carry
    value, grad = jax.value_and_grad(loss)(x, *([] if key is None else [k]))
    updates, opt_state = opt.update(grad, opt_state, x)
    return (optax.apply_updates(x, updates), opt_state), value

  keys = None if key is None else jax.random.split(key, n)
  (x, opt_state), losses = jax.lax.scan(body, (x, opt_state), keys, length=n)
  return x, opt_state, losses
