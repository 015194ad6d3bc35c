"""Runs across processes: JAX's own distributed runtime, work dealt by cost, results
gathered in input order.

A process joins a multi-process run with `initialize` (a coordinator address, the
number of processes and its own id: from arguments, from JAX_COORDINATOR_ADDRESS /
JAX_NUM_PROCESSES / JAX_PROCESS_ID, or from a cluster launcher that JAX detects, such
as SLURM or Open MPI). From then on the simulator's entry points (`simulate`,
`simulate_sweep`, `simulate_blocks`) and everything built on them run across all
processes: every process holds the whole input, takes its `deal`t share of the rows
(most expensive first, dealt in turn, as rows are dealt to a process's devices), runs
it on its local devices, and `gather` hands every process all rows in input order.

Without `initialize` there is one process and every function here is the identity:
nothing changes. On CPUs, cross-process collectives go through gloo; the payloads are
small (results and gradients, never blocks' cycle loops), and carried as raw bytes so
that a gathered result is bit-identical to the one computed in a single process.

A process that dies leaves the others waiting in their next collective until JAX's
heartbeat times out (100 s), when they fail too; the long workflows checkpoint what
is done (`simulate_blocks(checkpoint=...)`, the PerfVec label chunks, the search
enumerations, fit epochs), so that rerunning the same command resumes.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence

import jax
import numpy as np

ENV = ("JAX_COORDINATOR_ADDRESS", "JAX_NUM_PROCESSES", "JAX_PROCESS_ID")


def initialize(coordinator: str | None = None, num_processes: int | None = None,
               process_id: int | None = None, *, auto: bool = False) -> bool:
  """Joins a multi-process run through `jax.distributed.initialize`, before any other
  JAX call; a no-op (False) when nothing asks for one.

  Args:
    coordinator: "host:port" of process 0's coordinator (default
      $JAX_COORDINATOR_ADDRESS).
    num_processes: processes in the run (default $JAX_NUM_PROCESSES).
    process_id: this process's id, 0 to num_processes - 1 (default $JAX_PROCESS_ID).
    auto: let JAX detect what is missing from a cluster launcher (SLURM, Open MPI,
      Kubernetes...), even when nothing above is set.

  Returns:
    Whether this process is now part of a distributed run (also when it already was).
  """
  if jax.distributed.is_initialized():
    return True
  coordinator = coordinator or os.environ.get("JAX_COORDINATOR_ADDRESS") or None
  if num_processes is None and os.environ.get("JAX_NUM_PROCESSES"):
    num_processes = int(os.environ["JAX_NUM_PROCESSES"])
  if process_id is None and os.environ.get("JAX_PROCESS_ID"):
    process_id = int(os.environ["JAX_PROCESS_ID"])
  if not auto and coordinator is None and num_processes is None and process_id is None:
    return False
  # XLA:CPU has no cross-process collectives of its own; gloo runs them over TCP.
  jax.config.update("jax_cpu_collectives_implementation", "gloo")
  jax.distributed.initialize(coordinator, num_processes, process_id)
  return True


_alone = False  # within `alone()`
# What this process's collectives moved: each sends its payload to every other process
# (an all-gather), so that every one holds all of them (`benchmarks/scaling.py`).
TRAFFIC = {"collectives": 0, "bytes_sent": 0, "bytes_received": 0}


def _allgather(tree):
  """`process_allgather` of a pytree of numpy arrays, counted in TRAFFIC."""
  from jax.experimental import multihost_utils

  size = sum(np.asarray(x).nbytes for x in jax.tree.leaves(tree))
  TRAFFIC["collectives"] += 1
  TRAFFIC["bytes_sent"] += size
  TRAFFIC["bytes_received"] += size * (count() - 1)
  return multihost_utils.process_allgather(tree)


def count() -> int:
  """Processes in the run (1 without `initialize`, or within `alone`)."""
  return jax.process_count() if jax.distributed.is_initialized() and not _alone else 1


def index() -> int:
  """This process's id (0 without `initialize`, or within `alone`)."""
  return jax.process_index() if jax.distributed.is_initialized() and not _alone else 0


@contextlib.contextmanager
def alone():
  """Within the block, this process runs as if it were the only one: for the part of a
  command that process 0 finishes by itself once the shared work is done (a search
  after its enumerations), where the others have left."""
  global _alone
  before, _alone = _alone, True
  try:
    yield
  finally:
    _alone = before


def primary() -> bool:
  """Whether this process writes the run's outputs (process 0)."""
  return index() == 0


def deal(n: int, parts: int | None = None, cost: np.ndarray | None = None) -> list[np.ndarray]:
  """Each part's rows of n: ordered by cost, most expensive first (default: input
  order), and dealt in turn, so that every part gets the same mix of costs.

  Returns:
    `parts` (default `count()`) int arrays; part p's rows in the order dealt.

  >>> [s.tolist() for s in deal(5, 2, cost=np.array([1., 5., 2., 4., 3.]))]
  [[1, 4, 0], [3, 2]]
  """
  parts = count() if parts is None else parts
  order = np.arange(n) if cost is None else np.argsort(-np.asarray(cost), kind="stable")
  return [order[p::parts] for p in range(parts)]


def gather(tree, shares: Sequence[np.ndarray], n: int):
  """All processes' rows, in input order, on every process.

  Args:
    tree: a pytree of numpy arrays [S_p, ...]: this process's rows, in the order of
      its share (shares[index()]).
    shares: every process's rows (`deal`), the same on every process.
    n: rows in all.

  Returns:
    The pytree with [n, ...] leaves, row r from the process whose share holds r.
  """
  me = index()
  if len(shares) == 1:
    return jax.tree.map(lambda x: _scatter([np.asarray(x)], shares, n), tree)
  S = max(1, max(len(s) for s in shares))
  leaves, treedef = jax.tree.flatten(tree)
  leaves = [np.asarray(x) for x in leaves]
  # Bytes, padded to the longest share: every process sends the same shape, and
  # float64 or int64 rows cross unchanged (JAX would narrow them without x64).
  raw = [_as_bytes(x, S) for x in leaves]
  got = _allgather(raw)  # [count, S, bytes] per leaf
  out = []
  for x, g in zip(leaves, got):
    g = np.asarray(g)
    rows = [_from_bytes(g[p, :len(s)], x) for p, s in enumerate(shares)]
    assert rows[me].shape == x.shape
    out.append(_scatter(rows, shares, n))
  return jax.tree.unflatten(treedef, out)


def _as_bytes(x: np.ndarray, rows: int) -> np.ndarray:
  b = np.ascontiguousarray(x).reshape(len(x), -1).view(np.uint8).reshape(len(x), -1)
  return np.concatenate([b, np.zeros((rows - len(x), b.shape[1]), np.uint8)])


def _from_bytes(b: np.ndarray, like: np.ndarray) -> np.ndarray:
  return np.ascontiguousarray(b).view(like.dtype).reshape((len(b),) + like.shape[1:])


def _scatter(rows: list[np.ndarray], shares: Sequence[np.ndarray], n: int) -> np.ndarray:
  out = np.empty((n,) + rows[0].shape[1:], rows[0].dtype)
  for r, s in zip(rows, shares):
    out[s] = r
  return out


def total(tree):
  """The sum over processes of a pytree of arrays, the same on every process (summed
  in process order, so that every process holds identical bits)."""
  if count() == 1:
    return tree
  leaves, treedef = jax.tree.flatten(tree)
  leaves = [np.asarray(x) for x in leaves]
  full = [i for i, x in enumerate(leaves) if x.size]  # an empty leaf has no sum to take
  got = _allgather([leaves[i] for i in full])
  for i, g in zip(full, got):
    leaves[i] = np.sum(np.asarray(g), axis=0, dtype=leaves[i].dtype)
  return jax.tree.unflatten(treedef, leaves)


def agree(flag: bool) -> bool:
  """True on every process when `flag` is true on every process (a collective
  decision, where processes could see different files)."""
  if count() == 1:
    return bool(flag)
  return bool(np.all(_allgather(np.int32(bool(flag)))))


def same(digest: bytes) -> bool:
  """True on every process when every process passed the same bytes (of one length)."""
  if count() == 1:
    return True
  got = np.asarray(_allgather(np.frombuffer(digest, np.uint8)))
  return bool((got == got[:1]).all())
