"""Block hex to AT&T text with llvm-mc 14, the way the shared llvm-mca labels were made.

The reference labels in `../shared/data/mca` (and in the shipped `mca-small.csv`) come
from llvm-mc's disassembly of each block with a `ud2` between blocks. Comparing against
them, or labelling new blocks the same way, needs exactly that text, which is why this
lives beside the llvm-mca bridge rather than in `diffsim.isa` (the project's own
decoder, which does not depend on LLVM).

What it simplifies: the text is llvm-mc's, with comments dropped; prefixes such as
`lock` stay on their own line, as llvm-mc prints them (llvm-mca accepts that).

Checks. Each block goes to llvm-mc as one bracketed group, `[0x.. 0x..] [0x0f 0x0b]`,
one block per input line. llvm-mc decodes a bracketed group on its own, so a block whose
last instruction is cut off cannot swallow the `ud2` or the next block (as it can in a
plain byte stream, where even a trailing prefix byte silently merges into the `ud2`);
instead llvm-mc warns `<stdin>:LINE:COL: invalid instruction encoding`, and the line
names the block, which gets an error row. A batch is accepted when its output splits
into exactly one piece per block; blocks that contain the bytes `0f 0b` themselves run
alone, where only the final `ud2` counts as the separator. Anything else makes the batch
split in halves, down to single blocks.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import math
import os
import re
from typing import Sequence

from diffsim.mca.tools import run_tool

_SEP = "0f0b"  # ud2
_HEX = re.compile(r"^(?:[0-9a-f]{2})+$")


@dataclasses.dataclass(frozen=True)
class Disassembly:
  """llvm-mc's text of one block, or why there is none.

  Attributes:
    text: newline-separated AT&T instructions, or None.
    error: the reason `text` is None, else None.
  """

  text: str | None
  error: str | None


def _to_input(hexes: Sequence[str]) -> str:
  """llvm-mc's input: per line, one block as a bracketed group, then ud2 as another."""
  return "".join(
    "[" + " ".join("0x" + h[i:i + 2] for i in range(0, len(h), 2)) + "] [0x0f 0x0b]\n"
    for h in hexes
  )


def _segments(stdout: str) -> list[list[str]]:
  """The printed instructions, cut at every ud2 (the piece after the last one kept)."""
  segs: list[list[str]] = [[]]
  for raw in stdout.splitlines():
    line = raw.split("#", 1)[0].strip()
    if not line or line.startswith("."):
      continue
    if line == "ud2":
      segs.append([])
    else:
      # llvm-mc separates mnemonic and operands with tabs; llvm-mca does not care.
      segs[-1].append(line)
  return segs


def _run(hexes: Sequence[str]) -> list[Disassembly]:
  """Disassembles a batch, splitting it when the output cannot be trusted."""
  proc = run_tool("llvm-mc", ["--disassemble", "-triple=x86_64"], _to_input(hexes))
  segs = _segments(proc.stdout)
  # Diagnostics name input lines, and input line k holds block k.
  blamed: dict[int, str] = {}
  other = []
  for line in proc.stderr.splitlines():
    m = re.match(r"^<stdin>:(\d+):(\d+): (?:error|warning): (.*)$", line)
    if m and 0 < int(m.group(1)) <= len(hexes):
      k, col = int(m.group(1)) - 1, int(m.group(2))
      # Column c of "[0x.. 0x.." falls on byte (c - 2) // 5.
      blamed.setdefault(k, f"llvm-mc: {m.group(3)} at byte {(col - 2) // 5}")
    elif line.startswith(("error:", "warning:")) or ": error:" in line:
      other.append(line)
  # llvm-mc exits 1 after any warning; that is fine when every warning names a block.
  if not other and (proc.returncode == 0 or blamed):
    if len(hexes) == 1 and len(segs) >= 2 and not segs[-1]:
      # A lone block may hold ud2 itself: only the last ud2 is the separator.
      lines = list(segs[0])
      for seg in segs[1:-1]:
        lines += ["ud2", *seg]
      pieces = ["\n".join(lines)]
    elif len(segs) == len(hexes) + 1 and not segs[-1]:
      pieces = ["\n".join(s) for s in segs[:-1]]
    else:
      pieces = None
    if pieces is not None:
      return [
        Disassembly(None, blamed[k]) if k in blamed
        else Disassembly(p, None) if p else Disassembly(None, "llvm-mc printed no instructions")
        for k, p in enumerate(pieces)
      ]
  if len(hexes) > 1:
    half = len(hexes) // 2
    return _run(hexes[:half]) + _run(hexes[half:])
  diag = " ".join(proc.stderr.split())
  return [Disassembly(None, f"llvm-mc failed: {diag[:300] or 'unexpected output'}")]


def disassemble(
  hexes: Sequence[str], *, chunk: int = 5000, jobs: int | None = None
) -> list[Disassembly]:
  """Disassembles blocks given as hex with llvm-mc 14, one result per block.

  Args:
    hexes: each block's machine code as hex (case and surrounding space ignored).
    chunk: the most blocks per llvm-mc process.
    jobs: llvm-mc processes at once; default `os.cpu_count()`.

  Returns:
    A `Disassembly` per block, in order; bad hex gives an error row.

  >>> disassemble(["01c8"])[0].text  # doctest: +SKIP
  'addl\\t%ecx, %eax'
  """
  out: list[Disassembly | None] = [None] * len(hexes)
  batch: list[int] = []
  alone: list[int] = []
  for i, h in enumerate(hexes):
    h = h.strip().lower()
    if not _HEX.match(h):
      out[i] = Disassembly(None, f"not an even-length hex string: {h[:40]!r}")
    elif any(h[k:k + 4] == _SEP for k in range(0, len(h) - 2, 2)):
      alone.append(i)
    else:
      batch.append(i)
  jobs = max(1, jobs if jobs is not None else (os.cpu_count() or 1))
  size = max(1, min(chunk, math.ceil(len(batch) / jobs))) if batch else 1
  groups = [batch[k:k + size] for k in range(0, len(batch), size)] + [[i] for i in alone]
  norm = [h.strip().lower() for h in hexes]
  with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
    parts = pool.map(lambda g: (g, _run([norm[i] for i in g])), groups)
    for g, res in parts:
      for i, r in zip(g, res):
        out[i] = r
  return out  # type: ignore[return-value]
