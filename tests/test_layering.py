"""The package's imports follow the data flow: no module imports from a later stage.

Every module of `diffsim` is parsed (not imported), and each `import diffsim.X` or
`from diffsim.X import ...` it holds, lazy ones inside functions included, is checked
against the rank table below. A module may import from its own unit or from a unit of
lower rank; two units of the same rank stay independent.
"""

from __future__ import annotations

import ast
import pkgutil
from pathlib import Path

import diffsim

# Rank of each unit, in the order data flows (diffsim/ARCHITECTURE.md#layering): the LLVM tool
# lookup, then decoding (the isa modules, ranked below); the bridges to llvm-mca and to
# datasets, which parameter extraction already uses; parameter tables, and beside them
# measuring, which needs only decoding and the data formats (so any workflow may time
# blocks: search's measured objective does); the simulator; the workflows built on it
# (perfvec reuses fit's training loop); calibration, which measures and fits; the
# command line, which may use everything; and the package's curated surface and
# `python -m diffsim` on top. Nothing imports `cli` but those two.
RANK = {
    "diffsim.llvmtools": 0,
    "diffsim.lazy": 0,
    "diffsim.isa": 1,
    "diffsim.mca": 2,
    "diffsim.data": 2,
    "diffsim.params": 3,
    "diffsim.measure": 3,
    "diffsim.sim": 4,
    "diffsim.fit": 5,
    "diffsim.perfvec": 6,
    "diffsim.search": 6,
    "diffsim.calibrate": 7,
    "diffsim.cli": 8,
    "diffsim": 9,
    "diffsim.__main__": 9,
}
# What the harness may import, whatever the ranks allow: timing a block needs its
# bytes (isa), the data formats (data, mca's files) and the LLVM tools, nothing that
# simulates or searches. A workflow that measures lives in its own unit and imports
# measure, never the other way round.
MEASURE_MAY_IMPORT = {"diffsim.llvmtools", "diffsim.isa", "diffsim.mca", "diffsim.data",
                      "diffsim.measure"}
# Inside isa the same rule, one step finer: the IR vocabulary, the two decoders' facts,
# public decoding, what is built on it (assembly text, JSON, the background decoder),
# and last encoding to arrays, which nothing else in isa needs.
ISA_RANK = {
    "ir": 0, "roles": 0, "heap": 0, "idioms": 0, "memory": 1,
    "iced_facts": 2, "llvmmc": 2,
    "decode": 3,
    "asm": 4, "blockjson": 4, "background": 4,
    "encode": 5,
}


def unit(module: str) -> str:
  """The ranked unit a module belongs to: `diffsim.sim.issue` -> `diffsim.sim`."""
  parts = module.split(".")
  return ".".join(parts[:2]) if len(parts) > 1 else module


def modules() -> dict[str, Path]:
  """Every module of the package (its `__init__` included), with its source file."""
  found = {"diffsim": Path(diffsim.__file__)}
  for info in pkgutil.walk_packages(diffsim.__path__, "diffsim."):
    found[info.name] = Path(info.module_finder.find_spec(info.name).origin)
  return found


def imports(module: str, path: Path) -> list[tuple[int, str]]:
  """(line, imported diffsim module) for every import statement in the file."""
  package = module if path.name == "__init__.py" else module.rpartition(".")[0]
  out = []
  for node in ast.walk(ast.parse(path.read_text(), str(path))):
    if isinstance(node, ast.Import):
      out += [(node.lineno, a.name) for a in node.names]
    elif isinstance(node, ast.ImportFrom):
      base = node.module or ""
      if node.level:  # relative: resolve against this module's package
        anchor = package.split(".")[:len(package.split(".")) - node.level + 1]
        base = ".".join(anchor + ([base] if base else []))
      # `from diffsim.isa import decode` imports the submodule `diffsim.isa.decode`.
      out += [(node.lineno, f"{base}.{a.name}") for a in node.names]
  return [(line, name) for line, name in out if name.split(".")[0] == "diffsim"]


def violations(module: str, path: Path) -> list[str]:
  """What `module` imports against the rank tables, as `file:line: a -> b` lines."""
  bad = []
  here = unit(module)
  for line, name in imports(module, path):
    there = unit(name)
    if there not in RANK:  # `from diffsim import load_table`: the curated surface
      there = "diffsim"
    ok = there == here or RANK[there] < RANK[here]
    if ok and here == there == "diffsim.isa":
      a, b = module.split(".")[2:3], name.split(".")[2:3]
      if a and b and b[0] in ISA_RANK:
        ok = a[0] == b[0] or ISA_RANK[b[0]] < ISA_RANK[a[0]]
    if not ok:
      bad.append(f"{path}:{line}: {module} imports {name}")
  return bad


def test_every_unit_and_isa_module_is_ranked():
  found = modules()
  assert {unit(m) for m in found} <= set(RANK)
  isa = {m.split(".")[2] for m in found if m.startswith("diffsim.isa.")}
  assert isa == set(ISA_RANK), "rank the new isa module in ISA_RANK"


def test_no_module_imports_a_later_stage():
  bad = [v for m, p in sorted(modules().items()) for v in violations(m, p)]
  assert not bad, "imports against the data flow:\n" + "\n".join(bad)


def test_measure_imports_only_decoding_data_and_itself():
  bad = [f"{p}:{line}: {m} imports {name}"
         for m, p in sorted(modules().items()) if unit(m) == "diffsim.measure"
         for line, name in imports(m, p) if unit(name) not in MEASURE_MAY_IMPORT]
  assert not bad, "measure imports beyond isa, mca, data, llvmtools:\n" + "\n".join(bad)


def test_the_llvm_lookup_is_a_leaf():
  # It sits below isa, so it may import nothing from diffsim at all.
  path = modules()["diffsim.llvmtools"]
  assert imports("diffsim.llvmtools", path) == []


def test_a_later_import_is_caught(tmp_path):
  # The rule itself: isa importing a parameter table is the kind of slip it exists for.
  src = tmp_path / "decode.py"
  src.write_text("def f():\n  from diffsim.params import table\n")
  assert violations("diffsim.isa.decode", src) == [
      f"{src}:2: diffsim.isa.decode imports diffsim.params.table"]
  src.write_text("from diffsim.isa import encode\n")
  assert violations("diffsim.isa.decode", src)


def test_llvm_tools_run_only_through_llvmtools():
  """Every LLVM process diffsim starts goes through `diffsim.llvmtools.run_tool`, so
  they share one lookup, one way of passing input and one error type: no other module
  names an LLVM tool in a subprocess call of its own."""
  offenders = []
  for path in sorted(Path(diffsim.__file__).parent.rglob("*.py")):
    if path.name == "llvmtools.py":
      continue
    for node in ast.walk(ast.parse(path.read_text())):
      if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
          and isinstance(node.func.value, ast.Name) and node.func.value.id == "subprocess"
          and "llvm" in ast.unparse(node)):
        offenders.append(f"{path.name}:{node.lineno}")
  assert not offenders, offenders
