"""Every document the repository cites is in the repository, and ships in the wheel.

Code, tests, benchmarks, notebooks and the README cite Markdown documents by name
(`benchmarks/RESULTS.md`), by path relative to the citing file (`../sim/MODEL.md`) or
from the repository root (`diffsim/sim/MODEL.md#dispatch`). Each citation must name a
file of the repository, and an `#anchor` must name one of that file's headings, so
that a clone holds everything the code refers to.
"""

from __future__ import annotations

import fnmatch
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCANNED_DIRS = ("diffsim", "tests", "benchmarks", "notebooks")
SCANNED_FILES = ("README.md", "pyproject.toml", "setup.cfg")
TEXT_SUFFIXES = {".py", ".md", ".ipynb", ".c", ".txt", ".toml", ".cfg"}
# Documents a command writes, not documents of the repository (`diffsim calibrate`).
GENERATED = {"report.md"}
# The optional shared data folder (`diffsim.data.shared_data_dir`) is an input the user
# supplies, like BHive; its files document the data, not the code.
EXTERNAL_DATA = ("../shared/data/", "shared/data/")
# Where the project's design documents lived before they moved into the package
# (split, so that a search for the old path finds only real citations).
OUTSIDE_DOCS = "shared" + "/docs"

# A path ending in .md, optionally with an anchor; not the tail of a longer path or name.
CITATION = re.compile(r"(?<![\w./-])((?:\.{1,2}/|[\w-]+/)*[\w.-]+\.md)(#[\w-]+)?")
SAME_FILE_ANCHOR = re.compile(r"\]\((#[\w-]+)\)")
HEADING = re.compile(r"^#{1,6}\s+(.*?)\s*#*\s*$")


def scanned() -> list[Path]:
  """The files whose citations are checked (this one aside: it names bad examples)."""
  files = [ROOT / f for f in SCANNED_FILES if (ROOT / f).is_file()]
  for d in SCANNED_DIRS:
    files += [p for p in sorted((ROOT / d).rglob("*"))
              if p.is_file() and p.suffix in TEXT_SUFFIXES and "__pycache__" not in p.parts]
  return [p for p in files if p.resolve() != Path(__file__).resolve()]


def documents() -> dict[str, list[Path]]:
  """File name -> the repository's Markdown documents of that name."""
  out: dict[str, list[Path]] = {}
  for p in [*ROOT.glob("*.md"), *(q for d in SCANNED_DIRS for q in (ROOT / d).rglob("*.md"))]:
    out.setdefault(p.name, []).append(p)
  return out


def slug(heading: str) -> str:
  """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
  text = re.sub(r"[^\w\- ]", "", heading.strip().lower())
  return text.replace(" ", "-")


def anchors(md: Path) -> set[str]:
  """The anchors of a Markdown file's headings (code blocks skipped)."""
  out, fenced = set(), False
  for line in md.read_text(encoding="utf-8").splitlines():
    if line.lstrip().startswith("```"):
      fenced = not fenced
    elif not fenced and (m := HEADING.match(line)):
      out.add(slug(m.group(1)))
  return out


def targets(cited: str, source: Path, docs: dict[str, list[Path]]) -> list[Path] | None:
  """The repository files a citation can mean, [] when none; None when it is exempt."""
  if Path(cited).name in GENERATED or cited.startswith(EXTERNAL_DATA):
    return None
  if "/" not in cited:
    return docs.get(cited, [])
  found = []
  for base in (source.parent, ROOT):
    p = (base / cited).resolve()
    if p.is_file() and p.is_relative_to(ROOT):
      found.append(p)
  return found


def problems(text: str, source: Path, docs: dict[str, list[Path]]) -> list[str]:
  """`file:line: why` for each citation in `text` that names nothing in the repository."""
  where = source.relative_to(ROOT) if source.is_relative_to(ROOT) else source
  bad = []
  for n, line in enumerate(text.splitlines(), 1):
    if OUTSIDE_DOCS in line:
      bad.append(f"{where}:{n}: cites {OUTSIDE_DOCS}, outside the repository")
    for m in CITATION.finditer(line):
      cited, anchor = m.group(1), m.group(2)
      files = targets(cited, source, docs)
      if files is None:
        continue
      if not files:
        bad.append(f"{where}:{n}: cites {cited}, which is not in the repository")
      elif anchor and not any(anchor[1:] in anchors(f) for f in files):
        bad.append(f"{where}:{n}: {cited} has no heading for {anchor}")
    if source.suffix == ".md":
      for m in SAME_FILE_ANCHOR.finditer(line):
        if m.group(1)[1:] not in anchors(source):
          bad.append(f"{where}:{n}: no heading for {m.group(1)} in this file")
  return bad


def test_every_cited_document_is_in_the_repository():
  docs = documents()
  bad = [b for f in scanned() for b in problems(f.read_text(encoding="utf-8"), f, docs)]
  assert not bad, "citations of missing documents or headings:\n" + "\n".join(bad)


def test_the_model_document_is_cited_by_section():
  # The check above is not vacuous: the simulator's stages cite their sections.
  cites = [m.group(0) for f in scanned()
           for m in CITATION.finditer(f.read_text(encoding="utf-8"))
           if m.group(1).endswith("MODEL.md") and m.group(2)]
  assert len(cites) >= 10
  for stage, section in (("dispatch", "#dispatch"), ("issue", "#issue"), ("retire", "#retire")):
    text = (ROOT / "diffsim" / "sim" / f"{stage}.py").read_text(encoding="utf-8")
    assert f"diffsim/sim/MODEL.md{section}" in text, stage


def test_bad_citations_are_caught(tmp_path):
  docs = documents()
  src = ROOT / "diffsim" / "sim" / "example.py"  # resolved as if it lived there
  assert problems("see `MODEL.md#dispatch` and ../sim/README.md", src, docs) == []
  assert problems("as `diffsim/sim/MODEL.md#issue` says", tmp_path / "x.py", docs) == []
  assert problems("the [results](../../benchmarks/RESULTS.md)", src, docs) == []
  assert problems("written to DIR/report.md", src, docs) == []
  gone = "pipeline" + "-model.md section 4"
  assert len(problems(f"as {gone} says", src, docs)) == 1
  assert len(problems("`diffsim/sim/MODEL.md#no-such-section`", src, docs)) == 1
  assert len(problems("../" + OUTSIDE_DOCS + "/notes", src, docs)) == 1


def test_documents_in_the_package_ship_in_the_wheel():
  tomllib = pytest.importorskip("tomllib")
  config = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))
  data = config["tool"]["setuptools"]["package-data"]
  missing = []
  for md in sorted((ROOT / "diffsim").rglob("*.md")):
    package = md.parent
    while not (package / "__init__.py").exists():
      package = package.parent
    name = ".".join(package.relative_to(ROOT).parts)
    rel = md.relative_to(package).as_posix()
    if not any(fnmatch.fnmatch(rel, pattern) for pattern in data.get(name, [])):
      missing.append(f"{md.relative_to(ROOT)} (package {name})")
  assert not missing, "add to [tool.setuptools.package-data]: " + ", ".join(missing)
