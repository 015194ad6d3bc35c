"""Result codes: why a block's simulated cycles cannot be trusted.

Inside jit nothing can raise, so every entry point returns an int32 code per block
beside its cycles, as diffrax's `RESULTS` and jax-md's overflow flags do; the host
then raises (`check`, what `throw=True` does) or leaves the block out. Codes are bit
flags, so one block can report several conditions at once.

Only conditions the simulator can detect have a code. In-flight instructions live in
a ring of `window` slots sized from the table's ROB; every instruction holds at least
one ROB entry, so the ring suffices unless the parameters simulated have a larger ROB
than the table the ring was sized for (soft mode with other `params`, a schedule
recorded with an explicit `window`): then the ring would overwrite live slots.
"""

from __future__ import annotations

from typing import Sequence

import jax
import numpy as np

OK = 0
CYCLE_BUDGET = 1  # did not finish within `max_cycles`: its cycle count is meaningless
TRACE_LENGTH = 2  # ran more dynamic instructions than its schedule trace holds, so soft
#                   mode would replay a truncated schedule
WINDOW = 4  # the ROB (rounded) has more entries than the in-flight window has slots

_TEXT = {
    CYCLE_BUDGET: "did not finish within the cycle budget (max_cycles)",
    TRACE_LENGTH: "ran more dynamic instructions than its schedule trace holds",
    WINDOW: "its ROB has more entries than the in-flight window has slots",
}
SHOWN = 5  # failing blocks an error names before it counts the rest


class SimulationError(RuntimeError):
  """Some blocks have a status other than OK (raised when `throw=True`)."""


def message(code: int, block: int | str | None = None) -> str:
  """`code` in words, naming `block` (an index, or a label such as "training row 3")."""
  code = int(code)
  parts = [text for flag, text in _TEXT.items() if code & flag]
  if code & ~sum(_TEXT):
    parts.append(f"unknown status bits {code & ~sum(_TEXT):#x}")
  text = "; ".join(parts) or "ok"
  if block is None:
    return text
  return f"{block if isinstance(block, str) else f'block {block}'}: {text}"


def check(codes, blocks: Sequence | None = None, what: str = "simulation") -> None:
  """Raises SimulationError naming every block whose code is not OK.

  Args:
    codes: int codes of any shape ([B], or [P, B] for a sweep: blocks are then named
      by their (table, block) index).
    blocks: a name per code of a 1-d `codes` (default its index).
    what: the entry point, for the message.

  Under jit, with traced codes, the check runs when the program does
  (`jax.debug.callback`): the error then arrives wrapped in JAX's runtime error.
  """
  if isinstance(codes, jax.core.Tracer):
    jax.debug.callback(lambda c: check(c, blocks, what), codes)
    return
  codes = np.asarray(codes)
  bad = np.argwhere(codes != OK)
  if not len(bad):
    return
  names = [tuple(int(i) for i in at) if codes.ndim > 1 else
           (blocks[at[0]] if blocks is not None else int(at[0])) for at in bad]
  lines = [message(codes[tuple(at)], name) for at, name in zip(bad[:SHOWN], names)]
  if len(bad) > SHOWN:
    lines.append(f"... and {len(bad) - SHOWN} more")
  raise SimulationError(f"{what}: {len(bad)} of {codes.size} blocks failed "
                        f"(throw=False returns the status codes instead):\n  "
                        + "\n  ".join(lines))
