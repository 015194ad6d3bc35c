"""Calibrate: a table for the CPU at hand, learned from what is measured on it.

`calibrate(out)` (the `diffsim calibrate` command) probes the core's structure with
throughput micro-benchmarks (`probes`), measures every opcode key alone and chained
(anchors) and a sample of real basic blocks shipped with the package, starts from the
candidate table that fits them best with the probed structure applied, and runs the
exact search (`diffsim.fit.recipe`) in the time left. Every stage is resumable
(`stages`); the report (`report`) scores the table on measured blocks it never fitted.

>>> from diffsim.calibrate import CalibrateConfig
>>> CalibrateConfig(minutes=10).rounds
3
"""

from diffsim.calibrate.run import calibrate as calibrate
from diffsim.calibrate.stages import CalibrateConfig as CalibrateConfig
from diffsim.calibrate.stages import CalibrateError as CalibrateError

__all__ = ["CalibrateConfig", "CalibrateError", "calibrate"]
