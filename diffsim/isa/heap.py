"""The cyclic garbage collector paused around bulk work that builds no reference cycles.

Decoding and encoding make millions of small objects (instructions, operands, edge
tuples). Each allocation burst triggers CPython's cyclic collector, and its full
collections walk every object alive, JAX's modules included: in a process that has
imported JAX, encoding 20,000 BHive blocks took 3.6 CPU-s with the collector on and 2.1
with it paused, unpickling them 0.89 s against 0.37 s, and decoding 5,000 blocks 30-40%
longer (`benchmarks/RESULTS.md`, Simulator speed). The objects made here hold no
cycles, so reference counting frees them all the same; the collector resumes after.
"""

from __future__ import annotations

import contextlib
import gc


@contextlib.contextmanager
def collector_paused():
  """A context (and decorator) in which the cyclic collector does not run; it runs
  again afterwards if it ran before."""
  was = gc.isenabled()
  gc.disable()
  try:
    yield
  finally:
    if was:
      gc.enable()
