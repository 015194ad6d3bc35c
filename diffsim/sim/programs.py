"""The simulator's programs kept on disk, traced once per machine rather than once per run.

JAX's persistent compile cache skips XLA's compilation in a new process, but not the
tracing that comes before it: the cycle loop takes seconds to trace for every bucket
shape, which made tracing most of a short `diffsim simulate` run. With a directory set
(`keep_programs`; the CLI sets one beside its compile cache), each program is traced
once, serialized with `jax.export`, and later runs load it and go straight to the
(cached) compilation.

A kept program is keyed on everything that shapes it: the function, its static
arguments (the table's layout, window, budget...), the shapes and dtypes of its inputs,
the devices, the JAX version and the source of diffsim itself, so a program is never
reused where it would compute something else.
"""

from __future__ import annotations

import functools
import hashlib
import os
from pathlib import Path
from typing import Callable

import jax
import numpy as np
from jax import export
from jax.sharding import Mesh, NamedSharding, PartitionSpec

# XLA:CPU splits every reduction over more than 32 elements into a reduce-window and a
# second reduction (its tree-reduction rewrite, which keeps long float sums precise).
# The cycle loop's reductions over the window are integer or boolean, exact either way,
# and split they took a fifth of its time; the hard simulator's programs compile
# without the rewrite (`benchmarks/RESULTS.md`, "eighth session").
COMPILER_OPTIONS = {"xla_disable_hlo_passes": "tree_reduction_rewriter"}

_dir: Path | None = None
_loaded: dict[tuple[str, Path | None], Callable] = {}


def keep_programs(path: str | Path | None) -> None:
  """Keeps traced programs in `path` from now on (None: trace in every process)."""
  global _dir
  _dir = None if path is None else Path(path)


def call(fn, args: tuple, static: dict):
  """`fn(*args, **static)` for a jitted `fn`, compiled with `COMPILER_OPTIONS`, through a
  kept program when a directory is set. `args` may be pytrees of arrays; `static` are
  `fn`'s static arguments."""
  leaves, tree = jax.tree.flatten(args)
  # On the host: an array committed to one device would not fit the program's shardings.
  leaves = [np.asarray(x) for x in leaves]
  key = _key(fn, tree, leaves, static)
  run = _loaded.get((key, _dir))
  if run is None:
    run = _loaded[key, _dir] = (
        _compile(fn, tree, leaves, static) if _dir is None
        else _load_or_trace(fn, tree, leaves, static, _dir / f"{key}.jaxexport"))
  return run(*leaves)


def _compile(fn, tree, leaves, static) -> Callable:
  """`fn` traced in this process and compiled with `COMPILER_OPTIONS`, as a function of
  the leaves."""
  compiled = fn.lower(*jax.tree.unflatten(tree, leaves), **static).compile(
      compiler_options=COMPILER_OPTIONS)
  return lambda *xs: compiled(*jax.tree.unflatten(tree, xs))


def _load_or_trace(fn, tree, leaves, static, path: Path) -> Callable:
  mesh = Mesh(np.array(jax.local_devices()), ("devices",))
  exported = None
  if path.exists():
    try:
      exported = export.deserialize(bytearray(path.read_bytes()))
    except Exception:  # noqa: BLE001 - a damaged file is traced again
      exported = None
  if exported is None:
    whole = NamedSharding(mesh, PartitionSpec())
    flat = jax.jit(lambda *xs: fn(*jax.tree.unflatten(tree, xs), **static),
                   in_shardings=(whole,) * len(leaves), out_shardings=whole)
    try:
      exported = export.export(flat)(*leaves)
      _write(path, exported.serialize())
    except Exception:  # noqa: BLE001 - what cannot be exported still runs, traced here
      return _compile(fn, tree, leaves, static)
  return jax.jit(exported.call, in_shardings=exported.in_shardings_jax(mesh),
                 out_shardings=exported.out_shardings_jax(mesh),
                 compiler_options=COMPILER_OPTIONS)


def _write(path: Path, blob: bytes) -> None:
  """Atomically, so that a concurrent reader never sees half a program."""
  try:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_bytes(blob)
    tmp.replace(path)
  except OSError:
    pass  # a read-only cache only costs tracing time


def _key(fn, tree, leaves, static: dict) -> str:
  h = hashlib.blake2b(digest_size=16)
  devices = jax.local_devices()
  h.update(repr((jax.__version__, devices[0].platform, len(devices), source_digest(),
                 getattr(fn, "__qualname__", repr(fn)), str(tree),
                 [(np.shape(x), str(np.result_type(x))) for x in leaves],
                 sorted((k, repr(v)) for k, v in static.items()))).encode())
  return h.hexdigest()


@functools.cache
def source_digest(*packages: str) -> str:
  """diffsim's source files (of the named subpackages; all when none are named): a
  changed simulator never loads an old program, nor old labels."""
  root = Path(__file__).resolve().parents[1]
  files = [p for d in packages for p in (root / d).rglob("*.py")] if packages else \
      root.rglob("*.py")
  h = hashlib.blake2b(digest_size=16)
  for p in sorted(files):
    h.update(str(p.relative_to(root)).encode() + p.read_bytes())
  return h.hexdigest()
