"""Shared fixtures for the llvm-mca bridge tests: real blocks and direct llvm-mca runs.

Every test here needs LLVM 14's llvm-mca and llvm-mc; without them the tests skip.
"""

from __future__ import annotations

import re
import subprocess

import pytest

from diffsim.data import load_csv, shipped
from diffsim.llvmtools import find_llvm_tool
from diffsim.mca import disassemble


@pytest.fixture(scope="session")
def llvm_mca() -> str:
  try:
    find_llvm_tool("llvm-mc")
    return find_llvm_tool("llvm-mca")
  except FileNotFoundError as e:
    pytest.skip(str(e))


@pytest.fixture(scope="session")
def direct_mca(llvm_mca):
  """Total Cycles of one block from a plain llvm-mca run: no regions, no JSON.

  Deliberately independent of the bridge's own machinery, so it can serve as its oracle.
  """

  def run(text: str, mcpu: str, iterations: int, extra=()) -> int:
    proc = subprocess.run(
      [llvm_mca, "-mtriple=x86_64-unknown-unknown", f"-mcpu={mcpu}",
       f"-iterations={iterations}", *extra],
      input=text + "\n", capture_output=True, text=True, check=False,
    )
    assert proc.returncode == 0 and "error" not in proc.stderr, proc.stderr
    return int(re.search(r"Total Cycles:\s+(\d+)", proc.stdout).group(1))

  return run


@pytest.fixture(scope="session")
def real_blocks(llvm_mca):
  """20 real BHive blocks (every 100th row of the shipped mca-small.csv) as
  (hex, llvm-mc text, shipped labels by column name)."""
  ds = load_csv(shipped("mca-small.csv"))
  idx = list(range(0, 2000, 100))
  texts = disassemble([ds.hex[i] for i in idx])
  out = []
  for i, d in zip(idx, texts):
    assert d.error is None, d.error
    labels = {"haswell_100": ds.y[i], **{k: v[i] for k, v in ds.extra.items()}}
    out.append((ds.hex[i], d.text, labels))
  return out
