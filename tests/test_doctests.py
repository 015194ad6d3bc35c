"""The examples in README.md and in the public docstrings run, so they cannot rot.

A dedicated test rather than `--doctest-modules`: the suite's command stays the one
README and `.ci/run` give, and only files that hold examples are imported.
"""

import doctest
import importlib
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
MODULES = sorted(".".join(p.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")
                 for p in (ROOT / "diffsim").rglob("*.py") if ">>> " in p.read_text())


def _check(results: doctest.TestResults) -> None:
  assert results.failed == 0, f"{results.failed} of {results.attempted} examples failed"


def test_readme_examples_run():
  """The ```pycon blocks of README.md, the quick look among them (a closing fence
  right after an output would read as part of it, so each block is taken alone)."""
  text = (ROOT / "README.md").read_text()
  blocks = re.findall(r"^```pycon\n(.*?)^```", text, flags=re.S | re.M)
  test = doctest.DocTestParser().get_doctest("\n".join(blocks), {}, "README.md",
                                             str(ROOT / "README.md"), 0)
  runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS)
  runner.run(test)
  results = runner.summarize(verbose=False)
  assert results.attempted >= 7  # the quick look is there
  _check(results)


@pytest.mark.parametrize("name", MODULES)
def test_docstring_examples_run(name):
  results = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
  _check(results)
