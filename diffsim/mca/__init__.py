"""The bridge to the real llvm-mca 14: batch runs, timelines, CPU models, disassembly.

Impure code at the edge of diffsim: everything here runs LLVM 14's command-line tools
in subprocesses. Nothing here is differentiable; it produces reference numbers that the
JAX simulator is checked and fitted against.
"""

from diffsim.mca.bridge import McaResult as McaResult
from diffsim.mca.bridge import per_100 as per_100
from diffsim.mca.bridge import run_mca as run_mca
from diffsim.mca.bridge import steady as steady
from diffsim.mca.cpus import mca_cpu_groups as mca_cpu_groups
from diffsim.mca.cpus import mca_cpus as mca_cpus
from diffsim.mca.disasm import Disassembly as Disassembly
from diffsim.mca.disasm import disassemble as disassemble
from diffsim.mca.timeline import Timeline as Timeline
from diffsim.mca.timeline import timeline as timeline
from diffsim.mca.tools import McaError as McaError

__all__ = [
  "Disassembly",
  "McaError",
  "McaResult",
  "Timeline",
  "disassemble",
  "mca_cpu_groups",
  "mca_cpus",
  "per_100",
  "run_mca",
  "steady",
  "timeline",
]
