"""The resume log: an append-only record of finished blocks, so that an interrupted
run picks up where it stopped."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from diffsim.measure.build import MeasureError
from diffsim.measure.cpu import describe_cpu, same_model


class ResumeLog:
  """Append-only record of finished blocks, so that an interrupted run resumes.

  One JSON object per line: a header (CPU identity, configuration), then one line per
  finished row (`{"row": ..., "hex": ..., **record}`), flushed and fsynced as it is
  written. A half-written last line (the run was killed mid-write) is ignored. A log
  from another CPU is refused: its numbers would not belong in this file.
  """

  def __init__(self, path: Path, cpu: dict[str, object], config: dict[str, Any]):
    self.path = path
    self.done: dict[int, tuple[str, dict[str, Any]]] = {}
    header = {"diffsim_measure": 1, "cpu": cpu, "config": config}
    if path.exists():
      lines = path.read_text().splitlines()
      try:
        old = json.loads(lines[0]) if lines else None
      except json.JSONDecodeError:
        old = None
      if old is not None and old.get("cpu", {}).get("model") is not None and (
          not same_model(old["cpu"], cpu)):
        raise MeasureError(f"{path} holds measurements of another CPU "
                           f"({describe_cpu(old['cpu'])}); delete it to start over")
      for line in lines[1:]:
        try:
          rec = json.loads(line)
        except json.JSONDecodeError:
          continue
        self.done[rec.pop("row")] = (rec.pop("hex"), rec)
      self._f = open(path, "a")  # noqa: SIM115 (open for the whole run; see close)
    else:
      path.parent.mkdir(parents=True, exist_ok=True)
      self._f = open(path, "w")  # noqa: SIM115
      self._write(header)

  def lookup(self, row: int, hex_bytes: str) -> dict[str, Any] | None:
    """The record of `row` when it was these bytes, else None."""
    rec = self.done.get(row)
    return rec[1] if rec is not None and rec[0] == hex_bytes else None

  def add(self, row: int, hex_bytes: str, record: dict[str, Any]) -> None:
    self._write({"row": row, "hex": hex_bytes, **record})

  def _write(self, obj: dict) -> None:
    self._f.write(json.dumps(obj) + "\n")
    self._f.flush()
    os.fsync(self._f.fileno())

  def close(self) -> None:
    self._f.close()
