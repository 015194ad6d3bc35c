"""Hardware-prior search (Glimpse's job) over x86-64 kernel code-generation knobs.

- `space`: the tasks (GEMM micro-kernel, dot reduction, AXPY stream) and their knobs.
- `codegen`: a configuration to AT&T assembly and to the decoder's Block.
- `evaluate`: cost = simulated steady cycles per flop; exhaustive enumeration.
- `blueprint`: a CPU's specification embedded from its parameter table.
- `roofline`: the table read against each configuration, without simulating.
- `glimpse`: blueprint and roofline priors, meta-trained neural acquisition, validity
  ensemble; the meta-trained models ship in `pretrained/`.
- `baselines`: random search, AutoTVM-style (gradient boosting + annealing), plain BO.
- `measured`: costs timed on the CPU at hand instead (`diffsim.measure`'s harness),
  exhaustive measured runs, and the shipped table closest to that CPU.
- `diffsim search TASK --target CPU --budget N` (`diffsim.cli.search`) runs them.
"""

# The methods `diffsim search --method` takes (defined here, where the CLI parser can
# read them without importing the models).
ALL_METHODS = ("glimpse", "random", "autotvm", "bo")
