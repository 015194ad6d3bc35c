"""Batch runs of the real llvm-mca 14 over many basic blocks, with per-block errors.

Each block becomes one `# LLVM-MCA-BEGIN bN` / `# LLVM-MCA-END bN` region of a
chunk file, and one llvm-mca process simulates a whole chunk (`-json`, with the
instruction-info and resource-pressure views off, so only the summary is printed).
Chunks run in parallel: the workers are the llvm-mca processes, driven from a thread
pool (the Python side only waits and parses a small JSON document).

What this simplifies: only `SummaryView.TotalCycles` is read back. What it guarantees:
a returned number is one that llvm-mca printed for that block in a run where llvm-mca
reported no error at all, with the region names and instruction counts checked, so a
number is never silently wrong.

Error isolation. llvm-mca 14 reports two kinds of bad input on stderr:
- parse errors, `<stdin>:LINE:COL: error: ...`, after which it drops the line and goes
  on with exit status 0; the line number is mapped back to its block;
- instruction errors (`error: found an unsupported instruction ...` followed by
  `note: instruction: TEXT`), after which it rejects the whole file with status 1; the
  instruction text is matched against the chunk's lines.
The blocks named this way get an error row, and the rest of the chunk is simulated
again without them. Whatever cannot be attributed (an unmatched message, a crash, a
missing or misnamed region) makes the chunk split in halves, down to single blocks,
so that every other block still gets its number.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import json
import math
import os
import re
import sys
from typing import Iterable, Sequence

from diffsim.mca.tools import McaError, run_tool

_TRIPLE = "-mtriple=x86_64-unknown-unknown"
# Views that llvm-mca 14 prints by default; switching them off leaves the summary only
# (in JSON: the summary, the instruction list and the target info).
_QUIET = ("-resource-pressure=0", "-instruction-info=0")

_LINE_DIAG = re.compile(r"^<stdin>:(\d+):(\d+): (error|warning): (.*)$")
_NOTE_INSTR = re.compile(r"^note: instruction:\s*(.*)$")


@dataclasses.dataclass(frozen=True)
class McaResult:
  """llvm-mca's verdict on one block.

  Attributes:
    cycles: `SummaryView.TotalCycles` for the requested iterations, or None.
    error: why there is no number (quotes llvm-mca's message and the instruction), or
      None when `cycles` is set.
  """

  cycles: int | None
  error: str | None


@dataclasses.dataclass(frozen=True)
class _Block:
  """One prepared block: its index in the request and its assembly statements."""

  idx: int
  lines: tuple[str, ...]  # the block's non-empty lines, comments removed
  statements: int  # how many instructions llvm-mca should list for it (-1: unknown)


def steady(c2n, cn, n):
  """Steady-state throughput in cycles per 100 iterations, BHive's convention.

  `100 * (cycles(2N) - cycles(N)) / N`: the one-off fill and drain of the pipeline
  cancel in the difference. Works on scalars and on numpy arrays alike.

  Args:
    c2n: Total Cycles for 2N iterations.
    cn: Total Cycles for N iterations.
    n: N.

  Returns:
    Cycles per 100 iterations (a float, or an array like the inputs).

  >>> steady(209, 109, 100)
  100.0
  """
  return 100.0 * (c2n - cn) / n


def per_100(texts: Sequence[str], mcpu: str, *, iterations: int = 100,
            throughput: str = "total", progress: bool = False
            ) -> list[tuple[float | None, str | None]]:
  """llvm-mca's cycles per 100 iterations of each text, or why it has none: Total Cycles
  of `iterations` scaled to 100 (`throughput="total"`), or the steady state of N and 2N
  iterations (`"steady"`, `steady`). The one place where commands, calibration and
  benchmarks turn llvm-mca runs into throughputs."""
  counts = (iterations,) if throughput == "total" else (iterations, 2 * iterations)
  runs = [run_mca(texts, mcpu, iterations=n, progress=progress) for n in counts]
  out: list[tuple[float | None, str | None]] = []
  for res in zip(*runs):
    bad = next((r.error for r in res if r.cycles is None), None)
    if bad is not None:
      out.append((None, bad))
    elif throughput == "total":
      out.append((res[0].cycles * 100.0 / iterations, None))
    else:
      out.append((float(steady(res[1].cycles, res[0].cycles, iterations)), None))
  return out


def _strip(text: str) -> list[str]:
  """The block's lines without comments and blank lines.

  Removing comments also removes any `# LLVM-MCA-...` marker a text might carry, which
  would otherwise end or open regions of other blocks.
  """
  out = []
  for raw in text.split("\n"):
    line = raw.split("#", 1)[0].strip()
    if line:
      out.append(line)
  return out


def _prepare(idx: int, text: str) -> _Block | McaResult:
  """Turns one text into a `_Block`, or an error row when there is nothing to run."""
  lines = _strip(text)
  if not lines:
    return McaResult(None, "empty block: no instructions to simulate")
  # Directives (.rept, .code32, ...) and labels can change how the following lines
  # parse or expand, so such a block runs alone, and its instruction count is unknown.
  isolated = any(ln.startswith(".") or re.match(r"^[\w.$]+:", ln) for ln in lines)
  # `;` separates statements on one line in AT&T syntax.
  count = -1 if isolated else sum(len([s for s in ln.split(";") if s.strip()]) for ln in lines)
  return _Block(idx, tuple(lines), count)


def _norm(s: str) -> str:
  """Whitespace-insensitive form of an instruction, to match llvm-mca's echo of it."""
  return " ".join(s.replace(",", ", ").split())


def _render(blocks: Sequence[_Block]) -> tuple[str, list[int]]:
  """The chunk file, and for each of its lines (1-based) the block it belongs to."""
  lines: list[str] = []
  owner: list[int] = [-1]  # line 0 does not exist
  for b in blocks:
    lines.append(f"# LLVM-MCA-BEGIN b{b.idx}")
    owner.append(-1)
    lines.extend(b.lines)
    owner.extend([b.idx] * len(b.lines))
    lines.append(f"# LLVM-MCA-END b{b.idx}")
    owner.append(-1)
  return "\n".join(lines) + "\n", owner


@dataclasses.dataclass(frozen=True)
class _Diagnosis:
  """What llvm-mca's stderr says about a chunk."""

  blamed: dict[int, str]  # block idx -> error message
  unexplained: list[str]  # error lines that could not be tied to a block


def _diagnose(stderr: str, blocks: Sequence[_Block], owner: list[int]) -> _Diagnosis:
  """Attributes llvm-mca's error messages to blocks."""
  blamed: dict[int, str] = {}
  unexplained: list[str] = []
  by_idx = {b.idx: b for b in blocks}
  lines = stderr.splitlines()
  for k, line in enumerate(lines):
    m = _LINE_DIAG.match(line)
    if m:
      lineno, kind, msg = int(m.group(1)), m.group(3), m.group(4)
      if kind != "error":
        continue  # warnings do not change what llvm-mca simulates for the block
      idx = owner[lineno] if 0 < lineno < len(owner) else -1
      if idx < 0:
        unexplained.append(line)
        continue
      src = by_idx[idx].lines
      line_in_block = lineno - owner.index(idx) + 1
      text = src[line_in_block - 1] if 0 < line_in_block <= len(src) else "?"
      blamed.setdefault(
        idx, f"llvm-mca: error: {msg} (block line {line_in_block}: '{text}')"
      )
      continue
    if line.startswith("error:"):
      note = _NOTE_INSTR.match(lines[k + 1]) if k + 1 < len(lines) else None
      hits = []
      if note:
        target = _norm(note.group(1))
        # The same instruction fails in every block that holds it, so all of them are
        # blamed at once rather than one per rerun.
        hits = [
          b.idx
          for b in blocks
          if any(_norm(s) == target for ln in b.lines for s in ln.split(";"))
        ]
      if hits:
        for idx in hits:
          blamed.setdefault(idx, f"llvm-mca: {line} (instruction: '{note.group(1).strip()}')")
      else:
        unexplained.append(line + (" " + lines[k + 1] if note else ""))
  return _Diagnosis(blamed, unexplained)


def _parse_regions(stdout: str) -> list[dict] | None:
  """The `CodeRegions` list of llvm-mca's JSON, or None if the output is not that."""
  try:
    doc = json.loads(stdout)
    regions = doc["CodeRegions"]
  except (ValueError, KeyError, TypeError):
    return None
  return regions if isinstance(regions, list) else None


def _check_regions(regions: list[dict], blocks: Sequence[_Block]) -> dict[int, int] | None:
  """Maps block idx -> TotalCycles if the regions are exactly the blocks, else None."""
  if len(regions) != len(blocks):
    return None
  out = {}
  for region, b in zip(regions, blocks):
    try:
      name = region["Name"]
      cycles = region["SummaryView"]["TotalCycles"]
      n_instr = len(region["Instructions"])
    except (KeyError, TypeError):
      return None
    if name != f"b{b.idx}" or not isinstance(cycles, int):
      return None
    if b.statements >= 0 and n_instr != b.statements:
      return None
    out[b.idx] = cycles
  return out


def _run_chunk(
  blocks: Sequence[_Block], args: tuple[str, ...]
) -> dict[int, McaResult]:
  """Simulates a chunk and returns a result for every one of its blocks."""
  results: dict[int, McaResult] = {}
  pending = list(blocks)
  while pending:
    text, owner = _render(pending)
    proc = run_tool("llvm-mca", args, text)
    diag = _diagnose(proc.stderr, pending, owner)
    if diag.blamed:
      # Drop the blamed blocks and rerun the rest, so that every number kept comes from
      # a run without any error.
      for idx, msg in diag.blamed.items():
        results[idx] = McaResult(None, msg)
      pending = [b for b in pending if b.idx not in diag.blamed]
      continue
    regions = _parse_regions(proc.stdout) if proc.returncode == 0 else None
    cycles = None
    if regions is not None and not diag.unexplained:
      cycles = _check_regions(regions, pending)
    if cycles is not None:
      results.update({i: McaResult(c, None) for i, c in cycles.items()})
      return results
    if len(pending) > 1:
      half = len(pending) // 2
      results.update(_run_chunk(pending[:half], args))
      results.update(_run_chunk(pending[half:], args))
      return results
    results[pending[0].idx] = McaResult(None, _single_failure(proc, regions, diag))
    return results
  return results


def _single_failure(proc, regions, diag: _Diagnosis) -> str:
  """The error message for a lone block that produced no trustworthy number."""
  if diag.unexplained:
    return "llvm-mca: " + "; ".join(diag.unexplained)
  if proc.returncode != 0:
    tail = " ".join(proc.stderr.split())[-300:]
    return f"llvm-mca exited with status {proc.returncode}: {tail or 'no message'}"
  if regions is None:
    return "llvm-mca printed no JSON report for this block"
  if not regions:
    return "llvm-mca produced no output for this region"
  return (
    "llvm-mca's report does not match the block (region name or instruction count "
    "differs from the input)"
  )


@functools.lru_cache(maxsize=None)
def _check_config(mcpu: str, extra_args: tuple[str, ...]) -> None:
  """Raises McaError once if llvm-mca rejects the CPU or the options themselves.

  Without this, a bad `-mcpu` would fail every chunk and send each into bisection.
  """
  args = (_TRIPLE, f"-mcpu={mcpu}", "-json", *_QUIET, "-iterations=1", *extra_args)
  proc = run_tool("llvm-mca", args, "nop\n")
  problems = [
    ln for ln in proc.stderr.splitlines()
    if ln.startswith("error:") or "not a recognized processor" in ln
    or "Unknown command line argument" in ln or "for the -" in ln
  ]
  if proc.returncode != 0 or problems or _parse_regions(proc.stdout) is None:
    msg = "; ".join(problems) or " ".join(proc.stderr.split()) or "no output"
    raise McaError(f"llvm-mca rejects -mcpu={mcpu} {' '.join(extra_args)}: {msg}")


def _chunks(blocks: list[_Block], size: int) -> Iterable[list[_Block]]:
  """Consecutive chunks of `size` blocks; blocks of unknown length run alone."""
  regular = [b for b in blocks if b.statements >= 0]
  for i in range(0, len(regular), size):
    yield regular[i:i + size]
  for b in blocks:
    if b.statements < 0:
      yield [b]


def run_mca(
  texts: Sequence[str],
  mcpu: str,
  *,
  iterations: int = 100,
  chunk: int = 2000,
  jobs: int | None = None,
  extra_args: Sequence[str] = (),
  progress: bool = False,
) -> list[McaResult]:
  """Runs llvm-mca 14 on many blocks and returns each one's Total Cycles.

  The result for a block is the number llvm-mca prints when that block is its only
  input (tests check this), but many blocks share one process.

  Args:
    texts: one AT&T assembly text per block, instructions separated by newlines
      (`;` also separates statements; `#` starts a comment).
    mcpu: llvm-mca's `-mcpu` (see `mca_cpus()`).
    iterations: `-iterations`, at least 1.
    chunk: the most blocks per llvm-mca process. With several jobs, chunks shrink so
      that every job gets at least two.
    jobs: llvm-mca processes run at once; default `os.cpu_count()`.
    extra_args: more llvm-mca options, e.g. `["-noalias=false"]`.
    progress: print progress to stderr.

  Returns:
    One `McaResult` per text, in order.

  Raises:
    McaError: llvm-mca rejects the CPU or the options (nothing is per-block then).
    FileNotFoundError: llvm-mca 14 is not installed.

  >>> run_mca(["addl %ecx, %eax\\nimull %eax, %eax"], "haswell")  # doctest: +SKIP
  [McaResult(cycles=403, error=None)]
  """
  if iterations < 1:
    raise ValueError(f"iterations must be >= 1, got {iterations}")
  if chunk < 1:
    raise ValueError(f"chunk must be >= 1, got {chunk}")
  jobs = max(1, jobs if jobs is not None else (os.cpu_count() or 1))
  extra = tuple(str(a) for a in extra_args)
  results: list[McaResult | None] = [None] * len(texts)
  blocks: list[_Block] = []
  for i, text in enumerate(texts):
    prepared = _prepare(i, text)
    if isinstance(prepared, McaResult):
      results[i] = prepared
    else:
      blocks.append(prepared)
  if blocks:
    _check_config(mcpu, extra)
    args = (_TRIPLE, f"-mcpu={mcpu}", "-json", *_QUIET, f"-iterations={iterations}", *extra)
    # With several jobs, cut at least two chunks per job: block costs are heavy-tailed,
    # and one slow chunk per job would leave the other jobs idle at the end.
    per_job = 1 if jobs == 1 else 2 * jobs
    size = min(chunk, max(1, math.ceil(len(blocks) / per_job)))
    done = 0
    with concurrent.futures.ThreadPoolExecutor(max_workers=jobs) as pool:
      futures = [pool.submit(_run_chunk, c, args) for c in _chunks(blocks, size)]
      for fut in concurrent.futures.as_completed(futures):
        part = fut.result()
        for idx, res in part.items():
          results[idx] = res
        done += len(part)
        if progress:
          print(f"llvm-mca -mcpu={mcpu}: {done}/{len(blocks)} blocks", file=sys.stderr)
  missing = [i for i, r in enumerate(results) if r is None]
  if missing:  # a bug in this module, never a property of the input
    raise McaError(f"internal error: no result for blocks {missing[:10]}")
  return results  # type: ignore[return-value]
