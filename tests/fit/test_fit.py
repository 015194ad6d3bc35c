"""Learning through the simulator, end to end through the `diffsim fit` command."""

import csv
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from diffsim.cli import main
from diffsim.data import shipped
from diffsim.params.table import load_table

# No llvm-mca rows in these reports (--mca with no CPU): the tests time diffsim.
FIT = ["--init", "znver3", "--batch-size", "32", "--mca"]


@pytest.fixture(scope="module")
def short_blocks(tmp_path_factory) -> Path:
  """The measured Zen 5 blocks of up to 8 instructions (83% of them), as a CSV.

  One block-length bucket instead of five: the fits below compile a fifth as much.
  """
  from diffsim.isa import decode_blocks

  with open(shipped("zen5-small.csv")) as f:
    rows = list(csv.reader(f))
  decoded = decode_blocks([r[0] for r in rows[1:]])
  keep = [r for r, b in zip(rows[1:], decoded)
          if not isinstance(b, Exception) and len(b.instrs) <= 8]
  path = tmp_path_factory.mktemp("data") / "zen5-short.csv"
  with open(path, "w", newline="") as f:
    csv.writer(f).writerows([rows[0]] + keep)
  return path


def _report(out: Path) -> dict:
  return {r["name"]: r for r in json.loads((out / "report.json").read_text())
          ["held_out_results"]}


def test_fit_learns_on_measured_blocks_and_exports_a_usable_table(short_blocks, tmp_path, capsys):
  out = tmp_path / "run"
  args = ["fit", str(short_blocks)] + FIT + ["--limit", "300", "--epochs", "3", "--exact", "1",
                                            "--out", str(out)]
  assert main(args) == 0
  rows = _report(out)
  before = rows["diffsim znver3 (initial table)"]
  after = rows["diffsim fitted (learned, rounded)"]
  assert after["n"] == before["n"] > 20
  assert after["mape"] < 0.8 * before["mape"], (before, after)
  assert (out / "loss.png").stat().st_size > 1000
  history = json.loads((out / "phase1" / "history.json").read_text())
  assert history[-1]["val_hard"] < history[0]["val_hard"]
  # The exported table is an ordinary table: integer numbers, usable by eval.
  table, start = load_table(str(out / "params.json")), load_table("znver3")
  assert np.all(np.asarray(table.params.latency) == np.round(table.params.latency))
  # It learned: opcode rows moved (a fit that changes nothing fails here) ...
  moved = [k for k, key in enumerate(table.layout.keys)
           if any(not np.array_equal(np.asarray(getattr(table.params, f))[k],
                                     np.asarray(getattr(start.params, f))[start.layout.index[key]])
                  for f in ("uops", "latency", "read_advance", "res_cycles"))]
  assert len(moved) >= 5, moved
  # ... and eval, on blocks of the held-out part too, scores it better than its start.
  scores = []
  for params in (str(out / "params.json"), "znver3"):
    capsys.readouterr()
    assert main(["eval", str(short_blocks), "--limit", "50", "--params", params, "--json"]) == 0
    scores.append(json.loads(capsys.readouterr().out))
  assert scores[0]["n"] == scores[1]["n"] > 40
  assert scores[0]["mape"] < 0.8 * scores[1]["mape"], scores


def _fit_process(data: Path, out: Path, epochs: int):
  cmd = [sys.executable, "-m", "diffsim.cli", "fit", str(data)] + FIT + [
      "--limit", "150", "--epochs", str(epochs), "--out", str(out)]
  # The three runs share a compile cache, as a user's reruns do: only the first compiles.
  env = dict(os.environ, DIFFSIM_CACHE_DIR=str(out.parent / "xla-cache"))
  return subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          env=env)


# Three fits in subprocesses (about 3 minutes): slow suite; the in-process resume test
# below covers checkpointing by default.
@pytest.mark.slow
def test_a_killed_fit_resumes_with_nothing_lost(short_blocks, tmp_path):
  """Kill a fit once its first epoch is checkpointed; the rerun resumes there and
  ends with exactly the table of a run that was never interrupted."""
  whole = _fit_process(short_blocks, tmp_path / "whole", 3)
  assert whole.wait(timeout=900) == 0, whole.stdout.read()
  out = tmp_path / "killed"
  proc = _fit_process(short_blocks, out, 3)
  history = out / "phase1" / "history.json"
  deadline = time.time() + 900
  while not history.exists() and proc.poll() is None and time.time() < deadline:
    time.sleep(0.5)
  assert proc.poll() is None, "finished before it could be interrupted"
  os.kill(proc.pid, signal.SIGKILL)
  proc.wait()
  assert not (out / "params.json").exists()
  done = json.loads(history.read_text())
  resumed = _fit_process(short_blocks, out, 3)
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


def _short_haswell_split():
  """haswell, and 60 short mca-small blocks split 70/30 into training and validation:
  small fits that share their compiled programs."""
  from diffsim.data import load_csv, split

  ds = load_csv(shipped("mca-small.csv"))
  ds = ds.take([i for i, h in enumerate(ds.hex) if len(h) <= 16][:60])  # short blocks
  train, val, _ = split(ds, seed=0, fractions=(0.7, 0.3, 0.0))
  return load_table("haswell"), train, val


def test_tables_without_register_files_checkpoint_and_resume(tmp_path):
  """haswell has no register files (zero-size arrays in the table): a fit still
  checkpoints, and calling fit again on the same directory resumes at the end."""
  from diffsim.fit import FitConfig, fit

  table, train, val = _short_haswell_split()
  assert np.asarray(table.params.prf_size).size == 0
  config = FitConfig(epochs=1, batch_size=16)
  first = fit(table, train, val, tmp_path, config, progress=False)
  again = fit(table, train, val, tmp_path, config, progress=False, log=lambda *_: None)
  np.testing.assert_array_equal(np.asarray(first.params.latency),
                                np.asarray(again.params.latency))
  assert again.history == first.history


def test_fit_takes_an_optax_optimizer(tmp_path):
  """A step of size zero leaves every soft parameter where it was (the default, Adam,
  moves them: the soft validation error changes)."""
  import jax
  import optax

  from diffsim.fit import FitConfig, fit
  from diffsim.fit.learn import project
  from diffsim.sim.kernels import window_for

  table, train, val = _short_haswell_split()
  config = FitConfig(epochs=1, batch_size=16)
  quiet = dict(progress=False, log=lambda *_: None)
  still = fit(table, train, val, tmp_path / "sgd", config, optimizer=optax.sgd(0.0), **quiet)
  moved = fit(table, train, val, tmp_path / "adam", config, **quiet)
  # (`project` puts every table into physical values, a zero step included)
  start = project(jax.tree.map(np.asarray, table.params), table.params,
                  window_for(table.params.rob_size))
  for name in ("uops", "latency", "read_advance", "res_cycles"):
    np.testing.assert_array_equal(np.asarray(getattr(still.params, name)),
                                  np.asarray(getattr(start, name)), err_msg=name)
  # The soft validation error is that of the table as it stands after the epoch (the
  # best table, `params`, may still be the start).
  assert still.history[-1]["val_soft"] == still.history[0]["val_soft"]
  assert moved.history[-1]["val_soft"] != moved.history[0]["val_soft"]


def test_fit_raises_on_a_failed_hard_run_or_leaves_the_block_out(tmp_path):
  """Past the cycle budget (8 cycles: no block finishes), `fit` names the blocks' rows,
  or with throw=False scores without them and reports them."""
  from diffsim.fit import FitConfig, fit
  from diffsim.sim import SimulationError, status

  table, train, val = _short_haswell_split()
  config = FitConfig(epochs=1, batch_size=16, max_cycles=8)
  quiet = dict(progress=False, log=lambda *_: None)
  with pytest.raises(SimulationError, match=r"fit: (.|\n)*validation row \d+: did not finish"):
    fit(table, train, val, tmp_path / "throw", config, **quiet)
  result = fit(table, train, val, tmp_path / "kept", config, throw=False, **quiet)
  assert {part for part, _ in result.failed} == {"training", "validation"}
  assert set(result.failed.values()) == {status.CYCLE_BUDGET}
  assert sum(part == "training" for part, _ in result.failed) == len(train) - len(result.skipped)
