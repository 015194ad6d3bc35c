"""Compiling the native runner (`runner.c`) with the system C compiler, once.

The runner is C because timing must not pass through an interpreter, and it is built
at first use rather than shipped as a binary, so that it matches the machine it times.
The executable is cached under `~/.cache/diffsim/measure/<source hash>/` (or
`$XDG_CACHE_HOME`), so editing `runner.c` rebuilds it and nothing else does.
"""

from __future__ import annotations

import hashlib
import os
import platform
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

SOURCE = Path(__file__).with_name("runner.c")
# -O2 for the server loop only: the timed code is generated at run time, byte by byte.
CFLAGS = ("-O2", "-std=gnu11", "-Wall")


class MeasureError(RuntimeError):
  """The environment cannot measure: wrong platform, no C compiler, a broken build."""


def _cache_root() -> Path:
  base = os.environ.get("XDG_CACHE_HOME") or os.path.join("~", ".cache")
  return Path(base).expanduser() / "diffsim" / "measure"


def find_compiler() -> str:
  """The C compiler: `$CC`, else `cc`, `gcc` or `clang` on PATH."""
  for name in (os.environ.get("CC"), "cc", "gcc", "clang"):
    if name and shutil.which(name):
      return shutil.which(name)
  raise MeasureError("diffsim measure needs a C compiler to build its timing runner, and "
                     "none was found (tried $CC, cc, gcc, clang); on Debian: "
                     "apt-get install build-essential")


def check_platform() -> None:
  """Measuring runs x86-64 code natively, with Linux's fork, mmap and signals."""
  machine = platform.machine().lower()
  if not sys.platform.startswith("linux") or machine not in ("x86_64", "amd64"):
    raise MeasureError(f"diffsim measure runs on x86-64 Linux only (this is {sys.platform} "
                       f"on {machine})")


def runner_path() -> Path:
  """The runner executable, compiled now if this source has not been compiled yet.

  Returns:
    The path of the executable.

  Raises:
    MeasureError: not x86-64 Linux, no C compiler, or the compiler failed.
  """
  check_platform()
  source = SOURCE.read_bytes()
  digest = hashlib.sha256(source + " ".join(CFLAGS).encode()).hexdigest()[:16]
  for root in (_cache_root(), Path(tempfile.gettempdir()) / f"diffsim-measure-{os.getuid()}"):
    exe = root / digest / "runner"
    if exe.is_file() and os.access(exe, os.X_OK):
      return exe
    try:
      exe.parent.mkdir(parents=True, exist_ok=True)
    except OSError:
      continue  # read-only home: fall back to the temporary folder
    cc = find_compiler()
    # Build beside the target and rename: concurrent first uses never see half a file.
    tmp = exe.with_name(f"runner.{os.getpid()}.tmp")
    proc = subprocess.run([cc, *CFLAGS, "-o", str(tmp), str(SOURCE)], capture_output=True,
                          text=True, check=False)
    if proc.returncode != 0:
      tmp.unlink(missing_ok=True)
      raise MeasureError(f"{cc} could not compile {SOURCE}:\n{proc.stderr.strip()}")
    os.replace(tmp, exe)
    return exe
  raise MeasureError(f"no writable cache folder for the runner (tried {_cache_root()})")
