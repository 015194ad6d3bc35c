"""Using a trained PerfVec: save and load it, embed blocks, predict, evaluate, and fit
a uarch vector for a new CPU with the program encoder frozen: from measured blocks
(`fit_uarch`), or, for a parameter table, from its simulated probe blocks
(`Trained.adapt`, PerfVec's own way to a new microarchitecture)."""

from __future__ import annotations

import dataclasses
import functools
import hashlib
import json
import time
from pathlib import Path
from typing import Sequence

import jax
import jax.numpy as jnp
import numpy as np
import optax

from diffsim.data import metrics
from diffsim.isa.ir import Block
from diffsim.perfvec.data import Uarch, uarch_params, uarch_table
from diffsim.perfvec.features import vocabulary
from diffsim.perfvec.model import ModelConfig, log_predict, predict, smooth_abs
from diffsim.perfvec.learn import Data, Experiment, program_vectors, uarch_vectors, descend
from diffsim.perfvec.uarch import uarch_features

PROBES = 1024  # probe blocks simulated to adapt a uarch vector to a new table
# The model that ships in the package (benchmarks/perfvec_pretrain.py writes it).
PRETRAINED = Path(__file__).parent / "pretrained"
_KEPT_PROBES = 1024  # probe blocks a saved model keeps


@dataclasses.dataclass
class Trained:
  """A trained model: its variables, config, and the names of its training uarchs."""

  variables: dict
  cfg: ModelConfig
  train_uarchs: list[str]
  experiment: dict
  probes: tuple[str, ...] = ()  # hex of training blocks, for `adapt`
  fingerprint: str = ""  # a hash of the saved variables: adapted vectors name their model

  def embed(self, blocks: Sequence[Block]) -> np.ndarray:
    """[N, dim] program vectors."""
    return program_vectors(self.variables, self.cfg, blocks)

  def uarch(self, name_or_path: str) -> np.ndarray:
    """[dim] uarch vector: a training uarch's own vector, else the encoder's vector of
    the table (a shipped name, a JSON table, or a sampled name such as haswell~0.40)."""
    if name_or_path in self.train_uarchs:
      i = self.train_uarchs.index(name_or_path)
      return np.asarray(self.variables["params"]["uarch_table"])[i]
    u = Uarch.parse(name_or_path)
    table, params = uarch_params([u])
    per, glob = uarch_features(table, params)
    return uarch_vectors(self.variables, self.cfg, per, glob)[0]

  def adapt(self, name_or_path: str, probes: int = PROBES, log=None) -> np.ndarray:
    """[dim] uarch vector of a table fitted to the simulator's steady-state throughput
    of `probes` of the model's probe blocks on it, starting from (and pulled towards)
    the encoder's vector: the program encoder stays frozen, as with measured blocks.

    The table encoder alone generalises only so far from the tables it saw (13.1% MAPE
    on held-out sampled tables: benchmarks/RESULTS.md, PerfVec on simulator sweeps);
    1,024 simulated blocks, a few seconds of simulation, bring it to 8.8%. A training
    uarch keeps its own vector. `log`, when given, hears how many probes the fit used
    and how long it took.
    """
    from diffsim.isa import decode_blocks
    from diffsim.sim import simulate_blocks

    u0 = self.uarch(name_or_path)
    if name_or_path in self.train_uarchs or probes <= 0:
      return u0
    if not self.probes:
      raise ValueError("this model keeps no probe blocks (saved before they existed); "
                       "retrain it, or predict with the encoder's vector alone")
    t = time.time()
    blocks = decode_blocks(list(self.probes[:probes]))
    labels = simulate_blocks(uarch_table(Uarch.parse(name_or_path)), blocks,
                             iterations=self.experiment.get("iterations", 20),
                             throughput="steady")
    ok = [i for i, p in enumerate(labels) if p.error is None and p.cycles and p.cycles > 0]
    if not ok:
      raise ValueError(f"{name_or_path}: the simulator ran none of the {len(blocks)} probe "
                       f"blocks on this table ({labels[0].error})")
    u = fit_uarch(self, self.embed([blocks[i] for i in ok]),
                  np.array([labels[i].cycles for i in ok], np.float32), u0)
    if log:
      log(f"{name_or_path}: uarch vector adapted on {len(ok)} probe blocks simulated on it "
          f"({time.time() - t:.1f} s)")
    return u

  def predict(self, programs: np.ndarray, uarch: np.ndarray) -> np.ndarray:
    """Cycles per 100 iterations of each program vector on one uarch vector."""
    return np.asarray(predict(programs, uarch[None]))[:, 0] * 100.0


def _config(d: dict) -> ModelConfig:
  """A ModelConfig from its JSON form (tuples come back as lists)."""
  # Models saved before `references` or `structure` existed saw neither.
  return ModelConfig(**{**d, "references": tuple(d.get("references", ())),
                        "structure": d.get("structure", 0)})


def write_variables(path: Path, variables, cfg: ModelConfig) -> Path:
  """Variables as one .npz of float32 arrays named by their paths, with the config:
  a single small file that ships as package data and loads without orbax."""
  from flax.traverse_util import flatten_dict

  flat = {"/".join(k): np.asarray(v, np.float32)
          for k, v in flatten_dict(jax.device_get(variables)).items()}
  path = Path(path)
  path.parent.mkdir(parents=True, exist_ok=True)
  np.savez(path, __config__=np.array(json.dumps(dataclasses.asdict(cfg))), **flat)
  return path


def read_variables(path: Path) -> tuple[dict, ModelConfig]:
  """The inverse of `write_variables`."""
  from flax.traverse_util import unflatten_dict

  with np.load(path) as z:
    cfg = _config(json.loads(str(z["__config__"])))
    flat = {tuple(k.split("/")): jnp.asarray(z[k]) for k in z.files if k != "__config__"}
  return unflatten_dict(flat), cfg


def save(out_dir: Path, variables, cfg: ModelConfig, exp: Experiment, data: Data) -> Path:
  """Writes DIR/model.npz (`write_variables`) and DIR/model.json (config, uarch names,
  vocabulary size, probe blocks)."""
  out = Path(out_dir).absolute()
  path = write_variables(out / "model.npz", variables, cfg)
  # Probes: training blocks labelled on every training table, in a seeded order.
  train = np.array([r == "train" for r in data.role])
  core = np.flatnonzero((data.part == 0) & np.isfinite(data.y[train]).all(0))
  probes = np.random.default_rng(exp.seed + 3).permutation(core)[:_KEPT_PROBES]
  meta = dict(config=dataclasses.asdict(cfg), experiment=dataclasses.asdict(exp),
              train_uarchs=[u.name for u, t in zip(data.uarchs, train) if t],
              vocabulary=len(vocabulary()), probes=[data.blocks[i].hex for i in probes])
  (out / "model.json").write_text(json.dumps(meta, indent=1))
  return path


@functools.lru_cache(maxsize=4)
def _load_cached(d: Path, stamp: float) -> Trained:
  meta = json.loads((d / "model.json").read_text())
  if meta["vocabulary"] != len(vocabulary()):
    raise ValueError(f"{d}: the model's opcode vocabulary has {meta['vocabulary']} entries, "
                     f"this diffsim's {len(vocabulary())}")
  variables, cfg = read_variables(d / "model.npz")
  digest = hashlib.blake2b((d / "model.npz").read_bytes(), digest_size=8).hexdigest()
  return Trained(variables, cfg, meta["train_uarchs"], meta["experiment"],
                 tuple(meta.get("probes", ())), digest)


def load(model_dir: str | Path | None = None) -> Trained:
  """A model saved by `save` (`diffsim perfvec train --out DIR`); None: the pretrained
  model that ships in the package (`PRETRAINED`). Loaded once per process (a file
  changed since is read again)."""
  d = Path(model_dir).absolute() if model_dir is not None else PRETRAINED
  if not (d / "model.json").exists() or not (d / "model.npz").exists():
    hint = ("the package was installed without its pretrained model" if model_dir is None
            else f"train one with `diffsim perfvec train --out {d}`")
    raise FileNotFoundError(f"{d} holds no trained PerfVec model (model.json and "
                            f"model.npz); {hint}")
  return _load_cached(d, (d / "model.npz").stat().st_mtime)


def _summary(pred: np.ndarray, y: np.ndarray) -> dict:
  """MAPE over all (uarch, block) pairs; Kendall's tau per uarch, averaged."""
  ok = np.isfinite(y) & (y > 0)
  taus = [metrics.kendall_tau(p[o], t[o]) for p, t, o in zip(pred, y, ok) if o.sum() > 1]
  return dict(mape=metrics.mape(pred[ok], y[ok]), kendall_tau=float(np.nanmean(taus)),
              within_5pct=metrics.within(pred[ok], y[ok], 0.05), n=int(ok.sum()),
              uarchs=len(pred))


def evaluate(trained: Trained, data: Data,
             probes: int | Sequence[int] = PROBES) -> list[dict]:
  """Accuracy against the simulator's labels on everything training did not see.

  Unseen uarchs are scored with the table encoder's vector alone, and with that vector
  adapted on each count in `probes` of the model's probe blocks (as `Trained.adapt`
  does; 0: not scored). The blocks are embedded once for all counts.
  """
  progs = trained.embed(data.blocks)
  role = np.array(data.role)
  enc = uarch_vectors(trained.variables, trained.cfg, data.per_opcode, data.glob)
  tab = np.zeros_like(enc)
  tab[role == "train"] = np.asarray(trained.variables["params"]["uarch_table"])
  # The probes' labels on each unseen table are in the label matrix already (the
  # simulator's, as `adapt` would compute them): read there rather than simulated again.
  where = {b.hex: i for i, b in enumerate(data.blocks) if data.part[i] == 0}
  unseen = [(enc, "")]
  done = set()
  for m in [probes] if isinstance(probes, int) else probes:
    probe_ids = np.array([where[h] for h in trained.probes[:m] if h in where], int)
    if m <= 0 or len(probe_ids) in done | {0}:
      continue
    done.add(len(probe_ids))
    adapted = enc.copy()
    for i in np.flatnonzero(np.isin(role, ["heldout_sampled", "heldout_model"])):
      ok = probe_ids[np.isfinite(data.y[i, probe_ids]) & (data.y[i, probe_ids] > 0)]
      adapted[i] = fit_uarch(trained, progs[ok], data.y[i, ok], enc[i])
    unseen.append((adapted, f", adapted on {len(probe_ids)} probes"))
  rows = []

  def add(what, uarch_mask, part, vectors):
    ids = np.flatnonzero(np.isin(data.part, part))
    if not uarch_mask.any() or not len(ids):
      return
    pred = np.asarray(predict(progs[ids], vectors[uarch_mask])).T * 100.0
    rows.append(dict(what=what, **_summary(pred, data.y[uarch_mask][:, ids])))

  train = role == "train"
  add("seen uarchs x unseen blocks (uarch table)", train, [2], tab)
  add("seen uarchs x unseen blocks (uarch encoder)", train, [2], enc)
  for vectors, how in unseen:
    add(f"held-out sampled tables x unseen blocks{how}", role == "heldout_sampled", [2],
        vectors)
    for u, r in zip(data.uarchs, data.role):
      if r == "heldout_model":
        add(f"held-out model {u.name} x unseen blocks{how}",
            np.array([x is u for x in data.uarchs]), [2], vectors)
  add("seen uarchs x held-out application", train, [3], tab)
  for vectors, how in unseen:
    add(f"held-out sampled tables x held-out application{how}", role == "heldout_sampled",
        [3], vectors)
    add(f"held-out models x held-out application{how}", role == "heldout_model", [3], vectors)
  add("seen uarchs x training blocks (fit)", train, [0], tab)
  return rows


PRIORS = (1e-4, 1e-3, 1e-2, 1e-1, 1.0, 10.0, 100.0)  # pulls towards the start, tried by CV


def fit_uarch(trained: Trained, programs: np.ndarray, y: np.ndarray, init: np.ndarray, *,
              steps: int = 2000, lr: float = 0.02, prior: float | str | None = None,
              folds: int = 4, seed: int = 0) -> np.ndarray:
  """A uarch vector fitted to labelled blocks, everything else frozen.

  The fit minimises `_robust_error`, close to the MAPE it is judged by. The squared log
  error used before was ruled by the few blocks that the frozen program vectors miss by
  5-20x (stack and aliasing memory behaviour on Zen 5): on the same model and blocks,
  Zen 5 at K = 512 went from 27.4% to 19.4% held-out MAPE, tau 0.798 to 0.816
  (benchmarks/RESULTS.md, PerfVec on simulator sweeps).

  Args:
    programs: [K, dim] program vectors of the labelled blocks (`Trained.embed`).
    y: [K] cycles per 100 iterations.
    init: [dim] the starting vector (the encoder's vector of the nearest known table).
    prior: how strongly the fit is pulled towards `init`. None: 0.5 / sqrt(K), weaker as
      the blocks grow in number (on six Zen 5 splits it beat any fixed pull: K = 32 needs
      about 0.1, K = 512 0.01-0.025). "cv": chosen from `PRIORS` by `folds`-fold
      cross-validation (held-out robust error) on the K blocks themselves.
  """
  P = jnp.asarray(programs)
  t = jnp.log(jnp.asarray(y, jnp.float32) / 100.0)
  u0 = jnp.asarray(init, jnp.float32)
  K = len(t)
  if prior is None:
    prior = 0.5 / np.sqrt(K)
  if prior != "cv":
    return np.asarray(_fit_weighted(P, t, u0, jnp.ones(K), jnp.float32(prior), steps, lr))
  fold = np.random.default_rng(seed).permutation(K) % max(2, min(folds, K))
  held = jnp.asarray(fold[None, :] == np.arange(fold.max() + 1)[:, None])  # [F, K]
  priors = jnp.asarray(PRIORS, jnp.float32)

  def cv_error(prior):
    def one(h):
      u = _fit_weighted(P, t, u0, (~h).astype(jnp.float32), prior, steps, lr)
      err = _robust_error(P, t, u)
      return jnp.sum(jnp.where(h, err, 0.0)) / jnp.maximum(jnp.sum(h), 1)
    return jnp.mean(jax.vmap(one)(held))

  best = priors[int(jnp.argmin(jax.jit(jax.vmap(cv_error))(priors)))]
  return np.asarray(_fit_weighted(P, t, u0, jnp.ones(K), best, steps, lr))


def _robust_error(P, t, u):
  """|log ratio| + |ratio - 1| per block (ratio = prediction / label), each smoothed at 0.

  The second term is the relative error itself, MAPE's own; alone its gradient vanishes
  where a prediction is far too small (ratio -> 0), so a fit from a poor start stalls.
  The first keeps a unit gradient everywhere and, like it, grows only slowly with the
  size of a miss, so that a few blocks out of the model's reach do not rule the fit.
  """
  log_ratio = log_predict(P, u[None])[:, 0] - t
  return smooth_abs(log_ratio) + smooth_abs(jnp.exp(log_ratio) - 1.0)


@functools.partial(jax.jit, static_argnums=(5, 6))
def _fit_weighted(P, t, u0, weight, prior, steps: int, lr: float):
  """Adam (cosine schedule) on the weighted mean robust error plus the pull towards u0."""
  scale = jnp.maximum(jnp.mean(u0**2), 1e-6)

  def loss(u):
    err = _robust_error(P, t, u)
    return (jnp.sum(weight * err) / jnp.maximum(jnp.sum(weight), 1)
            + prior * jnp.mean((u - u0) ** 2) / scale)

  opt = optax.adam(optax.cosine_decay_schedule(lr, steps))
  return descend(loss, u0, opt, opt.init(u0), steps)[0]
