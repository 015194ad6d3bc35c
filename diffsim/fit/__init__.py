"""Parameter learning: fit a CPU table to measured throughputs through the simulator."""

from diffsim.fit.learn import FitConfig as FitConfig
from diffsim.fit.learn import FitResult as FitResult
from diffsim.fit.learn import fit as fit

__all__ = ["FitConfig", "FitResult", "fit"]
