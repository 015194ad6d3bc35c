"""Re-measuring blocks whose passes disagree, and the confidence of each row: the logic,
on a scripted runner (no timing), so these run anywhere and fast. One test at the end
measures for real and is skipped where the harness cannot run.
"""

from __future__ import annotations

import csv
import dataclasses
import json
import types

import numpy as np
import pytest

from diffsim.data import load_csv
from diffsim.measure import BlockResult, MeasureConfig, MeasureError, confidence_weights
from diffsim.measure import harness
from diffsim.measure.stats import Consensus, best_consensus, confidence, consensus

CFG = MeasureConfig()


class ScriptedRunner:
  """Stands in for `runner.Runner`: each block's passes come from a script, in order
  (cycles per 100 iterations); the probe (4 rounds) reads 1 cycle; no pass is disturbed."""

  def __init__(self, config: MeasureConfig, script: dict[str, list[float]]):
    self.config = config
    self.script = {h: iter(v) for h, v in script.items()}
    self.passes = self.disturbed = 0
    self.busy_host = False
    self.timed: dict[str, int] = {}

  def time(self, hex_bytes, a, b, rounds, repeat, tries=4):
    if rounds == 4:
      return types.SimpleNamespace(cycles=1.0)
    self.timed[hex_bytes] = self.timed.get(hex_bytes, 0) + 1
    return types.SimpleNamespace(cycles=next(self.script[hex_bytes]) / 100.0)

  def judge(self, p):
    self.passes += 1
    return True

  def __enter__(self):
    return self

  def __exit__(self, *exc):
    pass


def _scripted(monkeypatch, script, config=CFG):
  """measure_hexes on a ScriptedRunner (no prefilter, no warm-up); returns the runner."""
  runner = ScriptedRunner(config, script)
  monkeypatch.setattr(harness, "Runner", lambda cfg: runner)
  monkeypatch.setattr(harness, "warm_up", lambda r: None)
  monkeypatch.setattr(harness, "prefilter", lambda hexes, progress=False: [None] * len(hexes))
  return runner


# A block on a busy core: its first passes scatter upwards, two of them alike (a busy
# spell slowed them the same); later ones, spread in time, find the quiet value.
BUSY = [130.0, 100.2, 131.0, 117.0, 160.0, 100.0, 100.4, 100.1, 150.0, 100.3]
QUIET = [200.0, 200.2, 200.1]


def test_consensus_is_the_fastest_cluster_that_repeats():
  c = consensus(BUSY[:8], k=3, width=0.01)
  assert (c.value, c.agreeing, c.below) == (100.15, 4, 0)
  assert consensus([100.0, 104.0, 110.0], k=2, width=0.01) is None
  # A lone fast pass keeps a slower cluster from counting as converged...
  slow = consensus([50.5, 88.8, 88.9, 88.7, 120.0], k=3, width=0.01)
  assert slow.below == 1 and not slow.converged(3)
  # ...and a fast pair beats a slow triple for the value.
  assert best_consensus([50.5, 50.7, 88.8, 88.9, 88.8], k=3, width=0.01).value == 50.6


def test_confidence_grows_with_agreeing_passes_and_falls_with_their_spread():
  conf = [confidence(Consensus(1.0, n, s), 3, 0.01)
          for n, s in ((1, 0.0), (3, 0.015), (2, 0.0), (3, 0.005), (3, 0.0), (8, 0.0))]
  assert conf == sorted(conf) and conf[0] == 0.0 and conf[-1] == 1.0
  assert confidence(Consensus(1.0, 3, 0.0, below=1), 3, 0.01) < 1.0


def test_blocks_whose_passes_disagree_are_measured_again_until_they_agree(monkeypatch):
  runner = _scripted(monkeypatch, {"4801d8": BUSY, "480fafc3": QUIET})
  seen = []
  results, stats = harness.measure_hexes(["4801d8", "480fafc3"], CFG,
                                         on_result=lambda i, r: seen.append(i))
  busy, quiet = results
  # The median of the first five passes (the old value) would be 130.
  assert busy.cycles == pytest.approx(100.2) and len(busy.passes) > CFG.max_passes
  assert busy.confidence > 0.9 and not busy.pending
  # A quiet block pays nothing: its three passes agreed.
  assert runner.timed["480fafc3"] == 3 and quiet.cycles == 200.1 and quiet.confidence > 0.9
  assert stats.remeasured == 1 and stats.extra_passes == len(busy.passes) - CFG.max_passes
  assert stats.unconverged == 0 and stats.measured == 2 and sorted(seen) == [0, 1]


def test_no_budget_no_remeasuring_and_a_low_confidence(monkeypatch):
  cfg = dataclasses.replace(CFG, budget_seconds=0.0)
  runner = _scripted(monkeypatch, {"4801d8": BUSY}, cfg)
  (r,), stats = harness.measure_hexes(["4801d8"], cfg)
  assert runner.timed["4801d8"] == cfg.max_passes and stats.remeasured == 0
  # Only a pair agrees, and two passes were faster than it: the row is not to be trusted.
  assert r.cycles == pytest.approx(130.5) and r.confidence < 0.2


def test_remeasuring_stops_at_max_total_passes(monkeypatch):
  cfg = dataclasses.replace(CFG, max_total_passes=7, budget_seconds=60.0)
  scattered = [100.0 * 1.05 ** k for k in range(20)]
  runner = _scripted(monkeypatch, {"4801d8": scattered}, cfg)
  (r,), stats = harness.measure_hexes(["4801d8"], cfg)
  assert runner.timed["4801d8"] == 7 and stats.unconverged == 1 and r.confidence == 0.0


def test_the_csv_has_a_confidence_column_after_spread(tmp_path):
  from diffsim.cli.measure import _write_csv

  out = tmp_path / "out.csv"
  results = [BlockResult(100.0, 0.002, None, (100.0, 100.1, 99.9), 0, 0.99),
             BlockResult(None, error="null-page: at 0x0"),
             BlockResult(250.0, 0.4, None, (250.0, 300.0, 350.0), 2, 0.0)]
  _write_csv(out, [None] * 3, ["4801d8", "488b042500000000", "480fafc3"], results, {})
  rows = list(csv.reader(out.open()))
  assert rows[0] == ["hex", "cycles_per_100_iterations", "spread", "confidence", "error"]
  assert rows[1][3] == "0.990" and rows[2][3] == "" and rows[2][4].startswith("null-page")
  ds = load_csv(out)
  assert list(ds.extra) == ["spread", "confidence", "error"]
  w = confidence_weights(ds)
  assert w[0] == pytest.approx(0.99) and w[-1] == 0.0


def test_confidence_weights_fall_back_to_spread_then_to_one():
  w = confidence_weights({"spread": (0.01, 0.05, 0.10, 0.50, float("nan"))})
  assert w.tolist() == pytest.approx([1.0, 1.0, 0.25, 0.01, 1.0])
  assert confidence_weights({"app": ("a", "b", "c")}, n=3).tolist() == [1.0, 1.0, 1.0]
  mixed = confidence_weights({"confidence": ("0.5", "", "x"), "spread": (0.2, 0.2, 0.01)})
  assert mixed.tolist() == pytest.approx([0.5, 0.0625, 1.0])


def _log(tmp_path, records):
  from diffsim.measure.cpu import cpu_identity

  path = tmp_path / "run.partial"
  lines = [{"diffsim_measure": 1, "cpu": cpu_identity(), "config": {}}] + records
  path.write_text("".join(json.dumps(x) + "\n" for x in lines))
  return path


def test_a_log_without_confidences_still_resumes(tmp_path, monkeypatch):
  runner = _scripted(monkeypatch, {})
  old = {"row": 0, "hex": "4801d8", "cycles": 100.05, "spread": 0.002, "error": None,
         "passes": [100.0, 100.1, 100.05], "contended": 0}
  rej = {"row": 1, "hex": "f4", "cycles": None, "spread": None, "error": "privileged: hlt"}
  results, stats = harness.measure_hexes(["4801d8", "f4"], CFG, log_path=_log(tmp_path, [old, rej]))
  assert stats.resumed == 2 and stats.measured == 0 and runner.passes == 0
  assert results[0].cycles == 100.05 and results[0].confidence > 0.9
  assert results[1].confidence is None and results[1].reason == "privileged"


def test_a_pending_block_is_measured_again_on_resuming(tmp_path, monkeypatch):
  runner = _scripted(monkeypatch, {"4801d8": BUSY[5:]})
  pending = dataclasses.asdict(BlockResult(130.0, 0.6, None, tuple(BUSY[:5]), 0, 0.3, True, 0.5))
  log = _log(tmp_path, [{"row": 0, "hex": "4801d8", **pending}])
  (r,), stats = harness.measure_hexes(["4801d8"], CFG, log_path=log)
  assert runner.timed["4801d8"] >= 2 and r.cycles == pytest.approx(100.2) and not r.pending
  assert stats.resumed == 1 and stats.remeasured == 1
  last = json.loads(log.read_text().splitlines()[-1])
  assert last["row"] == 0 and last["pending"] is False and last["confidence"] == r.confidence


@pytest.mark.slow
def test_a_real_run_gives_every_row_a_confidence(tmp_path):
  from diffsim.cli import main
  from diffsim.measure import runner_path

  try:
    runner_path()
  except MeasureError as e:
    pytest.skip(f"the measure harness cannot run here: {e}")
  src = tmp_path / "in.csv"
  src.write_text("hex\n4801d8\n480fafc3\n4883c3014883c1014883c2014883c601\n")
  out = tmp_path / "out.csv"
  assert main(["measure", str(src), "-o", str(out), "--budget-seconds", "2"]) == 0
  ds = load_csv(out)
  conf = np.asarray(ds.extra["confidence"])
  assert ((conf >= 0) & (conf <= 1)).all()
  assert ds.y[0] == pytest.approx(100.0, rel=0.03) and ds.y[1] == pytest.approx(300.0, rel=0.03)
  side = json.loads((tmp_path / "out.csv.json").read_text())
  assert side["config"]["budget_seconds"] == 2 and "remeasured" in side
