"""`diffsim perfvec` end to end on a few shipped blocks: train, resume, embed, predict.

A tiny model (width 16, two epochs) on blocks of at most 8 instructions and three
uarchs, so the simulator compiles one bucket; the point is the plumbing and its
contracts, not accuracy (that is benchmarks/perfvec_eval.py's job).
"""

from __future__ import annotations

import csv
import dataclasses
import json

import numpy as np
import pytest

from diffsim.cli import main
from diffsim.perfvec import fit_uarch, load

pytestmark = pytest.mark.usefixtures("llvm14")

TRAIN = ["--shipped", "mca-small", "--limit", "150", "--train-tables", "haswell",
         "--heldout-models", "", "--samples", "2", "--heldout-samples", "1", "--extra-blocks",
         "10", "--extra-tables", "2", "--blocks", "40", "--max-len", "8", "--dim", "16",
         "--epochs", "2", "--batch-size", "16", "--encoder-tables", "2", "--encoder-blocks", "12"]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
  out = tmp_path_factory.mktemp("perfvec")
  assert main(["perfvec", "train", *TRAIN, "--out", str(out)]) == 0
  return out


def test_train_writes_model_report_and_labels(model_dir):
  meta = json.loads((model_dir / "model.json").read_text())
  assert meta["train_uarchs"] == ["haswell", "haswell~0.0", "haswell~0.1"]
  report = json.loads((model_dir / "report.json").read_text())
  whats = [r["what"] for r in report]
  assert "held-out sampled tables x unseen blocks" in whats
  n = len(meta["probes"])
  assert 0 < n == len(set(meta["probes"])) <= 40
  assert f"held-out sampled tables x unseen blocks, adapted on {n} probes" in whats
  assert all(r["n"] > 0 for r in report)
  # One sweep of every table but the encoder's over the drawn blocks, one of two training
  # tables over the extra blocks, one of the encoder's two tables over 12 training blocks;
  # those two are the refit's alone (neither trained on nor scored).
  ys = sorted((np.load(p) for p in (model_dir / "labels").glob("labels-*.npy")),
              key=lambda y: y.shape)
  assert [y.shape for y in ys] == [(2, 10), (2, 12), (4, ys[2].shape[1])]
  assert ys[2].shape[1] >= 30
  assert "haswell~0.3" not in meta["train_uarchs"]
  assert all(np.isfinite(y).all() and (y > 0).all() for y in ys)
  # Bounds from what this run scores (MAPE over seeds 0, 1, 2: every row 0.15 to 1.17, the
  # held-out sampled tables 0.15 to 0.60), well under what a broken model scores: 1.0
  # predicting zero, 9 predicting ten times the labels. Too small to beat the best
  # constant, though: one number for every pair scores 0.64 to 0.68.
  assert all(0 < r["mape"] < 1.5 for r in report), report
  held_out = [r["mape"] for r in report if r["what"].startswith("held-out sampled tables x unseen")]
  assert len(held_out) == 2 and max(held_out) < 0.75, report
  assert len(json.loads((model_dir / "history.json").read_text())) == 2


def test_rerun_resumes_from_checkpoint_and_label_cache(model_dir, capsys):
  assert main(["perfvec", "train", *TRAIN, "--out", str(model_dir)]) == 0
  err = capsys.readouterr().err
  assert "resumed from" in err and "labelled" not in err


def test_embed_one_vector_per_row_nan_for_bad_rows(model_dir, tmp_path):
  src = tmp_path / "in.csv"
  src.write_text("hex\n4883c001\nzz11\n4801d8480fafc3\n")
  out = tmp_path / "v.npy"
  assert main(["perfvec", "embed", str(src), "--model", str(model_dir), "-o", str(out)]) == 0
  v = np.load(out)
  assert v.shape == (3, 16)
  assert np.isfinite(v[[0, 2]]).all() and np.isnan(v[1]).all()
  direct = load(model_dir).embed([__import__("diffsim").decode_block("4883c001")])
  np.testing.assert_allclose(v[0], direct[0], rtol=1e-5, atol=1e-6)


def test_predict_columns_errors_and_uarch_kinds(model_dir, tmp_path, capsys):
  src = tmp_path / "in.csv"
  src.write_text("4883c001\nabc\n4801d8480fafc3\n")
  for uarch, probes in (("haswell~0.1", "256"), ("skylake", "16"), ("haswell~0.7", "0")):
    out = tmp_path / f"{uarch}.csv"
    assert main(["perfvec", "predict", str(src), "--model", str(model_dir), "--uarch", uarch,
                 "--probes", probes, "-o", str(out)]) == 0
    assert ("adapted on 16 probe blocks" in capsys.readouterr().err) == (uarch == "skylake")
    rows = list(csv.reader(out.open()))
    assert rows[0] == ["hex", "prediction", "error"] and len(rows) == 4
    assert float(rows[1][1]) > 0 and float(rows[3][1]) > 0 and rows[1][2] == ""
    assert rows[2][1] == "" and "odd" in rows[2][2]


def test_adapting_to_a_table_fits_its_simulated_probes(model_dir, capsys):
  """The adapted vector is fitted to the probes' throughput simulated on the table, from
  the encoder's vector; a training uarch keeps its own vector."""
  from diffsim.cli import perfvec as cli
  from diffsim.cli import sim_predict
  from diffsim.isa import decode_blocks
  from diffsim.perfvec import reuse
  from diffsim.perfvec.data import Uarch, uarch_table

  trained = load(model_dir)
  assert cli.PROBES == reuse.PROBES
  np.testing.assert_array_equal(trained.adapt("haswell~0.1"), trained.uarch("haswell~0.1"))
  name = "haswell~0.5"
  table = uarch_table(Uarch.parse(name))
  blocks = decode_blocks(list(trained.probes))
  y = np.array([c for c, _ in sim_predict(table, blocks, 20, "steady", False)])
  progs = trained.embed(blocks)
  adapted = trained.adapt(name)
  # It is the fit on the probes' throughput simulated on that very table ...
  np.testing.assert_allclose(adapted, fit_uarch(trained, progs, y, trained.uarch(name)),
                             rtol=1e-4, atol=1e-5)
  # ... and predicts them better than where it started, by the fit's own measure.
  before, after = (np.mean(np.log(trained.predict(progs, u) / y) ** 2)
                   for u in (trained.uarch(name), adapted))
  assert after < before
  bare = dataclasses.replace(trained, probes=())
  with pytest.raises(ValueError, match="keeps no probe blocks"):
    bare.adapt(name)
  np.testing.assert_array_equal(bare.adapt(name, probes=0), trained.uarch(name))


def test_bad_model_and_uarch_are_named(model_dir, tmp_path, capsys):
  src = tmp_path / "in.csv"
  src.write_text("4883c001\n")
  assert main(["perfvec", "predict", str(src), "--model", str(tmp_path), "--uarch",
               "haswell"]) == 2
  assert "no trained PerfVec model" in capsys.readouterr().err
  assert main(["perfvec", "predict", str(src), "--model", str(model_dir), "--uarch",
               "no-such-cpu"]) == 2
  assert "--uarch no-such-cpu" in capsys.readouterr().err


def test_negative_counts_are_refused_by_name(tmp_path, capsys):
  for flag in ("--extra-blocks", "--encoder-steps"):
    with pytest.raises(SystemExit):
      main(["perfvec", "train", *TRAIN, flag, "-1", "--out", str(tmp_path)])
    assert f"{flag}: must be at least 0, got -1" in capsys.readouterr().err
