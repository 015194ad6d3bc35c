"""Learning through the simulator, end to end through the `diffsim fit` command."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

from diffsim.cli import main
from diffsim.params.table import load_table

FIT = ["fit", "--shipped", "zen5-small", "--init", "znver3", "--batch-size", "32",
       "--mca"]  # no llvm-mca rows in these reports: the tests time diffsim


def _report(out: Path) -> dict:
  return {r["name"]: r for r in json.loads((out / "report.json").read_text())
          ["held_out_results"]}


def test_fit_learns_on_measured_blocks_and_exports_a_usable_table(tmp_path, capsys):
  out = tmp_path / "run"
  assert main(FIT + ["--limit", "400", "--epochs", "3", "--out", str(out)]) == 0
  rows = _report(out)
  before = rows["diffsim znver3 (initial table)"]
  after = rows["diffsim fitted (learned, rounded)"]
  assert after["n"] == before["n"] > 20
  assert after["mape"] < 0.8 * before["mape"], (before, after)
  assert (out / "loss.png").stat().st_size > 1000
  history = json.loads((out / "phase1" / "history.json").read_text())
  assert history[-1]["val_hard"] < history[0]["val_hard"]
  # The exported table is an ordinary table: integer numbers, usable by eval.
  table = load_table(str(out / "params.json"))
  assert np.all(np.asarray(table.params.latency) == np.round(table.params.latency))
  capsys.readouterr()
  assert main(["eval", "--shipped", "zen5-small", "--limit", "50", "--params",
               str(out / "params.json"), "--json"]) == 0
  result = json.loads(capsys.readouterr().out)
  assert result["n"] > 40 and result["mape"] < 1.0


def _fit_process(out: Path, epochs: int):
  cmd = [sys.executable, "-m", "diffsim.cli"] + FIT + [
      "--limit", "150", "--epochs", str(epochs), "--out", str(out)]
  return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)


def test_a_killed_fit_resumes_with_nothing_lost(tmp_path):
  """Kill a fit once its first epoch is checkpointed; the rerun resumes there and
  ends with exactly the table of a run that was never interrupted."""
  whole = _fit_process(tmp_path / "whole", 3)
  assert whole.wait(timeout=900) == 0, whole.stdout.read()
  out = tmp_path / "killed"
  proc = _fit_process(out, 3)
  history = out / "phase1" / "history.json"
  deadline = time.time() + 900
  while not history.exists() and proc.poll() is None and time.time() < deadline:
    time.sleep(0.5)
  assert proc.poll() is None, "finished before it could be interrupted"
  os.kill(proc.pid, signal.SIGKILL)
  proc.wait()
  assert not (out / "params.json").exists()
  done = json.loads(history.read_text())
  resumed = _fit_process(out, 3)
  log = resumed.communicate(timeout=900)[0]
  assert resumed.returncode == 0, log
  assert f"resumed from {out.absolute() / 'phase1' / 'checkpoints'} after epoch " \
         f"{done[-1]['epoch']}" in log
  a = json.loads((tmp_path / "whole" / "params.json").read_text())
  b = json.loads((out / "params.json").read_text())
  assert a["opcodes"] == b["opcodes"] and a["global"] == b["global"]
  ha = json.loads((tmp_path / "whole" / "phase1" / "history.json").read_text())
  hb = json.loads(history.read_text())
  assert [h["val_hard"] for h in ha] == [h["val_hard"] for h in hb]


def test_tables_without_register_files_checkpoint_and_resume(tmp_path):
  """haswell has no register files (zero-size arrays in the table): a fit still
  checkpoints, and calling fit again on the same directory resumes at the end."""
  from diffsim.data import load_csv, shipped, split
  from diffsim.fit import FitConfig, fit

  ds = load_csv(shipped("mca-small.csv"))
  ds = ds.take([i for i, h in enumerate(ds.hex) if len(h) <= 16][:60])  # short blocks
  train, val, _ = split(ds, seed=0, fractions=(0.7, 0.3, 0.0))
  table = load_table("haswell")
  assert np.asarray(table.params.prf_size).size == 0
  config = FitConfig(epochs=1, batch_size=16)
  first = fit(table, train, val, tmp_path, config, progress=False)
  again = fit(table, train, val, tmp_path, config, progress=False, log=lambda *_: None)
  np.testing.assert_array_equal(np.asarray(first.params.latency),
                                np.asarray(again.params.latency))
  assert again.history == first.history
