"""Search spaces, lowering and validity rules, with the real decoder and tables."""

import numpy as np
import pytest

from diffsim.params.table import load_table
from diffsim.search.codegen import assembly, lower, lower_many
from diffsim.search.space import ISAS, TASKS, get_task
from diffsim.sim.blocks import block_error


@pytest.mark.parametrize("name", sorted(TASKS))
def test_every_config_lowers_or_has_a_reason(name):
  task = TASKS[name]
  table = load_table("haswell")
  ok = [c for c in task.configs if task.static_error(c) is None]
  blocks = lower_many(task, ok)
  for c, b in zip(ok, blocks):
    assert not isinstance(b, Exception), (c, b)
    err = block_error(table, b)
    # The only target-dependent failure is an ISA the table lacks (AVX-512 here).
    assert err is None or (c[0] == "avx512" and "not in the" in err), (c, err)
    if c[0] != "avx512":
      assert err is None
  bad = [c for c in task.configs if task.static_error(c) is not None]
  assert bad, "every task has configurations a compiler would refuse"
  for c in bad:
    with pytest.raises(ValueError, match="registers|divide"):
      assembly(task, c)


def test_batched_lowering_matches_parse_asm():
  task = TASKS["gemm"]
  ok = [c for c in task.configs if task.static_error(c) is None][::97]
  assert lower_many(task, ok) == [lower(task, c) for c in ok]


def test_register_rule():
  gemm = TASKS["gemm"]
  # 4 x 3 accumulators x 1 set + 4 A registers + 3 broadcasts = 19 > 16 for AVX2 ...
  c = ("avx2", 4, 3, 1, 1, "broadcast", "grouped")
  assert gemm.live_vector_registers(c) == 19
  assert "16" in gemm.static_error(c)
  # ... but fits AVX-512's 32 registers (4 x 16 lanes = 64 rows do not divide M=96, so
  # take 3 rows there).
  assert gemm.static_error(("avx512", 3, 3, 1, 1, "broadcast", "grouped")) is None
  assert "registers" in gemm.static_error(("avx512", 4, 8, 4, 2, "broadcast", "grouped"))


def test_divisibility_rules():
  gemm, dot = TASKS["gemm"], TASKS["dot"]
  assert "N=24" in gemm.static_error(("avx2", 1, 5, 1, 1, "loadop", "interleaved"))
  assert "M=96" in gemm.static_error(("avx512", 4, 1, 1, 1, "loadop", "interleaved"))
  assert "accumulator" in gemm.static_error(("avx2", 1, 1, 1, 2, "loadop", "interleaved"))
  assert "N=2400" in dot.static_error(("avx2", 8, 1, "loadop", "interleaved"))
  assert "accumulators" in dot.static_error(("avx2", 3, 2, "loadop", "interleaved"))


def test_useful_ops_and_features():
  gemm = TASKS["gemm"]
  c = ("avx2", 2, 3, 4, 1, "broadcast", "grouped")
  assert gemm.useful_ops(c) == 2 * 2 * ISAS["avx2"][1] * 3 * 4
  f = gemm.features
  assert f.shape[0] == gemm.size and f.dtype == np.float32 and np.isfinite(f).all()


def test_unknown_task():
  with pytest.raises(ValueError, match="unknown task"):
    get_task("fft")


def _cpu_flags() -> set[str]:
  try:
    with open("/proc/cpuinfo") as f:
      for line in f:
        if line.startswith("flags"):
          return set(line.split(":", 1)[1].split())
  except OSError:
    pass
  return set()


@pytest.mark.parametrize("config", [("avx2", 2, 2, 4, 2, "broadcast", "grouped"),
                                    ("sse", 3, 3, 2, 1, "loadop", "interleaved")])
def test_c_kernel_computes_the_gemm_tile(tmp_path, config):
  """The emitted C compiles and adds A x B into the tile, checked against a plain loop."""
  import platform
  import shutil
  import subprocess

  from diffsim.search.codegen import c_kernel

  cc = shutil.which("cc") or shutil.which("gcc") or shutil.which("clang")
  if cc is None or platform.machine().lower() not in ("x86_64", "amd64"):
    pytest.skip("no C compiler, or not an x86-64 machine")
  gemm = TASKS["gemm"]
  c = gemm.as_dict(config)
  if c["isa"] == "avx2" and not {"avx2", "fma"} <= _cpu_flags():
    pytest.skip("no AVX2 and FMA on this CPU")
  rows, cols, k, ldc = c["mr"] * ISAS[c["isa"]][1], c["nr"], 8, c["mr"] * ISAS[c["isa"]][1] + 3
  main_c = c_kernel(gemm, config, name="kernel") + f"""
#include <stdio.h>
#include <math.h>
int main(void) {{
  float A[{k * rows}], B[{k * cols}], C[{ldc * cols}], R[{ldc * cols}];
  for (int i = 0; i < {k * rows}; i++) A[i] = (float)((i * 7) % 13) - 6.0f;
  for (int i = 0; i < {k * cols}; i++) B[i] = (float)((i * 5) % 11) - 5.0f;
  for (int i = 0; i < {ldc * cols}; i++) C[i] = R[i] = (float)(i % 3);
  for (int p = 0; p < {k}; p++)
    for (int j = 0; j < {cols}; j++)
      for (int i = 0; i < {rows}; i++) R[i + j * {ldc}] += A[p * {rows} + i] * B[p * {cols} + j];
  kernel({k}, A, B, C, {ldc});
  float err = 0;
  for (int i = 0; i < {ldc * cols}; i++) err = fmaxf(err, fabsf(C[i] - R[i]));
  printf("%g\\n", err);
  return 0;
}}
"""
  src = tmp_path / "k.c"
  src.write_text(main_c)
  flags = ["-mavx2", "-mfma"] if c["isa"] == "avx2" else ["-msse2"]
  subprocess.run([cc, "-O2", "-std=gnu11", *flags, "-o", str(tmp_path / "k"), str(src), "-lm"],
                 check=True)
  out = subprocess.run([str(tmp_path / "k")], capture_output=True, text=True, check=True)
  assert float(out.stdout) == 0.0  # small integers: exact in float32, whatever the order


def test_c_kernel_refuses_other_tasks():
  from diffsim.search.codegen import c_kernel

  with pytest.raises(ValueError, match="gemm only"):
    c_kernel(TASKS["dot"], TASKS["dot"].default)
