"""Measuring basic-block throughputs on the CPU at hand (`diffsim measure`).

A native runner (`runner.c`, built at first use with the system C compiler by `build`)
times blocks with the TSC in forked children; `runner` speaks its protocol and turns
ticks into core cycles with an interleaved calibration chain (`stats` holds the robust
estimates); `screen` rejects what cannot be timed; `harness` measures many blocks in
sweeps of passes, logging finished ones (`resume`) so that a run resumes; `cpu` names
the CPU the numbers belong to; `validate` checks the method on blocks with known
answers. The output is a BHive-format CSV that `diffsim fit` learns a table from; each
row carries a confidence, which `confidence_weights` turns into fit weights, so that
rows measured on a busy core weigh less:

>>> from diffsim.data import load_csv                       # doctest: +SKIP
>>> ds = load_csv("out.csv")                                # doctest: +SKIP
>>> w = confidence_weights(ds)   # [len(ds)] in [0, 1]      # doctest: +SKIP

"""

from diffsim.measure.build import MeasureError as MeasureError
from diffsim.measure.build import runner_path as runner_path
from diffsim.measure.config import MeasureConfig as MeasureConfig
from diffsim.measure.cpu import cpu_identity as cpu_identity
from diffsim.measure.cpu import describe_cpu as describe_cpu
from diffsim.measure.harness import BlockResult as BlockResult
from diffsim.measure.harness import RunStats as RunStats
from diffsim.measure.harness import measure_hexes as measure_hexes
from diffsim.measure.validate import CHECKS as CHECKS
from diffsim.measure.validate import run_checks as run_checks
from diffsim.data.weights import confidence_weights as confidence_weights

__all__ = [
  "CHECKS",
  "BlockResult",
  "MeasureConfig",
  "MeasureError",
  "RunStats",
  "confidence_weights",
  "cpu_identity",
  "describe_cpu",
  "measure_hexes",
  "run_checks",
  "runner_path",
]
