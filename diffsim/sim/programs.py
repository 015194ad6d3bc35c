"""The simulator's programs kept on disk, compiled once per machine rather than once per run.

The cycle loop takes seconds to trace and lower for every bucket shape, and JAX's
persistent compile cache only skips the compilation that comes after. With a directory
set (`keep_programs`; the CLI sets one beside its compile cache), each program is
compiled once and its executable serialized (`jax.experimental.serialize_executable`);
later runs load the executable and run it at once: about 0.6 s per program, against
1.1 s to load a traced program and find its compilation in the cache (`benchmarks/
RESULTS.md`, Simulator speed).

A kept program is keyed on everything that shapes it: the function, its static
arguments (the table's layout, window, budget...), the shapes and dtypes of its inputs,
the devices (and processes, `diffsim.sim.hosts`) and the host CPU's features (an executable is machine code), XLA's
options, the JAX version and the source of the diffsim code it is traced from
(`PROGRAM_SOURCES`), so a program is never reused where it would compute something
else, or could not run.
"""

from __future__ import annotations

import collections
import concurrent.futures
import contextlib
import functools
import hashlib
import os
import pickle
import platform
from pathlib import Path
from typing import Callable

import jax
import jaxlib
import numpy as np
from jax.experimental import serialize_executable

# XLA:CPU splits every reduction over more than 32 elements into a reduce-window and a
# second reduction (its tree-reduction rewrite, which keeps long float sums precise).
# The cycle loop's reductions over the window are integer or boolean, exact either way,
# and split they took a fifth of its time; the hard simulator's programs compile
# without the rewrite (`benchmarks/RESULTS.md`, Simulator speed).
COMPILER_OPTIONS = {"xla_disable_hlo_passes": "tree_reduction_rewriter"}

_dir: Path | None = None
# Programs by (key, directory), least recently called first; a prefetched one is a
# Future until `call` needs it.
_loaded: collections.OrderedDict[tuple[str, Path | None], Callable | concurrent.futures.Future] \
    = collections.OrderedDict()
# Programs a process holds at most. Each holds about 1,100 memory mappings (its
# kernels' code), which `jax.clear_caches` does not release, and Linux stops a process
# at 65,530 (vm.max_map_count): a long fit that ran every shape it met died in its
# report. The least recently called program goes first; called again, it is loaded
# from the kept directory (0.6 s) or compiled anew (`benchmarks/RESULTS.md`,
# Simulator speed).
MAX_HELD = 32
_loader = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="diffsim-programs")


def keep_programs(path: str | Path | None) -> None:
  """Keeps compiled programs in `path` from now on (None: compile in every process)."""
  global _dir
  _dir = None if path is None else Path(path)


def call(fn, args: tuple, static: dict):
  """`fn(*args, **static)` for a jitted `fn`, compiled with `COMPILER_OPTIONS`, through a
  kept program when a directory is set. `args` may be pytrees of arrays; `static` are
  `fn`'s static arguments."""
  key, tree, leaves = _keyed(fn, args, static)
  run = _loaded.get((key, _dir))
  if isinstance(run, concurrent.futures.Future):
    run = _loaded[key, _dir] = run.result()
  if run is None:
    run = _loaded[key, _dir] = (
        _compile(fn, tree, leaves, static) if _dir is None
        else _load_or_compile(fn, tree, leaves, static, _dir / f"{key}.xla"))
  _loaded.move_to_end((key, _dir))
  while len(_loaded) > MAX_HELD:
    _loaded.popitem(last=False)
  LAUNCHES[getattr(fn, "__qualname__", repr(fn))] += 1
  _last[getattr(fn, "__qualname__", repr(fn))] = run
  return run(*leaves)


# Programs launched per function in this process: one per job, never one per cycle
# (the cycle loop runs on the device); `benchmarks/gpu.py` checks it.
LAUNCHES: collections.Counter = collections.Counter()
_last: dict[str, Callable] = {}


def held() -> int:
  """Compiled programs this process holds (loaded or compiled): a count that stays put
  once every shape has run (`benchmarks/gpu.py`'s compile-once check), and never
  exceeds `MAX_HELD`."""
  return len(_loaded)


def footprint(fn) -> int | None:
  """Device bytes of the program of `fn` called last: its arguments, outputs and
  temporaries, by XLA's memory analysis (per device); None where XLA does not say."""
  run = _last.get(getattr(fn, "__qualname__", repr(fn)))
  try:
    m = run.memory_analysis()
    return int(m.argument_size_in_bytes + m.output_size_in_bytes + m.temp_size_in_bytes)
  except Exception:  # noqa: BLE001 - no program yet, or no analysis on this backend
    return None


def prefetch(fn, args: tuple, static: dict) -> None:
  """Starts loading the kept program that `call(fn, args, static)` will run, on a
  background thread, so that the call finds it ready: XLA rebuilds a program for
  about half a second, mostly outside the interpreter's lock. Does nothing unless
  the program is kept on disk already (a compilation traces Python, so it stays on
  the caller's thread) or loaded."""
  if _dir is None:
    return
  key = _keyed(fn, args, static)[0]
  path = _dir / f"{key}.xla"
  if (key, _dir) not in _loaded and path.exists():
    _loaded[key, _dir] = _loader.submit(_load, path)


def _keyed(fn, args: tuple, static: dict):
  """(key, tree, leaves) of a call, its leaves on the host: an array committed to one
  device would not fit the program's shardings."""
  leaves, tree = jax.tree.flatten(args)
  leaves = [np.asarray(x) for x in leaves]
  return _key(fn, tree, leaves, static), tree, leaves


def _compile(fn, tree, leaves, static):
  """`fn` traced in this process and compiled with `COMPILER_OPTIONS`, as a function of
  the leaves."""
  flat = jax.jit(lambda *xs: fn(*jax.tree.unflatten(tree, xs), **static))
  return flat.lower(*leaves).compile(compiler_options=COMPILER_OPTIONS)


def _load(path: Path):
  """The kept program in `path`, or None where it is missing, damaged or stale."""
  try:
    return serialize_executable.deserialize_and_load(*pickle.loads(path.read_bytes()))
  except Exception:  # noqa: BLE001 - compiled again by the caller
    return None


def _load_or_compile(fn, tree, leaves, static, path: Path):
  loaded = _load(path)
  if loaded is not None:
    return loaded
  compiled, fresh = _compile_fresh(fn, tree, leaves, static)
  if fresh:
    try:
      _write(path, pickle.dumps(serialize_executable.serialize(compiled)))
    except Exception:  # noqa: BLE001 - what cannot be serialized still runs, compiled here
      pass
  return compiled


def _compile_fresh(fn, tree, leaves, static):
  """(`_compile`'s program, whether XLA compiled it here).

  An executable that JAX's persistent compile cache hands back serializes without its
  machine code (loaded later, it fails to run), so only a fresh compilation is kept.
  Kept programs have their own files, so their compilations are not also written to
  the persistent cache, where a later compilation would find them.
  """
  _watch_cache_hits()
  hits = len(_CACHE_HITS)
  with persistent_cache_threshold(float("inf")):
    compiled = _compile(fn, tree, leaves, static)
  return compiled, len(_CACHE_HITS) == hits


@contextlib.contextmanager
def persistent_cache_threshold(seconds: float):
  """Within the block, JAX's persistent cache keeps only compilations that took at
  least `seconds` (inf: none)."""
  option = "jax_persistent_cache_min_compile_time_secs"
  before = getattr(jax.config, option)
  jax.config.update(option, seconds)
  try:
    yield
  finally:
    jax.config.update(option, before)


_CACHE_HITS: list[str] = []


@functools.cache
def _watch_cache_hits() -> None:
  def listen(event: str, **_):
    if event == "/jax/compilation_cache/cache_hits":
      _CACHE_HITS.append(event)

  jax.monitoring.register_event_listener(listen)


def _write(path: Path, blob: bytes) -> None:
  """Atomically, so that a concurrent reader never sees half a program."""
  try:
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(f".{os.getpid()}.tmp")
    tmp.write_bytes(blob)
    tmp.replace(path)
  except OSError:
    pass  # a read-only cache only costs compile time


def _key(fn, tree, leaves, static: dict) -> str:
  h = hashlib.blake2b(digest_size=16)
  devices = jax.local_devices()
  # The devices by id, and the processes: an executable of a one-process run fails to
  # run in a process of a multi-process run (its devices are numbered apart).
  h.update(repr((jax.__version__, jaxlib.__version__, len(devices), _machine(), _xla_flags(),
                 [d.id for d in devices], jax.process_count(),
                 source_digest(*sorted({*PROGRAM_SOURCES, _subpackage(fn)})),
                 getattr(fn, "__qualname__", repr(fn)), str(tree),
                 [(np.shape(x), str(np.result_type(x))) for x in leaves],
                 sorted((k, repr(v)) for k, v in static.items()))).encode())
  return h.hexdigest()


# The subpackages whose code a program of the simulator is traced from (a program's own
# subpackage is added): an edit elsewhere (the CLI, learning) does not recompile it.
PROGRAM_SOURCES = ("isa", "params", "sim")


def _subpackage(fn) -> str:
  """The diffsim subpackage that defines `fn` ("sim" for `diffsim.sim.api`)."""
  parts = getattr(fn, "__module__", "").split(".")
  return parts[1] if len(parts) > 2 and parts[0] == "diffsim" else "sim"


@functools.cache
def _xla_flags() -> str:
  """XLA's options as this process set them: they change what a compilation makes
  (`cli.tune_xla`), and XLA reads them once, at start."""
  return os.environ.get("XLA_FLAGS", "")


@functools.cache
def _machine() -> str:
  """The device kind and, for XLA:CPU's machine code, the host CPU's features."""
  device = jax.local_devices()[0]
  try:
    with open("/proc/cpuinfo") as f:
      cpu = next((line for line in f if line.startswith("flags")), "")
  except OSError:
    cpu = ""
  return repr((device.platform, device.device_kind, platform.machine(),
               cpu or platform.processor()))


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
