"""load_csv / load_rows: headers, extra columns, bad rows, dedupe, file errors."""

from __future__ import annotations

import math

import numpy as np
import pytest

from diffsim.data import load_csv, load_rows


def write(tmp_path, text: str, name: str = "d.csv"):
  p = tmp_path / name
  p.write_text(text)
  return p


def test_with_header_and_extra_columns(tmp_path):
  p = write(tmp_path, "hex,cycles,app,spread\n01C8,100.5,redis,0.01\n4801c8,200,gzip,\n")
  ds = load_csv(p)
  assert ds.hex == ("01c8", "4801c8")
  np.testing.assert_array_equal(ds.y, [100.5, 200.0])
  assert ds.y.dtype == np.float64
  assert ds.line == (2, 3) and ds.errors == () and ds.label == "cycles"
  assert ds.extra["app"] == ("redis", "gzip")
  assert ds.extra["spread"][0] == 0.01 and math.isnan(ds.extra["spread"][1])
  assert len(ds) == 2 and ds.source == str(p)


def test_without_header(tmp_path):
  ds = load_csv(write(tmp_path, "01c8,100\n4801c8,200,x\n"))
  assert ds.hex == ("01c8", "4801c8") and ds.line == (1, 2) and ds.label == ""
  assert ds.extra == {"col2": ("", "x")}


def test_hex_only_file_is_unlabelled(tmp_path):
  ds = load_csv(write(tmp_path, "01c8\n0x4801c8\n"))
  assert ds.hex == ("01c8", "4801c8") and np.isnan(ds.y).all()
  ds = load_csv(write(tmp_path, "hex\n01c8\n", "h.csv"))
  assert ds.hex == ("01c8",) and ds.line == (2,)


def test_bad_rows_reported_with_lines(tmp_path):
  text = "hex,y\n01c8,100\n01c,50\n\nzz,3\n4801c8,abc\n,7\n90,-1\n90,inf\n90,\n90,nan\n91,1,2\n"
  p = write(tmp_path, text)
  ds = load_csv(p)
  errors = dict(ds.errors)
  assert sorted(errors) == [3, 4, 5, 6, 7, 8, 9, 12]
  assert "odd" in errors[3] and "empty line" == errors[4] and "not hex" in errors[5]
  assert "not a number" in errors[6] and "empty hex" in errors[7]
  assert "positive" in errors[8] and "positive" in errors[9] and "fields" in errors[12]
  # Empty and "nan" labels are unlabelled blocks, not errors; "90" is merged.
  assert ds.hex == ("01c8", "90") and ds.line == (2, 10) and ds.merged == 1
  assert ds.y[0] == 100 and np.isnan(ds.y[1])
  rows = load_rows(p)
  assert [r.line for r in rows] == list(range(2, 13))
  assert [r.error is None for r in rows] == [
    True, False, False, False, False, False, False, False, True, True, False]
  assert rows[1].hex is None and rows[1].fields == ("01c", "50")


def test_odd_first_row_is_data_not_header(tmp_path):
  ds = load_csv(write(tmp_path, "abc,100\n01c8,5\n"))
  assert ds.hex == ("01c8",) and ds.errors[0][0] == 1 and "odd" in ds.errors[0][1]


def test_dedupe_keeps_first_and_median(tmp_path):
  text = "hex,y,app\n01c8,100,a\n90,7,b\n01C8,300,c\n01c8,110,d\n01c8,,e\n"
  ds = load_csv(write(tmp_path, text))
  assert ds.hex == ("01c8", "90") and ds.line == (2, 3) and ds.merged == 3
  assert ds.y[0] == 110.0 and ds.extra["app"] == ("a", "b")
  raw = load_csv(write(tmp_path, text), dedupe=False)
  assert len(raw) == 5 and raw.merged == 0 and np.isnan(raw.y[4])


def test_file_errors(tmp_path):
  with pytest.raises(FileNotFoundError, match="nope.csv"):
    load_csv(tmp_path / "nope.csv")
  binary = tmp_path / "b.csv"
  binary.write_bytes(b"\x7fELF\x00\x01\x02")
  with pytest.raises(ValueError, match="b.csv"):
    load_csv(binary)
  latin = tmp_path / "l.csv"
  latin.write_bytes(b"01c8,1\n\xff\xfe,2\n")
  with pytest.raises(ValueError, match="l.csv:2"):
    load_csv(latin)
  with pytest.raises(ValueError, match=r"j.csv:2: no usable rows"):
    load_csv(write(tmp_path, '{"a": 1,\n "b": 2}\n', "j.csv"))


def test_empty_file_is_an_empty_dataset(tmp_path):
  ds = load_csv(write(tmp_path, ""))
  assert len(ds) == 0 and ds.y.shape == (0,)
  ds = load_csv(write(tmp_path, "hex,y\n", "h.csv"))
  assert len(ds) == 0 and ds.label == "y"


def test_take(tmp_path):
  ds = load_csv(write(tmp_path, "hex,y,a\n01c8,1,x\n90,2,y\n4801c8,3,z\n"))
  sub = ds.take([2, 0])
  assert sub.hex == ("4801c8", "01c8") and sub.y.tolist() == [3.0, 1.0]
  assert sub.extra["a"] == ("z", "x") and sub.line == (4, 2)


def test_the_bhive_corpus_format_with_crlf_reads_its_names_as_a_column(tmp_path):
  # BHive's own blocks.csv lists application names where measured files have labels.
  p = tmp_path / "corpus.csv"
  p.write_bytes(b"hex,apps,frequency\r\n4801d8,openblas-sgeev.goto,12\r\n"
                b"480fafc3,redis-server,3\r\n")
  ds = load_csv(p)
  assert ds.hex == ("4801d8", "480fafc3") and ds.errors == () and ds.label == ""
  assert np.isnan(ds.y).all()
  assert ds.extra == {"apps": ("openblas-sgeev.goto", "redis-server"), "frequency": (12.0, 3.0)}
  assert [r.error for r in load_rows(p)] == [None, None]
  # One number in the column makes it labels again, and the names are bad labels.
  p.write_text("hex,y\n4801d8,100\n480fafc3,redis-server\n")
  assert "not a number" in dict(load_csv(p).errors)[3]
