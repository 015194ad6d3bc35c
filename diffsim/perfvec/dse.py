"""Design-space exploration at the speed of a matrix product.

A candidate microarchitecture is a parameter table; PerfVec's table encoder turns each
into a vector once, the program encoder turns each block into a vector once, and the
predicted cycles of every (block, table) pair are one [N, dim] x [dim, M] product (and
a softplus). `rank_tables` orders M candidates by their mean predicted cycles over N
blocks (or any weighting of them: a profile's hot blocks); `candidates` draws M tables
around a shipped one (`diffsim.params.sample`). The simulator can then check the few
best (`benchmarks/perfvec_dse.py` measures the speed ratio and the rank agreement).
"""

from __future__ import annotations

import dataclasses
from typing import Sequence

import numpy as np

from diffsim.params.sample import sample_params, table_at
from diffsim.params.table import Params, Table, load_table
from diffsim.perfvec.learn import uarch_vectors
from diffsim.perfvec.model import predict
from diffsim.perfvec.reuse import Trained
from diffsim.perfvec.uarch import uarch_features


@dataclasses.dataclass
class Candidates:
  """M tables of one layout: a base table and its parameter sets stacked [M, ...]."""

  table: Table
  params: Params
  names: list[str]  # [M]

  def __len__(self) -> int:
    return len(self.names)

  def at(self, i: int) -> Table:
    """The i-th candidate as a table of its own (to simulate, or to export)."""
    return table_at(self.table, self.params, i)


def candidates(base: str, n: int, *, seed: int = 1, scale: float = 1.0) -> Candidates:
  """`n` tables sampled around the shipped table (or JSON file) `base`, named as
  `perfvec.data.Uarch` names them (`zen5~1.17`: base, seed, index)."""
  table = load_table(base)
  return Candidates(table, sample_params(table, n, seed, scale),
                    [f"{base}~{seed}.{i}" for i in range(n)])


def encode_tables(trained: Trained, cands: Candidates, chunk: int = 256) -> np.ndarray:
  """[M, dim] uarch vectors of the candidates (the table encoder, `chunk` at a time)."""
  import jax

  out = []
  for s in range(0, len(cands), chunk):
    sub = jax.tree.map(lambda x, s=s: np.asarray(x)[s:s + chunk], cands.params)
    per, glob = uarch_features(cands.table, sub)
    out.append(uarch_vectors(trained.variables, trained.cfg, per, glob))
  return np.concatenate(out)


def predict_pairs(programs: np.ndarray, uarchs: np.ndarray) -> np.ndarray:
  """[N, M] cycles per 100 iterations of N program vectors on M uarch vectors: one
  matrix product.

  >>> predict_pairs(np.zeros((2, 4)), np.zeros((3, 4))).shape
  (2, 3)
  """
  return np.asarray(predict(np.asarray(programs, np.float32),
                            np.asarray(uarchs, np.float32))) * 100.0


def rank_tables(programs: np.ndarray, uarchs: np.ndarray,
                weights: Sequence[float] | None = None) -> tuple[np.ndarray, np.ndarray]:
  """Candidates from fastest to slowest on the blocks.

  Args:
    programs: [N, dim] program vectors (`Trained.embed`).
    uarchs: [M, dim] uarch vectors (`encode_tables`).
    weights: [N] how much each block counts (its share of run time, say); default 1.

  Returns:
    (order [M] int: candidate indices, best first; score [M]: each candidate's weighted
    mean predicted cycles per 100 iterations).
  """
  pred = predict_pairs(programs, uarchs)
  w = np.ones(len(pred)) if weights is None else np.asarray(weights, np.float64)
  score = (w[:, None] * pred).sum(0) / w.sum()
  return np.argsort(score, kind="stable"), score
