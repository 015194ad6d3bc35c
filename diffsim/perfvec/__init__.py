"""PerfVec in JAX: program and microarchitecture representations whose product
predicts a block's throughput, trained on the simulator's sweeps.

`build_data` labels blocks x parameter tables with `simulate_sweep`; `train` fits the
flax model; `evaluate`, `load`, `save` and `Trained` use it; `fit_uarch` fits only a
new CPU's vector with the program encoder frozen (the foundation-model use), from
measurements, and `Trained.adapt` does the same for a parameter table from simulated
probe blocks. `load()` with no argument returns the pretrained model that ships in the
package. `adapt` fits a measured CPU's vector (and optionally the last program layer)
with its cross-validated error; `candidates`, `encode_tables` and `rank_tables` rank
candidate tables by one matrix product (design-space exploration). Names load
on first use, so that `diffsim --help` does not import JAX for this subcommand.
"""

from __future__ import annotations

from diffsim.lazy import exports

_EXPORTS = {
  "Adapted": "diffsim.perfvec.adapt",
  "adapt": "diffsim.perfvec.adapt",
  "candidates": "diffsim.perfvec.dse",
  "encode_tables": "diffsim.perfvec.dse",
  "rank_tables": "diffsim.perfvec.dse",
  "Experiment": "diffsim.perfvec.learn",
  "build_data": "diffsim.perfvec.learn",
  "train": "diffsim.perfvec.learn",
  "Trained": "diffsim.perfvec.reuse",
  "evaluate": "diffsim.perfvec.reuse",
  "fit_uarch": "diffsim.perfvec.reuse",
  "load": "diffsim.perfvec.reuse",
  "save": "diffsim.perfvec.reuse",
}
__all__ = sorted(_EXPORTS)


__getattr__, __dir__ = exports(__name__, _EXPORTS)
