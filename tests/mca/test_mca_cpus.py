"""mca_cpus lists the names with a real, non-generic scheduling model."""

from __future__ import annotations

import pytest

from diffsim.mca import mca_cpu_groups, mca_cpus

pytestmark = pytest.mark.mca


def test_real_models_listed(llvm_mca):
  cpus = mca_cpus()
  assert {"haswell", "skylake", "znver3", "znver1", "btver2", "icelake-server"} <= set(cpus)
  assert cpus == sorted(cpus)


def test_generic_and_modelless_names_excluded(llvm_mca):
  cpus = set(mca_cpus())
  # No instruction-level model at all (llvm-mca refuses them).
  assert not cpus & {"i386", "i686", "pentium4", "k8", "athlon64", "amdfam10", "bdver3"}
  # The generic model and the names that reuse it.
  assert not cpus & {"generic", "x86-64", "x86-64-v2", "core2", "nehalem"}
  assert "notacpu" not in cpus


def test_generic_class_on_request(llvm_mca):
  cpus = set(mca_cpus(include_generic=True))
  assert {"generic", "sandybridge", "x86-64", "haswell"} <= cpus
  assert "i386" not in cpus


def test_groups_join_aliases(llvm_mca):
  groups = {name: tuple(g) for g in mca_cpu_groups() for name in g}
  assert "core-avx2" in groups["haswell"]
  assert "x86-64" in groups["generic"]
  assert "znver3" not in groups["znver2"]
