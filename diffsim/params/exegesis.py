"""Reads scheduling classes from llvm-exegesis 14's analysis mode.

llvm-exegesis prints, for every benchmark point whose measurement disagrees with the
CPU model, the model's view of that point's scheduling class
(diffsim/sim/MODEL.md#llvm-exegesis):
its name, NumMicroOps, the write-latency entries (with their WriteResourceIDs when
there are several), RThroughput, the resource list as written in the model
(`WriteProcRes`: groups named, cycles not expanded) and the idealised per-unit
pressure. No measurement is needed: a point with an absurd latency is always
"inconsistent", so one file with one point per opcode key lists every class.

Points carry their opcode key in the `config` field, which the HTML report repeats,
so `@same` variants of one opcode stay apart. The instruction is written as
`OPCODE op1 op2 ...` with the MCInst's operands (see `mctools.exegesis_operand`),
so llvm-exegesis resolves variant classes (zero idioms and the like) from the same
operands that llvm-mca sees.
"""

from __future__ import annotations

import dataclasses
import html
import os
import re
import tempfile

from diffsim.llvmtools import run_tool
from diffsim.params import mctools

_POINT = """---
mode:            latency
key:
  instructions:
    - '{inst}'
  config:          '{config}'
  register_initial_values: []
cpu_name:        {cpu}
llvm_triple:     {triple}
num_repetitions: 10000
measurements:
  - {{ key: latency, value: 100000.0, per_snippet_value: 100000.0 }}
error:           ''
info:            ''
assembled_snippet: ''
...
"""


@dataclasses.dataclass
class SchedClass:
  """One resolved scheduling class as llvm-exegesis reports it.

  Attributes:
    name: the class name (`WriteALULd_ReadAfterLd`).
    valid: False when the CPU model has no data for the class (unsupported).
    variant: the class was reached through a variant (resolved from operands).
    uops: NumMicroOps.
    latencies: the write-latency entries, in definition order: (cycles, resource id).
    rthroughput: the static reciprocal throughput.
    resources: [(resource name, cycles)] as written in the model.
    pressure: {unit name: idealised cycles}.
  """

  name: str
  valid: bool
  variant: bool = False
  uops: int = 0
  latencies: list = dataclasses.field(default_factory=list)
  rthroughput: float = 0.0
  resources: list = dataclasses.field(default_factory=list)
  pressure: dict = dataclasses.field(default_factory=dict)

  @property
  def max_latency(self) -> int:
    """The largest write latency (0 without writes), as llvm-mca's MaxLatency."""
    return max((c for c, _ in self.latencies), default=0)


def write_points(cpu: str, points: dict[str, str]) -> str:
  """The benchmarks-file text for `points` ({key: 'OPCODE operands'})."""
  return "".join(
      _POINT.format(inst=inst.strip(), config=key, cpu=cpu, triple=mctools.TRIPLE)
      for key, inst in points.items())


_SECTION = re.compile(r'<div class="inconsistency">(.*?)</div>', re.DOTALL)
_CLASS_NAME = re.compile(r'<span class="sched-class-name">([^<]*)</span>')
_MEMBER = re.compile(
    r'<li><span class="mono" title="[^"]*">([^<]*)</span> <span class="mono">([^<]*)</span>')
_ROW = re.compile(r'<table class="sched-class-desc">.*?</tr>\s*<tr>(.*?)</tr>', re.DOTALL)
_CELL = re.compile(r"<td>(.*?)</td>", re.DOTALL)
_LI = re.compile(r"<li>(.*?)</li>", re.DOTALL)
_TAG = re.compile(r"<[^>]+>")


def _items(cell: str) -> list[str]:
  return [html.unescape(_TAG.sub("", li)).strip() for li in _LI.findall(cell)]


def parse_report(text: str) -> dict[str, SchedClass]:
  """Parses the inconsistencies HTML into {config (= key): SchedClass}."""
  out: dict[str, SchedClass] = {}
  for sec in _SECTION.findall(text):
    name = html.unescape(_CLASS_NAME.search(sec).group(1))
    members = [html.unescape(cfg) for _, cfg in _MEMBER.findall(sec)]
    row = _ROW.search(sec)
    cells = _CELL.findall(row.group(1)) if row else []
    if not cells or "10004" not in cells[0]:  # the check mark: a valid class
      sc = SchedClass(name=name, valid=False)
    else:
      lats = []
      for item in _items(cells[3]):
        m = re.match(r"(-?\d+)(?: \(WriteResourceID (\d+)\))?", item)
        lats.append((int(m.group(1)), int(m.group(2) or 0)))
      res = []
      for item in _items(cells[5]):
        rname, cyc = item.split(":")
        res.append((rname.strip(), int(cyc)))
      pres = {}
      for item in _items(cells[6]):
        rname, cyc = item.split(":")
        pres[rname.strip()] = float(cyc)
      sc = SchedClass(name=name, valid=True, variant="10004" in cells[1],
                      uops=int(_TAG.sub("", cells[2])), latencies=lats,
                      rthroughput=float(_TAG.sub("", cells[4]) or 0), resources=res,
                      pressure=pres)
    for key in members:
      out[key] = sc
  return out


def read_classes(cpu: str, points: dict[str, str], *, workdir: str | None = None
                 ) -> tuple[dict[str, SchedClass], dict[str, str]]:
  """Runs llvm-exegesis' analysis on one point per key.

  Args:
    cpu: llvm -mcpu name.
    points: {key: 'OPCODE op op ...'}.
    workdir: where to keep the files (a temporary directory when None).

  Returns:
    ({key: SchedClass}, {key: reason}) for the points llvm-exegesis rejected.
  """
  rejected: dict[str, str] = {}
  points = dict(points)
  with tempfile.TemporaryDirectory() as tmp:
    d = workdir or tmp
    yml, rep, csv = (os.path.join(d, f"exegesis-{cpu}.{e}") for e in ("yaml", "html", "csv"))
    while True:
      with open(yml, "w") as f:
        f.write(write_points(cpu, points))
      p = run_tool("llvm-exegesis", [
          "-mode=analysis", f"-benchmarks-file={yml}",
          f"-analysis-inconsistencies-output-file={rep}",
          f"-analysis-clusters-output-file={csv}", "-analysis-numpoints=1",
          "-analysis-clustering=naive"])
      if p.returncode == 0:
        break
      # A point llvm-exegesis cannot read fails the whole file: drop it and retry.
      m = re.search(r":(\d+):\d+: error: (.*)", p.stderr)
      if not m:
        raise mctools.ToolError(f"llvm-exegesis: {p.stderr[:2000]}")
      line = int(m.group(1))
      key = list(points)[(line - 1) // _POINT.count("\n")]
      rejected[key] = f"llvm-exegesis: {m.group(2)}"
      del points[key]
    with open(rep) as f:
      classes = parse_report(f.read())
  for key in points:
    if key not in classes:
      rejected[key] = "llvm-exegesis reported no class"
  return classes, rejected
