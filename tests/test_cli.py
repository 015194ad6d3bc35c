"""The `diffsim` command, run for real on small inputs: no mocks, real llvm-mca 14.

Most tests call `diffsim.cli.main` in this process, so the simulator compiles once per
shape for the whole file (the budget is about a minute). The simulator runs on two
shapes only: `simulate` in total mode and `eval`/`compare` in steady mode, each on the
same five short blocks. A few tests start `python -m diffsim` to check the exit status
and messages a shell sees.

The five blocks come from the shipped `mca-small.csv`, whose llvm-mca 14 labels are the
oracle: Total Cycles for 100 and 200 iterations on haswell.
"""

from __future__ import annotations

import csv
import json
import math
import os
import subprocess
import sys

import pytest

from diffsim.cli import main
from diffsim.data import load_csv, shipped

pytestmark = [pytest.mark.mca, pytest.mark.usefixtures("llvm14")]

# Rows 1, 10, 11, 20 and 39 of mca-small.csv: short blocks (one length bucket) with
# different throughputs, loop-carried chains and a store.
GOOD = [
  "0f1f004531f60f1f4400000fafcb418d044e4183c60148984c8d7cc500",
  "0f1f400089d183c2014139d548c704c800000000",
  "0f1f4400004889074801f74983e801",
  "0f1f8000000000f30f10064801d6f30f11014c01c148ffc8",
  "0fb689a0e44f004983c00101c8410fb648ff69c0b179379e84c9",
]
# Bad rows between the good ones: (raw line, decode reason).
BAD = [("", "empty"), ("abc", "odd-length-hex"), ("zz11", "bad-hex")]
# Output order: good, bad, good, bad, good, bad, good, good.
ORDER = [("good", 0), ("bad", 0), ("good", 1), ("bad", 1), ("good", 2), ("bad", 2),
         ("good", 3), ("good", 4)]


@pytest.fixture(scope="module")
def oracle() -> dict[str, dict[str, float]]:
  """hex -> {"total": llvm-mca's Total Cycles x 100/100, "steady": BHive's figure}."""
  ds = load_csv(shipped("mca-small.csv"))
  pos = {h: i for i, h in enumerate(ds.hex)}
  out = {}
  for h in GOOD:
    c100, c200 = ds.y[pos[h]], ds.extra["haswell_200"][pos[h]]
    out[h] = {"total": float(c100), "steady": float(c200 - c100)}
  return out


def _write(path, rows):
  path.write_text("".join(r + "\n" for r in rows))
  return path


@pytest.fixture(scope="module")
def blocks_csv(tmp_path_factory, oracle):
  """Eight rows with a header: the five good blocks, labelled with llvm-mca's steady
  throughput, and three bad rows (empty line, odd-length hex, non-hex)."""
  lines = ["hex,cycles_per_100_iterations"]
  for kind, k in ORDER:
    if kind == "good":
      lines.append(f"{GOOD[k]},{oracle[GOOD[k]]['steady']:g}")
    else:
      lines.append(BAD[k][0] if not BAD[k][0] else f"{BAD[k][0]},100")
  return _write(tmp_path_factory.mktemp("cli") / "blocks.csv", lines)


def _expected_hex(kind, k):
  return GOOD[k] if kind == "good" else BAD[k][0]


def _read_predictions(path):
  with open(path, newline="") as f:
    rows = list(csv.reader(f))
  assert rows[0] == ["hex", "prediction", "error"]
  return rows[1:]


def _check_rows(rows, oracle, mode):
  """Rows in input order; bad rows carry an error; good rows match llvm-mca's labels."""
  assert [r[0] for r in rows] == [_expected_hex(*o) for o in ORDER]
  for (kind, k), (_, pred, err) in zip(ORDER, rows):
    if kind == "bad":
      assert pred == "" and err.startswith(f"decode: {BAD[k][1]}:"), (pred, err)
    else:
      assert pred != "" and math.isclose(float(pred), oracle[GOOD[k]][mode], rel_tol=1e-9), \
          (GOOD[k], pred, err, oracle[GOOD[k]][mode])


def test_decode_keeps_every_row_in_order(blocks_csv, tmp_path, capsys):
  out = tmp_path / "blocks.jsonl"
  assert main(["decode", str(blocks_csv), "-o", str(out)]) == 0
  docs = [json.loads(line) for line in out.read_text().splitlines()]
  assert len(docs) == len(ORDER)
  for (kind, k), doc in zip(ORDER, docs):
    if kind == "good":
      assert doc["hex"] == GOOD[k] and "error" not in doc
      assert "".join(i["hex"] for i in doc["instrs"]) == GOOD[k]
      assert all(i["text"] and i["key"] for i in doc["instrs"])
    else:
      assert doc["hex"] == BAD[k][0]
      assert doc["error"].startswith(BAD[k][1] + ":")
  err = capsys.readouterr().err
  assert "decoded 5 of 8" in err
  for _, reason in BAD:
    assert f"1 {reason}" in err


def test_decode_writes_stdout_without_output_file(blocks_csv, capsys):
  assert main(["decode", str(blocks_csv), "--limit", "2"]) == 0
  lines = capsys.readouterr().out.splitlines()
  assert [json.loads(x)["hex"] for x in lines] == [GOOD[0], ""]


@pytest.mark.parametrize("mode", ["total", "steady"])
def test_mca_matches_llvm_mca_labels(blocks_csv, oracle, tmp_path, mode):
  out = tmp_path / "mca.csv"
  assert main(["mca", str(blocks_csv), "--mcpu", "haswell", "--throughput", mode,
               "-o", str(out)]) == 0
  _check_rows(_read_predictions(out), oracle, mode)


def test_mca_scales_total_cycles_to_100_iterations(blocks_csv, oracle, tmp_path):
  out = tmp_path / "mca.csv"
  assert main(["mca", str(blocks_csv), "--mcpu", "haswell", "--iterations", "200",
               "-o", str(out)]) == 0
  rows = [r for r in _read_predictions(out) if r[1]]
  ds = load_csv(shipped("mca-small.csv"))
  c200 = dict(zip(ds.hex, ds.extra["haswell_200"]))
  assert [float(r[1]) for r in rows] == [c200[h] / 2 for h in GOOD]


def test_simulate_agrees_with_llvm_mca(blocks_csv, oracle, tmp_path):
  out = tmp_path / "sim.csv"
  assert main(["simulate", str(blocks_csv), "--params", "haswell", "-o", str(out)]) == 0
  # The simulator is exact by design: every block's Total Cycles is llvm-mca's.
  _check_rows(_read_predictions(out), oracle, "total")


def test_simulate_decoding_in_chunks_in_a_second_process(blocks_csv, tmp_path, monkeypatch):
  """Past one chunk of rows, a child process decodes while the simulator runs what is
  decoded; the rows come out as from one chunk decoded here."""
  from diffsim.cli import predict

  one, chunked = tmp_path / "one.csv", tmp_path / "chunked.csv"
  assert main(["simulate", str(blocks_csv), "--params", "haswell", "-o", str(one)]) == 0
  monkeypatch.setattr(predict, "DECODE_CHUNK", 3)
  assert main(["simulate", str(blocks_csv), "--params", "haswell", "-o", str(chunked)]) == 0
  assert _read_predictions(chunked) == _read_predictions(one)


def _eval_json(capsys, argv):
  assert main(argv) == 0
  doc = json.loads(capsys.readouterr().out)
  assert set(doc) == {"mape", "kendall_tau", "within_5pct", "n", "n_failed"}
  assert doc["n"] == 5 and doc["n_failed"] == 3
  assert 0 <= doc["mape"] and 0 <= doc["within_5pct"] <= 1 and -1 <= doc["kendall_tau"] <= 1
  return doc


def test_eval_json_simulator(blocks_csv, capsys):
  # The labels are llvm-mca's steady-state figures, which the simulator reproduces
  # exactly.
  doc = _eval_json(capsys, ["eval", str(blocks_csv), "--params", "haswell", "--json"])
  assert doc["within_5pct"] == 1.0 and doc["mape"] == 0.0, doc


def test_eval_mca_against_its_own_labels(blocks_csv, capsys):
  doc = _eval_json(capsys, ["eval", str(blocks_csv), "--mca", "haswell", "--json"])
  assert doc["mape"] == 0.0 and doc["within_5pct"] == 1.0
  assert math.isclose(doc["kendall_tau"], 1.0, rel_tol=1e-9)


def test_eval_prints_a_readable_summary(blocks_csv, capsys):
  assert main(["eval", str(blocks_csv), "--mca", "haswell"]) == 0
  out = capsys.readouterr().out
  for word in ("MAPE", "Kendall tau", "within 5%", "evaluated     5", "failed        3"):
    assert word in out


def test_compare_prints_agreement_and_speed(blocks_csv, tmp_path, capsys):
  out = tmp_path / "cmp.csv"
  assert main(["compare", str(blocks_csv), "--params", "haswell", "--throughput", "steady",
               "-o", str(out)]) == 0
  text = capsys.readouterr().out
  for word in ("exactly equal", "within 1%", "within 5%", "MAPE", "blocks/s", "llvm-mca 14",
               "diffsim (JAX)"):
    assert word in text
  with open(out, newline="") as f:
    rows = list(csv.reader(f))
  assert rows[0] == ["hex", "diffsim", "llvm_mca", "error"] and len(rows) == 1 + len(ORDER)


def test_shipped_input_and_limit(capsys):
  assert main(["mca", "--shipped", "mca-small", "--limit", "3", "--mcpu", "znver3"]) == 0
  rows = list(csv.reader(capsys.readouterr().out.splitlines()))
  ds = load_csv(shipped("mca-small.csv"))
  assert [r[0] for r in rows[1:]] == list(ds.hex[:3])
  assert [float(r[1]) for r in rows[1:]] == list(ds.extra["znver3_100"][:3])


def test_params_list(capsys):
  assert main(["params", "--list"]) == 0
  out = capsys.readouterr().out
  models, tables = out.split("shipped tables")
  for cpu in ("haswell", "skylake", "znver3"):
    assert cpu in models.split() and cpu in tables.split()


def _run(*argv):
  return subprocess.run([sys.executable, "-m", "diffsim", *argv], capture_output=True,
                        text=True, check=False, timeout=120)


def test_missing_file_fails_and_names_it(tmp_path):
  missing = tmp_path / "no-such-blocks.csv"
  proc = _run("mca", str(missing), "--mcpu", "haswell", "-o", str(tmp_path / "out.csv"))
  assert proc.returncode != 0
  assert str(missing) in proc.stderr and "Traceback" not in proc.stderr
  assert not (tmp_path / "out.csv").exists()


@pytest.mark.parametrize("command", [["decode"], ["simulate", "--params", "haswell"],
                                     ["eval", "--params", "haswell"]])
def test_binary_input_fails_and_names_it(tmp_path, capsys, command):
  binary = tmp_path / "blocks.bin"
  binary.write_bytes(b"\x7fELF\x00\x01\x02hex")
  assert main([command[0], str(binary), *command[1:]]) != 0
  assert str(binary) in capsys.readouterr().err


def test_unknown_params_fail_cleanly(blocks_csv, capsys):
  assert main(["simulate", str(blocks_csv), "--params", "no-such-cpu"]) != 0
  assert "no-such-cpu" in capsys.readouterr().err


def test_tune_xla_adds_its_options_and_keeps_the_users(monkeypatch):
  from diffsim.cli import SMALL_LOOP_BYTES, tune_xla

  monkeypatch.delenv("XLA_FLAGS", raising=False)
  tune_xla()
  flags = os.environ["XLA_FLAGS"].split()
  assert any(f.startswith("--xla_force_host_platform_device_count=") for f in flags)
  assert ("--xla_backend_extra_options=xla_cpu_small_while_loop_byte_threshold="
          f"{SMALL_LOOP_BYTES}") in flags
  mine = "--xla_force_host_platform_device_count=3 --xla_backend_extra_options=a=1"
  monkeypatch.setenv("XLA_FLAGS", mine)
  tune_xla()
  assert os.environ["XLA_FLAGS"] == mine


def test_python_m_diffsim_help():
  proc = _run("--help")
  assert proc.returncode == 0
  for command in ("decode", "mca", "simulate", "eval", "compare", "params"):
    assert command in proc.stdout


def test_params_builds_a_table_that_loads(tmp_path, capsys):
  from diffsim.params.table import load_json, load_table

  out = tmp_path / "haswell.json"
  assert main(["params", "haswell", "-o", str(out)]) == 0
  assert str(out) in capsys.readouterr().err
  table = load_table(str(out))
  assert table.layout.cpu == "haswell"
  # Extraction is deterministic: the shipped table was built the same way.
  assert load_json(out)["opcodes"].keys() == load_json("haswell")["opcodes"].keys()


def test_params_writes_several_tables_into_a_folder(tmp_path, capsys):
  from diffsim.params.table import load_json

  # -o names one file, so it cannot take two CPUs.
  assert main(["params", "haswell", "znver3", "-o", str(tmp_path / "t.json")]) == 2
  assert "--out-dir" in capsys.readouterr().err
  assert main(["params", "znver3", "--out-dir", str(tmp_path / "tables"), "--no-probe"]) == 0
  doc = load_json(tmp_path / "tables" / "znver3.json")
  # Without the probes nothing is measured from timelines: no read-advance at all.
  assert doc["cpu"] == "znver3" and not any("read_advance" in e for e in doc["opcodes"].values())


def test_params_names_what_stops_a_table(tmp_path, capsys):
  # btver2 lacks AVX2: those keys are refused one by one (llvm-mca exits 1 on each), and
  # then its FPU groups defeat the group inference: the error says so by name.
  assert main(["params", "btver2", "-o", str(tmp_path / "b.json")]) == 2
  err = capsys.readouterr().err
  assert "cannot build a table for btver2" in err and "JFPU01" in err
  assert not (tmp_path / "b.json").exists()


@pytest.mark.parametrize("command", [["decode"], ["simulate", "--params", "haswell"]])
def test_commands_read_the_bhive_corpus_format(tmp_path, capsys, command):
  corpus = tmp_path / "blocks.csv"
  corpus.write_bytes(("hex,apps,frequency\r\n" + "".join(
      f"{h},openblas-sgeev.goto,{i}\r\n" for i, h in enumerate(GOOD[:2]))).encode())
  assert main([command[0], str(corpus), *command[1:], "-o", str(tmp_path / "out")]) == 0
  assert "bad-row" not in capsys.readouterr().err
  out = (tmp_path / "out").read_text()
  assert all(h in out for h in GOOD[:2]) and "error" not in out.split("\n", 1)[1]
