"""Tests of the llvm-mca parameter extraction (diffsim.params.extract and helpers).

The shipped tables are checked against the facts diffsim/sim/MODEL.md gives (global
parameters, resource lists, llvm-exegesis' lists, worked examples);
a few keys are rebuilt with the real LLVM 14 tools (marked `mca`, skipped without
them); rebuilding whole tables is `slow`.
"""

import json

import pytest

from diffsim.llvmtools import TOOLS, available
from diffsim.params import corpus_keys, extract, mctools, variants
from diffsim.params import resources as R
from diffsim.params.table import TABLES_DIR

needs_tools = pytest.mark.skipif(not available(*TOOLS), reason="no LLVM 14 tools")


def _table(cpu):
  with open(TABLES_DIR / f"{cpu}.json") as f:
    return json.load(f)


@pytest.fixture(scope="module")
def haswell():
  return _table("haswell")


@pytest.fixture(scope="module")
def znver3():
  return _table("znver3")


# ----------------------------------------------------------------------------------------
# Shipped tables


# Keys whose llvm-mca 14 pressure no integer list over the model's units and groups
# reproduces (these Zen 1/2 FPU classes spread cycles in thirds over three of four
# pipes, or over two named pipes): the table keeps llvm-exegesis' list and says so.
UNVERIFIED = {
  "znver1": {"LD_Frr", "RSQRTSSr_Int", "ST_FPrr"},
  "znver2": {"CVTSI2SDrr_Int", "CVTSI642SDrr_Int", "VCVTSI2SDrr_Int", "VCVTSI642SDrr_Int",
             "VEXTRACTF128rr", "VINSERTF128rr"},
}


@pytest.mark.parametrize("cpu", extract.CPUS)
def test_table_covers_corpus_keys(cpu):
  t = _table(cpu)
  assert t["format"] == "diffsim-params/1" and t["cpu"] == cpu
  keys = corpus_keys.load()
  missing = [k for k in keys if k not in t["opcodes"] and k not in t["unsupported"]]
  assert not missing
  for k, e in t["opcodes"].items():
    assert isinstance(e["uops"], int) and isinstance(e["latency"], int), k
  unverified = {k for k, e in t["opcodes"].items() if "UNVERIFIED" in e.get("evidence", "")}
  assert unverified == UNVERIFIED.get(cpu, set())


@pytest.mark.parametrize("cpu", extract.CPUS)
def test_table_keys_are_the_corpus_keys(cpu):
  # Besides the corpus keys, a table holds only condition-code variants (`@<cc>`), the
  # slow LEA forms (`@3op`, `@scale`) and zero immediates (`@imm0`), each where it costs
  # something else.
  t = _table(cpu)
  suffixes = set(variants.CONDITIONS) | {"3op", "scale", "imm0"}
  plain = {k for k in t["opcodes"] if k.split("@")[-1] not in suffixes}
  assert plain | set(t["unsupported"]) == set(corpus_keys.load())
  for k in set(t["opcodes"]) - plain:
    assert {f: v for f, v in t["opcodes"][k].items() if f not in ("evidence", "sched_class")} \
        != {f: v for f, v in t["opcodes"][k.split("@")[0]].items()
            if f not in ("evidence", "sched_class")}, k


def test_slow_lea_forms():
  # Zen 3's Zn3SlowLEAPredicate: base + index + non-zero displacement, or scale != 1.
  t = _table("znver3")
  assert t["opcodes"]["LEA64r@3op"]["latency"] == 2 and t["opcodes"]["LEA64r"]["latency"] == 1
  assert "LEA64r@scale" in t["opcodes"] and "LEA64r@3op" not in _table("haswell")["opcodes"]
  from diffsim.isa import idioms  # pylint: disable=import-outside-toplevel
  assert idioms.lea_variant("LEA64r", "leaq\t1(%rbx,%rax), %rbx") == "@3op"
  assert idioms.lea_variant("LEA64r", "leaq\t(%rbx,%rax,4), %rbx") == "@scale"
  assert idioms.lea_variant("LEA64r", "leaq\t8(,%rax,8), %rbx") == "@scale"
  assert idioms.lea_variant("LEA64r", "leaq\t(%rbx,%rax), %rbx") == ""
  assert idioms.lea_variant("LEA64r", "leaq\t16(%rsp), %rdi") == ""


@needs_tools
def test_corpus_examples_decode_to_their_keys():
  # The keys are the decoder's: each example's bytes decode to its key, and no key is
  # a non-canonical encoding that llvm-mca never simulates (XOR32rr_REV, PUSH64i32
  # for a small immediate).
  from diffsim.isa import decode_blocks  # pylint: disable=import-outside-toplevel
  keys = corpus_keys.load()
  blocks = decode_blocks([e["hex"] for e in keys.values()])
  assert [b.instrs[0].key for b in blocks] == list(keys)
  assert "XOR32rr_REV@same" not in keys and "XOR32rr@same" in keys


@pytest.mark.parametrize("cpu", extract.CPUS)
def test_resource_lists_name_known_resources(cpu):
  t = _table(cpu)
  names = {r["name"] for r in t["resources"]}
  units = [r["name"] for r in t["resources"] if "members" not in r]
  for r in t["resources"]:
    assert set(r.get("members", [])) <= set(units)
  for k, e in t["opcodes"].items():
    for name, cycles in e["resources"]:
      assert name in names and cycles > 0, k


def test_haswell_globals(haswell):
  g = haswell["global"]
  assert (g["dispatch_width"], g["rob_size"], g["retire_width"]) == (4, 192, 0)
  assert (g["load_queue"], g["store_queue"], g["register_files"]) == (0, 0, [])
  res = {r["name"]: r for r in haswell["resources"]}
  assert res["HWPortAny"]["buffer"] == 60
  assert res["HWPortAny"]["members"] == [f"HWPort{i}" for i in range(8)]
  assert res["HWPort0156"]["members"] == ["HWPort0", "HWPort1", "HWPort5", "HWPort6"]
  assert res["HWPort237"]["members"] == ["HWPort2", "HWPort3", "HWPort7"]
  assert all(res[f"HWPort{i}"]["buffer"] == -1 for i in range(8))


@pytest.mark.parametrize("key,uops,lat,res", [
    ("DIV32r", 32, 98, [["HWPort0", 7], ["HWPort1", 7], ["HWPort5", 3], ["HWPort6", 3],
                        ["HWPort01", 1], ["HWPort0156", 11]]),
    ("ADD64rm", 2, 6, [["HWPort23", 1], ["HWPort0156", 1]]),
    ("PUSH64r", 3, 2, [["HWPort4", 1], ["HWPort237", 1], ["HWPort0156", 1]]),
    ("POP64r", 2, 6, [["HWPort23", 1], ["HWPort0156", 1]]),
    ("VDIVSDrr_Int", 1, 20, [["HWFPDivider", 14], ["HWPort0", 1]]),
])
def test_haswell_pipeline_model_facts(haswell, key, uops, lat, res):
  e = haswell["opcodes"][key]
  assert (e["uops"], e["latency"]) == (uops, lat)
  assert sorted(e["resources"]) == sorted(res)


def test_haswell_read_advance_and_flags(haswell):
  ops = haswell["opcodes"]
  assert ops["ADD64rm"]["read_advance"] == {"op": 5}
  assert ops["ADD64rm"]["may_load"] and not ops["ADD64rm"].get("may_store")
  assert ops["VADDPSrm"]["read_advance"] == {"op": 6}
  assert ops["VADDPSYrm"]["read_advance"] == {"op": 7}
  assert "read_advance" not in ops["ADD64rr"]
  assert ops["MFENCE"]["load_barrier"] and ops["MFENCE"]["store_barrier"]
  assert ops["LFENCE"]["load_barrier"] and not ops["LFENCE"].get("store_barrier")
  assert not any(e.get("begin_group") or e.get("end_group") for e in ops.values())


def test_haswell_idioms(haswell):
  ops = haswell["opcodes"]
  xor = ops["XOR32rr@same"]
  assert xor["zero_idiom"] and (xor["latency"], xor["resources"]) == (0, [])
  assert ops["XOR32rr"]["latency"] == 1 and not ops["XOR32rr"].get("zero_idiom")
  # diffsim/sim/MODEL.md#zero-idioms: not idioms on Haswell.
  for k in ("XOR8rr@same", "SBB32rr@same", "PCMPEQDrr@same", "CMP64rr@same"):
    assert not ops[k].get("zero_idiom") and not ops[k].get("dep_breaking"), k
  assert not any(e.get("move_elim") for e in ops.values())


def test_haswell_condition_code_variants(haswell):
  ops = haswell["opcodes"]
  assert (ops["SETCCr"]["uops"], ops["SETCCr@a"]["uops"], ops["SETCCr@be"]["uops"]) == (1, 2, 2)
  assert "SETCCr@e" not in ops


def test_haswell_zero_immediate_variants(haswell):
  # HWWriteADC0: adc/sbb $0 is 1 uop, latency 1, except on the accumulator.
  ops = haswell["opcodes"]
  for k in ("ADC32ri8", "ADC64ri8", "SBB32ri8", "SBB64ri8"):
    assert (ops[k]["uops"], ops[k]["latency"]) == (2, 2), k
    assert (ops[k + "@imm0"]["uops"], ops[k + "@imm0"]["latency"]) == (1, 1), k
  assert not any(k.endswith("@imm0") for k in _table("skylake")["opcodes"])
  from diffsim.isa import idioms  # pylint: disable=import-outside-toplevel
  assert idioms.imm_variant("sbbq\t$0, %rdx") == "@imm0"
  assert idioms.imm_variant("sbbq\t$0x0, 8(%rsp)") == "@imm0"
  assert idioms.imm_variant("sbbl\t$0, %eax") == idioms.imm_variant("sbbq\t$-1, %rdx") == ""
  assert idioms.imm_variant("addq\t%rax, %rdx") == ""


def test_zen1_register_file_facts():
  # llvm-mca's Zen 1 renames a YMM register as two 128-bit halves, and its zero idioms
  # keep latency and resources but take no physical register.
  t = _table("znver1")
  fp = next(f for f in t["global"]["register_files"] if "vec" in f["classes"])
  assert fp["costs"] == {"ymm": 2}
  ops = t["opcodes"]
  assert ops["XOR32rr@same"]["zero_idiom"] and ops["XOR32rr@same"]["latency"] == 1
  assert ops["SBB32rr@same"]["dep_breaking"] and not ops["SBB32rr@same"].get("zero_idiom")
  assert all("costs" not in f for f in _table("znver3")["global"]["register_files"])
  assert ops["LD_F80m"]["buffers"] == ["ZnAGU", "ZnFPU"]


def test_znver3_facts(znver3):
  ops = znver3["opcodes"]
  assert ops["IMUL64rr"]["resources"] == [["Zn3ALU1", 1]]
  assert ops["IMUL64rr"]["latency"] == 3
  g = znver3["global"]
  assert (g["dispatch_width"], g["rob_size"], g["retire_width"]) == (6, 256, 8)
  assert (g["load_queue"], g["store_queue"]) == (72, 64)
  files = {f["name"]: f for f in g["register_files"]}
  assert files["Zn3IntegerPRF"]["size"] == 192 and files["Zn3FpPRF"]["size"] == 160
  assert ops["MOV64rr"]["move_elim"] and ops["VMOVAPSrr"]["move_elim"]
  assert ops["XOR32rr@same"]["zero_idiom"]
  assert ops["PCMPEQDrr@same"]["dep_breaking"] and not ops["PCMPEQDrr@same"].get("zero_idiom")
  res = {r["name"]: r for r in znver3["resources"]}
  assert res["Zn3Int"]["buffer"] == 96 and res["Zn3FP"]["buffer"] == 64
  assert res["Zn3Load"]["units"] == 3 and res["Zn3Load"]["buffer"] == 72


# ----------------------------------------------------------------------------------------
# Pure helpers


def test_compare_numeric():
  assert R.compare_numeric("HWPort2", "HWPort10") < 0
  assert R.compare_numeric("HWPort15", "HWPort015") < 0
  assert R.compare_numeric("a", "a") == 0


def _haswell_model():
  units = {n: 1 for n in ["HWDivider", "HWFPDivider"] + [f"HWPort{i}" for i in range(8)]}
  groups = {"HWPort01": {"HWPort0", "HWPort1"},
            "HWPort0156": {"HWPort0", "HWPort1", "HWPort5", "HWPort6"}}
  return R.Model(units, groups, {})


def test_normalize_reserves_divl_groups():
  # diffsim/sim/MODEL.md#resource-lists: divl reserves HWPort01 (1 cycle) and HWPort0156 (11).
  m = _haswell_model()
  written = [("HWPort0", 7), ("HWPort1", 7), ("HWPort5", 3), ("HWPort6", 3), ("HWPort01", 1),
             ("HWPort0156", 11)]
  n = R.normalize(m, R.expand(m, written))
  assert sorted(n.kept) == sorted(written)
  assert n.reserved == {"HWPort01", "HWPort0156"}
  p = R.static_pressure(m, n.kept)
  assert abs(p["HWPort0"] - 10.25) < 1e-9 and abs(p["HWPort5"] - 5.75) < 1e-9


def test_exegesis_operand_spelling():
  assert mctools.exegesis_operand("imm", -8, {}) == "i_0x-8"
  assert mctools.exegesis_operand("imm", 12, {}) == "i_0xc"
  assert mctools.exegesis_operand("reg", 0, {}) == "i_0x0"
  assert mctools.exegesis_operand("reg", 22, {22: "EAX"}) == "EAX"


def test_parse_show_inst():
  out = ("\taddl\t%edx, 12(%rdi)                  # <MCInst #384 ADD32mr\n"
         "                                        #  <MCOperand Reg:53>\n"
         "                                        #  <MCOperand Imm:-12>>\n"
         "\tud2                                     # <MCInst #3038 TRAP>\n")
  a, b = mctools.parse_show_inst(out)
  assert (a.opcode, a.operands) == ("ADD32mr", (("reg", 53), ("imm", -12)))
  assert (b.opcode, b.operands) == ("TRAP", ())


# ----------------------------------------------------------------------------------------
# With the real tools


_SUBSET = {
    "DIV32r": "divl\t%ecx",
    "ADD64rm": "addq\t(%rdi), %rbx",
    "PUSH64r": "pushq\t%rax",
    "POP64r": "popq\t%rbx",
    "VDIVSDrr": "vdivsd\t%xmm1, %xmm2, %xmm3",
    "XOR32rr@same": "xorl\t%eax, %eax",
    "IMUL64rr": "imulq\t%rcx, %rdx",
}


def _subset_keys():
  hexes = mctools.encode(list(_SUBSET.values()))
  return {k: {"example": t, "count": 1, "hex": h} for (k, t), h in zip(_SUBSET.items(), hexes)}


@pytest.mark.mca
@needs_tools
def test_build_table_haswell_subset():
  t = extract.build_table("haswell", _subset_keys())
  ops = t["opcodes"]
  assert ops["DIV32r"]["resources"] == [["HWPort0", 7], ["HWPort1", 7], ["HWPort5", 3],
                                       ["HWPort6", 3], ["HWPort01", 1], ["HWPort0156", 11]]
  assert (ops["DIV32r"]["uops"], ops["DIV32r"]["latency"]) == (32, 98)
  assert ops["ADD64rm"]["read_advance"] == {"op": 5}
  assert (ops["VDIVSDrr"]["latency"], ops["VDIVSDrr"]["resources"]) == (
      20, [["HWFPDivider", 14], ["HWPort0", 1]])
  assert ops["XOR32rr@same"]["zero_idiom"]
  assert (t["global"]["dispatch_width"], t["global"]["rob_size"]) == (4, 192)
  res = {r["name"]: r for r in t["resources"]}
  assert res["HWPortAny"]["buffer"] == 60


@pytest.mark.mca
@needs_tools
def test_build_table_znver3_subset():
  t = extract.build_table("znver3", _subset_keys(), probe=False)
  assert t["opcodes"]["IMUL64rr"]["resources"] == [["Zn3ALU1", 1]]
  assert t["opcodes"]["IMUL64rr"]["latency"] == 3


@pytest.mark.slow
@pytest.mark.mca
@needs_tools
@pytest.mark.parametrize("cpu", extract.CPUS)
def test_rebuild_matches_shipped(cpu):
  built = extract.build_table(cpu)
  shipped = _table(cpu)
  assert built["global"] == shipped["global"]
  assert built["resources"] == shipped["resources"]
  assert built["opcodes"] == shipped["opcodes"]
