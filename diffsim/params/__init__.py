"""CPU parameter tables: their JSON form (SCHEMA.md) and extraction from llvm-mca.

Loading a table (`diffsim.params.table`) is light; extraction (`build_table`, which
needs iced-x86 and the LLVM tools) loads on first use.
"""


def __getattr__(name: str):
  if name == "build_table":
    from diffsim.params.extract import build_table

    return build_table
  raise AttributeError(f"module 'diffsim.params' has no attribute {name!r}")
