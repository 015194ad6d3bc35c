"""The shipped datasets load cleanly; the shared folder is found or skipped."""

from __future__ import annotations

import numpy as np
import pytest

from diffsim.data import SHIPPED, load_csv, shared_data_dir, shipped


def test_shipped_files_load():
  zen5 = load_csv(shipped("zen5-small.csv"))
  assert len(zen5) == 3000 and zen5.errors == () and zen5.merged == 0
  assert zen5.label == "cycles_per_100_iterations"
  assert max(zen5.extra["spread"]) <= 0.05 and np.isfinite(zen5.y).all()
  mca = load_csv(shipped("mca-small.csv"))
  assert len(mca) == 2000 and mca.errors == () and mca.label == "haswell_100"
  assert list(mca.extra) == ["haswell_200", "skylake_100", "skylake_200", "znver3_100",
                             "znver3_200"]
  assert set(SHIPPED) == {"zen5-small.csv", "mca-small.csv", "graniterapids-anchors.csv",
                          "search-measured-xeon6.json", "corpus-sample.csv",
                          "calibrate-zen4.json", "zen4-calibrate-measured.csv"}
  corpus = load_csv(shipped("corpus-sample.csv"))  # what calibrate measures: hex only
  assert len(corpus) == 6000 and corpus.errors == () and list(corpus.extra) == ["apps"]
  zen4 = load_csv(shipped("zen4-calibrate-measured.csv"), dedupe=False)
  kinds = np.asarray(zen4.extra["kind"])
  assert set(kinds) == {"probe", "anchor", "block"} and (kinds == "block").sum() == 3000
  assert np.isfinite(zen4.y).mean() > 0.95


def test_shipped_anchors_are_single_instructions_measured_or_rejected_with_a_reason():
  from diffsim.isa import decode_blocks

  anchors = load_csv(shipped("graniterapids-anchors.csv"))
  assert len(anchors) == 2224 and list(anchors.extra) == ["spread", "error"]
  blocks = decode_blocks(list(anchors.hex))
  assert all(len(b) == 1 for b in blocks)
  rejected = ~np.isfinite(anchors.y)
  assert 0 < rejected.sum() < 50
  assert all(anchors.extra["error"][i] for i in np.flatnonzero(rejected))
  assert np.all(anchors.y[~rejected] > 0)


def test_shipped_folder_is_small_and_licensed():
  folder = shipped("zen5-small.csv").parent
  # The corpus sample (0.7 MB) and a calibration's measurements (0.4 MB) are most of it.
  assert sum(p.stat().st_size for p in folder.iterdir()) < 2.0e6
  assert "MIT" in shipped("BHIVE-LICENSE.txt").read_text()
  with pytest.raises(FileNotFoundError, match="zen5-small.csv"):
    shipped("nope.csv")


def test_shared_dir_env_override(tmp_path, monkeypatch):
  monkeypatch.setenv("DIFFSIM_SHARED", str(tmp_path))
  assert shared_data_dir() == tmp_path.resolve()
  monkeypatch.setenv("DIFFSIM_SHARED", str(tmp_path / "missing"))
  assert shared_data_dir() is None


def test_shipped_rows_come_from_shared_data():
  shared = shared_data_dir()
  if shared is None:
    pytest.skip("shared data folder not present")
  zen5 = load_csv(shipped("zen5-small.csv"))
  full = load_csv(shared / "measured" / "zen5-measured.csv")
  by_hex = dict(zip(full.hex, full.y))
  assert all(by_hex[h] == y for h, y in zip(zen5.hex, zen5.y))


@pytest.mark.slow
def test_make_shipped_is_reproducible(tmp_path):
  shared = shared_data_dir()
  if shared is None:
    pytest.skip("shared data folder not present")
  from diffsim.data import make_shipped

  assert make_shipped.main(["--shared", str(shared), "--out", str(tmp_path)]) == 0
  for name in ("zen5-small.csv", "mca-small.csv", "BHIVE-LICENSE.txt"):
    assert (tmp_path / name).read_bytes() == shipped(name).read_bytes()
