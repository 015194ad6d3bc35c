"""Running the LLVM 14 command-line tools (llvm-mca, llvm-mc) on text.

The tools are found by `diffsim.llvmtools`; this module runs them with input on stdin
and names the error that concerns a whole request.
"""

from __future__ import annotations

import subprocess
from typing import Sequence

from diffsim.llvmtools import find_llvm_tool


class McaError(RuntimeError):
  """llvm-mca or llvm-mc failed in a way that concerns the whole request.

  Errors that concern single blocks never raise: they come back as error rows.
  """


def run_tool(
  name: str, args: Sequence[str], stdin: str, *, timeout: float | None = None
) -> subprocess.CompletedProcess:
  """Runs an LLVM tool with text on stdin and returns the finished process.

  Input goes through stdin (llvm-mca's default input `-`), so diagnostics name lines as
  `<stdin>:LINE:COL`, and no temporary files are left behind by killed workers.
  """
  return subprocess.run(
    [find_llvm_tool(name), *args],
    input=stdin,
    capture_output=True,
    text=True,
    timeout=timeout,
    check=False,
  )
