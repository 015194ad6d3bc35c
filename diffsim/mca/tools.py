"""Locating the LLVM 14 command-line tools (llvm-mca, llvm-mc) and running them.

diffsim treats LLVM 14's llvm-mca as the reference simulator, and its numbers differ
between LLVM releases, so this module looks for the 14.x binaries specifically and
says how to install them when they are missing. It simplifies nothing about the tools;
it only spares every caller the search and the version check.
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import subprocess
from pathlib import Path
from typing import Sequence

# The versioned names and Debian's private bin folder come first among the fallbacks:
# a machine may carry a newer default `llvm-mca` on PATH whose numbers would differ.
_LLVM14_BIN = Path("/usr/lib/llvm-14/bin")
_INSTALL_HINT = (
  "diffsim needs LLVM 14's {name}; install it with `apt-get install llvm-14` "
  "(it then lives in /usr/lib/llvm-14/bin or on PATH as {name}-14), or set "
  "DIFFSIM_LLVM_BIN to the folder that holds it."
)


class McaError(RuntimeError):
  """llvm-mca or llvm-mc failed in a way that concerns the whole request.

  Errors that concern single blocks never raise: they come back as error rows.
  """


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

  The search order is `$DIFFSIM_LLVM_BIN/<name>`, `<name>-14` on PATH,
  `/usr/lib/llvm-14/bin/<name>`, then `<name>` on PATH. A candidate counts only if its
  `--version` says LLVM 14; when none does, an unversioned `<name>` on PATH is accepted
  as the last resort only if it reports version 14 too.

  Args:
    name: the tool's base name, e.g. `"llvm-mca"`.

  Returns:
    The absolute path of the executable.

  Raises:
    FileNotFoundError: no LLVM 14 build of the tool was found; the message says how to
      install it.

  >>> find_llvm_tool("llvm-mca").endswith(("llvm-mca", "llvm-mca-14"))  # doctest: +SKIP
  True
  """
  candidates: list[str] = []
  env_bin = os.environ.get("DIFFSIM_LLVM_BIN")
  if env_bin:
    candidates.append(str(Path(env_bin) / name))
  for cand in (shutil.which(f"{name}-14"), str(_LLVM14_BIN / name), shutil.which(name)):
    if cand:
      candidates.append(cand)
  seen_versions = []
  for cand in candidates:
    if not (os.path.isfile(cand) and os.access(cand, os.X_OK)):
      continue
    version = _version_of(cand)
    if version is not None and version.startswith("14."):
      return os.path.abspath(cand)
    seen_versions.append(f"{cand} (LLVM {version or 'unknown'})")
  found = f" Found only: {', '.join(seen_versions)}." if seen_versions else ""
  raise FileNotFoundError(_INSTALL_HINT.format(name=name) + found)


@functools.lru_cache(maxsize=None)
def llvm_version(name: str = "llvm-mca") -> str:
  """The LLVM version string (`"14.0.6"`) of the tool `find_llvm_tool(name)` returns."""
  return _version_of(find_llvm_tool(name)) or "unknown"


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
