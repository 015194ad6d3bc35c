"""Glimpse's three uses of the Blueprint (DAC'22), in JAX and flax, for x86-64 kernels.

1. Priors, two of them. `PriorNet` maps a Blueprint to a categorical distribution over
   each knob, meta-trained so that its marginals match where the near-optimal
   configurations of each training CPU lie (softmax-weighted by cost). Knob marginals
   cannot say which knob values go together (a wide tile needs few accumulators), so
   `JointPrior` also gives a distribution over whole configurations: the training
   CPUs' near-optimal distributions mixed with weights that fall with the distance
   between their Blueprints and the target's (a kernel density in Blueprint space,
   its bandwidth chosen by leave-one-CPU-out likelihood).
2. Acquisition: `AcquisitionNet` scores a candidate from the Blueprint, the candidate's
   features, its log-prior, its roofline on the target (`roofline`: the table read
   against the candidate, without simulating) and a small Gaussian process's posterior
   over what has been observed so far (mean, deviation, z-score); it is meta-trained
   across training CPUs (each seeing the joint prior built without itself) to predict
   whether the candidate beats the best observation, on search states drawn from many
   simulated episodes (a learned probability of improvement).
3. Validity: an ensemble of `ValidityNet`s, each trained on a bootstrap of the training
   CPUs' enumerations, votes on whether a candidate compiles for the target; the search
   never evaluates a candidate the majority rejects. Given the target's roofline, the
   search takes validity from it instead: lowering each candidate against the table
   says exactly which compile and run, where the ensemble, trained on other CPUs, can
   reject the optimum.

The search starts, as Bayesian optimisation does, from an initial design, here drawn from
the joint prior times the roofline's near-optimal distribution (its `init` most likely
configurations) instead of at random; then it picks, at each step, the unevaluated valid candidate that the acquisition ranks first,
weighed against its roofline (the roofline orders, the acquisition reorders near-ties).
Costs enter every model as log(cost / best).
"""

from __future__ import annotations

import dataclasses
import functools
import hashlib
from pathlib import Path

import flax.linen as nn
import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import serialization

from diffsim.search.cpus import TrainingSet
from diffsim.search.space import Task

# Log-cost ratios are divided by this before the GP sees them (typical spread of log
# cost among the promising configurations).
_R_SCALE = 0.3
_GP_LENGTH = 1.0
_GP_NOISE = 1e-3
MAX_OBS = 64  # observations the GP features use (the best valid ones)
_NEAR_OPT_TEMP = 0.05  # log-cost temperature of "near-optimal" in the priors' targets
# The initial design weighs configurations by the joint prior times exp(-roofline ratio
# / this): the roofline's near-optimal distribution, so sharp that the roofline ranks
# and the priors break its ties (the joint prior, and the acquisition's score before any
# observation). Chosen on the training CPUs alone (meta-trained on one base's family,
# searching the other's): best on every task among no roofline, 0.05, 0.02, 0.01, 0.003
# and 0.001 (lower changes nothing). Breaking ties with the acquisition too took the
# moved training CPUs from 3.00 to 2.50 evaluations on axpy and from 1.57 to 1.43 on dot
# (gemm 1.33 either way); `init` sizes 1-4 then do the same.
_INIT_ROOF_TEMP = 0.001
# After the initial design, each candidate's acquisition logit less its roofline ratio
# over this: the roofline orders the candidates, and the acquisition, reading the
# observations, reorders those within about 1% of each other. Chosen the same way
# (before the acquisition broke the initial design's ties): on the moved training CPUs,
# axpy needed 4.10 evaluations with the acquisition alone, 3.60 at 0.01, 3.00 at 0.003
# and 0.001; dot and gemm were the same at every setting (1.57 and 1.33).
_ACQ_ROOF_TEMP = 0.003
_ROOF_CAP = 2.0  # log roofline ratios are capped here (and inf, a lacking key, set to it)


class _MLP(nn.Module):
  hidden: int
  out: int
  layers: int = 2

  @nn.compact
  def __call__(self, x):
    for _ in range(self.layers):
      x = nn.gelu(nn.Dense(self.hidden)(x))
    return nn.Dense(self.out)(x)


class PriorNet(nn.Module):
  """Blueprint [D] -> logits over every knob value [sum of knob sizes]."""

  sizes: tuple[int, ...]

  @nn.compact
  def __call__(self, bp):
    return _MLP(64, sum(self.sizes))(bp)


class ValidityNet(nn.Module):
  """(Blueprint [D], config features [C, F]) -> logit that each config is valid [C]."""

  @nn.compact
  def __call__(self, bp, x):
    bp = jnp.broadcast_to(bp, (x.shape[0], bp.shape[-1]))
    return _MLP(64, 1)(jnp.concatenate([bp, x], -1))[:, 0]


class AcquisitionNet(nn.Module):
  """(Blueprint, features, log-prior, GP statistics) -> logit of improvement [C].

  A second head predicts the candidate's log(cost / optimum) during meta-training only
  (an auxiliary task: it makes the shared layers learn a blueprint-conditioned cost
  model, which the improvement labels alone teach slowly).
  """

  @nn.compact
  def __call__(self, bp, x, extra, with_cost: bool = False):
    bp = jnp.broadcast_to(bp, (x.shape[0], bp.shape[-1]))
    out = _MLP(128, 2, 3)(jnp.concatenate([bp, x, extra], -1))
    return (out[:, 0], out[:, 1]) if with_cost else out[:, 0]


def log_prior(logits, value_index, sizes):
  """Log-probability of every configuration under the per-knob priors: [C]."""
  out, at = 0.0, 0
  for j, n in enumerate(sizes):
    logp = jax.nn.log_softmax(logits[at:at + n])
    out = out + logp[value_index[:, j]]
    at += n
  return out


def near_optimal(costs: np.ndarray) -> np.ndarray:
  """[T, C] per CPU, a distribution over its configurations: softmax(-log(cost/best)/0.05)
  over the valid ones (a configuration 5% slower than the best weighs e^-1 of it)."""
  valid = np.isfinite(costs)
  z = np.where(valid, np.log(costs / np.nanmin(costs, 1, keepdims=True)), np.inf)
  w = np.exp(-z / _NEAR_OPT_TEMP)
  return w / w.sum(1, keepdims=True)


@dataclasses.dataclass(frozen=True)
class JointPrior:
  """A prior over whole configurations from the training CPUs, read through the Blueprint.

  log p(c | bp) = log((1 - eps) sum_t w_t(bp) q_t(c) + eps / C), where q_t is training
  CPU t's `near_optimal` distribution and w_t = softmax_t(-sum_d s_d (bp - bp_t)_d^2 / 2h^2):
  a kernel density in Blueprint space whose per-entry scales s (1 when not learned) say
  which entries of the Blueprint tell CPUs with different optima apart.
  """

  bps: np.ndarray  # [T, D] training Blueprints
  dists: np.ndarray  # [T, C] their near-optimal distributions
  bandwidth: float
  eps: float = 1e-3
  scales: np.ndarray | None = None  # [D] learned metric (None: every entry weighs 1)

  @classmethod
  def fit(cls, bps: np.ndarray, costs: np.ndarray, *, metric: bool = True,
          families=None, steps: int = 300) -> JointPrior:
    """The bandwidth, then the metric, that predict each training CPU from the others.

    Leave-one-out flatters narrow kernels (sampled siblings of a CPU are in its
    training set, a new CPU's are not), so it takes the widest bandwidth whose
    likelihood is within one standard error of the best (the one-SE rule). Then, with
    `metric`, it learns one log-scale per Blueprint entry by gradient ascent on the same
    leave-one-out likelihood (shrunk towards 1): a Blueprint is dominated by the many
    entries in which two base CPUs differ, while what moves an optimum is often one
    entry (the dispatch width, the FMA units); the learned metric lets a CPU find the
    training CPUs that bind where it binds.
    """
    bps = np.asarray(bps, np.float64)
    dists = near_optimal(costs)
    d2 = np.sum((bps[:, None] - bps[None]) ** 2, -1)
    scale = float(np.sqrt(np.median(d2[d2 > 0]))) if (d2 > 0).any() else 1.0
    priors, lls = [], []
    for h in scale * np.array([0.0625, 0.125, 0.25, 0.5, 1.0, 2.0, 4.0, 1e3]):
      priors.append(cls(bps, dists, float(h)))
      lls.append([dists[t] @ priors[-1].log_probs(bps[t], exclude=t) for t in range(len(bps))])
    mean = np.mean(lls, 1)
    best = int(np.argmax(mean))
    line = mean[best] - np.std(lls[best]) / np.sqrt(len(bps))
    prior = priors[max(i for i in range(len(priors)) if mean[i] >= line)]
    if not metric or len(bps) < 4:
      return prior
    # The metric starts from the Blueprint's own scaling (every entry about [0, 1]) and
    # the median distance as bandwidth; learning weighs entries up or down, and can
    # widen the kernel again.
    fam = np.arange(len(bps)) if families is None else np.unique(families, return_inverse=True)[1]
    scales = _learn_metric(bps, dists, scale, prior.eps, steps, start=np.ones(bps.shape[1]),
                           family=fam)
    learned = cls(bps, dists, scale, prior.eps, scales)
    if families is None:
      return learned
    # Kept only if it predicts each family from the others better than the isotropic
    # kernel does: the held-out CPUs are new families too.
    def across(p):
      return np.mean([dists[t] @ p.log_probs(bps[t], exclude=np.flatnonzero(fam == fam[t]))
                      for t in range(len(bps))])
    return learned if across(learned) > across(prior) else prior

  def log_probs(self, bp, exclude: int | None = None) -> np.ndarray:
    """[C] log-probability of every configuration for a CPU of Blueprint `bp`
    (without training CPU `exclude`, for leave-one-out)."""
    diff2 = (self.bps - np.asarray(bp, np.float64)) ** 2
    if self.scales is not None:
      diff2 = diff2 * self.scales
    logw = -0.5 * np.sum(diff2, 1) / self.bandwidth ** 2
    if exclude is not None:  # an index or an array of them
      logw[exclude] = -np.inf
    w = np.exp(logw - logw.max())
    q = (w / w.sum()) @ self.dists
    return np.log((1 - self.eps) * q + self.eps / q.shape[0]).astype(np.float32)


def _learn_metric(bps: np.ndarray, dists: np.ndarray, bandwidth: float, eps: float,
                  steps: int, *, start: np.ndarray, family: np.ndarray,
                  shrink: float = 1e-2) -> np.ndarray:
  """[D] per-entry scales maximising the log-likelihood of each training CPU's
  near-optimal distribution predicted from the CPUs of other families (`family` [T]
  int; each CPU its own family: leave-one-out), minus `shrink` x the mean squared
  log-ratio to `start` [D]."""
  X = jnp.asarray(bps, jnp.float32)
  Q = jnp.asarray(dists, jnp.float32)
  log0 = jnp.asarray(np.log(start), jnp.float32)
  T, C = Q.shape
  off = jnp.where(jnp.asarray(family[:, None] == family[None, :]), -1e9, 0.0)

  def loss(delta, _key):
    d2 = jnp.sum(jnp.exp(log0 + delta)[None, None, :] * (X[:, None] - X[None]) ** 2, -1)
    w = jax.nn.softmax(-0.5 * d2 / bandwidth ** 2 + off, axis=1)
    ll = jnp.sum(Q * jnp.log((1 - eps) * (w @ Q) + eps / C), 1)  # [T]
    return -jnp.mean(ll) + shrink * jnp.mean(delta ** 2)

  delta, _ = _fit(loss, jnp.zeros(X.shape[1]), steps, 0.05, jax.random.PRNGKey(0))
  return np.exp(np.log(start) + np.asarray(delta, np.float64))


def gp_stats(x, obs_x, obs_r, obs_mask):
  """GP posterior mean and deviation at every configuration.

  Args:
    x: [C, F] features of all configurations.
    obs_x: [N, F] observed features (padded), obs_r: [N] scaled log(cost / best),
    obs_mask: [N] bool, which rows are real.

  Returns:
    (mean [C], std [C]); with no observation, the prior (0, 1).
  """
  def k(a, b):
    d2 = jnp.sum((a[:, None, :] - b[None, :, :]) ** 2, -1)
    return jnp.exp(-0.5 * d2 / _GP_LENGTH ** 2)

  m = obs_mask.astype(x.dtype)
  K = k(obs_x, obs_x) * m[:, None] * m[None, :]
  K = K + jnp.diag(jnp.where(obs_mask, _GP_NOISE, 1.0))
  Ks = k(x, obs_x) * m[None, :]
  chol = jnp.linalg.cholesky(K)
  alpha = jax.scipy.linalg.cho_solve((chol, True), obs_r * m)
  mean = Ks @ alpha
  v = jax.scipy.linalg.solve_triangular(chol, Ks.T, lower=True)
  var = jnp.maximum(1.0 - jnp.sum(v * v, 0), 1e-6)
  return mean, jnp.sqrt(var)


def _observations(features: np.ndarray, ids, log_costs):
  """What the GP sees, padded to MAX_OBS rows: (features, scaled log(cost / best), mask)."""
  ox = np.zeros((MAX_OBS, features.shape[1]), np.float32)
  orr = np.zeros(MAX_OBS, np.float32)
  om = np.zeros(MAX_OBS, bool)
  if len(ids):
    ox[:len(ids)] = features[ids]
    orr[:len(ids)] = (log_costs - log_costs.min()) / _R_SCALE
    om[:len(ids)] = True
  return ox, orr, om


def roofline_ratio(roof, size: int) -> np.ndarray:
  """[C] log(roofline / its best), capped at `_ROOF_CAP` (zeros without a roofline)."""
  if roof is None:
    return np.zeros(size, np.float32)
  roof = np.asarray(roof, np.float64)
  finite = np.isfinite(roof)
  if not finite.any():
    return np.full(roof.shape, _ROOF_CAP, np.float32)
  z = np.log(np.where(finite, roof, 1.0) / roof[finite].min())
  return np.where(finite, np.minimum(z, _ROOF_CAP), _ROOF_CAP).astype(np.float32)


def acquisition_inputs(x, logprior, joint, roof, obs_x, obs_r, obs_mask, num_knobs):
  """The acquisition's per-candidate statistics: [C, 7].

  `logprior` is the knob priors' log-probability, `joint` the joint prior's, `roof` the
  `roofline_ratio` (zeros when the models use none), all [C].
  """
  mean, std = gp_stats(x, obs_x, obs_r, obs_mask)
  n = jnp.sum(obs_mask) / MAX_OBS
  joint = (joint - jnp.max(joint)) / 5.0  # relative to the favourite, about [-1.5, 0]
  return jnp.stack([logprior / num_knobs, joint, roof / _R_SCALE, mean, std, mean / std,
                    jnp.broadcast_to(n, mean.shape)], -1)


@dataclasses.dataclass
class GlimpseModels:
  """The meta-trained parameters of one task's three models."""

  task: str
  prior: dict
  validity: list  # one parameter tree per ensemble member
  acquisition: dict
  joint: JointPrior
  roofline: bool = False  # meta-trained with the roofline: the search needs it too


# ---------------------------------------------------------------------------------
# Meta-training.


def _fit(loss_fn, params, steps: int, lr: float, key):
  opt = optax.adamw(lr, weight_decay=1e-4)
  state = opt.init(params)

  @jax.jit
  def step(params, state, key):
    loss, grads = jax.value_and_grad(loss_fn)(params, key)
    updates, state = opt.update(grads, state, params)
    return optax.apply_updates(params, updates), state, loss

  for _ in range(steps):
    key, sub = jax.random.split(key)
    params, state, loss = step(params, state, sub)
  return params, float(loss)


def _episodes(task: Task, costs: np.ndarray, rng: np.random.Generator, n_episodes: int):
  """Search states on one training CPU: (obs indices, labels [C]) per episode.

  Observations are drawn among valid configurations with probability falling with
  cost at a random temperature (states that a good or a poor search could reach);
  a candidate's label is whether it beats the best observation by more than 0.5%.
  """
  valid = np.flatnonzero(np.isfinite(costs))
  z = np.log(costs[valid] / np.min(costs[valid]))
  out = []
  for _ in range(n_episodes):
    n = int(rng.integers(0, min(MAX_OBS // 2, len(valid) - 1) + 1))
    temp = rng.choice([0.05, 0.2, 1.0, np.inf])
    w = np.ones_like(z) if np.isinf(temp) else np.exp(-z / temp)
    obs = rng.choice(valid, size=n, replace=False, p=w / w.sum()) if n else valid[:0]
    best = np.min(costs[obs]) if n else np.inf
    labels = np.isfinite(costs) & (np.nan_to_num(costs, nan=np.inf) < best * 0.995)
    out.append((obs, labels.astype(np.float32)))
  return out


def models_key(task: Task, data: TrainingSet, seed: int) -> str:
  """A hash of what meta-training sees, for the on-disk cache."""
  h = hashlib.sha256(f"{task.name}/{signature(task)}/{seed}/v5".encode())
  h.update(np.asarray(data.blueprints, np.float32).tobytes())
  h.update(np.nan_to_num(np.asarray(data.costs, np.float64), nan=-1).tobytes())
  h.update("\0".join(data.families).encode())
  if data.rooflines is not None:
    h.update(np.nan_to_num(np.asarray(data.rooflines, np.float64), posinf=-1).tobytes())
  return h.hexdigest()[:16]


def meta_train(task: Task, data: TrainingSet, *, seed: int = 0, ensemble: int = 5,
               episodes: int = 24, steps: int = 1500, cache: Path | None = None,
               log=None) -> GlimpseModels:
  """Meta-trains the three models of `task` over training CPUs.

  Args:
    task: the task.
    data: the training tables (`cpus.training_set`). Their families (base CPUs) teach
      the joint prior's metric by predicting each family from the others, as the
      held-out CPUs are new families (one family: each table from the others). Their
      rooflines are an input of the acquisition (None: meta-train without it).
    seed: the PRNG seed of initialisation, bootstraps and episodes.
    ensemble: validity predictors in the ensemble.
    episodes: simulated search states per training CPU for the acquisition.
    steps: optimiser steps per model.
    cache: a directory; the models are stored there (`save_models`) under a hash of the
      inputs and loaded instead of trained when present.
  """
  log = log or (lambda msg: None)
  path = cache / f"glimpse-{task.name}-{models_key(task, data, seed)}.msgpack" if cache else None
  if path is not None and path.exists():
    models = load_models(task, path)
    if models is not None:
      return models
  T = len(data.costs)
  roofs = [roofline_ratio(None if data.rooflines is None else data.rooflines[t], task.size)
           for t in range(T)]
  sizes = tuple(len(k.values) for k in task.knobs)
  X = jnp.asarray(task.features)
  VI = jnp.asarray(task.value_index)
  bps = jnp.asarray(data.blueprints)
  costs = np.asarray(data.costs, np.float64)
  valid = np.isfinite(costs)
  key = jax.random.PRNGKey(seed)
  k_prior, k_val, k_acq = jax.random.split(key, 3)
  prior_net, val_net, acq_net = PriorNet(sizes), ValidityNet(), AcquisitionNet()
  extra_dim = 7
  one = len(set(data.families)) < 2  # one family: each CPU predicted from the others
  joint = JointPrior.fit(np.asarray(bps), costs, families=None if one else list(data.families))
  log(f"joint prior: bandwidth {joint.bandwidth:.3f}")
  templates = {
    "prior": prior_net.init(k_prior, bps[0]),
    "validity": [val_net.init(k, bps[0], X[:2]) for k in jax.random.split(k_val, ensemble)],
    "acquisition": acq_net.init(k_acq, bps[0], X[:2], jnp.zeros((2, extra_dim))),
  }

  # 1. Knob priors: per-knob marginals of the near-optimal distributions.
  w = joint.dists
  targets = np.concatenate([np.stack([np.bincount(task.value_index[:, j], weights=w[t],
                                                  minlength=n) for t in range(len(w))])
                            for j, n in enumerate(sizes)], 1)

  def prior_loss(params, key):
    logits = jax.vmap(lambda b: prior_net.apply(params, b))(bps)
    loss, at = 0.0, 0
    for n in sizes:
      loss -= jnp.mean(jnp.sum(targets[:, at:at + n] * jax.nn.log_softmax(logits[:, at:at + n]), 1))
      at += n
    return loss
  prior_params, loss = _fit(prior_loss, templates["prior"], steps // 3, 3e-3, k_prior)
  log(f"prior: cross-entropy {loss:.3f}")

  # 2. Validity ensemble: each member sees a bootstrap of the training CPUs.
  rng = np.random.default_rng(seed)
  members = []
  labels = jnp.asarray(valid, jnp.float32)
  for m, init in enumerate(templates["validity"]):
    pick = jnp.asarray(rng.integers(0, T, T))

    def val_loss(params, key, pick=pick):
      logit = jax.vmap(lambda b: val_net.apply(params, b, X))(bps[pick])
      return jnp.mean(optax.sigmoid_binary_cross_entropy(logit, labels[pick]))
    params, loss = _fit(val_loss, init, steps // 2, 3e-3, jax.random.fold_in(k_val, m))
    members.append(params)
    log(f"validity member {m}: cross-entropy {loss:.4f}")

  # 3. Acquisition: supervised on simulated search states of every training CPU.
  lp_all = jax.vmap(lambda b: log_prior(prior_net.apply(prior_params, b), VI, sizes))(bps)
  rows_bp, rows_extra, rows_lab, rows_z = [], [], [], []
  inputs = jax.jit(functools.partial(acquisition_inputs, num_knobs=len(sizes)))
  for t in range(T):
    logc = np.log(costs[t])
    joint_t = joint.log_probs(data.blueprints[t], exclude=t)
    for obs, lab in _episodes(task, costs[t], rng, episodes):
      extra = inputs(X, lp_all[t], joint_t, roofs[t],
                     *_observations(task.features, obs, logc[obs]))
      keep = np.ones(task.size, bool)
      keep[obs] = False
      rows_bp.append(np.full(keep.sum(), t))
      rows_extra.append(np.concatenate([np.flatnonzero(keep)[:, None],
                                        np.asarray(extra)[keep]], 1))
      rows_lab.append(lab[keep])
      rows_z.append(np.log(costs[t] / np.nanmin(costs[t]))[keep])
  tid = jnp.asarray(np.concatenate(rows_bp))
  cfg = jnp.asarray(np.concatenate(rows_extra)[:, 0].astype(np.int32))
  ext = jnp.asarray(np.concatenate(rows_extra)[:, 1:], jnp.float32)
  lab = jnp.asarray(np.concatenate(rows_lab))
  zs = np.concatenate(rows_z)
  has_z = jnp.asarray(np.isfinite(zs))
  zs = jnp.asarray(np.nan_to_num(zs, nan=0.0), jnp.float32)
  pos_weight = float((1 - lab.mean()) / max(float(lab.mean()), 1e-3)) ** 0.5
  batch = 4096

  def acq_loss(params, key):
    i = jax.random.randint(key, (batch,), 0, lab.shape[0])
    logit, zhat = jax.vmap(
        lambda b, x, e: [o[0] for o in acq_net.apply(params, b, x[None], e[None], True)])(
        bps[tid[i]], X[cfg[i]], ext[i])
    weight = jnp.where(lab[i] > 0, pos_weight, 1.0)
    cost_err = jnp.where(has_z[i], (zhat - zs[i]) ** 2, 0.0)
    return (jnp.mean(weight * optax.sigmoid_binary_cross_entropy(logit, lab[i]))
            + jnp.mean(cost_err))
  acq_params, loss = _fit(acq_loss, templates["acquisition"], steps, 1e-3, k_acq)
  log(f"acquisition: weighted cross-entropy {loss:.4f} on {lab.shape[0]} search states")

  models = GlimpseModels(task.name, prior_params, members, acq_params, joint,
                         data.rooflines is not None)
  if path is not None:
    save_models(models, task, path)
  return models


# ---------------------------------------------------------------------------------
# The models the package ships, meta-trained by `benchmarks/search_eval.py --ship`.

PRETRAINED = Path(__file__).parent / "pretrained"


def signature(task: Task) -> str:
  """A hash of what shipped models depend on besides their weights: the task's space
  and features, and the Blueprint's entries."""
  from diffsim.search.blueprint import NAMES

  h = hashlib.sha256(f"{task.name}/{task.size}/".encode())
  h.update(np.ascontiguousarray(task.features).tobytes())
  h.update("\0".join(NAMES).encode())
  return h.hexdigest()[:16]


def save_models(models: GlimpseModels, task: Task, path: Path) -> Path:
  """Writes `models` (the joint prior included) to one msgpack file."""
  j = models.joint
  state = {"prior": models.prior, "acquisition": models.acquisition,
           "validity": {str(i): v for i, v in enumerate(models.validity)},
           "joint": {"bps": j.bps, "dists": j.dists.astype(np.float32),
                     "bandwidth": j.bandwidth, "eps": j.eps,
                     "scales": np.ones(0) if j.scales is None else j.scales},
           "meta": {"task": task.name, "signature": signature(task),
                    "roofline": int(models.roofline)}}
  path.parent.mkdir(parents=True, exist_ok=True)
  path.write_bytes(serialization.msgpack_serialize(
      jax.tree.map(lambda x: x if isinstance(x, str) else np.asarray(x), state)))
  return path


def load_models(task: Task, path: Path | None = None) -> GlimpseModels | None:
  """`save_models`'s file (default: the shipped one for `task`), or None when there is
  none or it was meta-trained on another space or Blueprint (`signature`)."""
  path = path or PRETRAINED / f"glimpse-{task.name}.msgpack"
  if not path.exists():
    return None
  state = serialization.msgpack_restore(path.read_bytes())
  meta = state["meta"]
  if str(meta["signature"]) != signature(task) or str(meta["task"]) != task.name:
    return None
  j = state["joint"]
  scales = np.asarray(j["scales"], np.float64)
  joint = JointPrior(np.asarray(j["bps"], np.float64), np.asarray(j["dists"], np.float64),
                     float(j["bandwidth"]), float(j["eps"]), scales if scales.size else None)
  validity = [state["validity"][str(i)] for i in range(len(state["validity"]))]
  return GlimpseModels(task.name, state["prior"], validity, state["acquisition"], joint,
                       bool(int(meta["roofline"])))


# ---------------------------------------------------------------------------------
# Search.


def validity_votes(models: GlimpseModels, task: Task, bp) -> np.ndarray:
  """[M, C] each ensemble member's probability that each configuration is valid."""
  X = jnp.asarray(task.features)
  net = ValidityNet()
  return np.stack([np.asarray(jax.nn.sigmoid(net.apply(p, jnp.asarray(bp), X)))
                   for p in models.validity])


def prior_log_probs(models: GlimpseModels, task: Task, bp) -> np.ndarray:
  sizes = tuple(len(k.values) for k in task.knobs)
  logits = PriorNet(sizes).apply(models.prior, jnp.asarray(bp))
  return np.asarray(log_prior(logits, jnp.asarray(task.value_index), sizes))


@functools.partial(jax.jit, static_argnames=("num_knobs",))
def _scores(acq_params, bp, X, logprior, joint, roof, obs_x, obs_r, obs_mask, num_knobs):
  extra = acquisition_inputs(X, logprior, joint, roof, obs_x, obs_r, obs_mask, num_knobs)
  return AcquisitionNet().apply(acq_params, bp, X, extra)


def glimpse_search(task: Task, bp, objective, budget: int, *, models: GlimpseModels,
                   seed: int = 0, target: float | None = None, on_step=None,
                   init: int = 3, roofline=None) -> dict:
  """Glimpse-style search for `budget` evaluations (or until `target` cost is reached).

  Args:
    task: the task; bp: the target's Blueprint [D]; objective: `evaluate.Objective`.
    budget: most evaluations; models: `meta_train`'s result.
    seed: breaks ties between equally scored candidates (tiny Gumbel noise).
    target: stop once a cost at or below it is found (the benchmark's 2% line).
    on_step: called with (step, index, cost, best) after each evaluation.
    init: size of the initial design (the favourites of the joint prior times the
      roofline's near-optimal distribution).
    roofline: [C] the target's `roofline.roofline`; needed when the models were
      meta-trained with rooflines.

  Returns:
    {"best": index or None, "cost": best cost, "rejected": candidates rejected without
    evaluating (by the roofline, or without one by the ensemble)}.
  """
  if models.roofline and roofline is None:
    raise ValueError("these models were meta-trained with rooflines: pass the target's "
                     "(diffsim.search.roofline.roofline(task, table))")
  roof = roofline_ratio(roofline if models.roofline else None, task.size)
  rng = np.random.default_rng(seed)
  if models.roofline:
    # The roofline lowered every configuration against the target's table: it knows
    # which ones compile and which the table can run, where the ensemble only guesses
    # (and, trained on other CPUs, sometimes rejects the optimum).
    accept = np.isfinite(np.asarray(roofline, np.float64))
  else:
    accept = (validity_votes(models, task, bp) > 0.5).mean(0) > 0.5
  if not accept.any():  # nothing accepted: fall back to trusting none
    accept[:] = True
  logprior = jnp.asarray(prior_log_probs(models, task, bp))
  joint = jnp.asarray(models.joint.log_probs(bp))
  X, bpj, roofj = jnp.asarray(task.features), jnp.asarray(bp), jnp.asarray(roof)

  def acquisition(obs_ids, obs_costs):
    seen_obs = _observations(task.features, np.asarray(obs_ids, int), np.log(obs_costs))
    return np.asarray(_scores(models.acquisition, bpj, X, logprior, joint, roofj, *seen_obs,
                              len(task.knobs)))

  # The initial design: the roofline's favourites, ties broken by the joint prior and by
  # the acquisition before any observation (the blueprint-conditioned cost model it learned).
  start = np.asarray(joint) + acquisition([], np.zeros(0)) - roof / _INIT_ROOF_TEMP
  noise = rng.gumbel(size=task.size) * 1e-4
  seen = np.zeros(task.size, bool)
  obs, obs_cost = [], []
  best_i, best = None, np.inf
  for step in range(budget):
    if step < init:
      s = start + noise
    else:
      best_first = np.argsort(obs_cost)[:MAX_OBS]  # the best ones inform the GP most
      s = (acquisition(np.asarray(obs)[best_first], np.asarray(obs_cost)[best_first])
           - roof / _ACQ_ROOF_TEMP + noise)
    s[seen | ~accept] = -np.inf
    if not np.isfinite(s).any():
      break
    i = int(np.argmax(s))
    seen[i] = True
    c = float(objective([i])[0])
    if np.isfinite(c):
      obs.append(i)
      obs_cost.append(c)
      if c < best:
        best_i, best = i, c
    if on_step:
      on_step(step, i, c, best)
    if target is not None and best <= target:
      break
  return {"best": best_i, "cost": best, "rejected": int((~accept).sum())}
