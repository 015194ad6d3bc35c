"""Pure helpers of the bridge: no llvm-mca run needed."""

from __future__ import annotations

import numpy as np
import pytest

from diffsim.llvmtools import find_llvm_tool
from diffsim.mca import steady


def test_steady():
  assert steady(209, 109, 100) == 100.0
  assert steady(1203, 603, 300) == 200.0
  np.testing.assert_array_equal(
    steady(np.array([209, 409]), np.array([109, 209]), 100), [100.0, 200.0]
  )


def test_missing_tool_says_how_to_install():
  with pytest.raises(FileNotFoundError, match="apt-get install llvm-14"):
    find_llvm_tool("llvm-no-such-tool")
