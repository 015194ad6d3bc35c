"""`diffsim calibrate`'s stages: probe, measure anchors and blocks, choose a base, fit.

Every stage leaves its result in the output folder and is recorded in
`calibrate.json` when it ends; a rerun skips the stages recorded there, a measuring
stage resumes from its `.partial` log (`diffsim.measure.harness`) and the fit from its
saved search state, so an interrupted calibration loses at most the measurement in
progress.

  DIR/calibrate.json   the CPU, the settings, each finished stage and its seconds
  DIR/probes.csv       the structure probes, measured; DIR/structure.json their verdicts
  DIR/anchors.csv      single instructions of the corpus sample, measured alone
  DIR/blocks.csv       corpus-sample blocks, measured
  DIR/measured.csv     all three: hex,cycles_per_100_iterations,spread,confidence,error,kind,name
  DIR/base.json        each candidate base table's error on the training rows
  DIR/exact/           the exact search's state; DIR/params.json the table
  DIR/report.json, DIR/report.md
"""

from __future__ import annotations

import csv
import dataclasses
import json
import math
import os
import time
from pathlib import Path

import numpy as np

MANIFEST = "calibrate.json"
KINDS = ("probe", "anchor", "block")


class CalibrateError(Exception):
  """A calibration that cannot go on, with the reason a person can act on."""


@dataclasses.dataclass(frozen=True)
class CalibrateConfig:
  """What a calibration measures and how long it may take.

  Attributes:
    minutes: wall-time budget; the fit gets what the measuring stages leave, less
      `report_minutes`.
    blocks: corpus-sample blocks to measure (`corpus-sample.csv`).
    forms, per_key: anchors per opcode key (`diffsim.fit.anchors.pick`).
    anchor_weight: how many blocks one anchor counts as in the fit.
    rounds: at most this many rounds of the exact search (the budget may stop it
      sooner).
    cap: judging blocks per opcode in the search.
    bases: candidate base tables; None picks by vendor (`candidate_bases`).
    seed: the split of the measured blocks into training, validation and test.
    quick: fewer passes per measurement (tests, notebooks).
  """

  minutes: float = 30.0
  blocks: int = 3000
  forms: int = 4
  per_key: int = 4
  anchor_weight: float = 4.0
  rounds: int = 3
  cap: int = 48
  bases: tuple[str, ...] | None = None
  seed: int = 0
  quick: bool = False
  report_minutes: float = 3.0


def candidate_bases(cpu: dict) -> tuple[str, ...]:
  """The tables a calibration may start from: llvm-mca's newest models of the CPU's
  vendor and the project's measured table of that vendor (every one's structure is
  then set by the probes).

  >>> candidate_bases({"vendor": "GenuineIntel"})
  ('skylake', 'icelake-client', 'graniterapids')
  """
  if cpu.get("vendor") == "AuthenticAMD":
    return ("znver2", "znver3", "zen5")
  return ("skylake", "icelake-client", "graniterapids")


class Manifest:
  """`calibrate.json`: which stages have ended, on which CPU, with which settings."""

  def __init__(self, out: Path, cpu: dict, config: CalibrateConfig):
    self.path = out / MANIFEST
    self.doc = dict(command="diffsim calibrate", cpu=cpu,
                    config=dataclasses.asdict(config), stages={})
    if self.path.exists():
      old = json.loads(self.path.read_text())
      if old.get("command") != "diffsim calibrate":
        raise CalibrateError(f"{self.path} was not written by diffsim calibrate")
      if {k: old["cpu"].get(k) for k in ("vendor", "family", "model", "stepping")} != \
          {k: cpu.get(k) for k in ("vendor", "family", "model", "stepping")}:
        raise CalibrateError(
            f"{out} holds a calibration of another CPU ({_cpu_name(old['cpu'])}; this is "
            f"{_cpu_name(cpu)}): choose another --out")
      self.doc["stages"] = old.get("stages", {})
      self.doc["started"] = old.get("started")
    self.doc["started"] = self.doc.get("started") or time.strftime("%Y-%m-%dT%H:%M:%SZ",
                                                                    time.gmtime())

  def done(self, stage: str) -> dict | None:
    return self.doc["stages"].get(stage)

  def finish(self, stage: str, seconds: float, **facts) -> None:
    self.doc["stages"][stage] = dict(seconds=round(seconds, 1), **facts)
    self.save()

  def save(self) -> None:
    write_atomic(self.path, json.dumps(self.doc, indent=1, default=float) + "\n")


def _cpu_name(cpu: dict) -> str:
  from diffsim.measure import describe_cpu

  return describe_cpu(cpu)


def write_atomic(path: Path, text: str) -> None:
  """Writes a file whole or not at all (a full disk names the file)."""
  tmp = path.with_name(path.name + ".tmp")
  try:
    tmp.write_text(text)
    os.replace(tmp, path)
  except OSError as e:
    tmp.unlink(missing_ok=True)
    raise CalibrateError(f"cannot write {path}: {e.strerror}") from None


def check_out_dir(out: Path) -> None:
  """`out` must be new, empty, or a calibration's own folder: anything else (a fit's
  output, a home directory) is refused before a file is written into it."""
  if out.exists() and not out.is_dir():
    raise CalibrateError(f"--out {out} is a file, not a folder")
  if out.is_dir() and any(out.iterdir()) and not (out / MANIFEST).exists():
    names = ", ".join(sorted(p.name for p in out.iterdir())[:4])
    raise CalibrateError(f"--out {out} holds files calibrate did not write ({names}...): "
                         "give a new or empty folder")


# ---- measuring ------------------------------------------------------------------------

# BHive's layout first (hex, label), so that every command reads these files as they are.
MEASURED_HEADER = ["hex", "cycles_per_100_iterations", "spread", "confidence", "error",
                   "kind", "name"]


def measure_rows(out: Path, kind: str, names: list[str], hexes: list[str], config,
                 progress: bool) -> list[dict]:
  """Measures `hexes` (resuming from `DIR/KIND.partial`) and writes `DIR/KIND.csv`."""
  from diffsim.measure import measure_hexes

  partial = out / f"{kind}s.partial"
  try:
    results, stats = measure_hexes(hexes, config, log_path=partial, progress=progress)
  except OSError as e:
    raise CalibrateError(f"cannot write {partial}: {e.strerror}") from None
  rows = [dict(kind=kind, name=n, hex=h, cycles_per_100_iterations=r.cycles,
               spread=r.spread, confidence=getattr(r, "confidence", None), error=r.error)
          for n, h, r in zip(names, hexes, results)]
  write_rows(out / f"{kind}s.csv", rows)
  partial.unlink(missing_ok=True)
  return rows


def _fmt(v) -> str:
  if v is None or (isinstance(v, float) and not math.isfinite(v)):
    return ""
  return f"{v:.4f}" if isinstance(v, float) else str(v)


def write_rows(path: Path, rows: list[dict]) -> None:
  import io

  buf = io.StringIO()
  w = csv.writer(buf, lineterminator="\n")
  w.writerow(MEASURED_HEADER)
  for r in rows:
    w.writerow([_fmt(r.get(k)) for k in MEASURED_HEADER])
  write_atomic(path, buf.getvalue())


def read_rows(path: Path) -> list[dict]:
  with open(path, newline="") as f:
    rows = list(csv.DictReader(f))
  for r in rows:
    for k in ("cycles_per_100_iterations", "spread", "confidence"):
      r[k] = float(r[k]) if r.get(k) else None
    r["error"] = r.get("error") or None
  return rows


def weights_of(rows: list[dict]) -> np.ndarray:
  """Each row's fit weight from its measurement (`diffsim.measure.confidence_weights`)."""
  from diffsim.measure import confidence_weights

  col = lambda k: tuple(math.nan if r[k] is None else r[k] for r in rows)  # noqa: E731
  return confidence_weights({"spread": col("spread"), "confidence": col("confidence")},
                            n=len(rows))
