"""Per-instruction event cycles of one block, from llvm-mca 14's JSON timeline.

This is the cycle-by-cycle oracle for the simulator's hard mode: for every dynamic
instruction (iteration i, instruction k) llvm-mca reports when it was dispatched,
became ready, issued, finished executing and retired. It runs one block in one
process with `-timeline -timeline-max-iterations=N -timeline-max-cycles=0`, so no
event is cut off; it simplifies nothing else.
"""

from __future__ import annotations

import dataclasses
import json

import numpy as np

from diffsim.mca.bridge import _QUIET, _TRIPLE, _strip
from diffsim.mca.tools import McaError, run_tool

# llvm-mca 14's JSON keys, in pipeline order, and the field names used here.
_EVENTS = (
  ("dispatched", "CycleDispatched"),
  ("ready", "CycleReady"),
  ("issued", "CycleIssued"),
  ("executed", "CycleExecuted"),
  ("retired", "CycleRetired"),
)


@dataclasses.dataclass(frozen=True, eq=False)
class Timeline:
  """llvm-mca's events for every dynamic instruction of one block.

  Attributes:
    instructions: the block's instructions as llvm-mca printed them (B of them).
    iterations: N, the number of iterations simulated (and shown).
    total_cycles: `SummaryView.TotalCycles` (the last retire cycle + 1).
    dispatched: [N, B] int64: cycle of dispatch (`D`).
    ready: [N, B] int64: cycle at which all register operands were ready.
    issued: [N, B] int64: cycle of issue (first `e`).
    executed: [N, B] int64: cycle at which execution completed (`E`).
    retired: [N, B] int64: cycle of retirement (`R`).
  """

  instructions: tuple[str, ...]
  iterations: int
  total_cycles: int
  dispatched: np.ndarray
  ready: np.ndarray
  issued: np.ndarray
  executed: np.ndarray
  retired: np.ndarray


def timeline(
  text: str, mcpu: str, iterations: int = 10, *, extra_args=()
) -> Timeline:
  """Runs one block through llvm-mca and returns its full timeline.

  Args:
    text: the block's AT&T assembly, one instruction per line (`.rept` is fine).
    mcpu: llvm-mca's `-mcpu`.
    iterations: N; every iteration is recorded, so keep it modest (cost is O(N·B)).
    extra_args: more llvm-mca options, e.g. `["-noalias=false"]`.

  Returns:
    A `Timeline` with [N, B] event arrays.

  Raises:
    McaError: llvm-mca reported an error or printed no usable timeline.

  >>> timeline("addl %ecx, %eax\\nimull %eax, %eax", "haswell", 1).retired  # doctest: +SKIP
  array([[3, 6]])
  """
  if iterations < 1:
    raise ValueError(f"iterations must be >= 1, got {iterations}")
  lines = _strip(text)
  if not lines:
    raise McaError("empty block: no instructions to simulate")
  args = (
    _TRIPLE, f"-mcpu={mcpu}", "-json", *_QUIET, f"-iterations={iterations}",
    "-timeline", f"-timeline-max-iterations={iterations}", "-timeline-max-cycles=0",
    *(str(a) for a in extra_args),
  )
  proc = run_tool("llvm-mca", args, "\n".join(lines) + "\n")
  errors = [ln for ln in proc.stderr.splitlines() if "error:" in ln]
  if proc.returncode != 0 or errors:
    msg = "; ".join(errors) or " ".join(proc.stderr.split()) or "no message"
    raise McaError(f"llvm-mca -mcpu={mcpu} failed on the block: {msg}")
  try:
    region = json.loads(proc.stdout)["CodeRegions"][0]
    info = region["TimelineView"]["TimelineInfo"]
    instructions = tuple(region["Instructions"])
    total = int(region["SummaryView"]["TotalCycles"])
  except (ValueError, KeyError, IndexError, TypeError) as e:
    raise McaError(f"llvm-mca printed no usable timeline: {e!r}") from None
  b = len(instructions)
  if len(info) != iterations * b:
    raise McaError(
      f"llvm-mca's timeline has {len(info)} entries, expected {iterations} x {b}"
    )
  # TimelineInfo lists dynamic instructions in program order: iteration-major.
  arrays = {
    field: np.array([e[key] for e in info], dtype=np.int64).reshape(iterations, b)
    for field, key in _EVENTS
  }
  return Timeline(instructions, iterations, total, **arrays)
