"""Repo-wide test configuration: JAX strictness, compile cache, LLVM 14 and shared-data skips.

Runs before any test module is imported, so the settings below also hold for
module-level `skipif` checks and for the notebook kernels nbmake starts (they inherit
this process's environment).
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
from pathlib import Path

import jax
import pytest

from diffsim.cli.common import enable_compile_cache

# Silent broadcasting between arrays of different rank is a bug in this codebase
# (diffsim/ARCHITECTURE.md#numerics): make it fail loudly in every test.
jax.config.update("jax_numpy_rank_promotion", "raise")

# Compiled programs are kept on disk for this session only: the modules compile many
# of the same simulator programs, and each module's in-memory copies are dropped when
# it ends (`_drop_compiled_programs`), so later modules, the `diffsim` commands the
# tests start and the notebooks' kernels (they inherit DIFFSIM_CACHE_DIR) load them
# instead of compiling again. The user's ~/.cache is never touched.
if "DIFFSIM_CACHE_DIR" not in os.environ:
  _session_cache = tempfile.mkdtemp(prefix="diffsim-test-xla-")
  atexit.register(shutil.rmtree, _session_cache, ignore_errors=True)
  os.environ["DIFFSIM_CACHE_DIR"] = _session_cache
enable_compile_cache()  # as the `diffsim` command does, in this process too


@pytest.fixture(scope="session")
def shared_data() -> Path:
  """The shared data folder (`bhive/`, `measured/`, `mca/`); skips the test without it."""
  from diffsim.data import shared_data_dir

  path = shared_data_dir()
  if path is None:
    pytest.skip("no shared data folder (set DIFFSIM_SHARED or check out ../shared/data)")
  return path


@pytest.fixture(scope="session")
def llvm14() -> dict[str, str]:
  """Paths of LLVM 14's llvm-mc and llvm-mca; skips the test when either is missing."""
  from diffsim.llvmtools import find_llvm_tool

  try:
    return {name: find_llvm_tool(name) for name in ("llvm-mc", "llvm-mca")}
  except FileNotFoundError as e:
    pytest.skip(str(e))


@pytest.fixture(scope="module", autouse=True)
def _drop_compiled_programs():
  """Frees each module's compiled XLA programs when the module is done.

  The simulator's programs are large (tens of MB each, one per table shape, bucket and
  mode); kept for the whole session they grew the test process past 5 GB, and XLA
  crashed compiling inside the bloated process on a CI machine. Modules share few
  programs, so recompiling the odd one costs less than carrying them all.
  """
  yield
  jax.clear_caches()
  import gc

  gc.collect()


def free_port() -> int:
  import socket

  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


@pytest.fixture
def processes():
  """Starts `argv` as n processes of one multi-process run on the loopback address
  (JAX's environment variables name the coordinator, the count and each id) and
  returns their Popen handles at once; `wait(handles)` collects them, killing all when
  one fails or the time runs out (the others would wait for it in a collective)."""
  import subprocess
  import sys

  started = []

  def start(argv: list[str], n: int, env: dict | None = None) -> list:
    port = free_port()
    base = dict(os.environ, **(env or {}))
    base.update(JAX_COORDINATOR_ADDRESS=f"127.0.0.1:{port}", JAX_NUM_PROCESSES=str(n))
    base["PYTHONPATH"] = os.pathsep.join(
        [str(Path(__file__).resolve().parents[1])] + [p for p in [base.get("PYTHONPATH")] if p])
    handles = [subprocess.Popen([sys.executable, *argv], env=dict(base, JAX_PROCESS_ID=str(i)),
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
               for i in range(n)]
    started.extend(handles)
    return handles

  def wait(handles: list, timeout: float = 600) -> list[str]:
    import time

    deadline, outs = time.time() + timeout, []
    try:
      for h in handles:
        outs.append(h.communicate(timeout=max(1.0, deadline - time.time()))[0])
        if h.returncode != 0:
          raise AssertionError(f"process {len(outs) - 1} failed:\n{outs[-1][-3000:]}")
    finally:
      for h in handles:
        if h.poll() is None:
          h.kill()
          h.communicate()
    return outs

  yield start, wait
  for h in started:
    if h.poll() is None:
      h.kill()
      h.communicate()
