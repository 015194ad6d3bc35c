"""Kept programs (diffsim.sim.programs): the same cycles as a program compiled in this
process, loaded by a later process without tracing or compiling, compiled again when
damaged, never reused for other inputs."""

import numpy as np
import pytest

from diffsim.isa import parse_asm
from diffsim.params.table import load_table
from diffsim.sim import encode, programs, simulate
from diffsim.sim.kernels import program, simulate_jobs

BLOCKS = ["addl %ecx, %eax; imull %eax, %eax", "movq (%rdi), %rax; addq %rax, %rbx",
          "vaddps %ymm0, %ymm1, %ymm2; vmulps %ymm2, %ymm2, %ymm3"]


@pytest.fixture
def kept(tmp_path):
  """Programs kept in tmp_path for this test alone; the session's setting after it."""
  before, loaded = programs._dir, dict(programs._loaded)
  programs._loaded.clear()
  programs.keep_programs(tmp_path)
  yield tmp_path
  programs.keep_programs(before)
  programs._loaded.clear()
  programs._loaded.update(loaded)


def test_a_kept_program_is_loaded_and_gives_the_same_cycles(kept, monkeypatch):
  table = load_table("haswell")
  batch = encode(table, [parse_asm(b) for b in BLOCKS], length=8)
  its = np.array([20, 50, 100])
  cycles, codes = simulate(table, batch, iterations=its)
  files = list(kept.glob("*.xla"))
  assert len(files) == 1 and not codes.any()
  # The same cycles as the program compiled in this process, without a directory (and
  # not written to JAX's persistent cache, where it would stop later runs of this test
  # from keeping their program: see the next test).
  programs.keep_programs(None)
  with programs.persistent_cache_threshold(float("inf")):
    np.testing.assert_array_equal(simulate(table, batch, iterations=its)[0], cycles)
  programs.keep_programs(kept)

  # A new process: nothing in memory, so the file is read and nothing is compiled.
  programs._loaded.clear()

  def no_compiling(*args, **kw):
    raise AssertionError("compiled again instead of loading the kept program")

  monkeypatch.setattr(programs, "_compile", no_compiling)
  np.testing.assert_array_equal(simulate(table, batch, iterations=its)[0], cycles)
  monkeypatch.undo()

  # A damaged file is compiled again and replaced.
  files[0].write_bytes(b"not a program")
  programs._loaded.clear()
  np.testing.assert_array_equal(simulate(table, batch, iterations=its)[0], cycles)
  assert files[0].read_bytes() != b"not a program"


def test_a_prefetched_program_is_loaded_in_the_background_and_then_run(kept, monkeypatch):
  table = load_table("haswell")
  batch = encode(table, [parse_asm(b) for b in BLOCKS], length=8)
  its = np.array([20, 50, 100])
  args, static, _ = program(table, batch, its)
  programs.prefetch(simulate_jobs, args, static)
  assert not programs._loaded  # not kept yet: compiling stays with the caller
  cycles = simulate(table, batch, iterations=its)[0]

  programs._loaded.clear()  # a new process
  programs.prefetch(simulate_jobs, args, static)
  (pending,) = programs._loaded.values()
  assert pending.result() is not None  # loaded on the loader's thread

  def not_here(*args, **kw):
    raise AssertionError("loaded again instead of taking the prefetched program")

  monkeypatch.setattr(programs, "_load_or_compile", not_here)
  np.testing.assert_array_equal(simulate(table, batch, iterations=its)[0], cycles)


def test_a_program_from_the_persistent_cache_is_run_but_not_kept(kept):
  """An executable that JAX's compile cache hands back serializes without its machine
  code: such a program must run, and never be kept."""
  import jax

  if not jax.config.jax_compilation_cache_dir:
    pytest.skip("no persistent compile cache in this session (DIFFSIM_CACHE_DIR=off)")
  table = load_table("haswell")
  # 12 blocks: a shape of its own (the command's jobs are powers of two from 8).
  batch = encode(table, [parse_asm(b) for b in BLOCKS * 4], length=8)
  programs.keep_programs(None)
  with programs.persistent_cache_threshold(0.0):
    direct = simulate(table, batch, iterations=30)[0]  # compiled, and written to the cache
  programs.keep_programs(kept)
  np.testing.assert_array_equal(simulate(table, batch, iterations=30)[0], direct)
  assert not list(kept.glob("*.xla"))


def test_the_key_covers_shapes_static_arguments_and_code():
  table = load_table("haswell")
  batch8 = encode(table, [parse_asm(b) for b in BLOCKS], length=8)
  batch16 = encode(table, [parse_asm(b) for b in BLOCKS], length=16)
  other = load_table("skylake")
  import jax

  def key(batch, layout=table.layout, window=224):
    leaves, tree = jax.tree.flatten((table.params, table.structure, batch, np.zeros(3)))
    return programs._key(simulate_jobs, tree, leaves, dict(layout=layout, window=window))

  assert key(batch8) == key(batch8)
  assert len({key(batch8), key(batch16), key(batch8, window=256),
              key(batch8, layout=other.layout)}) == 4
  assert len(programs.source_digest()) == 32


def _scaled(x, *, k):
  return x * k


def _maps() -> int:
  with open("/proc/self/maps") as f:
    return sum(1 for _ in f)


def test_a_process_holds_at_most_max_held_programs_and_releases_their_mappings(
    kept, monkeypatch):
  """Each compiled program holds hundreds of memory mappings and Linux caps them, so
  the least recently called program is dropped past MAX_HELD (and its mappings with
  it); called again, it gives the same result."""
  import gc

  import jax

  programs.keep_programs(None)
  monkeypatch.setattr(programs, "MAX_HELD", 2)
  fn = jax.jit(_scaled, static_argnames="k")
  x = np.arange(4.0, dtype=np.float32)
  for k in (1, 2, 3):
    np.testing.assert_array_equal(programs.call(fn, (x,), dict(k=k)), x * k)
    assert programs.held() <= 2
  assert [key for key in programs._loaded] == [
      (programs._keyed(fn, (x,), dict(k=k))[0], None) for k in (2, 3)]
  gc.collect()
  before = _maps()
  programs.call(fn, (x,), dict(k=1))  # compiled again, k=2 dropped
  np.testing.assert_array_equal(programs.call(fn, (x,), dict(k=1)), x)
  assert programs.held() == 2
  gc.collect()
  assert _maps() <= before + 50  # one program in, one out: the count does not grow
