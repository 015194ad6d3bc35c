"""Measuring basic-block throughputs on the CPU at hand (`diffsim measure`).

A native runner (`runner.c`, built at first use with the system C compiler) times
blocks with the TSC in forked children; `harness` turns ticks into core cycles per 100
iterations with an interleaved calibration chain, rejects what cannot be timed, and
logs finished blocks so that a run resumes; `validate` checks the method on blocks with
known answers. The output is a BHive-format CSV that `diffsim fit` learns a table from.
"""

from diffsim.measure.build import MeasureError as MeasureError
from diffsim.measure.build import runner_path as runner_path
from diffsim.measure.harness import BlockResult as BlockResult
from diffsim.measure.harness import MeasureConfig as MeasureConfig
from diffsim.measure.harness import RunStats as RunStats
from diffsim.measure.harness import cpu_identity as cpu_identity
from diffsim.measure.harness import describe_cpu as describe_cpu
from diffsim.measure.harness import measure_hexes as measure_hexes
from diffsim.measure.validate import CHECKS as CHECKS
from diffsim.measure.validate import run_checks as run_checks

__all__ = [
  "CHECKS",
  "BlockResult",
  "MeasureConfig",
  "MeasureError",
  "RunStats",
  "cpu_identity",
  "describe_cpu",
  "measure_hexes",
  "run_checks",
  "runner_path",
]
