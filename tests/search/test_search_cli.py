"""`diffsim search` end to end (real simulator) and its errors."""

import pytest

from diffsim.cli import main


def test_search_end_to_end_tiny_budget(capsys, tmp_path, monkeypatch):
  monkeypatch.setenv("DIFFSIM_SEARCH_CACHE", str(tmp_path))
  rc = main(["search", "axpy", "--target", "haswell", "--budget", "4", "--method", "random",
             "--seed", "1"])
  out = capsys.readouterr()
  assert rc == 0, out.err  # seed 1 picks valid configurations
  assert "cycles per flop" in out.out and "config: isa=" in out.out
  assert "vmovups" in out.out or "movups" in out.out
  assert "4 configurations evaluated" in out.err


def test_unknown_task_is_a_clear_error(capsys):
  with pytest.raises(SystemExit) as e:
    main(["search", "fft", "--target", "haswell"])
  assert e.value.code == 2
  assert "invalid choice: 'fft'" in capsys.readouterr().err


def test_bad_target_is_a_clear_error(capsys, tmp_path):
  assert main(["search", "dot", "--target", str(tmp_path / "none.json")]) == 2
  assert "--target" in capsys.readouterr().err
  assert main(["search", "dot", "--target", "pentium"]) == 2
  assert "unknown CPU table" in capsys.readouterr().err


def test_glimpse_searches_with_the_shipped_models_at_once(capsys, tmp_path, monkeypatch):
  """No training CPU is enumerated: the meta-trained models ship with the package."""
  monkeypatch.setenv("DIFFSIM_SEARCH_CACHE", str(tmp_path))
  rc = main(["search", "dot", "--target", "zen5/narrow", "--budget", "3"])
  out = capsys.readouterr()
  assert rc == 0, out.err
  assert "3 configurations evaluated" in out.err and "meta-training" not in out.err
  assert "reproduce: diffsim search dot --target zen5/narrow --budget 3" in out.out
  assert not list(tmp_path.rglob("*.json")) and not list(tmp_path.rglob("*.msgpack"))
