"""The bridge's error for a whole request; the tools run through `diffsim.llvmtools`."""

from __future__ import annotations

from diffsim.llvmtools import LlvmError
from diffsim.llvmtools import run_tool as run_tool  # the one runner of LLVM processes


class McaError(LlvmError):
  """llvm-mca or llvm-mc failed in a way that concerns the whole request.

  Errors that concern single blocks never raise: they come back as error rows.
  """
