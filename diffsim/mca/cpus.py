"""Which x86-64 `-mcpu` names give llvm-mca 14 a real, CPU-specific scheduling model.

`llvm-mca -mcpu=help` lists about 90 names, but many of them cannot be simulated or
quietly stand for another model:
- Names without an instruction-level model (i386 ... pentium4, k8, amdfam10, bdver3/4,
  btver1, ...) make llvm-mca stop with "unable to find instruction-level scheduling
  information"; unknown names print "... is not a recognized processor ...".
- In LLVM 14, `generic` (and `x86-64`, `x86-64-v2`, core2, nehalem, westmere, penryn,
  yonah, corei7, sandybridge, ivybridge, ...) all use one and the same model.

The check. Every name simulates one probe block (base x86-64 and SSE2 only, so every
model accepts it) with the instruction-info view on. A name counts when llvm-mca
(1) exits 0 with nothing on stderr, (2) reports at least one processor resource, and
(3) yields a fingerprint -- the resource list, each probe instruction's uops, latency
and reciprocal throughput, the dispatch width and the Total Cycles -- that differs from
the fingerprint of `-mcpu=generic`. So a name is never listed when its results are
indistinguishable from the generic model's. The price: Sandy Bridge and Ivy Bridge, whose
model *is* LLVM 14's generic model, are not listed either; pass `include_generic=True`
to get the names of that class too. Names that are aliases of one model (core-avx2 and
knl share haswell's) are all listed; `mca_cpu_groups()` says which share a model.
"""

from __future__ import annotations

import concurrent.futures
import functools
import hashlib
import json
import re

from diffsim.mca.bridge import _TRIPLE
from diffsim.mca.tools import run_tool

# Base x86-64 + SSE2 only: integer ALU, multiply, divide, load, store, folded load,
# stack, FP sqrt/mul and a shuffle, to touch many resources of each model.
_PROBE = "\n".join([
  "addl %ecx, %eax",
  "imull %eax, %edx",
  "movq (%rdi), %rax",
  "movq %rax, 8(%rsi)",
  "divl %ecx",
  "sqrtsd %xmm1, %xmm2",
  "mulps %xmm3, %xmm4",
  "pshufd $27, %xmm5, %xmm6",
  "addq (%rsi), %rbx",
  "pushq %rbx",
  "popq %rcx",
  "cmovel %esi, %edi",
]) + "\n"


def _help_names() -> list[str]:
  """The CPU names `llvm-mca -mcpu=help` lists for x86-64 (it prints them on stderr)."""
  proc = run_tool("llvm-mca", ["-mtriple=x86_64", "-mcpu=help"], "")
  text = proc.stdout + proc.stderr
  section = text.split("Available CPUs for this target:", 1)[-1]
  section = section.split("Available features for this target:", 1)[0]
  return [m.group(1) for m in re.finditer(r"^\s+(\S+)\s+- Select the", section, re.M)]


def _fingerprint(mcpu: str) -> str | None:
  """A digest of the model's behaviour on the probe block; None if it has no model."""
  proc = run_tool(
    "llvm-mca",
    [_TRIPLE, f"-mcpu={mcpu}", "-json", "-resource-pressure=0", "-iterations=10"],
    _PROBE,
  )
  if proc.returncode != 0 or proc.stderr.strip():
    return None
  try:
    doc = json.loads(proc.stdout)
    resources = doc["TargetInfo"]["Resources"]
    region = doc["CodeRegions"][0]
    key = [
      resources,
      region["InstructionInfoView"],
      region["SummaryView"]["TotalCycles"],
      region["SummaryView"]["DispatchWidth"],
    ]
  except (ValueError, KeyError, IndexError, TypeError):
    return None
  if not resources:
    return None
  return hashlib.sha256(json.dumps(key, sort_keys=True).encode()).hexdigest()


@functools.lru_cache(maxsize=None)
def _fingerprints() -> tuple[tuple[str, str | None], ...]:
  """(name, fingerprint) for every listed name; cached for the process."""
  names = _help_names()
  with concurrent.futures.ThreadPoolExecutor(max_workers=8) as pool:
    prints = list(pool.map(_fingerprint, names))
  return tuple(zip(names, prints))


def mca_cpus(*, include_generic: bool = False) -> list[str]:
  """The x86-64 CPU names for which llvm-mca 14 has a real scheduling model.

  See the module docstring for the check. The result is cached per process (the
  first call runs llvm-mca about 90 times, about a second).

  Args:
    include_generic: also list the names whose model is the generic one
      (generic, sandybridge, ivybridge, x86-64, ...).

  Returns:
    Sorted CPU names, e.g. `[..., "haswell", ..., "skylake", ..., "znver3"]`.

  >>> {"haswell", "skylake", "znver3"} <= set(mca_cpus())  # doctest: +SKIP
  True
  """
  table = _fingerprints()
  generic = dict(table).get("generic")
  return sorted(
    name for name, fp in table
    if fp is not None and (include_generic or fp != generic)
  )


def mca_cpu_groups() -> list[list[str]]:
  """The names of `mca_cpus(include_generic=True)` grouped by identical model.

  Names in one group give identical results on the probe (for example haswell,
  core-avx2, knl, knm and x86-64-v3), so a sweep needs only one of each group.
  The group of `generic` is included.
  """
  groups: dict[str, list[str]] = {}
  for name, fp in _fingerprints():
    if fp is not None:
      groups.setdefault(fp, []).append(name)
  return sorted(sorted(g) for g in groups.values())
