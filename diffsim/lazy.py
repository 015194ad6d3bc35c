"""Names a package exports that load their module on first use, the one way every
package of diffsim does it: `import diffsim` and the command's start-up stay light (no
JAX, no decoder) until a name that needs them is touched."""

from __future__ import annotations

import importlib
import sys
from typing import Any, Callable


def exports(package: str, names: dict[str, str], subpackages: tuple[str, ...] = ()
            ) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
  """The `__getattr__` and `__dir__` of `package`: each of `names` (name -> the module
  that defines it) is imported on first use and then kept in the package's namespace,
  and each of `subpackages` is reachable as an attribute.

  >>> import diffsim.isa
  >>> diffsim.isa.parse_asm("addq %rbx, %rax").instrs[0].mnemonic
  'add'
  """

  def __getattr__(name: str) -> Any:
    if name in names:
      value = getattr(importlib.import_module(names[name]), name)
      setattr(sys.modules[package], name, value)  # later lookups skip this hook
      return value
    if name in subpackages:
      return importlib.import_module(f"{package}.{name}")
    raise AttributeError(f"module {package!r} has no attribute {name!r}")

  def __dir__() -> list[str]:
    return sorted(set(vars(sys.modules[package])) | set(names) | set(subpackages))

  return __getattr__, __dir__
