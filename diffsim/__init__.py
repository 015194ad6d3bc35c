"""diffsim: llvm-mca's x86-64 basic-block pipeline model as pure JAX functions.

The curated public surface. Names load lazily on first use, so `import diffsim` (and
the `diffsim` command's start-up, `--help` included) does not pay for importing JAX
until a simulator name is touched. The subpackages hold the rest:

- `diffsim.isa`: decoding hex or assembly into the Block IR, and encoding to arrays.
- `diffsim.mca`: the bridge to the real llvm-mca 14 (the reference simulator).
- `diffsim.data`: BHive-format files, splits, metrics and the shipped datasets.
- `diffsim.params`: CPU parameter tables (shipped, from JSON, or built from llvm-mca).
- `diffsim.sim`: the simulator itself.
- `diffsim.fit`, `diffsim.perfvec`, `diffsim.search`: the three workflows.
- `diffsim.measure`: throughputs measured on this CPU; `diffsim.calibrate`: a table
  for it (`diffsim.calibrate.calibrate(out)`).

>>> import diffsim
>>> "simulate_blocks" in diffsim.__all__
True
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from diffsim.lazy import exports

__version__ = "0.1.0"

# Public name -> the module that defines it. One table, so that `__all__`, `dir()` and
# lazy loading cannot drift apart.
_EXPORTS = {
  # Decoding and the Block IR.
  "Block": "diffsim.isa",
  "DecodeError": "diffsim.isa",
  "Instr": "diffsim.isa",
  "decode_block": "diffsim.isa",
  "decode_blocks": "diffsim.isa",
  "parse_asm": "diffsim.isa",
  "block_to_json": "diffsim.isa",
  # The llvm-mca bridge.
  "run_mca": "diffsim.mca",
  "mca_cpus": "diffsim.mca",
  "steady": "diffsim.mca",
  # Data and metrics.
  "load_csv": "diffsim.data",
  "load_rows": "diffsim.data",
  "shipped": "diffsim.data",
  "split": "diffsim.data",
  "summary": "diffsim.data",
  # Parameter tables.
  "load_table": "diffsim.params.table",
  "available_tables": "diffsim.params.table",
  # The simulator.
  "Cycles": "diffsim.sim",
  "Prediction": "diffsim.sim",
  "SimulationError": "diffsim.sim",
  "SoftCycles": "diffsim.sim",
  "encode": "diffsim.sim",
  "simulate": "diffsim.sim",
  "simulate_blocks": "diffsim.sim",
  "simulate_soft": "diffsim.sim",
  "simulate_sweep": "diffsim.sim",
  # Learning tables from measurements.
  "fit": "diffsim.fit",
  "FitConfig": "diffsim.fit",
}
_SUBPACKAGES = ("isa", "mca", "data", "params", "sim", "fit", "perfvec", "search", "measure",
                "calibrate")

__all__ = [
  "Block",
  "Cycles",
  "DecodeError",
  "FitConfig",
  "Instr",
  "Prediction",
  "SimulationError",
  "SoftCycles",
  "__version__",
  "available_tables",
  "block_to_json",
  "decode_block",
  "decode_blocks",
  "encode",
  "fit",
  "load_csv",
  "load_rows",
  "load_table",
  "mca_cpus",
  "parse_asm",
  "run_mca",
  "shipped",
  "simulate",
  "simulate_blocks",
  "simulate_soft",
  "simulate_sweep",
  "split",
  "steady",
  "summary",
]

if TYPE_CHECKING:  # static analysers see plain re-exports
  from diffsim.data import load_csv as load_csv
  from diffsim.data import load_rows as load_rows
  from diffsim.data import shipped as shipped
  from diffsim.data import split as split
  from diffsim.data import summary as summary
  from diffsim.isa import Block as Block
  from diffsim.isa import DecodeError as DecodeError
  from diffsim.isa import Instr as Instr
  from diffsim.isa import block_to_json as block_to_json
  from diffsim.isa import decode_block as decode_block
  from diffsim.isa import decode_blocks as decode_blocks
  from diffsim.isa import parse_asm as parse_asm
  from diffsim.mca import mca_cpus as mca_cpus
  from diffsim.mca import run_mca as run_mca
  from diffsim.mca import steady as steady
  from diffsim.params.table import available_tables as available_tables
  from diffsim.params.table import load_table as load_table
  from diffsim.sim import Cycles as Cycles
  from diffsim.sim import Prediction as Prediction
  from diffsim.sim import SimulationError as SimulationError
  from diffsim.sim import SoftCycles as SoftCycles
  from diffsim.sim import encode as encode
  from diffsim.sim import simulate as simulate
  from diffsim.sim import simulate_blocks as simulate_blocks
  from diffsim.sim import simulate_soft as simulate_soft
  from diffsim.sim import simulate_sweep as simulate_sweep
  from diffsim.fit import FitConfig as FitConfig
  from diffsim.fit import fit as fit


__getattr__, __dir__ = exports(__name__, _EXPORTS, _SUBPACKAGES)
