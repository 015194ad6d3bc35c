"""A trained PerfVec adapted to a measured CPU: the foundation-model use.

Given measured throughputs of a few blocks (BHive format, `diffsim measure`'s output),
`adapt` fits the CPU's uarch vector with everything else frozen (`reuse.fit_uarch`),
starting from the training table whose vector already predicts the rows best. With
`fine_tune="last"`, it also refits the program encoder's last layer, lightly: that layer
is linear and its outputs are summed over the block, so a program vector is
  S @ W + n * b,  S = the last LSTM layer's outputs summed over the counted steps,
and the refit needs S (computed once per block, `lstm_sums`) rather than the LSTM.
With `fine_tune="all"` (thousands of rows), the whole program encoder trains on the
rows with the uarch vector, from the pretrained weights: the foundation-model use when
a CPU has been measured at length, since a frozen encoder cannot learn what the
simulator sweeps never showed it (Zen 5's stack and memory behaviour).

Every adaptation reports its own estimate of its error on blocks it did not fit: the
K-fold cross-validated error on the rows (each fold fitted afresh on the others), so
that a user with a handful of blocks knows what to expect on the rest; for "all", the
error on a tenth of the rows kept out of training, which also stops it. The result
(`Adapted`) saves to one .npz that names the model it belongs to.
"""

from __future__ import annotations

import dataclasses
import functools
import json
from pathlib import Path
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax

from diffsim.data import metrics
from diffsim.isa.ir import Block
from diffsim.perfvec.features import SEQ_BUCKETS, encode_sequences
from diffsim.perfvec.learn import (network, pad_to, program_vectors, sequences, descend,
                                   lstm_optimizer, with_params)
from diffsim.perfvec.model import PerfVec
from diffsim.perfvec.reuse import Trained, _robust_error, fit_uarch

MIN_ROWS = 8  # fewer usable rows cannot be cross-validated into a trustworthy error
MIN_ROWS_ALL = 256  # fewer cannot train the whole encoder (nor keep a tenth to stop it)
FOLDS = 5
FINE_TUNES = ("last", "all")


@dataclasses.dataclass
class Adapted:
  """A uarch vector fitted to measurements (and, if fine-tuned, a new last layer)."""

  uarch: np.ndarray  # [dim] float32
  init: str  # the training uarch it started from
  rows: int  # measured rows fitted on
  cv_mape: float  # K-fold cross-validated MAPE on those rows
  cv_tau: float  # and Kendall's tau
  model: str  # fingerprint of the model it belongs to (`Trained.fingerprint`)
  kernel: np.ndarray | None = None  # [dim, dim] fine-tuned program.instruction kernel
  bias: np.ndarray | None = None  # [dim]
  encoder: dict | None = None  # the retrained program encoder's parameters ("all")

  def save(self, path: str | Path) -> Path:
    from flax.traverse_util import flatten_dict

    meta = dict(init=self.init, rows=self.rows, cv_mape=self.cv_mape, cv_tau=self.cv_tau,
                model=self.model, fine_tuned=self.kernel is not None,
                retrained=self.encoder is not None)
    extra = {} if self.kernel is None else dict(kernel=self.kernel, bias=self.bias)
    if self.encoder is not None:
      extra.update({"encoder/" + "/".join(k): np.asarray(v, np.float32)
                    for k, v in flatten_dict(jax.device_get(self.encoder)).items()})
    path = Path(path)
    with open(path, "wb") as f:  # np.savez would append .npz to any other name
      np.savez(f, uarch=self.uarch, meta=np.array(json.dumps(meta)), **extra)
    return path

  @staticmethod
  def load(path: str | Path) -> Adapted:
    from flax.traverse_util import unflatten_dict

    with np.load(path) as z:
      if "uarch" not in z.files or "meta" not in z.files:
        raise ValueError(f"{path} is not a `diffsim perfvec adapt` output (no uarch vector)")
      meta = json.loads(str(z["meta"]))
      enc = {tuple(k.split("/")[1:]): jnp.asarray(z[k]) for k in z.files
             if k.startswith("encoder/")}
      return Adapted(z["uarch"], meta["init"], meta["rows"], meta["cv_mape"], meta["cv_tau"],
                     meta["model"], z["kernel"] if "kernel" in z.files else None,
                     z["bias"] if "bias" in z.files else None,
                     unflatten_dict(enc) if enc else None)


def usable(blocks: Sequence[Block | Exception], y: np.ndarray) -> tuple[np.ndarray, dict]:
  """Rows PerfVec can learn from, and why the others cannot ({reason: count})."""
  reasons: dict[str, int] = {}
  ok = []
  for i, (b, t) in enumerate(zip(blocks, np.asarray(y, np.float64))):
    if isinstance(b, Exception):
      why = "failed to decode"
    elif not b.instrs:
      why = "are empty"
    elif 2 * len(b.instrs) > SEQ_BUCKETS[-1]:
      why = f"have more than {SEQ_BUCKETS[-1] // 2} instructions"
    elif not np.isfinite(t) or t <= 0:
      why = "have no positive throughput"
    else:
      ok.append(i)
      continue
    reasons[why] = reasons.get(why, 0) + 1
  return np.array(ok, int), reasons


def check_rows(n_rows: int, ok: np.ndarray, reasons: dict, minimum: int = MIN_ROWS) -> None:
  """Raises ValueError, naming what is wrong, when fewer than `minimum` rows are usable."""
  if len(ok) >= minimum:
    return
  why = "; ".join(f"{n} {r}" for r, n in reasons.items())
  raise ValueError(f"{len(ok)} usable rows of {n_rows}; adapting needs at least {minimum} "
                   f"measured blocks" + (f" ({why})" if why else ""))


@functools.partial(jax.jit, static_argnames="cfg")
def _sums(variables, seq, cfg):
  """[B, dim] the last LSTM layer's outputs summed over the counted steps, [B] counts."""
  last = f"lstm{cfg.layers - 1}"
  _, state = network(cfg).apply(
      variables, seq, method=PerfVec.embed,
      capture_intermediates=lambda m, name: m.name == last and name == "__call__")
  x = state["intermediates"]["program"][last]["__call__"][0]
  counted = jnp.asarray(seq.counted)
  return (x * counted[..., None]).sum(-2), counted.sum(-1).astype(x.dtype)


def lstm_sums(trained: Trained, blocks: Sequence[Block],
              batch_size: int = 256) -> tuple[np.ndarray, np.ndarray]:
  """(S [N, dim], n [N]) for `programs`: the program vector is S @ W + n * b."""
  dim = trained.cfg.dim
  S, n = np.zeros((len(blocks), dim), np.float32), np.zeros(len(blocks), np.float32)
  for length, ids in sequences(blocks, np.arange(len(blocks)), batch_size, None):
    padded, real = pad_to(ids, batch_size)
    s, c = _sums(trained.variables, encode_sequences([blocks[i] for i in padded], length),
                 trained.cfg)
    S[ids], n[ids] = np.asarray(s)[real], np.asarray(c)[real]
  return S, n


def _last_layer(trained: Trained) -> tuple[np.ndarray, np.ndarray]:
  layer = trained.variables["params"]["program"]["instruction"]
  return np.asarray(layer["kernel"]), np.asarray(layer["bias"])


def programs(trained: Trained, blocks: Sequence[Block], adapted: Adapted | None = None):
  """[N, dim] program vectors, under the adapted encoder or last layer when fine-tuned."""
  if adapted is not None and adapted.encoder is not None:
    return program_vectors(with_params(trained.variables, program=adapted.encoder),
                            trained.cfg, blocks)
  if adapted is None or adapted.kernel is None:
    return trained.embed(blocks)
  S, n = lstm_sums(trained, blocks)
  return S @ adapted.kernel + n[:, None] * adapted.bias


@functools.partial(jax.jit, static_argnums=(7, 8))
def _fine_tune(S, n, t, weight, kernel0, bias0, u0, steps: int, lr: float, prior):
  """Adam on the weighted robust error of (S @ W + n b) . u, pulled towards the start."""
  k_scale = jnp.maximum(jnp.mean(kernel0**2), 1e-8)
  u_scale = jnp.maximum(jnp.mean(u0**2), 1e-8)

  def loss(x):
    kernel, bias, u = x
    P = S @ kernel + n[:, None] * bias[None, :]
    err = _robust_error(P, t, u)
    pull = (jnp.mean((kernel - kernel0) ** 2) / k_scale + jnp.mean((u - u0) ** 2) / u_scale)
    return jnp.sum(weight * err) / jnp.maximum(jnp.sum(weight), 1) + prior * pull

  opt = optax.adam(optax.cosine_decay_schedule(lr, steps))
  x0 = (kernel0, bias0, u0)
  return descend(loss, x0, opt, opt.init(x0), steps)[0]


def _fit(trained, P, S, n, y, u0, fine_tune: bool, prior_ft: float):
  """(uarch, kernel, bias) fitted on the rows given."""
  u = fit_uarch(trained, P, y, u0)
  if not fine_tune:
    return u, None, None
  kernel0, bias0 = _last_layer(trained)
  t = jnp.log(jnp.asarray(y, jnp.float32) / 100.0)
  kernel, bias, u = _fine_tune(jnp.asarray(S), jnp.asarray(n), t, jnp.ones(len(y)),
                               jnp.asarray(kernel0), jnp.asarray(bias0), jnp.asarray(u),
                               1000, 1e-3, jnp.float32(prior_ft))
  return np.asarray(u), np.asarray(kernel), np.asarray(bias)


def _retrain_step(cfg, opt):
  """One Adam step on the program encoder and the uarch vector (mean robust error)."""

  @jax.jit
  def step(x, opt_state, variables, seq, t, real):
    def loss(x):
      P = network(cfg).apply(with_params(variables, program=x["program"]), seq,
                            method=PerfVec.embed)
      err = _robust_error(P, t, x["uarch"])
      return jnp.sum(jnp.where(real, err, 0.0)) / jnp.maximum(jnp.sum(real), 1)

    value, grad = jax.value_and_grad(loss)(x)
    updates, opt_state = opt.update(grad, opt_state, x)
    return optax.apply_updates(x, updates), opt_state, value

  return step


def retrain(trained: Trained, blocks: Sequence[Block], y: np.ndarray, u0: np.ndarray, *,
            epochs: int = 20, patience: int = 3, batch_size: int = 64, lr: float = 1e-3,
            seed: int = 0, checkpoints: Path | None = None, progress: bool = False, log=None):
  """The whole program encoder and the uarch vector trained on measured rows, from the
  pretrained weights and `u0`; a tenth of the rows (seeded) is kept out to stop it
  (the best epoch by their MAPE) and to estimate its error. With `checkpoints` (a
  folder), the state is saved after every epoch and a rerun on the same rows resumes.

  Returns:
    (encoder parameters, uarch [dim], the kept rows' MAPE, their Kendall tau).
  """
  from diffsim.fit.learn import EpochCheckpoints, _bar

  K = len(y)
  t_all = np.log(np.asarray(y, np.float32) / 100.0)
  order = np.random.default_rng(seed).permutation(K)
  keep, fit_ids = order[:max(1, K // 10)], order[max(1, K // 10):]
  cfg = trained.cfg
  n_batches = len(sequences(blocks, fit_ids, batch_size, 0))
  opt = lstm_optimizer(lr, n_batches, epochs)
  x = dict(program=trained.variables["params"]["program"], uarch=jnp.asarray(u0))
  opt_state = opt.init(x)
  step = _retrain_step(cfg, opt)
  kept_blocks = [blocks[i] for i in keep]

  def score(x):
    P = program_vectors(with_params(trained.variables, program=x["program"]), cfg,
                         kept_blocks)
    pred = trained.predict(P, np.asarray(x["uarch"]))
    return metrics.mape(pred, y[keep]), metrics.kendall_tau(pred, y[keep])

  mape, tau = score(x)
  state = dict(x=x, opt=opt_state, best=x, best_mape=jnp.float32(mape),
               best_tau=jnp.float32(tau), bad=jnp.int32(0), epoch=jnp.int32(0))
  if checkpoints:
    Path(checkpoints).mkdir(parents=True, exist_ok=True)
  saved = EpochCheckpoints(Path(checkpoints), log or (lambda *_: None)) if checkpoints else None
  state, history = saved.resume(state) if saved else (state, [])
  if log:
    log(f"retraining the program encoder on {len(fit_ids)} rows; {len(keep)} kept out: "
        f"MAPE {100 * mape:.1f}% before")
  x, opt_state = state["x"], state["opt"]
  for epoch in range(int(state["epoch"]), epochs):
    if int(state["bad"]) >= patience:
      break
    batches = sequences(blocks, fit_ids, batch_size, seed * 1000 + epoch)
    for S, ids in _bar(batches, f"epoch {epoch + 1}/{epochs}", progress):
      padded, real = pad_to(ids, batch_size)
      seq = encode_sequences([blocks[i] for i in padded], S)
      x, opt_state, _ = step(x, opt_state, trained.variables, seq, t_all[padded], real)
    mape, tau = score(x)
    if log:
      log(f"epoch {epoch + 1}: kept rows' MAPE {100 * mape:.2f}%, tau {tau:.3f}")
    better = mape < float(state["best_mape"])
    state = dict(x=x, opt=opt_state, best=x if better else state["best"],
                 best_mape=jnp.float32(mape if better else state["best_mape"]),
                 best_tau=jnp.float32(tau if better else state["best_tau"]),
                 bad=jnp.int32(0 if better else int(state["bad"]) + 1),
                 epoch=jnp.int32(epoch + 1))
    history.append(dict(epoch=epoch + 1, kept_mape=float(mape), kept_tau=float(tau)))
    if saved:
      saved.save(epoch + 1, state, history)
  if saved:
    saved.close()
  best = state["best"]
  return (best["program"], np.asarray(best["uarch"], np.float32), float(state["best_mape"]),
          float(state["best_tau"]))


def nearest_uarch(trained: Trained, P: np.ndarray, y: np.ndarray) -> str:
  """The training uarch whose own vector predicts the rows best (MAPE)."""
  tab = np.asarray(trained.variables["params"]["uarch_table"])
  errs = [metrics.mape(trained.predict(P, u), y) for u in tab]
  return trained.train_uarchs[int(np.argmin(errs))]


def adapt(trained: Trained, blocks: Sequence[Block], y: np.ndarray, *,
          init: str | None = None, fine_tune: bool | str = False, folds: int = FOLDS,
          fine_tune_prior: float | None = None, programs: np.ndarray | None = None,
          seed: int = 0, checkpoints: Path | None = None, progress: bool = False,
          log=None) -> Adapted:
  """A uarch vector (and with `fine_tune` the last program layer, or the whole program
  encoder) fitted to measured cycles per 100 iterations `y` of `blocks`, with its own
  estimate of its error on blocks it did not fit.

  Args:
    blocks: decoded blocks, each usable (`usable`); at least MIN_ROWS (MIN_ROWS_ALL for
      "all").
    y: [K] measured cycles per 100 iterations.
    init: the uarch to start from (a training uarch, a table name or JSON path); None:
      the training uarch that predicts the rows best (`nearest_uarch`).
    fine_tune: False (the uarch vector alone), "last" (or True: the last program layer
      too, K-fold cross-validated) or "all" (`retrain`: the whole program encoder, a
      tenth of the rows kept out).
    fine_tune_prior: the pull of the fine-tuned last layer towards the trained one;
      None: 10 / sqrt(K) (stronger with fewer rows).
    programs: [K, dim] the blocks' program vectors, when the caller has them already.
    checkpoints: for "all", a folder for `retrain`'s epoch checkpoints (resumable).

  Raises:
    ValueError: too few rows, or an unknown `fine_tune`.
  """
  fine_tune = "last" if fine_tune is True else fine_tune
  if fine_tune and fine_tune not in FINE_TUNES:
    raise ValueError(f"fine_tune {fine_tune!r}: one of {', '.join(FINE_TUNES)}")
  y = np.asarray(y, np.float32)
  K = len(y)
  if fine_tune == "all" and K < MIN_ROWS_ALL:
    raise ValueError(f"{K} rows; retraining the program encoder (fine-tune all) needs at "
                     f"least {MIN_ROWS_ALL} measured blocks: with fewer, fine-tune the last "
                     f"layer only")
  check_rows(K, np.arange(K), {})
  P = trained.embed(blocks) if programs is None else np.asarray(programs, np.float32)
  init = init or nearest_uarch(trained, P, y)
  u0 = trained.uarch(init)
  if fine_tune == "all":
    encoder, u, mape, tau = retrain(trained, blocks, y, fit_uarch(trained, P, y, u0),
                                    seed=seed, checkpoints=checkpoints,
                                    progress=progress, log=log)
    a = Adapted(u, init, K, float(mape), float(tau), trained.fingerprint, encoder=encoder)
    if log:
      log(f"adapted from {init} on {K} measured blocks (program encoder retrained): "
          f"MAPE {100 * a.cv_mape:.1f}%, Kendall tau {a.cv_tau:.3f} on the tenth kept out")
    return a
  S, n = lstm_sums(trained, blocks) if fine_tune else (None, None)
  prior_ft = 10.0 / np.sqrt(K) if fine_tune_prior is None else fine_tune_prior
  fold = np.random.default_rng(seed).permutation(K) % min(folds, K)
  out = np.zeros(K, np.float32)
  for f in range(fold.max() + 1):
    tr, te = fold != f, fold == f
    u, kernel, bias = _fit(trained, P[tr], None if S is None else S[tr],
                           None if n is None else n[tr], y[tr], u0, fine_tune, prior_ft)
    Pte = P[te] if kernel is None else S[te] @ kernel + n[te, None] * bias
    out[te] = trained.predict(Pte, u)
  u, kernel, bias = _fit(trained, P, S, n, y, u0, fine_tune, prior_ft)
  a = Adapted(np.asarray(u, np.float32), init, K, float(metrics.mape(out, y)),
              float(metrics.kendall_tau(out, y)), trained.fingerprint, kernel, bias)
  if log:
    log(f"adapted from {init} on {K} measured blocks"
        + (" (last program layer fine-tuned)" if fine_tune else "")
        + f": {min(folds, K)}-fold cross-validated MAPE {100 * a.cv_mape:.1f}%, "
          f"Kendall tau {a.cv_tau:.3f}")
  return a
