"""Exact integer moves: per-opcode coordinate search with the hard simulator.

A table's integers (an opcode's micro-ops, latencies, resource cycles, read-advance)
change only where the change makes the exact simulator better on the training blocks
that use that opcode: no rounding decides, and no surrogate. Blocks are indexed by
opcode, so a move is judged on the opcode's own blocks (at most `cap` of them), and
every opcode's candidate move runs in one simulator call: the table gets a second copy
of every opcode row (`variants`), and each judging block runs with its opcode's row
swapped for the moved copy. The moves that gain are then applied together and each
is kept only where it still gains with the others in place (`_verified`); the ones
dropped are judged again against the table with the kept moves. Besides the numbers,
an opcode may move to a wider group of its scheduler's pipes (`port_moves`): the
port sets follow the evidence too. Global moves (the dispatch width) change every
block, so they are judged on all the judging blocks at once (the ROB size is not
searched: every size compiles the simulator anew).

The objective is the metric that is reported: MAPE of the steady-state throughput
(BHive's definition, 100 and 200 iterations) against the measurements.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence

import jax
import numpy as np

from diffsim.isa.encode import key_lookup, renaming_for
from diffsim.params.table import READ_CLASSES, WRITE_ROLES, Params, Table

# Latency columns a latency move shifts: every write role except the stack pointer's,
# whose latency is the stack engine's business (0 where push/pop do not serialise).
_SHIFTED_ROLES = np.array([r != "RSP" for r in WRITE_ROLES])
# Read-advance columns an advance move shifts: the explicit register sources (a store's
# data, a load-op's register operand), not flags, implicit reads or addresses.
_EXPLICIT_READS = np.array([c.startswith("op") for c in READ_CLASSES])
_MEM_READ = READ_CLASSES.index("mem")  # a load's read of a forwarded store (negative)
_PER_KEY = ("uops", "latency", "read_advance", "res_cycles")


@dataclasses.dataclass(frozen=True)
class Move:
  """One kind of change to one opcode's row: `field` by `delta` (see `apply`)."""

  field: str  # "latency" | "uops" | "cycles" | "pipelined" | "advance" | "forward" | "port"
  #             or global (`GLOBAL`): "dispatch"
  delta: int = 0

  def __str__(self) -> str:
    return self.field if self.field in ("pipelined", "port") else f"{self.field} {self.delta:+d}"


# Moves of the table's global numbers: the field each changes, and its range.
GLOBAL = {"dispatch": ("dispatch_width", 1, 16)}
# The moves of `diffsim fit --exact`, in the order each round tries them.
MOVES = (Move("dispatch", +1), Move("dispatch", -1),
         Move("latency", -1), Move("latency", +1), Move("uops", -1), Move("uops", +1),
         Move("cycles", -1), Move("cycles", +1), Move("pipelined"), Move("port"),
         Move("advance", +1), Move("advance", -1), Move("forward", +1), Move("forward", -1))


def _step(row: np.ndarray) -> int:
  """How far one latency or cycles move goes: 1 cycle up to 31, then a sixteenth of
  the row's largest value (a relative error is what the objective sees), so that a
  divide at 98 cycles reaches 76 within one round's passes."""
  return max(1, int(np.max(row, initial=0)) // 16)


def apply(p: dict[str, np.ndarray], k: int, move: Move,
          ports: dict[int, tuple[int, int]] | None = None) -> bool:
  """Applies `move` to opcode row `k` of the numpy table `p` in place; False where it
  does not apply (the value would leave its physical range, or nothing would change).
  A port move shifts row k's cycles from column a to column b, (a, b) = `ports[k]`
  (`port_moves`)."""
  if move.field in GLOBAL:  # k is not used
    name, low, high = GLOBAL[move.field]
    new = float(p[name]) + move.delta
    if not low <= new <= high:
      return False
    p[name] = np.float32(new)
  elif move.field == "port":
    if not ports or k not in ports:
      return False
    a, b = ports[k]
    row = p["res_cycles"][k]
    if row[a] <= 0 or row[b] > 0:
      return False
    row[b], row[a] = row[a], 0.0
  elif move.field == "latency":
    row = p["latency"][k]
    step = move.delta * _step(row[_SHIFTED_ROLES])
    new = np.where(_SHIFTED_ROLES, np.maximum(row + step, 0), row)
    if np.array_equal(new, row):
      return False
    p["latency"][k] = new
  elif move.field == "pipelined":  # every resource it uses held for one cycle
    row = p["res_cycles"][k]
    new = np.where(row > 0, 1.0, 0.0)
    if np.array_equal(new, row):
      return False
    p["res_cycles"][k] = new
  elif move.field == "advance":  # read-advance of the explicit register sources
    row = p["read_advance"][k]
    new = np.where(_EXPLICIT_READS, row + move.delta, row)
    if new[_EXPLICIT_READS].min() < min(row[_EXPLICIT_READS].min(), 0) or \
        new[_EXPLICIT_READS].max() > 8:
      return False
    p["read_advance"][k] = new
  elif move.field == "forward":  # cycles a forwarded store's data costs a load
    row = p["read_advance"][k]
    if not -12 <= row[_MEM_READ] - move.delta <= 0:
      return False  # a forward costs a load 0 to 12 cycles (`refine` moves loads only)
    row[_MEM_READ] -= move.delta
  elif move.field == "uops":
    new = p["uops"][k] + move.delta
    if new < 1:
      return False
    p["uops"][k] = new
  elif move.field == "cycles":
    row = p["res_cycles"][k]
    used = row > 0
    if not used.any():
      return False
    new = np.where(used, np.maximum(row + move.delta * _step(row), 1), 0)
    if np.array_equal(new, row):
      return False
    p["res_cycles"][k] = new
  else:
    raise ValueError(f"unknown move field {move.field!r}")
  return True


def port_moves(table: Table) -> dict[int, tuple[int, int]]:
  """Per opcode row, the one port move it may make: its execution group (the one group
  it holds that no scheduler buffers) to the widest group of the scheduler it sits in,
  e.g. an ALU operation modelled on three pipes to all six. Loads and stores keep
  their address units. Rows whose moved form the structure cannot run get none."""
  lay, st = table.layout, table.structure
  U = len(lay.units)
  buffered = np.asarray(table.params.buffer_size) > 0
  cyc = np.asarray(table.params.res_cycles)
  need = np.asarray(st.res_need)
  size = [bin(m).count("1") for m in lay.group_members]
  members = list(lay.group_members)
  buffers = np.asarray(st.buffers)
  mem = np.asarray(st.may_load) | np.asarray(st.may_store)
  out = {}
  for k in range(len(lay.keys)):
    if mem[k]:
      continue
    held = [g for g in range(len(members)) if cyc[k, U + g] > 0 and not buffered[U + g]]
    sched = [g for g in range(len(members)) if buffers[k, U + g]]
    if len(held) != 1 or len(sched) != 1 or need[k, U + held[0]] != 1:
      continue
    a = held[0]
    inside = [g for g in range(len(members)) if not buffered[U + g] and g != a
              and members[g] & ~members[sched[0]] == 0 and size[g] > size[a]]
    if inside:
      b = max(inside, key=lambda g: (size[g], -g))
      out[k] = (U + a, U + b)
  return out


def _any_group_needs_one(table: Table) -> Table:
  """`table` with one free member needed of every group an opcode does not hold (the
  need of an unheld group is never read), so a port move may hold any group."""
  U = len(table.layout.units)
  need = np.array(table.structure.res_need)
  need[:, U:] = np.maximum(need[:, U:], 1)
  return dataclasses.replace(table, structure=table.structure.replace(res_need=need))


def _numpy(params: Params) -> dict[str, np.ndarray]:
  return {f.name: np.array(getattr(params, f.name), np.float32)
          for f in dataclasses.fields(params)}


def _table(table: Table, p: dict[str, np.ndarray]) -> Table:
  return dataclasses.replace(table, params=Params(**p))


def _shape(e) -> tuple[int, int, int]:
  from diffsim.isa.encode import DEP_BUCKETS, bucket_of, bucket_length

  L = bucket_length(e.length)
  D = bucket_of(max(e.max_deps, 1), DEP_BUCKETS + (128, 256))
  C = max(min(L, 32), bucket_of(max(e.max_uses, 1), DEP_BUCKETS + (128, 256)))
  return L, D, C


class Judge:
  """Steady-state throughputs of a fixed set of blocks under tables of one layout, in
  fixed shapes: every block is encoded once, and any subset runs as jobs of `job`
  blocks per bucket length (padded with blocks of zero iterations), so that a search
  that calls it thousands of times compiles one program per bucket length.

  Every table runs in its doubled form (`variants`), moved rows or not, and with the
  widest dispatch pass seen so far: a table, its variants and its dispatch-width moves
  then share the same compiled programs (compiling them is most of a short search).

  A block's cycles depend only on the table's global numbers and the rows of the
  opcodes it runs, so each result is remembered under a digest of exactly those
  (`_digests`): a search asks again and again for blocks whose rows no move changed
  (a verified trial, then the same table's re-judging; a pass that kept nothing), and
  those are not simulated again."""

  def __init__(self, table: Table, blocks: Sequence, job: int = 256):
    from diffsim.sim.blocks import block_encoding

    supported = np.asarray(table.structure.supported)
    renaming, key_of = renaming_for(table), key_lookup(table.layout.index)
    self.encodings = [block_encoding(table, b, supported, renaming, key_of) for b in blocks]
    # Each block's program shape: its bucket length, deps and consumers per instruction
    # (few shapes, so few compilations; a block runs with no more slots than it needs).
    self.shape = [None if isinstance(e, str) else _shape(e) for e in self.encodings]
    self.job = job
    self.K = len(table.layout.keys)
    self.group = 1  # the widest dispatch pass so far
    # Per block, the distinct opcode rows it uses (none for a block that cannot run).
    self.rows = [np.zeros(0, int) if isinstance(e, str) else np.unique([r[1] for r in e.instrs])
                 for e in self.encodings]
    self.known: dict[bytes, float] = {}  # `_digests` -> steady cycles per 100 iterations
    self.simulated = self.remembered = 0  # blocks run, and blocks answered from `known`

  def keys(self, i: int) -> np.ndarray:
    """The distinct opcode rows block i uses (none for a block that cannot run)."""
    return self.rows[i]

  def __call__(self, table: Table, ids: Sequence[int], iterations: int = 100,
               moved: Sequence[int] | None = None) -> np.ndarray:
    """[len(ids)] steady cycles per 100 iterations; NaN where a block cannot run or
    its run failed (a status code: past its cycle budget). `moved[j]` (>= 0): block
    ids[j] runs with its opcode row moved[j] replaced by that row's variant, which
    `table` then holds (`variants`); otherwise `table` may be of the judge's layout."""
    import jax

    from diffsim.isa.encode import assemble
    from diffsim.sim.api import simulate
    from diffsim.sim.dispatch import group_for

    if len(table.layout.keys) == self.K:
      table = variants(table)
    self.group = max(self.group, group_for(table.params.dispatch_width))
    ids = np.asarray(ids, int)
    out = np.full(len(ids), np.nan)
    digests = self._digests(table, ids, moved, iterations)
    groups: dict[tuple, list[int]] = {}
    for j, i in enumerate(ids.tolist()):
      if (known := self.known.get(digests[j])) is not None:
        out[j] = known
        self.remembered += 1
      elif self.shape[i] is not None:
        groups.setdefault(self.shape[i], []).append(j)
    for (L, D, C), pos in sorted(groups.items()):
      pos = np.array(pos)
      for s in range(0, len(pos), self.job):
        part = pos[s:s + self.job]
        encs = [self.encodings[i] for i in ids[part]]
        if moved is not None:
          encs = [_remapped(e, int(k), self.K + int(k)) if k >= 0 else e
                  for e, k in zip(encs, np.asarray(moved)[part])]
        encs += [encs[0]] * (self.job - len(encs))
        batch = assemble(encs, length=L, max_deps=D, max_uses=C)
        batch = jax.tree.map(lambda x: np.concatenate([x, x]), batch)
        m = len(part)
        its = np.zeros(2 * self.job, np.int32)
        its[:m], its[self.job:self.job + m] = iterations, 2 * iterations
        cyc, codes = simulate(table, batch, iterations=its, group=self.group, throw=False)
        val = 100.0 * (cyc[self.job:self.job + m] - cyc[:m]) / iterations
        out[part] = np.where((codes[:m] | codes[self.job:self.job + m]) != 0, np.nan, val)
        self.known.update(zip((digests[j] for j in part), out[part].tolist()))
        self.simulated += m
    return out

  def _digests(self, table: Table, ids: np.ndarray, moved, iterations: int) -> list[bytes]:
    """Per block, a digest of all that decides its cycles: the iterations, the doubled
    table's global numbers and structure, and the rows it runs (its moved opcode's
    variant row in place of the original)."""
    import hashlib

    n_rows = len(table.layout.keys)
    fields = [np.asarray(getattr(table.params, f.name)) for f in dataclasses.fields(table.params)]
    fields += [np.asarray(x) for x in jax.tree.leaves(table.structure)]
    per_row = [a for a in fields if a.ndim and a.shape[0] == n_rows]
    common = hashlib.blake2b(str(iterations).encode(), digest_size=16)
    for a in fields:
      if not (a.ndim and a.shape[0] == n_rows):
        common.update(np.ascontiguousarray(a).tobytes())
    out = []
    for j, i in enumerate(ids.tolist()):
      rows = self.rows[i]
      if moved is not None and (k := int(moved[j])) >= 0:
        rows = np.where(rows == k, self.K + k, rows)
      h = common.copy()
      h.update(i.to_bytes(8, "little"))
      for a in per_row:
        h.update(np.ascontiguousarray(a[rows]).tobytes())
      out.append(h.digest())
    return out


def _remapped(e, old: int, new: int):
  """An encoding whose instructions of opcode row `old` use row `new` instead."""
  return dataclasses.replace(e, instrs=tuple((c, new if k == old else k, *rest)
                                             for c, k, *rest in e.instrs))


def variants(table: Table) -> Table:
  """`table` with each opcode row doubled: rows K..2K-1 are copies that a search
  changes, so that every opcode's candidate move runs in one simulator call."""
  import jax

  twice = lambda x: np.concatenate([np.asarray(x)] * 2)  # noqa: E731
  params = table.params.replace(**{k: twice(getattr(table.params, k)) for k in _PER_KEY})
  structure = jax.tree.map(twice, table.structure)
  layout = dataclasses.replace(table.layout, keys=table.layout.keys
                               + tuple(f"{k}~moved" for k in table.layout.keys))
  return dataclasses.replace(table, params=params, structure=structure, layout=layout)


def _errors(pred: np.ndarray, y: np.ndarray) -> np.ndarray:
  """Per-block absolute relative error; a block the simulator could not run costs 1."""
  e = np.abs(pred - y) / y
  return np.where(np.isfinite(e), e, 1.0)


@dataclasses.dataclass
class BlockIndex:
  """Which opcode rows each block uses, and which blocks judge each row."""

  keys: list[np.ndarray]  # per block: distinct opcode rows
  judges: dict[int, np.ndarray]  # row -> blocks (a seeded sample of at most `cap`)

  @classmethod
  def build(cls, judge: Judge, cap: int, seed: int = 0,
            always: np.ndarray | None = None) -> "BlockIndex":
    """Each opcode is judged by its blocks when it has at most `cap`; else by `cap` of
    them drawn at random (seeded). Blocks in `always` (micro-benchmarks) judge every
    opcode they use, on top of the sample."""
    keys = [judge.keys(i) for i in range(len(judge.encodings))]
    users: dict[int, list[int]] = {}
    for i, ks in enumerate(keys):
      for k in ks:
        users.setdefault(int(k), []).append(i)
    rng = np.random.default_rng(seed)
    pinned = np.zeros(len(keys), bool) if always is None else np.asarray(always, bool)
    judges = {}
    for k, ids in users.items():
      ids = np.array(ids)
      own, rest = ids[pinned[ids]], ids[~pinned[ids]]
      if len(rest) > cap:
        rest = rng.choice(rest, cap, replace=False)
      judges[k] = np.sort(np.concatenate([own, rest]))
    return cls(keys, judges)


@dataclasses.dataclass
class Refined:
  """What an exact search produced: the table chosen by validation error, and each
  step's record."""

  table: Table
  history: list[dict]
  val_mape: float | None


def _save(state_dir, p: dict, best: dict, done: dict) -> None:
  """Atomically writes the search state: current and best tables, and the record."""
  import json
  import os

  state_dir.mkdir(parents=True, exist_ok=True)
  # (temporary names per process: the processes of a multi-process run write the same)
  tmp = state_dir / f"tables.{os.getpid()}.tmp.npz"
  np.savez(tmp, **{f"p_{k}": v for k, v in p.items()}, **{f"b_{k}": v for k, v in best.items()})
  os.replace(tmp, state_dir / "tables.npz")
  tmp = state_dir / f"state.{os.getpid()}.tmp.json"
  tmp.write_text(json.dumps(done, indent=1))
  os.replace(tmp, state_dir / "state.json")


def _load(state_dir):
  import json

  try:
    done = json.loads((state_dir / "state.json").read_text())
    z = np.load(state_dir / "tables.npz")
  except (FileNotFoundError, ValueError):
    return None
  pick = lambda prefix: {k[2:]: z[k] for k in z.files if k.startswith(prefix)}  # noqa: E731
  return pick("p_"), pick("b_"), done


def _verified(p: dict, candidates: list[int], move: Move, ports, judge: "Judge",
              table: Table, index: BlockIndex, err: np.ndarray, errors: Callable,
              min_gain: float, tries: int = 3) -> list[int]:
  """The candidates to keep: all are applied together, and each must still lower the
  error of its judging blocks by `min_gain` with the others in place; those that do
  not are dropped and the rest checked again (at most `tries` times). Frequent opcodes
  sit in nearly every other opcode's blocks, so moves are judged together rather
  than kept apart."""
  keep = list(candidates)
  for _ in range(tries if keep else 0):
    trial = {k: v.copy() for k, v in p.items()}
    for k in keep:
      apply(trial, k, move, ports)
    ids = np.unique(np.concatenate([index.judges[k] for k in keep]))
    now = np.zeros(len(err))
    now[ids] = errors(judge(_table(table, trial), ids), ids)
    bad = {k for k in keep if (err[index.judges[k]] - now[index.judges[k]]).mean() < min_gain}
    if not bad:
      break
    keep = [k for k in keep if k not in bad]
    if not keep:
      break
  return keep


def _mappings() -> int | None:
  """The process's memory mappings (Linux), which compiled programs hold: a long search
  must keep them flat, as the kernel caps them (vm.max_map_count, 65,530 by default)."""
  try:
    with open("/proc/self/maps", "rb") as f:
      return sum(1 for _ in f)
  except OSError:
    return None


def _out_of_time(table: Table, p: dict, best: dict, done: dict, val_mape, log) -> Refined:
  """The result of a search stopped by its deadline between move kinds: the table it
  has now where that scores better on validation than the best finished round."""
  if val_mape is None:
    best = p
  elif (now := val_mape(p)) < done["best"]["val"]:
    best, done["best"] = p, dict(round=len(done["history"]), val=now, partial=True)
  log(f"exact search: out of time after {done['steps']} steps"
      + (f", validation {100 * done['best']['val']:.2f}%" if val_mape is not None else ""))
  return Refined(_table(table, best), done["history"],
                 done["best"]["val"] if done["best"] else None)


def refine(table: Table, blocks: Sequence, y: np.ndarray, moves: Sequence[Move], *,
           rounds: int = 2, cap: int = 48, min_blocks: int = 3, min_gain: float = 0.002,
           val: tuple[Sequence, np.ndarray] | None = None, state_dir=None,
           frozen: Callable[[int], bool] | None = None, passes: int = 4,
           weights: np.ndarray | None = None, deadline: float | None = None,
           log=print) -> Refined:
  """Coordinate search over per-opcode integers, judged by the exact simulator.

  Each round tries every move on every opcode that enough training blocks use; a move
  stays where it lowers the error of the opcode's judging blocks. After each round
  the table is scored on the validation blocks, and the best round's table is the
  result (the metric is the reported one: steady-state MAPE of the exact simulator).

  Args:
    table: the starting table (integers; its structure and layout are kept).
    blocks: decoded training blocks; y: their measured cycles per 100 iterations.
    moves: the moves tried on every opcode, in order, each round.
    cap: blocks (a seeded sample) that judge one opcode's move.
    min_blocks: opcodes used by fewer training blocks never move (too little evidence).
    min_gain: a move is kept when it lowers the mean relative error of its judging
      blocks by at least this much (0.002 = 0.2 points of MAPE on those blocks).
    val: (blocks, y) for model selection; without it the last round's table is kept.
    state_dir: where the search keeps its state after every move kind; a search
      started again with the same arguments resumes from it.
    frozen: rows that never move.
    passes: how often one move kind is judged again, for the opcodes that gained
      alone but were dropped when judged with the others (`_verified`), and for those
      whose move was kept (one step further).
    deadline: a `time.time()` after which no new move kind starts: the search scores
      the table it has on the validation blocks and stops (a time budget; the state is
      saved, so a later call with a later deadline goes on).
    weights: per training block, how much its error counts (default 1). Blocks
      weighted above 1 (micro-benchmarks of single instructions, the clean evidence)
      also judge every opcode they use, whatever `cap` samples.
  """
  from pathlib import Path

  y = np.asarray(y, np.float64)
  w = np.ones(len(y)) if weights is None else np.asarray(weights, np.float64)

  def errors(pred, ids):  # each block's weighted relative error
    return _errors(pred, y[ids]) * w[ids]

  mape = "weighted MAPE" if np.any(w != 1) else "MAPE"  # what the log's error is

  table = _any_group_needs_one(table)
  ports = port_moves(table) if any(m.field == "port" for m in moves) else {}
  judge = Judge(table, blocks)
  index = BlockIndex.build(judge, cap, always=w > 1)
  p = _numpy(table.params)
  best, done = {k: v.copy() for k, v in p.items()}, dict(steps=0, history=[], best=None)
  state_dir = Path(state_dir) if state_dir else None
  if state_dir and (saved := _load(state_dir)):
    p, best, done = saved
    log(f"exact search: resuming after {done['steps']} steps from {state_dir}")
  val_judge = Judge(table, val[0]) if val is not None else None

  def val_mape(params) -> float:
    ids = np.arange(len(val[0]))
    return float(_errors(val_judge(_table(table, params), ids), np.asarray(val[1])).mean())

  rows = [k for k, ids in index.judges.items() if len(ids) >= min_blocks
          and not (frozen and frozen(k))]
  doubled, K = variants(table), len(table.layout.keys)
  may_load = np.asarray(table.structure.may_load)
  vports = {K + k: (a, b) for k, (a, b) in ports.items()}
  # Only the judging blocks decide anything, so only they are kept up to date.
  judged = np.unique(np.concatenate([index.judges[k] for k in rows]))
  t0 = time.time()
  err = np.zeros(len(blocks))
  err[judged] = errors(judge(_table(table, p), judged), judged)
  if done["best"] is None and val is not None:
    done["best"] = dict(round=-1, val=val_mape(p))
  log(f"exact search: {len(rows)} opcodes judged by {len(judged)} of {len(blocks)} blocks, "
      f"their {mape} {100 * err[judged].mean():.2f}%"
      + (f", validation {100 * done['best']['val']:.2f}%" if val is not None else "")
      + f" ({time.time() - t0:.0f} s)")
  step = 0
  for r in range(rounds):
    for move in moves:
      step += 1
      if step <= done["steps"]:
        continue
      if deadline is not None and time.time() > deadline:
        return _out_of_time(table, p, best, done, val_mape if val is not None else None, log)
      t0 = time.time()
      kept, pending, tried = [], rows, 0
      if move.field in GLOBAL:  # one number for every block: judged on all of them
        pending = []
        while tried < 8:
          q = {name: a.copy() for name, a in p.items()}
          if not apply(q, -1, move):
            break
          tried += 1
          # (The judge runs every width with its widest dispatch pass so far, so a
          # narrower one compiles nothing new.)
          new = errors(judge(_table(table, q), judged), judged)
          if err[judged].mean() - new.mean() < min_gain / 4:
            break
          p, err[judged] = q, new
          kept.append(-1)
      if move.field == "forward":  # loads, where the table has memory dependences
        pending = [k for k in rows if may_load[k] and table.layout.memory_dependences]
      for _ in range(passes):
        # Every pending opcode's move at once, each on its own variant row; those that
        # gain are applied together and kept where they still gain (`_verified`). The
        # ones dropped there are judged again against the table with the kept moves.
        q = {name: np.concatenate([a, a]) if name in _PER_KEY else a for name, a in p.items()}
        moved = [k for k in pending if apply(q, K + k, move, vports)]
        if not moved:
          break
        tried = max(tried, len(moved))
        ids = np.concatenate([index.judges[k] for k in moved])
        which = np.concatenate([np.full(len(index.judges[k]), k) for k in moved])
        gain = err[ids] - errors(judge(_table(doubled, q), ids, moved=which), ids)
        gains = {k: gain[which == k].mean() for k in moved}
        now = _verified(p, [k for k in moved if gains[k] >= min_gain], move, ports, judge,
                        table, index, err, errors, min_gain)
        if not now:
          break
        for k in now:
          apply(p, k, move, ports)
        kept += now
        # Re-judge the judging blocks that a kept move touches.
        touched = judged[np.isin(judged, np.flatnonzero(
            [np.isin(ks, now).any() for ks in index.keys]))]
        err[touched] = errors(judge(_table(table, p), touched), touched)
        # Next pass: the dropped ones again, and the kept ones one step further (a line
        # search: a divide 20 cycles off needs several steps).
        pending = [k for k in moved if gains[k] >= min_gain and k not in now] + now
      rec = dict(round=r, move=str(move), tried=tried, kept=len(kept),
                 train=float(err[judged].mean()), seconds=time.time() - t0,
                 mappings=_mappings(), simulated=judge.simulated,
                 remembered=judge.remembered)
      if move is moves[-1]:
        jax.clear_caches()  # a round compiles many programs; a process holds only so many
      if move is moves[-1] and val is not None:
        rec["val"] = val_mape(p)
        if rec["val"] < done["best"]["val"]:
          done["best"] = dict(round=r, val=rec["val"])
          best = {k: v.copy() for k, v in p.items()}
      elif val is None:
        best = {k: v.copy() for k, v in p.items()}
      done["history"].append(rec)
      done["steps"] = step
      log(f"  round {r} {move}: kept {len(kept)} of {tried}, train {mape} "
          f"{100 * rec['train']:.2f}%" + (f", validation {100 * rec['val']:.2f}%"
                                          if "val" in rec else "")
          + f" ({rec['seconds']:.0f} s)")
      if state_dir:
        _save(state_dir, p, best, done)
  return Refined(_table(table, best), done["history"],
                 done["best"]["val"] if done["best"] else None)
