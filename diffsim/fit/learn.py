"""DiffTune-style parameter learning through the simulator itself.

Each step runs the hard simulator on a minibatch with the current table rounded to
integers (the schedule), replays that schedule with the float table in soft mode
(`diffsim.sim.soft`), and takes an optax step on the mean absolute percentage error
of the steady-state throughput. After each step the table is projected back to
physical values. Every epoch ends with a validation pass, an orbax checkpoint (the
table, the optimiser state, the best table so far and the history), and early
stopping on the validation error of the rounded table: the one that is exported.

In a multi-process run (`diffsim.sim.hosts`) every process holds every minibatch and
takes its part of each (`batches.share`); the parts' gradients are summed across
processes, so the same seed gives the same table, to float rounding, for any number of
processes, and an epoch takes 1 / processes as long. The checkpoints then need a
folder that every process sees (orbax's multi-host checkpointing).
"""

from __future__ import annotations

import dataclasses
import functools
import json
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import optax

from diffsim.fit.batches import Minibatch, dynamic_for, minibatches, share
from diffsim.params.table import Params, Table
from diffsim.sim import hosts, soft, status
from diffsim.sim.api import Schedules, record_schedules
from diffsim.sim.kernels import DEFAULT_MAX_CYCLES, window_for
from diffsim.sim.state import DISPATCH, ISSUE, RETIRE

# What a fit may change; the rest of the table (buffers, queues, register files)
# stays as the initial table has it.
TRAINABLE = ("uops", "latency", "read_advance", "res_cycles", "dispatch_width", "rob_size")


@dataclasses.dataclass(frozen=True)
class FitConfig:
  """Hyper-parameters of a fit (defaults: those used for the shipped zen5 table)."""

  epochs: int = 30
  batch_size: int = 128
  lr: float = 0.1  # Adam's peak step (cycles), cosine-decayed to lr / 10 (`optimizer`)
  # The pull towards the initial table, in blocks' worth of evidence: each parameter's
  # squared distance from its start weighs as much as `prior` training blocks' error,
  # so a parameter that 50 blocks exercise moves and one that none does stays.
  prior: float = 1.0
  tau: float = 0.5  # soft-mode temperature, in cycles
  straight_through: bool = False  # exact forward, tempered backward
  quantize: bool = True  # fit the rounded table: integers forward, identity backward
  patience: int = 6  # epochs without a better validation error before stopping
  seed: int = 0
  trainable: tuple[str, ...] = TRAINABLE
  max_cycles: int = DEFAULT_MAX_CYCLES  # the hard runs' cycle budget (`simulate`)


def record_local(table: Table, params, mb: Minibatch, window: int,
                 max_cycles: int = DEFAULT_MAX_CYCLES) -> Schedules:
  """The minibatch's hard schedules (`record_schedules`), gathered onto one device for
  the replay (which then runs as one program, with no cross-device reduction)."""
  out = record_schedules(table, mb.batch, params=params, iterations=mb.iterations,
                         dynamic=dynamic_for(mb.length), window=window, max_cycles=max_cycles)
  return jax.device_put(out, jax.local_devices()[0])


def replayable(mb: Minibatch, codes, throw: bool, failed: dict, part: str) -> np.ndarray:
  """`mb.weight` without the blocks whose hard run failed (`codes`, their status): a
  truncated or unfinished schedule must not be replayed as if it were whole. With
  `throw`, a failure raises `status.SimulationError` naming the blocks' rows in the
  dataset; without, each is recorded in `failed` ((part, row) -> its codes, or-ed)."""
  real = mb.weight > 0  # padding is no block
  codes = np.where(real, np.asarray(codes), status.OK)
  if throw:
    status.check(codes[real], [f"{part} row {r}" for r in mb.rows[real]], what="fit")
  for r, code in zip(mb.rows[codes != status.OK], codes[codes != status.OK]):
    failed[part, int(r)] = failed.get((part, int(r)), status.OK) | int(code)
  return np.where(codes == status.OK, mb.weight, 0.0).astype(np.float32)


def _predict(params, structure, layout, batch, traces, iterations, tau, straight_through):
  def one(block, trace, its):
    return soft.block_throughputs(params, structure, layout, block, trace, its, tau,
                                  straight_through)[1]
  return jax.vmap(one)(batch, traces, iterations)


soft_predictions = jax.jit(_predict, static_argnames=("layout", "tau", "straight_through"))


def _mape(pred, y, weight):
  return jnp.sum(jnp.abs(pred - y) / y * weight) / jnp.maximum(jnp.sum(weight), 1.0)


@functools.partial(jax.jit, static_argnames=("layout", "tau", "straight_through", "quantize"))
def loss_and_grad(params, structure, batch, traces, iterations, y, weight, *, layout, tau,
                  straight_through, init=None, prior=0.0, quantize=False, denominator=None):
  """(soft MAPE, soft predictions, gradient) of a recorded minibatch.

  With `init`, the gradient also pulls towards the initial table (a Gaussian prior
  of weight `prior`): parameters the data say nothing about stay where they were,
  and those they say little about move only as far as the evidence carries them.
  With `denominator`, the error is summed over this batch and divided by it (the
  whole minibatch's weight, when processes take parts of it: `hosts.total` of the
  parts' results is then the minibatch's).
  """
  def loss(p):
    q = quantized(p) if quantize else p
    pred = _predict(q, structure, layout, batch, traces, iterations, tau, straight_through)
    value = _mape(pred, y, weight) if denominator is None else \
        jnp.sum(jnp.abs(pred - y) / y * weight) / denominator
    penalty = 0.0
    if init is not None:
      penalty = prior * sum(jnp.sum((getattr(p, k) - getattr(init, k)) ** 2)
                            for k in ("uops", "latency", "read_advance", "res_cycles"))
    return value + penalty, (value, pred)
  (_, (value, pred)), grad = jax.value_and_grad(loss, has_aux=True)(params)
  return value, pred, grad


@jax.jit
def hard_steady(traces, n, iterations):
  """Steady cycles per 100 iterations of the hard schedules (rounded table)."""
  def one(trace, n, its):
    times = jnp.concatenate([trace[:, DISPATCH], trace[:, ISSUE], trace[:, RETIRE]])
    times = times.astype(jnp.float32)
    return soft.throughputs(times, n, its, trace.shape[0])[1]
  return jax.vmap(one)(traces, n, iterations)


def project(params: Params, init: Params, window: int) -> Params:
  """Back to physical values: at least one micro-op, no negative latency, resources
  in use keep a positive (soft) cycle count and unused ones stay unused."""
  return params.replace(
      uops=jnp.maximum(params.uops, 1.0),
      latency=jnp.maximum(params.latency, 0.0),
      read_advance=jnp.maximum(params.read_advance, jnp.minimum(init.read_advance, 0.0)),
      res_cycles=jnp.where(init.res_cycles > 0, jnp.maximum(params.res_cycles, 0.05), 0.0),
      dispatch_width=jnp.clip(params.dispatch_width, 1.0, 16.0),
      rob_size=jnp.clip(params.rob_size, 16.0, float(window)))


def quantized(params: Params) -> Params:
  """`rounded` forward, identity backward: the loss is that of the integer table the
  hard simulator runs, while the gradient still moves the float values (so a
  resource pushed below one cycle keeps saying so, see `grow`)."""
  sg = jax.lax.stop_gradient
  return jax.tree.map(lambda p, r: p + sg(r - p), params, rounded(params))


def rounded(params: Params) -> Params:
  """The integer table the hard simulator runs (what gets exported)."""
  return params.replace(
      uops=jnp.maximum(jnp.round(params.uops), 1.0), latency=jnp.round(params.latency),
      read_advance=jnp.round(params.read_advance),
      res_cycles=jnp.where(params.res_cycles > 0, jnp.maximum(jnp.round(params.res_cycles), 1), 0),
      dispatch_width=jnp.round(params.dispatch_width), rob_size=jnp.round(params.rob_size))


def _mask_grad(grad: Params, trainable) -> Params:
  return grad.replace(**{f.name: jnp.zeros_like(getattr(grad, f.name))
                         for f in dataclasses.fields(grad) if f.name not in trainable})


class Evaluator:
  """MAPE of a fixed set of minibatches: `soft` for the float table (before rounding),
  `hard` for the rounded table in the hard simulator (what is exported). Blocks whose
  hard run fails raise (`throw`) or are left out and recorded in `failed`
  (`replayable`)."""

  def __init__(self, table: Table, batches: list[Minibatch], window: int, *,
               throw: bool = True, part: str = "validation"):
    self.table, self.batches, self.window = table, batches, window
    self.throw, self.part, self.failed = throw, part, {}

  def __call__(self, params: Params, config: FitConfig) -> dict:
    layout, structure = self.table.layout, self.table.structure
    soft_err, hard_err, weight = 0.0, 0.0, 0.0
    for whole in self.batches:
      # In a multi-process run each process scores its part of every minibatch.
      mb, recorded, w_all, w = recorded_part(self.table, params, whole, self.window, config,
                                             self.throw, self.failed, self.part)
      # The float table as it is (before rounding), on the rounded table's schedule.
      pred = np.asarray(soft_predictions(params, structure, layout, mb.batch, recorded.traces,
                                         mb.iterations, config.tau, config.straight_through))
      hard = np.asarray(hard_steady(recorded.traces, mb.batch.length, mb.iterations))
      soft_err += float(np.sum(np.abs(pred - mb.y) / mb.y * w))
      hard_err += float(np.sum(np.abs(hard - mb.y) / mb.y * w))
      weight += float(w_all.sum())
    soft_err, hard_err = hosts.total(np.array([soft_err, hard_err]))
    return dict(soft=float(soft_err) / max(weight, 1), hard=float(hard_err) / max(weight, 1))


def recorded_part(table: Table, params, mb: Minibatch, window: int, config: FitConfig,
                  throw: bool, failed: dict, part: str):
  """This process's part of a minibatch, recorded: (the part, its `Schedules`, the whole
  minibatch's replayable weights [B], the part's [B / processes]).

  Every process learns every part's status, so that all of them raise, or leave
  blocks out, alike (`replayable`). One process: the whole minibatch.
  """
  n = hosts.count()
  if n == 1:
    recorded = record_local(table, params, mb, window, config.max_cycles)
    w = replayable(mb, recorded.status, throw, failed, part)
    return mb, recorded, w, w
  sub, pos = share(mb, n, hosts.index())
  recorded = record_local(table, params, sub, window, config.max_cycles)
  B = len(mb.weight)
  mine = pos[pos >= 0]
  codes = hosts.gather(np.asarray(recorded.status)[:len(mine)],
                       [np.arange(p, B, n) for p in range(n)], B)
  w_all = replayable(mb, codes, throw, failed, part)
  return sub, recorded, w_all, np.where(pos >= 0, w_all[np.maximum(pos, 0)], 0.0).astype(
      np.float32)


@dataclasses.dataclass
class FitResult:
  """What a fit produced: the best table (float and rounded) and the history."""

  params: Params  # best float table (by validation error of its rounded form)
  table: Table  # the initial table the fit started from (its structure and layout)
  history: list[dict]
  skipped: dict  # training-set position -> why the block was left out
  counts: np.ndarray  # [K] training instructions per opcode (`grow.usage`)
  # ("training" | "validation", position) -> status code of a block whose hard run
  # failed, so that it was left out of steps or scores (only with throw=False).
  failed: dict = dataclasses.field(default_factory=dict)
  last: Params | None = None  # the float table after the last epoch run


def _bar(items, desc: str, enabled: bool):
  """A tqdm progress bar over `items`, or a silent stand-in."""
  if enabled:
    from tqdm.auto import tqdm

    return tqdm(items, desc=desc, unit="batch", leave=False)

  class Silent(list):
    def set_postfix(self, **_):
      pass

    def close(self):
      pass

  return Silent(items)


def _leaves(state) -> dict:
  """The checkpointed form of the fit state: its non-empty leaves by position (orbax
  cannot save zero-size arrays, and tables without register files have some)."""
  # (On the host in a multi-process run: every process holds the same state, and orbax
  # would take one-device arrays of several processes for shards of one array.)
  host = hosts.count() > 1
  return {f"{i:04d}": np.asarray(x) if host else x
          for i, x in enumerate(jax.tree.leaves(state)) if np.size(x)}


def _restore_or_init(manager, state):
  import orbax.checkpoint as ocp

  step = manager.latest_step()
  if step is None:
    return state, False
  like = _leaves(state)
  abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, like)
  saved = manager.restore(step, args=ocp.args.StandardRestore(abstract))
  leaves, treedef = jax.tree.flatten(state)
  return treedef.unflatten([saved.get(f"{i:04d}", x) for i, x in enumerate(leaves)]), True


class EpochCheckpoints:
  """A training state checkpointed (orbax) after each epoch beside `history.json` in
  `out`, so that rerunning the same command resumes where it stopped."""

  def __init__(self, out: Path, log=print):
    import orbax.checkpoint as ocp

    self.dir, self.history_file, self.log = out / "checkpoints", out / "history.json", log
    self.manager = ocp.CheckpointManager(self.dir,
                                         options=ocp.CheckpointManagerOptions(max_to_keep=2))
    self.resumed = False

  def resume(self, state) -> tuple[Any, list]:
    """`state` restored from the last checkpoint (as is when there is none), and the
    epochs' history so far."""
    state, self.resumed = _restore_or_init(self.manager, state)
    if not self.resumed:
      return state, []
    self.log(f"resumed from {self.dir} after epoch {int(state['epoch'])}")
    f = self.history_file
    return state, (json.loads(f.read_text()) if f.exists() else [])

  def save(self, epoch: int, state, history: list) -> None:
    import orbax.checkpoint as ocp

    self.manager.save(epoch, args=ocp.args.StandardSave(_leaves(state)))
    self.manager.wait_until_finished()
    if hosts.primary():  # the processes of a multi-process run share the folder
      self.history_file.write_text(json.dumps(history, indent=1))

  def close(self) -> None:
    self.manager.close()


def fit(table: Table, train, val, out_dir, config: FitConfig = FitConfig(), *,
        optimizer: optax.GradientTransformation | None = None, throw: bool = True,
        progress: bool = True, log=print) -> FitResult:
  """Fits `table` to the labelled datasets `train` (and `val`); resumable.

  Args:
    table: the initial table (its layout is kept; see `diffsim.params.export.grow`).
    train, val: `diffsim.data.Dataset`s with labels in cycles per 100 iterations
      (steady state); `val` may be None (then the training set is used for early
      stopping, which is reported as such).
    out_dir: checkpoints go to out_dir/checkpoints, the history to history.json. A
      directory holding a checkpoint of the same fit is resumed from it.
    optimizer: the optax transformation that turns gradients into steps (in cycles);
      None: Adam with `config.lr` cosine-decayed to a tenth over the fit. Steps are
      projected back to physical values (`project`) after each update.
    throw: raise `status.SimulationError` naming the dataset rows whose hard run
      failed (past `config.max_cycles`); otherwise leave them out of that step or
      score and report them in `FitResult.failed`.

  Returns:
    FitResult with the best table by rounded validation error.
  """

  out = Path(out_dir).absolute()
  out.mkdir(parents=True, exist_ok=True)
  layout, structure = table.layout, table.structure
  window = window_for(np.asarray(table.params.rob_size))
  train_b, skipped = minibatches(table, train.hex, train.y, config.batch_size)
  if not train_b:
    raise ValueError("no training block can be simulated with this table: "
                     + "; ".join(f"row {i}: {e}" for i, e in list(skipped.items())[:3]))
  val_b = minibatches(table, val.hex, val.y, config.batch_size)[0] if val is not None else []
  evaluate = Evaluator(table, val_b or train_b, window, throw=throw,
                       part="validation" if val_b else "training")
  # Committed to the device the steps run on, as every later table is: a jitted step
  # compiles again for an uncommitted argument where it saw committed ones.
  init = jax.device_put(jax.tree.map(lambda x: jnp.asarray(x, jnp.float32), table.params),
                        jax.local_devices()[0])
  steps = config.epochs * len(train_b)
  opt = optimizer or optax.adam(optax.cosine_decay_schedule(config.lr, steps, alpha=0.1))
  failed = evaluate.failed  # training rows join the evaluator's (one record)
  state = dict(params=init, opt=opt.init(init), best=init, epoch=jnp.int32(0),
               best_val=jnp.float32(np.inf), bad=jnp.int32(0))
  checkpoints = EpochCheckpoints(out, log)
  state, history = checkpoints.resume(state)
  n_train = sum(int(mb.weight.sum()) for mb in train_b)
  n_proc = hosts.count()
  log(f"fitting {len(table.layout.keys)}-opcode table {layout.cpu!r} on {n_train} blocks "
      f"({len(skipped)} skipped), validating on "
      f"{sum(int(mb.weight.sum()) for mb in val_b) if val_b else 'the training'} blocks")
  if not checkpoints.resumed:
    before = evaluate(init, config)
    history.append(dict(epoch=0, train=None, val_soft=before["soft"], val_hard=before["hard"],
                        seconds=0.0))
    state["best_val"] = jnp.float32(before["hard"])
    log(f"initial table: validation {before['soft']:.4f} soft, {before['hard']:.4f} rounded")
  import time

  for epoch in range(int(state["epoch"]), config.epochs):
    if int(state["bad"]) >= config.patience:
      break
    t0 = time.time()
    params, opt_state = state["params"], state["opt"]
    order = np.random.default_rng([config.seed, epoch]).permutation(len(train_b))
    losses, weights = [], []
    bar = _bar(order, f"epoch {epoch + 1}/{config.epochs}", progress)
    for k in bar:
      # Data-parallel over processes (`diffsim.sim.hosts`): each takes its part of the
      # minibatch; the parts' error sums over the minibatch's weight, and their gradients,
      # add up to the minibatch's, whatever the number of processes. (The prior's pull
      # is split evenly between them.)
      mb, recorded, weight_all, weight = recorded_part(table, params, train_b[k], window,
                                                       config, throw, failed, "training")
      value, _, grad = loss_and_grad(
          params, structure, mb.batch, recorded.traces, mb.iterations, mb.y, weight,
          layout=layout, tau=config.tau, straight_through=config.straight_through, init=init,
          prior=config.prior / n_train / n_proc, quantize=config.quantize,
          denominator=None if n_proc == 1 else np.float32(max(weight_all.sum(), 1.0)))
      if n_proc > 1:
        value, grad = hosts.total((value, grad))
      grad = _mask_grad(grad, config.trainable)
      updates, opt_state = opt.update(grad, opt_state, params)
      params = project(optax.apply_updates(params, updates), init, window)
      losses.append(float(value))
      weights.append(float(weight_all.sum()))
      bar.set_postfix(mape=f"{float(value):.3f}")
    bar.close()
    steps_seconds = time.time() - t0
    scores = evaluate(params, config)
    # (best_val is stored in float32: an unchanged score must not count as better)
    better = scores["hard"] < float(state["best_val"]) - 1e-6
    state = dict(params=params, opt=opt_state,
                 best=params if better else state["best"], epoch=jnp.int32(epoch + 1),
                 best_val=jnp.float32(scores["hard"]) if better else state["best_val"],
                 bad=jnp.int32(0) if better else state["bad"] + 1)
    # (nan: every training block failed, throw=False)
    train_loss = float(np.average(losses, weights=weights)) if sum(weights) else float("nan")
    history.append(dict(epoch=epoch + 1, train=train_loss, val_soft=scores["soft"],
                        val_hard=scores["hard"], seconds=time.time() - t0,
                        steps_seconds=steps_seconds))
    checkpoints.save(epoch + 1, state, history)
    log(f"epoch {epoch + 1}: train MAPE {train_loss:.4f} (soft)  validation "
        f"{scores['soft']:.4f} soft, {scores['hard']:.4f} rounded"
        f"{'  *' if better else ''}  {time.time() - t0:.1f} s")
  checkpoints.close()
  from diffsim.fit.grow import usage

  return FitResult(params=state["best"], table=table, history=history, skipped=skipped,
                   counts=usage(table, train_b), failed=failed, last=state["params"])
