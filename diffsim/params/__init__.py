"""CPU parameter tables: their JSON form (SCHEMA.md) and extraction from llvm-mca.

Loading a table (`diffsim.params.table`) is light; extraction (`build_table`, which
needs iced-x86 and the LLVM tools) loads on first use.
"""


from diffsim.lazy import exports

__getattr__, __dir__ = exports(__name__, {"build_table": "diffsim.params.extract"})
