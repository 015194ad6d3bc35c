"""Decoding in a second process, chunk by chunk, ahead of the blocks' consumer.

Decoding is Python work (iced-x86's facts, llvm-mc's output parsed), and so is the start
of a simulation (importing JAX, loading a table, encoding batches): in one process they
take turns on one interpreter, and the first seconds of `diffsim simulate` kept one of
two cores idle. A child process decodes beside them, and the consumer starts on the
first chunks while later ones decode. The child gets the hex strings on stdin and hands
back each chunk's results as a pickle file in a private temporary folder, named on its
stdout, so that neither side ever waits on a full pipe.
"""

from __future__ import annotations

import contextlib
import gc
import os
import pickle
import signal
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from pathlib import Path

from diffsim.isa.heap import collector_paused

# The folder that holds the `diffsim` package, for the child's imports.
_ROOT = str(Path(__file__).resolve().parents[2])


@contextlib.contextmanager
def decode_in_background(hexes: Sequence[str], chunk: int) -> Iterator[Iterator[list]]:
  """Yields an iterator over `decode_blocks` of each `chunk` of `hexes`, in order, which a
  child process starts decoding at once.

  The iterator raises what `decode_blocks` raised (RuntimeError: llvm-mc missing or
  broken), or RuntimeError when the child dies. Leaving the block ends the child.
  Each chunk, and whatever else this process holds then, is frozen out of the cyclic
  collector's reach as it arrives (`gc.freeze`): made for a consumer that keeps every
  chunk to its end, as `diffsim simulate` does.
  """
  parts = [list(hexes[s:s + chunk]) for s in range(0, len(hexes), chunk)]
  env = dict(os.environ, PYTHONPATH=os.pathsep.join(
      [_ROOT] + [p for p in [os.environ.get("PYTHONPATH")] if p]))
  with tempfile.TemporaryDirectory(prefix="diffsim-decode-") as folder:
    child = subprocess.Popen([sys.executable, "-m", "diffsim.isa.background", folder],
                             stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env)
    try:
      pickle.dump(parts, child.stdin, protocol=pickle.HIGHEST_PROTOCOL)
      child.stdin.close()
      yield _results(child, len(parts))
    finally:
      child.kill()
      child.wait()
      child.stdout.close()


def _results(child: subprocess.Popen, n: int) -> Iterator[list]:
  for _ in range(n):
    line = child.stdout.readline().decode().strip()
    if not line:
      raise RuntimeError(f"the decoding process ended early (exit status {child.wait()})")
    path = Path(line)
    with collector_paused():
      result = pickle.loads(path.read_bytes())
      # The consumer keeps every chunk to its end, and the collector's passes over
      # them (0.5-0.8 s in all) would find no cycles there.
      gc.freeze()
    path.unlink()
    if isinstance(result, BaseException):
      raise result
    yield result


def _serve(folder: str) -> None:
  """The child: decodes each chunk read from stdin, one pickle file per chunk."""
  signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent ends it
  from diffsim.isa.decode import decode_blocks

  parts = pickle.load(sys.stdin.buffer)
  for k, hexes in enumerate(parts):
    try:
      result = decode_blocks(hexes)
    except RuntimeError as e:  # the environment (llvm-mc); rows never raise
      result = e
    path = Path(folder) / f"{k}.pickle"
    tmp = path.with_suffix(".tmp")
    tmp.write_bytes(pickle.dumps(result, protocol=pickle.HIGHEST_PROTOCOL))
    tmp.replace(path)
    print(path, flush=True)
    if isinstance(result, BaseException):
      return


if __name__ == "__main__":
  _serve(sys.argv[1])
