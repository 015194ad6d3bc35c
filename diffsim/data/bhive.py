"""Loading BHive-format CSV files of basic blocks and their measured throughputs.

The format: column 1 is the block's machine code as hex, column 2 (optional) its
throughput in cycles per 100 iterations (BHive's unit; the simulator works in cycles
per iteration, and the conversion happens at this edge, by the caller). More columns
are allowed and kept. A header row is optional and detected. An empty label means an
unlabelled block (NaN).

Decisions (a demanding user's defaults):
- Bad rows are never dropped silently. `load_csv` leaves them out of the `Dataset` but
  lists each in `Dataset.errors` as (line, reason). `load_rows` returns every data row in
  input order, bad ones included, so a tool that must write one output row per input
  row can map results back.
- Duplicate blocks are merged by default: the first occurrence keeps its place, line and
  extra columns; its label becomes the median of the group's labels (robust to one bad
  measurement; NaN labels are ignored), and `Dataset.merged` counts the rows merged away.
- Hex is normalised to lower case without surrounding spaces (an `0x` prefix is accepted).
- Labels must be positive finite numbers (a throughput of 0 or below is a broken
  measurement); `nan` or an empty field means unlabelled.
- Extra columns whose non-empty values all parse as numbers come back as float tuples
  (empty = NaN); other extra columns stay strings.
"""

from __future__ import annotations

import csv
import dataclasses
import io
import math
import re
from pathlib import Path
from typing import Sequence

import numpy as np

_HEX = re.compile(r"^[0-9a-fA-F]*$")


@dataclasses.dataclass(frozen=True)
class Row:
  """One data row of a BHive CSV file, exactly as it stands, good or bad.

  Attributes:
    line: 1-based line number in the file.
    hex: the normalised block hex, or None when the row is bad.
    y: the label in cycles per 100 iterations; NaN when unlabelled or bad.
    fields: the raw fields of the row.
    error: why the row is unusable, or None.
  """

  line: int
  hex: str | None
  y: float
  fields: tuple[str, ...]
  error: str | None


@dataclasses.dataclass(frozen=True, eq=False)
class Dataset:
  """Basic blocks with throughput labels, in file order.

  Attributes:
    hex: [N] the blocks' machine code, lower-case hex.
    y: [N] float64 cycles per 100 iterations; NaN = unlabelled.
    line: [N] 1-based source line of each block (the first one when merged).
    extra: extra columns by name, each an [N] tuple (floats if numeric, else strings).
    errors: (line, reason) for every unusable row of the source.
    label: the name of the label column ("" when the file has no header or no label).
    merged: rows merged away as duplicates.
    source: the file the data came from ("" if none).
  """

  hex: tuple[str, ...]
  y: np.ndarray
  line: tuple[int, ...]
  extra: dict[str, tuple] = dataclasses.field(default_factory=dict)
  errors: tuple[tuple[int, str], ...] = ()
  label: str = ""
  merged: int = 0
  source: str = ""

  def __len__(self) -> int:
    return len(self.hex)

  def take(self, idx: Sequence[int] | np.ndarray) -> Dataset:
    """The subset at positions `idx` (in that order); `errors` are not carried over."""
    idx = [int(i) for i in np.asarray(idx, dtype=np.int64).reshape(-1)]
    return Dataset(
      hex=tuple(self.hex[i] for i in idx),
      y=self.y[idx] if idx else np.zeros(0, np.float64),
      line=tuple(self.line[i] for i in idx),
      extra={k: tuple(v[i] for i in idx) for k, v in self.extra.items()},
      errors=(),
      label=self.label,
      merged=0,
      source=self.source,
    )


def _is_number(s: str) -> bool:
  try:
    float(s)
  except ValueError:
    return False
  return True


def _check_hex(field: str) -> tuple[str | None, str | None]:
  """(normalised hex, None) or (None, reason)."""
  h = field.strip()
  if h[:2] in ("0x", "0X"):
    h = h[2:]
  if not h:
    return None, "empty hex"
  if not _HEX.match(h):
    return None, f"not hex: {field.strip()[:40]!r}"
  if len(h) % 2:
    return None, f"odd number of hex digits ({len(h)})"
  return h.lower(), None


def _check_label(field: str) -> tuple[float, str | None]:
  """(label, None) or (NaN, reason); an empty field is an unlabelled block."""
  s = field.strip()
  if not s:
    return math.nan, None
  try:
    y = float(s)
  except ValueError:
    return math.nan, f"label is not a number: {s[:40]!r}"
  if math.isnan(y):
    return math.nan, None
  if not math.isfinite(y) or y <= 0:
    return math.nan, f"label must be a positive finite number, got {s[:40]!r}"
  return y, None


def _read_text(path: Path) -> str:
  """The file's text; a clear error for missing or binary files."""
  path = Path(path)
  if not path.exists():
    raise FileNotFoundError(f"{path}: no such file")
  if path.is_dir():
    raise IsADirectoryError(f"{path}: is a directory, not a CSV file")
  data = path.read_bytes()
  if b"\0" in data:
    raise ValueError(f"{path}: binary content (NUL bytes), not a CSV file")
  try:
    return data.decode("utf-8-sig")
  except UnicodeDecodeError as e:
    line = data[: e.start].count(b"\n") + 1
    raise ValueError(f"{path}:{line}: not UTF-8 text, not a CSV file") from None


def _parse(path: Path) -> tuple[list[str] | None, list[Row], bool]:
  """The header (or None), every data row of a BHive CSV file, and whether column 2
  holds labels: it does unless none of its values is a number (the BHive corpus's
  own `hex,apps,frequency` lists application names there)."""
  text = _read_text(path)
  records: list[tuple[int, tuple[str, ...]]] = []  # (first physical line, fields)
  reader = csv.reader(io.StringIO(text, newline=""))
  prev = 0
  try:
    for fields in reader:
      # A quoted field may span lines; the record starts after the previous one ended.
      records.append((prev + 1, tuple(fields)))
      prev = reader.line_num
  except csv.Error as e:
    raise ValueError(f"{path}:{reader.line_num}: not a CSV file: {e}") from None
  header = None
  start = 0
  if records and records[0][1]:
    first = records[0][1]
    name = first[0].strip()
    second = first[1].strip() if len(first) > 1 else ""
    # A header row's first field is a column name made of more than hex digits (e.g.
    # "hex"), or its second field is a name, not a number. A data row with a broken hex
    # (odd length, empty) stays a data row and is reported as such.
    looks_hex = bool(_HEX.match(name[2:] if name[:2] in ("0x", "0X") else name))
    if not looks_hex or (second and not _is_number(second)):
      header = [f.strip() for f in first]
      start = 1
  width = len(header) if header else None
  seconds = [f[1].strip() for _, f in records[start:] if len(f) > 1 and f[1].strip()]
  labelled = not seconds or any(_is_number(v) for v in seconds)
  rows = []
  for k, fields in records[start:]:
    if not fields or all(not f.strip() for f in fields):
      rows.append(Row(k, None, math.nan, fields, "empty line"))
      continue
    hx, err = _check_hex(fields[0])
    y, lerr = _check_label(fields[1]) if labelled and len(fields) > 1 else (math.nan, None)
    err = err or lerr
    if err is None and width is not None and len(fields) > width:
      err = f"{len(fields)} fields, but the header has {width}"
    rows.append(Row(k, hx if err is None else None, y if err is None else math.nan,
                    fields, err))
  return header, rows, labelled


def load_rows(path: str | Path) -> list[Row]:
  """Every data row of a BHive CSV file in input order, bad rows included.

  Args:
    path: the CSV file.

  Returns:
    One `Row` per data row (the header, if any, is not a row); `Row.error` says why a
    row is unusable.

  Raises:
    FileNotFoundError: the file does not exist.
    ValueError: the file is not text.

  >>> from diffsim.data import shipped
  >>> rows = load_rows(shipped("zen5-small.csv"))
  >>> len(rows), rows[0].error
  (3000, None)
  """
  return _parse(Path(path))[1]


def _column(values: list[str]) -> tuple:
  """A column as floats when every non-empty value is a number, else as strings."""
  if values and all((not v.strip()) or _is_number(v) for v in values):
    return tuple(float(v) if v.strip() else math.nan for v in values)
  return tuple(values)


def load_csv(path: str | Path, *, dedupe: bool = True) -> Dataset:
  """Loads a BHive-format CSV file of blocks and throughputs.

  Args:
    path: the CSV file: hex, then optionally cycles per 100 iterations, then any
      extra columns; header optional. A second column none of whose values is a number
      is an extra column, not labels (the BHive corpus's `hex,apps,frequency`).
    dedupe: merge repeated blocks (first occurrence kept, median label).

  Returns:
    A `Dataset` of the usable rows; unusable ones are listed in `errors`.

  Raises:
    FileNotFoundError: the file does not exist.
    ValueError: the file is not a text CSV file, or none of its rows is usable (the
      message names the first bad line).

  >>> ds = load_csv(shipped("zen5-small.csv"))  # doctest: +SKIP
  >>> len(ds), ds.label                          # doctest: +SKIP
  (3000, 'cycles_per_100_iterations')
  """
  path = Path(path)
  header, rows, labelled = _parse(path)
  good = [r for r in rows if r.error is None]
  errors = tuple((r.line, r.error) for r in rows if r.error is not None)
  if rows and not good:
    line, reason = errors[0]
    raise ValueError(f"{path}:{line}: no usable rows in the file; first: {reason}")
  ncols = max((len(r.fields) for r in good), default=0)
  extra_from = 2 if labelled else 1  # the first extra column
  if header:
    names = header[extra_from:] + [f"col{i}" for i in range(max(len(header), extra_from), ncols)]
  else:
    names = [f"col{i}" for i in range(extra_from, ncols)]
  label = header[1] if labelled and header and len(header) > 1 else ""

  keep = list(range(len(good)))
  ys = np.array([r.y for r in good], dtype=np.float64)
  merged = 0
  if dedupe:
    first: dict[str, int] = {}
    groups: dict[int, list[float]] = {}
    keep = []
    for k, r in enumerate(good):
      j = first.setdefault(r.hex, k)
      if j == k:
        keep.append(k)
      else:
        merged += 1
      groups.setdefault(j, []).append(r.y)
    for j, labels in groups.items():
      if len(labels) > 1:
        finite = [v for v in labels if not math.isnan(v)]
        ys[j] = float(np.median(finite)) if finite else math.nan
  extra = {}
  for c, name in enumerate(names, start=extra_from):
    extra[name] = _column([good[k].fields[c] if c < len(good[k].fields) else ""
                           for k in keep])
  return Dataset(
    hex=tuple(good[k].hex for k in keep),
    y=ys[keep] if keep else np.zeros(0, np.float64),
    line=tuple(good[k].line for k in keep),
    extra=extra,
    errors=errors,
    label=label,
    merged=merged,
    source=str(path),
  )
