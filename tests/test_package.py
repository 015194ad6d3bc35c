"""`import diffsim` reaches every subpackage as an attribute, lazily."""

from __future__ import annotations

import pkgutil

import diffsim


def test_every_subpackage_is_an_attribute():
  subpackages = {m.name for m in pkgutil.iter_modules(diffsim.__path__) if m.ispkg}
  # `cli` is the command, not a library surface.
  # `fit` is also the gradient fit's name: the attribute is the function or, once any
  # `diffsim.fit.*` module has been imported, the subpackage.
  for name in sorted(subpackages - {"cli", "fit"}):
    assert getattr(diffsim, name).__name__ == f"diffsim.{name}", name
    assert name in dir(diffsim)
  assert diffsim.fit is not None
