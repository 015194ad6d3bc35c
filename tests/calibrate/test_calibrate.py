"""`diffsim calibrate`: its folder rules, its resumption, and a whole small calibration
measured on this machine's CPU (real runner, real blocks, real fit)."""

from __future__ import annotations

import csv
import json

import numpy as np
import pytest

from diffsim.calibrate import CalibrateConfig, CalibrateError, calibrate
from diffsim.calibrate.stages import (MANIFEST, MEASURED_HEADER, Manifest, candidate_bases,
                                      check_out_dir, read_rows, weights_of, write_rows)
from diffsim.cli import main

ZEN4 = {"vendor": "AuthenticAMD", "family": 25, "model": 17, "stepping": 1}


def test_out_dir_of_another_command_is_refused(tmp_path):
  (tmp_path / "params.json").write_text("{}")  # a `diffsim fit` folder, say
  with pytest.raises(CalibrateError, match="params.json"):
    check_out_dir(tmp_path)
  (tmp_path / "file").write_text("")
  with pytest.raises(CalibrateError, match="is a file"):
    check_out_dir(tmp_path / "file")
  check_out_dir(tmp_path / "new")  # new folders and empty ones are fine


def test_a_calibration_of_another_cpu_is_not_resumed(tmp_path):
  Manifest(tmp_path, ZEN4, CalibrateConfig()).finish("probes", 1.0)
  assert Manifest(tmp_path, ZEN4, CalibrateConfig()).done("probes") == {"seconds": 1.0}
  other = dict(ZEN4, model=97)
  with pytest.raises(CalibrateError, match="another CPU"):
    Manifest(tmp_path, other, CalibrateConfig())
  (tmp_path / MANIFEST).write_text(json.dumps({"command": "diffsim fit"}))
  with pytest.raises(CalibrateError, match="not written by diffsim calibrate"):
    Manifest(tmp_path, ZEN4, CalibrateConfig())


def test_candidate_bases_follow_the_vendor():
  assert "znver3" in candidate_bases(ZEN4)
  assert "skylake" in candidate_bases({"vendor": "GenuineIntel"})


def test_measured_rows_read_as_bhive_and_weigh_by_confidence(tmp_path):
  from diffsim.data import load_csv

  rows = [dict(kind="block", name="", hex="4801d8", cycles_per_100_iterations=100.0,
               spread=0.01, confidence=0.9, error=None),
          dict(kind="anchor", name="ADD64rr", hex="4801d8", cycles_per_100_iterations=None,
               spread=None, confidence=None, error="privileged: x"),
          dict(kind="block", name="", hex="4889c3", cycles_per_100_iterations=50.0,
               spread=0.2, confidence=None, error=None)]
  write_rows(tmp_path / "m.csv", rows)
  with open(tmp_path / "m.csv") as f:
    assert next(csv.reader(f)) == MEASURED_HEADER
  back = read_rows(tmp_path / "m.csv")
  assert back[0]["cycles_per_100_iterations"] == 100.0 and back[1]["error"] == "privileged: x"
  w = weights_of(back)
  assert w[0] == pytest.approx(0.9) and w[2] < 0.1  # confidence, else spread
  ds = load_csv(tmp_path / "m.csv", dedupe=False)  # BHive layout: hex, then the label
  assert ds.hex[0] == "4801d8" and ds.y[0] == 100.0


def test_bad_budget_is_refused_by_the_command(tmp_path, capsys):
  assert main(["calibrate", "--out", str(tmp_path / "c"), "--minutes", "0"]) == 2
  assert "--minutes" in capsys.readouterr().err


@pytest.mark.slow
def test_a_small_calibration_runs_and_resumes(tmp_path):
  """A whole calibration at small size: probes, anchors, 120 blocks, one base, a fit
  stopped by its budget, and the report; then the same call again does nothing new."""
  out = tmp_path / "cal"
  config = CalibrateConfig(minutes=12, blocks=120, rounds=1, bases=("znver3",), quick=True,
                           forms=1, per_key=1, report_minutes=4)
  report = calibrate(out, config, log=lambda s: None)["report"]
  for name in ("params.json", "measured.csv", "report.json", "report.md", "structure.json"):
    assert (out / name).exists(), name
  kinds = {r["kind"] for r in read_rows(out / "measured.csv")}
  assert kinds == {"probe", "anchor", "block"}
  names = [r["name"] for r in report["held_out"]]
  assert any(n.startswith("calibrated") for n in names)
  assert any(n.startswith("llvm-mca") for n in names)
  mape = {r["name"]: r["mape"] for r in report["held_out"]}
  assert all(np.isfinite(v) for v in mape.values())
  stamp = (out / "params.json").stat().st_mtime_ns
  again = calibrate(out, config, log=lambda s: None)["report"]  # nothing redone
  assert (out / "params.json").stat().st_mtime_ns == stamp
  assert again["held_out"] == report["held_out"]
