"""Starting tables from public facts: Zen 5's widths, built from llvm-mca's znver3."""

import numpy as np

from diffsim.isa import parse_asm
from diffsim.params.table import available_tables, load_json, load_table
from diffsim.sim import simulate_blocks


def steady(table, asm: str) -> float:
  return simulate_blocks(table, [parse_asm(asm)], throughput="steady")[0].cycles


def test_zen5_facts_is_a_named_table_built_from_znver3():
  assert "zen5-facts" in available_tables()
  doc, base = load_json("zen5-facts"), load_json("znver3")
  assert set(doc["opcodes"]) == set(base["opcodes"])
  assert doc["global"]["dispatch_width"] == 8 and doc["global"]["rob_size"] == 448
  units = {r["name"]: r.get("units", 1) for r in doc["resources"] if "members" not in r}
  assert units["Zn3Load"] == 4 and units["Zn3LSU"] == 4 and units["Zn3FPSt"] == 2


def test_zen5_facts_runs_the_documented_rates_where_znver3_does_not():
  zen5, znver3 = load_table("zen5-facts"), load_table("znver3")
  loads = "\n".join(f"movq {8 * i}(%rdi), %r{8 + i}" for i in range(8))
  assert steady(zen5, loads) == 200.0  # 4 loads per cycle
  assert steady(znver3, loads) > 250.0
  stores = "\n".join(f"movq %rax, {8 * i}(%rdi)" for i in range(4))
  assert steady(zen5, stores) == 200.0  # 2 stores per cycle
  assert steady(znver3, stores) == 400.0
  # The stack engine: no 1-cycle rsp chain through push and pop.
  assert steady(zen5, "pushq %rbx\npopq %rbx\npushq %rcx\npopq %rcx") < 200.0
  assert steady(znver3, "pushq %rbx\npopq %rbx\npushq %rcx\npopq %rcx") >= 400.0
  assert steady(zen5, "bsrq %rcx, %rcx") == 100.0  # latency 1 (znver3: 4)
  muls = "imulq $3, %rcx, %rdx\nimulq $5, %rcx, %rsi\nimulq $7, %rcx, %rdi"
  assert np.isclose(steady(zen5, muls), 100.0)  # 3 multipliers
  assert np.isclose(steady(znver3, muls), 300.0)


def test_graniterapids_facts_runs_the_rates_measured_on_the_xeon_6():
  gnr, skylake = load_table("graniterapids-facts"), load_table("skylake")
  loads = "\n".join(f"movq {8 * i}(%rdi), %r{8 + i}" for i in range(6))
  assert steady(gnr, loads) == 200.0  # 3 load ports: 6 loads in 2.0 cycles
  assert steady(skylake, loads) == 300.0
  assert steady(gnr, "cltd\nidivl %ecx") == 1300.0  # cltd 1 + idivl 12 (skylake 102)
  # Memory renamed through another register: no chain through memory (0.62 measured).
  assert steady(gnr, "movq %rax, 8(%rbx)\nmovq 8(%rcx), %rax\nimulq %rax, %rax") == 300.0
  # An indexed pair is forwarded: store data -> load (5) -> imul (3), 8.0 measured.
  assert steady(gnr, "movq %rax, 8(%rbx,%rcx)\nmovq 8(%rbx,%rcx), %rax\n"
                "imulq %rax, %rax") == 800.0


def test_graniterapids_facts_keys_leas_by_their_address_form():
  gnr = load_table("graniterapids-facts")
  assert steady(gnr, "leaq 8(%rdi), %rdi") < 20.0  # at rename: 0.16 measured
  assert steady(gnr, "leaq 8(%rdi,%rcx), %rdi") == 100.0  # indexed, an ALU: 1.0
  assert steady(gnr, "leaq (%rdi,%rcx,4), %rdi") == 200.0  # scaled: 2.0
  # Tables without the variant keep one LEA for every form (skylake: 1 cycle).
  skylake = load_table("skylake")
  assert steady(skylake, "leaq 8(%rdi), %rdi") == steady(skylake, "leaq (%rdi,%rcx,4), %rdi")
