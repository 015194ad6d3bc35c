"""The pure-functional pipeline simulator (llvm-mca's model class).

`simulate` runs encoded batches exactly (hard mode); `simulate_soft` gives the same
runs' throughputs differentiably (soft mode); `simulate_blocks` takes decoded blocks
and returns per-block predictions or errors (`simulate_chunks`: blocks that arrive in
chunks, simulated as they come); `simulate_sweep` crosses a batch of parameter tables
with a batch of blocks.
"""

from diffsim.sim.api import Prediction as Prediction
from diffsim.sim.api import simulate as simulate
from diffsim.sim.api import simulate_blocks as simulate_blocks
from diffsim.sim.api import simulate_chunks as simulate_chunks
from diffsim.sim.api import simulate_soft as simulate_soft
from diffsim.sim.api import simulate_sweep as simulate_sweep

__all__ = ["Prediction", "simulate", "simulate_blocks", "simulate_chunks", "simulate_soft",
           "simulate_sweep"]
