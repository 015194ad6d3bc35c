"""Finding and running the LLVM 14 command-line tools (llvm-mc, llvm-mca, llvm-exegesis).

diffsim treats LLVM 14's llvm-mca as the reference simulator, and its numbers differ
between LLVM releases, so every caller that runs an LLVM tool asks this module for the
14.x binary rather than trusting a plain name on PATH. The lookup happens at first use,
not at import (importing diffsim never needs LLVM), and its answer is cached. Every
LLVM process diffsim starts goes through `run_tool`, and every failure of a whole
request is an `LlvmError` (the bridge's `McaError` and extraction's `ToolError` are
kinds of it). A leaf: it imports nothing from diffsim, so that the decoder, the first
stage, can use it.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
import tempfile
from pathlib import Path
from typing import Sequence

# Debian's llvm-14 package keeps the unversioned names here; on PATH they are only
# `llvm-mc-14` etc., while a plain `llvm-mca` may be a newer release.
_LLVM14_BIN = Path("/usr/lib/llvm-14/bin")
# Every tool diffsim runs: llvm-mc decodes, llvm-mca simulates, llvm-exegesis names
# the scheduling classes a parameter table is built from.
TOOLS = ("llvm-mc", "llvm-mca", "llvm-exegesis")
_INSTALL_HINT = (
  "diffsim needs LLVM 14's {name}; install it with `apt-get install llvm-14` "
  "(it then lives in /usr/lib/llvm-14/bin or on PATH as {name}-14), or set "
  "DIFFSIM_LLVM_BIN to the folder that holds it."
)


def _version_of(path: str) -> str | None:
  """The `X.Y.Z` LLVM version a tool reports, or None when it does not say."""
  try:
    out = subprocess.run(
      [path, "--version"], capture_output=True, text=True, timeout=30, check=False
    )
  except (OSError, subprocess.TimeoutExpired):
    return None
  m = re.search(r"LLVM version (\d+\.\d+\.\d+)", out.stdout + out.stderr)
  return m.group(1) if m else None


@functools.lru_cache(maxsize=None)
def find_llvm_tool(name: str) -> str:
  """Finds an LLVM 14 tool such as `llvm-mca` or `llvm-mc`.

  With `$DIFFSIM_LLVM_BIN` set, only `$DIFFSIM_LLVM_BIN/<name>` is tried (an explicit
  choice is not second-guessed); otherwise `<name>-14` on PATH,
  `/usr/lib/llvm-14/bin/<name>`, then `<name>` on PATH. A candidate counts only if its
  `--version` says LLVM 14. The answer is cached for the process.

  Args:
    name: the tool's base name, e.g. `"llvm-mca"`.

  Returns:
    The absolute path of the executable.

  Raises:
    FileNotFoundError: no LLVM 14 build of the tool was found; the message names the
      tool and says how to install it.

  >>> find_llvm_tool("llvm-mca").endswith(("llvm-mca", "llvm-mca-14"))  # doctest: +SKIP
  True
  """
  env_bin = os.environ.get("DIFFSIM_LLVM_BIN")
  if env_bin:
    candidates = [str(Path(env_bin) / name)]
  else:
    candidates = [c for c in (shutil.which(f"{name}-14"), str(_LLVM14_BIN / name),
                              shutil.which(name)) if c]
  seen_versions = []
  for cand in candidates:
    if not (os.path.isfile(cand) and os.access(cand, os.X_OK)):
      continue
    version = _version_of(cand)
    if version is not None and version.startswith("14."):
      return os.path.abspath(cand)
    seen_versions.append(f"{cand} (LLVM {version or 'unknown'})")
  found = f" Found only: {', '.join(seen_versions)}." if seen_versions else ""
  if env_bin:
    found += f" DIFFSIM_LLVM_BIN is {env_bin}."
  raise FileNotFoundError(_INSTALL_HINT.format(name=name) + found)


def available(*names: str) -> bool:
  """Whether every named LLVM 14 tool is found (for skipping work that needs them)."""
  try:
    for name in names:
      find_llvm_tool(name)
  except FileNotFoundError:
    return False
  return True


@functools.lru_cache(maxsize=None)
def llvm_version(name: str = "llvm-mca") -> str:
  """The LLVM version string (`"14.0.6"`) of the tool `find_llvm_tool(name)` returns."""
  return _version_of(find_llvm_tool(name)) or "unknown"


class LlvmError(RuntimeError):
  """An LLVM tool failed in a way that concerns the whole request (errors that concern
  one block come back as that block's error, never as an exception)."""


def run_tool(tool: str, args: Sequence[str], stdin: str = "", *,
             timeout: float | None = None, files: bool = False
             ) -> subprocess.CompletedProcess:
  """Runs LLVM 14's `tool` (a name such as `"llvm-mca"`, or the path `find_llvm_tool`
  gave) with `stdin` as its input, and returns the finished process, whatever its
  status (the caller reads it).

  Input goes through stdin (llvm-mca's default input `-`), so diagnostics name lines as
  `<stdin>:LINE:COL` and killed workers leave no files behind. `files=True` passes the
  streams through temporary files instead of pipes: pipes are pumped by a Python
  thread that needs the interpreter's lock for every 64 KiB, so beside a thread that
  computes (the decoder's iced pass) llvm-mc took 3 s instead of 0.7 s.

  Raises:
    FileNotFoundError: no LLVM 14 build of the tool (`find_llvm_tool`).
  """
  exe = tool if os.sep in tool else find_llvm_tool(tool)
  if not files:
    return subprocess.run([exe, *args], input=stdin, capture_output=True, text=True,
                          timeout=timeout, check=False)
  with tempfile.TemporaryFile() as fin, tempfile.TemporaryFile() as fout, \
      tempfile.TemporaryFile() as ferr:
    fin.write(stdin.encode())
    fin.seek(0)
    proc = subprocess.run([exe, *args], stdin=fin, stdout=fout, stderr=ferr,
                          timeout=timeout, check=False)
    fout.seek(0)
    ferr.seek(0)
    return subprocess.CompletedProcess(proc.args, proc.returncode,
                                       fout.read().decode(errors="replace"),
                                       ferr.read().decode(errors="replace"))
