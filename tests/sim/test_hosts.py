"""Multi-process runs (`diffsim.sim.hosts`): dealing, gathering, and two local processes
on the loopback address giving exactly what one process gives."""

import csv
import textwrap

import numpy as np
import pytest

from diffsim.data import shipped
from diffsim.isa import decode_blocks, parse_asm
from diffsim.params.sample import sample_params
from diffsim.params.table import load_table
from diffsim.sim import encode, hosts, simulate_sweep

SMALL = ["addl %ecx, %eax; imull %eax, %eax", "vdivsd %xmm1, %xmm2, %xmm3",
         "movl %ecx, (%rdi); movl (%rsi), %eax; addl %eax, %ecx", "pushq %rbx; popq %rbx",
         "movb $1, %al; imull %eax, %eax", "imulq %rax, %rax", "divl %ecx",
         "movq (%rdi), %rax; addq %rax, %rbx; movq %rbx, (%rdi)"]


def test_deal_gives_every_row_once_most_expensive_first_in_turn():
  cost = np.array([3.0, 9.0, 1.0, 7.0, 5.0, 2.0, 8.0])
  shares = hosts.deal(7, 3, cost)
  assert [s.tolist() for s in shares] == [[1, 4, 2], [6, 0], [3, 5]]
  assert sorted(np.concatenate(shares).tolist()) == list(range(7))
  # Without costs, rows in turn: a process's rows and then its devices' interleave.
  assert [s.tolist() for s in hosts.deal(5, 2)] == [[0, 2, 4], [1, 3]]


def test_one_process_is_the_identity():
  assert (hosts.count(), hosts.index(), hosts.primary()) == (1, 0, True)
  x = (np.arange(4.0), np.array([[1, 2], [3, 4], [5, 6], [7, 8]], np.int64))
  shares = hosts.deal(4, 1, np.array([1.0, 4.0, 2.0, 3.0]))
  got = hosts.gather(tuple(a[shares[0]] for a in x), shares, 4)
  for a, b in zip(x, got):
    np.testing.assert_array_equal(a, b)
  assert hosts.agree(True) and not hosts.agree(False)
  with hosts.alone():
    assert hosts.count() == 1


def test_initialize_without_flags_or_environment_does_nothing(monkeypatch):
  for k in hosts.ENV:
    monkeypatch.delenv(k, raising=False)
  assert hosts.initialize() is False
  assert hosts.count() == 1


def _rows(n: int = 14) -> list[list[str]]:
  """Shipped blocks of up to 8 instructions (one bucket), a duplicate and a bad row."""
  with open(shipped("mca-small.csv")) as f:
    rows = list(csv.reader(f))[1:]
  blocks = decode_blocks([r[0] for r in rows[:200]])
  keep = [r[:1] for r, b in zip(rows, blocks) if not isinstance(b, Exception)
          and len(b.instrs) <= 8][:n]
  return keep[:5] + [keep[2], ["zz"]] + keep[5:]


# What every process of the run does: the `diffsim simulate` command (joining the run
# from JAX's environment variables), then `simulate_sweep` on one batch. (`simulate`
# shares their dealing and gathering; each entry point costs a compilation per process.)
SCRIPT = """
import sys
import numpy as np
from diffsim.cli import main
from diffsim.params.sample import sample_params
from diffsim.params.table import load_table
from diffsim.isa import parse_asm
from diffsim.sim import encode, hosts, simulate_sweep

data, out = sys.argv[1], sys.argv[2]
assert main(["simulate", data, "--params", "haswell", "-o", out + "/sim.csv"]) == 0
assert hosts.count() == 2
table = load_table("haswell")
batch = encode(table, [parse_asm(a) for a in {small!r}], length=8)
s = simulate_sweep(table, batch, params=sample_params(table, 3, 0), iterations=30, throw=False)
np.savez(out + f"/p{{hosts.index()}}.npz", sweep=s.total, sweep_status=s.status)
"""


def test_two_processes_on_loopback_equal_one(tmp_path, processes):
  start, wait = processes
  data = tmp_path / "in.csv"
  with open(data, "w", newline="") as f:
    csv.writer(f).writerows([["hex"]] + _rows())
  script = tmp_path / "run.py"
  script.write_text(textwrap.dedent(SCRIPT.format(small=SMALL)))
  two = tmp_path / "two"
  two.mkdir()
  handles = start([str(script), str(data), str(two)], 2)
  # One process, here, while the two run.
  from diffsim.cli import main

  assert main(["simulate", str(data), "--params", "haswell", "-o", str(tmp_path / "one.csv")]) == 0
  table = load_table("haswell")
  batch = encode(table, [parse_asm(a) for a in SMALL], length=8)
  sweep = simulate_sweep(table, batch, params=sample_params(table, 3, 0), iterations=30,
                         throw=False)
  wait(handles)
  # The command's output, written by process 0 alone, is byte for byte one process's.
  assert (two / "sim.csv").read_text() == (tmp_path / "one.csv").read_text()
  lines = (two / "sim.csv").read_text().splitlines()
  assert len(lines) == 1 + len(_rows()) and lines[1].split(",")[1] and "zz" in lines[7]
  for p in (0, 1):  # every process holds all results, in input order
    got = np.load(two / f"p{p}.npz")
    np.testing.assert_array_equal(got["sweep"], sweep.total)
    np.testing.assert_array_equal(got["sweep_status"], sweep.status)
  assert sweep.total.shape == (3, 8) and (sweep.status == 0).all()


@pytest.mark.parametrize("n", [1, 3])
def test_shares_of_a_sweep_cover_every_block(n):
  # What each process would run: its blocks, padded with zero-iteration copies.
  from diffsim.sim.api import share_rows

  table = load_table("haswell")
  batch = encode(table, [parse_asm(a) for a in SMALL[:5]], length=8)
  shares = hosts.deal(5, n)
  size = max(map(len, shares))
  for s in shares:
    sub, its = share_rows(batch, np.full(5, 100, np.int32), s, size)
    assert sub.opcode.shape == (size, 8)
    np.testing.assert_array_equal(sub.opcode[:len(s)], batch.opcode[s])
    assert (its[len(s):] == 0).all() and (its[:len(s)] == 100).all()


def test_a_checkpointed_run_resumes_and_repeats_nothing(tmp_path, monkeypatch):
  from diffsim.sim import blocks as sim_blocks
  from diffsim.sim import simulate_blocks

  table = load_table("haswell")
  blocks = [parse_asm(a) for a in SMALL] + [parse_asm(SMALL[0]), ValueError("bad")]
  first = simulate_blocks(table, blocks, checkpoint=tmp_path, batch_size=4)
  files = sorted(tmp_path.glob("*.npz"))
  assert len(files) == 2  # one per job of 4 distinct blocks
  assert first == simulate_blocks(table, blocks)  # a checkpoint changes no result

  launched = []
  real_launch = sim_blocks.launch
  monkeypatch.setattr(sim_blocks, "launch", lambda call: launched.append(1) or real_launch(call))
  assert simulate_blocks(table, blocks, checkpoint=tmp_path, batch_size=4) == first
  assert not launched  # everything came from the folder
  files[0].unlink()  # as if killed before its second job was saved
  (tmp_path / f".{files[1].stem}.tmp.npz").write_bytes(b"half a file")
  assert simulate_blocks(table, blocks, checkpoint=tmp_path, batch_size=4) == first
  assert len(launched) == 1
  # Another table, or other iterations, are another run: nothing is shared with this one.
  runs = {sim_blocks.Checkpoint(tmp_path / "k", t, n, "total", 1 << 20).run
          for t in (table, load_table("skylake")) for n in (100, 200)}
  assert len(runs) == 4


def test_a_copy_arriving_after_its_block_was_collected_gets_its_result():
  from diffsim.sim import simulate_chunks

  table = load_table("haswell")
  a, b = parse_asm(SMALL[0]), parse_asm(SMALL[5])
  # Jobs of one block: a's job is collected when b's launches, before a's copy arrives.
  got = simulate_chunks(table, [[a], [b], [b], [a]], batch_size=1)
  assert [p.cycles for p in got] == [p.cycles for p in simulate_chunks(table, [[a, b, b, a]])]
  assert None not in [p.cycles for p in got]
