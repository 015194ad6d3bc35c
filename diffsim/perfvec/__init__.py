"""PerfVec in JAX: program and microarchitecture representations whose product
predicts a block's throughput, trained on the simulator's sweeps.

`build_data` labels blocks x parameter tables with `simulate_sweep`; `train` fits the
flax model; `evaluate`, `load`, `save` and `Trained` use it; `fit_uarch` fits only a
new CPU's vector with the program encoder frozen (the foundation-model use).
"""

from diffsim.perfvec.evaluate import Trained as Trained
from diffsim.perfvec.evaluate import evaluate as evaluate
from diffsim.perfvec.evaluate import fit_uarch as fit_uarch
from diffsim.perfvec.evaluate import load as load
from diffsim.perfvec.evaluate import save as save
from diffsim.perfvec.train import Experiment as Experiment
from diffsim.perfvec.train import build_data as build_data
from diffsim.perfvec.train import train as train

__all__ = ["Experiment", "Trained", "build_data", "evaluate", "fit_uarch", "load", "save",
           "train"]
