"""`benchmarks/gpu.py --dry-run`: the GPU benchmark, whole, at toy size on the CPU, so
that the script is known to run before anyone rents a GPU for it."""

import json
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_gpu_benchmark_dry_run(tmp_path):
  from diffsim.llvmtools import find_llvm_tool

  try:
    find_llvm_tool("llvm-mca")
    mca = []
  except FileNotFoundError:
    mca = ["--skip-mca"]
  env = dict(os.environ, PYTHONPATH=os.pathsep.join(
      [str(ROOT)] + [p for p in [os.environ.get("PYTHONPATH")] if p]))
  env.pop("XLA_FLAGS", None)  # the script sets its own, before JAX starts
  out = tmp_path / "gpu.json"
  run = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu.py"), "--dry-run",
                        "--out", str(out), *mca], env=env, capture_output=True, text=True,
                       timeout=1800, check=False)
  assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
  record = json.loads(out.read_text())
  assert record["device"]["platform"] == "cpu" and record["dry_run"]
  figures = record["figures"]
  assert {"diffsim steady state (warm)", "diffsim sweep, 3 tables x 16 blocks"} <= set(figures)
  assert any(k.startswith("diffsim fit epoch") for k in figures)
  assert all(f["per_s"] > 0 for f in figures.values())
  checks = record["checks"]
  for name in ("steady: compiled once", "steady: one launch per chunk, not per cycle",
               "sweep: compiled once", "fit: compiled once", "under the memory ceiling"):
    assert checks[name] is True, name
  assert checks["steady: chunk per bucket"] == {"8": 8}  # 48 blocks in several chunks
  assert checks["sweep: tables per chunk"] == 2  # 3 tables in two chunks
  if not mca:
    assert checks["steady: equal to llvm-mca's"] == "100.0%"
  assert "blocks/s" in run.stdout or "items/s" in run.stdout
