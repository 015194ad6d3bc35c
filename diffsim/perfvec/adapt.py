"""A trained PerfVec adapted to a measured CPU: the foundation-model use.

Given measured throughputs of a few blocks (BHive format, `diffsim measure`'s output),
`adapt` fits the CPU's uarch vector with everything else frozen (`reuse.fit_uarch`),
starting from the training table whose vector already predicts the rows best. With
`fine_tune`, it also refits the program encoder's last layer, lightly: that layer is
linear and its outputs are summed over the block, so a program vector is
  S @ W + n * b,  S = the last LSTM layer's outputs summed over the counted steps,
and the refit needs S (computed once per block, `lstm_sums`) rather than the LSTM.

Every adaptation reports its own K-fold cross-validated error on the rows (each fold
fitted afresh on the others), so that a user with a handful of blocks knows what to
expect on the rest. The result (`Adapted`) saves to one .npz that names the model it
belongs to.
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
from diffsim.perfvec.learn import _model, _pad_to, _sequences, descend
from diffsim.perfvec.model import PerfVec
from diffsim.perfvec.reuse import Trained, _robust_error, fit_uarch

MIN_ROWS = 8  # fewer usable rows cannot be cross-validated into a trustworthy error
FOLDS = 5


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

  def save(self, path: str | Path) -> Path:
    meta = dict(init=self.init, rows=self.rows, cv_mape=self.cv_mape, cv_tau=self.cv_tau,
                model=self.model, fine_tuned=self.kernel is not None)
    extra = {} if self.kernel is None else dict(kernel=self.kernel, bias=self.bias)
    path = Path(path)
    with open(path, "wb") as f:  # np.savez would append .npz to any other name
      np.savez(f, uarch=self.uarch, meta=np.array(json.dumps(meta)), **extra)
    return path

  @staticmethod
  def load(path: str | Path) -> Adapted:
    with np.load(path) as z:
      if "uarch" not in z.files or "meta" not in z.files:
        raise ValueError(f"{path} is not a `diffsim perfvec adapt` output (no uarch vector)")
      meta = json.loads(str(z["meta"]))
      return Adapted(z["uarch"], meta["init"], meta["rows"], meta["cv_mape"], meta["cv_tau"],
                     meta["model"], z["kernel"] if "kernel" in z.files else None,
                     z["bias"] if "bias" in z.files else None)


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
  _, state = _model(cfg).apply(
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
  for length, ids in _sequences(blocks, np.arange(len(blocks)), batch_size, None):
    padded, real = _pad_to(ids, batch_size)
    s, c = _sums(trained.variables, encode_sequences([blocks[i] for i in padded], length),
                 trained.cfg)
    S[ids], n[ids] = np.asarray(s)[real], np.asarray(c)[real]
  return S, n


def _last_layer(trained: Trained) -> tuple[np.ndarray, np.ndarray]:
  layer = trained.variables["params"]["program"]["instruction"]
  return np.asarray(layer["kernel"]), np.asarray(layer["bias"])


def programs(trained: Trained, blocks: Sequence[Block], adapted: Adapted | None = None):
  """[N, dim] program vectors, under the adapted last layer when it was fine-tuned."""
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


def nearest_uarch(trained: Trained, P: np.ndarray, y: np.ndarray) -> str:
  """The training uarch whose own vector predicts the rows best (MAPE)."""
  tab = np.asarray(trained.variables["params"]["uarch_table"])
  errs = [metrics.mape(trained.predict(P, u), y) for u in tab]
  return trained.train_uarchs[int(np.argmin(errs))]


def adapt(trained: Trained, blocks: Sequence[Block], y: np.ndarray, *,
          init: str | None = None, fine_tune: bool = False, folds: int = FOLDS,
          fine_tune_prior: float | None = None, programs: np.ndarray | None = None,
          seed: int = 0, log=None) -> Adapted:
  """A uarch vector (and with `fine_tune` the last program layer) fitted to measured
  cycles per 100 iterations `y` of `blocks`, with its K-fold cross-validated error.

  Args:
    blocks: decoded blocks, each usable (`usable`); at least MIN_ROWS.
    y: [K] measured cycles per 100 iterations.
    init: the uarch to start from (a training uarch, a table name or JSON path); None:
      the training uarch that predicts the rows best (`nearest_uarch`).
    fine_tune_prior: the pull of the fine-tuned layer towards the trained one; None:
      10 / sqrt(K) (stronger with fewer rows).
    programs: [K, dim] the blocks' program vectors, when the caller has them already.

  Raises:
    ValueError: fewer than MIN_ROWS rows.
  """
  y = np.asarray(y, np.float32)
  K = len(y)
  check_rows(K, np.arange(K), {})
  P = trained.embed(blocks) if programs is None else np.asarray(programs, np.float32)
  S, n = lstm_sums(trained, blocks) if fine_tune else (None, None)
  init = init or nearest_uarch(trained, P, y)
  u0 = trained.uarch(init)
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
