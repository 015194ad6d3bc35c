"""Runs llvm-mca 14 and parses the views the extractor reads.

Everything here is a read-out of llvm-mca's own output, no modelling:

* `instruction_tables`: `-instruction-tables -show-barriers` on one line per key:
  NumMicroOps, MaxLatency, RThroughput, MayLoad, MayStore, HasSideEffects,
  LoadBarrier, StoreBarrier, and the static per-unit pressure (groups spread evenly
  over their members), plus the unit list (`Resources:`, with `[i.j]` sub-units
  giving NumUnits).
* `run_regions`: many small simulations in one process, one
  `# LLVM-MCA-BEGIN/END` region each, with either the text views (statistics) or
  `-json` (per-instruction timeline cycles).
* small parsers for the summary, `-retire-stats`, `-scheduler-stats`,
  `-register-file-stats` and `-dispatch-stats` text views.

llvm-mca refuses a whole file when one instruction cannot be modelled; the helpers
drop such lines, one at a time, and report them.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Sequence

from diffsim.llvmtools import find_llvm_tool
from diffsim.params import mctools


@dataclasses.dataclass
class InstrInfo:
  """One row of `-instruction-info`, with the static resource pressure."""

  uops: int
  latency: int
  rthroughput: float
  may_load: bool
  may_store: bool
  side_effects: bool
  load_barrier: bool
  store_barrier: bool
  pressure: dict  # unit name -> cycles (groups spread evenly), zero entries left out


@dataclasses.dataclass
class Units:
  """The processor resource units llvm-mca lists, in its order (bit order)."""

  names: list  # unit names
  counts: dict  # name -> NumUnits


def mca_args(cpu: str) -> list[str]:
  """The fixed part of every llvm-mca command line."""
  return [find_llvm_tool("llvm-mca"), f"-mtriple={mctools.TRIPLE}", f"-mcpu={cpu}"]


def _unsupported(stderr: str) -> str | None:
  """The instruction text llvm-mca complained about, or None."""
  m = re.search(r"error: (.*)\n(?:note: instruction: (.*))?", stderr)
  if not m:
    return None
  return (m.group(2) or "").strip() or m.group(1)


def run_checked(cpu: str, asm: str, args: Sequence[str]) -> str:
  """Runs llvm-mca on `asm`; raises `ToolError` with the complaint on any error."""
  p = mctools.run(mca_args(cpu) + list(args), asm)
  if "error:" in p.stderr:
    raise mctools.ToolError(p.stderr[:2000])
  return p.stdout


def filter_supported(cpu: str, lines: dict[str, str]) -> tuple[dict[str, str], dict[str, str]]:
  """Drops the lines llvm-mca cannot model on `cpu`.

  Args:
    cpu: -mcpu name.
    lines: {key: AT&T line}.

  Returns:
    ({key: line} that llvm-mca accepts together, {key: reason} for the others).
  """
  lines = dict(lines)
  rejected: dict[str, str] = {}
  while lines:
    # An instruction the CPU lacks (AVX2 on btver2) makes llvm-mca exit 1, naming it.
    p = mctools.run(mca_args(cpu) + ["-instruction-tables"], "\n".join(lines.values()) + "\n",
                    check_status=False)
    if "error:" not in p.stderr and p.returncode == 0:
      break
    m = re.search(r"<stdin>:(\d+):\d+: (error: .*)", p.stderr)
    if m:  # an assembler error names the line
      key = list(lines)[int(m.group(1)) - 1]
      rejected[key] = "llvm-mc: " + m.group(2)
      del lines[key]
      continue
    bad = _unsupported(p.stderr)
    hit = [k for k, v in lines.items() if bad and v.split() == bad.split()]
    if not hit:
      raise mctools.ToolError(f"llvm-mca: {p.stderr[:2000]}")
    for k in hit:
      rejected[k] = "llvm-mca: " + p.stderr.splitlines()[0].replace("error: ", "")
      del lines[k]
  return lines, rejected


def _parse_units(text: str) -> Units:
  """The `Resources:` list: `[i]   - Name` or `[i.j] - Name` per unit."""
  names: list[str] = []
  counts: dict[str, int] = {}
  block = text.split("\nResources:\n", 1)[1].split("\n\n", 1)[0]
  for m in re.finditer(r"^\[(\d+)(?:\.(\d+))?\]\s+-\s+(\S+)", block, re.MULTILINE):
    name = m.group(3)
    if name not in counts:
      names.append(name)
      counts[name] = 0
    counts[name] += 1
  return Units(names, counts)


def instruction_tables(cpu: str, lines: Sequence[str]) -> tuple[list[InstrInfo], Units]:
  """Static instruction info and per-unit pressure for each line.

  Args:
    cpu: -mcpu name.
    lines: AT&T instructions that llvm-mca accepts (see `filter_supported`).

  Returns:
    ([InstrInfo per line], units).
  """
  out = run_checked(cpu, "\n".join(lines) + "\n", ["-instruction-tables", "-show-barriers"])
  info_part, rest = out.split("\nResources:\n", 1)
  units = _parse_units(out)
  columns = [f"{n}.{i}" if units.counts[n] > 1 else n for n in units.names
             for i in range(units.counts[n])]
  rows = []
  head = None
  for line in info_part.splitlines():
    if line.startswith("[1]") and "Instructions:" in line:
      head = [m.start() for m in re.finditer(r"\[\d\]", line)]
      continue
    if head is None or not line.strip():
      continue
    cols = [line[a:a + 7].strip() for a in head]
    rows.append(InstrInfo(
        uops=int(cols[0]), latency=int(cols[1]), rthroughput=float(cols[2]),
        may_load=cols[3] == "*", may_store=cols[4] == "*", side_effects=cols[5] == "U",
        load_barrier=cols[6] == "*", store_barrier=cols[7] == "*", pressure={}))
  by_instr = rest.split("Resource pressure by instruction:\n", 1)[1].splitlines()[1:]
  for row, line in zip(rows, by_instr):
    vals = line.split()[:len(columns)]
    for col, v in zip(columns, vals):
      if v != "-":
        name = col.split(".")[0]
        row.pressure[name] = row.pressure.get(name, 0.0) + float(v)
  if len(rows) != len(lines):
    raise mctools.ToolError(f"instruction-tables: {len(rows)} rows for {len(lines)} lines")
  return rows, units


def region_file(regions: Sequence[Sequence[str]]) -> str:
  """An llvm-mca input with one named region (`r<i>`) per instruction list."""
  parts = []
  for i, body in enumerate(regions):
    parts.append(f"# LLVM-MCA-BEGIN r{i}")
    parts.extend(body)
    parts.append("# LLVM-MCA-END")
  return "\n".join(parts) + "\n"


def run_regions(cpu: str, regions: Sequence[Sequence[str]], args: Sequence[str], *,
                as_json: bool = False, chunk: int = 400) -> list:
  """Simulates each instruction list as its own region.

  Args:
    cpu: -mcpu name.
    regions: instruction lists (AT&T lines).
    args: extra llvm-mca flags (`-iterations=...`, views).
    as_json: add `-json` and return each region's JSON object; otherwise return
      each region's text.
    chunk: regions per llvm-mca process.

  Returns:
    One entry per region, in order.
  """
  out: list = []
  for start in range(0, len(regions), chunk):
    part = regions[start:start + chunk]
    text = run_checked(cpu, region_file(part), list(args) + (["-json"] if as_json else []))
    if as_json:
      got = json.loads(text)["CodeRegions"]
    else:
      got = re.split(r"\n\[\d+\] Code Region - r\d+\n", "\n" + text)[1:]
    if len(got) != len(part):
      raise mctools.ToolError(f"{len(got)} regions back for {len(part)}")
    out.extend(got)
  return out


# ----------------------------------------------------------------------------------------
# Text-view parsers


def parse_summary(text: str) -> dict:
  """Summary view: Iterations, Instructions, Total Cycles, Total uOps, Dispatch Width."""
  out = {}
  for key in ("Iterations", "Instructions", "Total Cycles", "Total uOps", "Dispatch Width"):
    m = re.search(rf"^{key}:\s+(\d+)", text, re.MULTILINE)
    if m:
      out[key] = int(m.group(1))
  return out


def parse_scheduler_queues(text: str) -> dict:
  """`-scheduler-stats` queue table: {resource: (avg, max used, size)}."""
  out = {}
  if "Scheduler's queue usage:" not in text:
    return out
  block = text.split("Scheduler's queue usage:", 1)[1]
  for m in re.finditer(r"^(\w+)\s+(\d+)\s+(\d+)\s+(\d+)\s*$", block, re.MULTILINE):
    out[m.group(1)] = (int(m.group(2)), int(m.group(3)), int(m.group(4)))
  return out


def parse_dispatch_stalls(text: str) -> dict:
  """`-dispatch-stats` stall counters: {RAT, RCU, SCHEDQ, LQ, SQ, GROUP, USH}."""
  return {m.group(1): int(m.group(2))
          for m in re.finditer(r"^(RAT|RCU|SCHEDQ|LQ|SQ|GROUP|USH)\s+-[^:]*:\s+(\d+)", text, re.MULTILINE)}


def parse_retire(text: str) -> dict:
  """`-retire-stats`: ROB size and the retire histogram {n retired: cycles}."""
  out = {"rob": None, "hist": {}}
  m = re.search(r"Total ROB Entries:\s+(\d+)", text)
  if m:
    out["rob"] = int(m.group(1))
  if "Retire Control Unit" in text:
    block = text.split("Retire Control Unit", 1)[1].split("Total ROB", 1)[0]
    for m in re.finditer(r"^\s*(\d+),\s+(\d+)", block, re.MULTILINE):
      out["hist"][int(m.group(1))] = int(m.group(2))
  return out


def parse_register_files(text: str) -> list[dict]:
  """`-register-file-stats`: one dict per numbered register file (file #0, the
  default unbounded one, is left out)."""
  files = []
  for m in re.finditer(r"\*  Register File #(\d+) -- (\w+):\n((?:   .*\n?)*)", text):
    d = {"index": int(m.group(1)), "name": m.group(2)}
    for line in m.group(3).splitlines():
      k, _, v = line.strip().partition(":")
      v = v.strip().split()[0] if v.strip() else ""
      if v.isdigit():
        d[k.strip()] = int(v)
    files.append(d)
  return files
