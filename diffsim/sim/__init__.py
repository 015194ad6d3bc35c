"""The pure-functional pipeline simulator (llvm-mca's model class).

`encode` turns decoded blocks into a batch for a table; `simulate` runs encoded
batches exactly (hard mode); `simulate_soft` gives the same runs' throughputs
differentiably (soft mode); `simulate_blocks` takes decoded blocks and returns
per-block predictions or errors (`simulate_chunks`: blocks that arrive in chunks,
simulated as they come); `simulate_sweep` crosses a batch of parameter tables with a
batch of blocks. All take `(table, batch_or_blocks, *, iterations=..., ...)` and
report a status code per block (`diffsim.sim.status`).
"""

from diffsim.sim import status as status
from diffsim.sim.api import Cycles as Cycles
from diffsim.sim.api import SoftCycles as SoftCycles
from diffsim.sim.api import encode as encode
from diffsim.sim.api import simulate as simulate
from diffsim.sim.api import simulate_soft as simulate_soft
from diffsim.sim.api import simulate_sweep as simulate_sweep
from diffsim.sim.blocks import Prediction as Prediction
from diffsim.sim.blocks import simulate_blocks as simulate_blocks
from diffsim.sim.blocks import simulate_chunks as simulate_chunks
from diffsim.sim.status import SimulationError as SimulationError

__all__ = ["Cycles", "Prediction", "SimulationError", "SoftCycles", "encode", "simulate",
           "simulate_blocks", "simulate_chunks", "simulate_soft", "simulate_sweep", "status"]
