"""The exact per-opcode search: it must recover a known table, and resume."""

import csv

import numpy as np
import pytest

from diffsim.data import shipped
from diffsim.fit.exact import (BlockIndex, Judge, Move, _any_group_needs_one, apply, port_moves,
                                refine, variants)
from diffsim.isa import decode_blocks, parse_asm
from diffsim.params.table import load_table

MOVES = (Move("latency", -1), Move("latency", -2), Move("latency", +1))


@pytest.fixture(scope="module")
def short():
  """Up to 400 shipped blocks of at most 8 instructions (one program shape)."""
  with open(shipped("mca-small.csv")) as f:
    hexes = [r[0] for r in list(csv.reader(f))[1:]]
  blocks = [b for b in decode_blocks(hexes) if not isinstance(b, Exception) and len(b) <= 8]
  return blocks[:400]


@pytest.fixture(scope="module")
def truth(short):
  """(the haswell table, its exact steady throughputs of the blocks, a perturbed copy
  in which 6 frequently used opcodes have 2 cycles more latency, their rows).

  Only opcodes whose latency the labels can see are perturbed: alone, the change
  alters the throughput of at least 5 blocks."""
  table = load_table("haswell")
  judge = Judge(table, short)
  y = judge(table, np.arange(len(short)))
  p = {k: np.array(v) for k, v in vars(table.params).items()}
  counts = np.bincount(np.concatenate([judge.keys(i) for i in range(len(short))]),
                       minlength=len(table.layout.keys))
  moved = []
  for k in np.argsort(-counts)[:30]:
    if len(moved) == 6:
      break
    alone = {n: a.copy() for n, a in p.items()}
    apply(alone, int(k), Move("latency", +2))
    ids = np.array([i for i in range(len(short)) if k in judge.keys(i)])
    if np.sum(judge(_with(table, alone), ids) != y[ids]) >= 5:
      apply(p, int(k), Move("latency", +2))
      moved.append(int(k))
  return table, y, _with(table, p), moved


def _with(table, p):
  return table.__class__(params=table.params.replace(**p), structure=table.structure,
                         layout=table.layout, source=table.source)


def test_variant_rows_run_the_moved_row_only_where_asked(short, truth):
  table, y, perturbed, moved = truth
  judge = Judge(perturbed, short)
  doubled = variants(perturbed)
  K = len(table.layout.keys)
  # Variant rows hold the true rows: a block run on them gets the true throughput.
  p = {k: np.array(v) for k, v in vars(doubled.params).items()}
  p["latency"][K:] = np.asarray(table.params.latency)
  with_true = _with(doubled, p)
  k = moved[0]
  ids = np.array([i for i in range(len(short)) if k in judge.keys(i)])
  base = judge(perturbed, ids)
  mixed = judge(with_true, ids, moved=np.full(len(ids), k))
  plain = judge(with_true, ids, moved=np.full(len(ids), -1))
  np.testing.assert_array_equal(plain, base)  # no remap: the perturbed rows run
  assert np.mean(np.abs(mixed - y[ids]) / y[ids]) < np.mean(np.abs(base - y[ids]) / y[ids])


def test_a_judge_simulates_again_only_the_blocks_whose_rows_changed(short, truth):
  """Results are remembered under the rows a block runs: asked again, a judge answers
  from memory, and after one opcode's row changes it runs exactly that opcode's blocks,
  with the cycles a fresh judge gets."""
  table, y, perturbed, moved = truth
  judge = Judge(table, short)
  ids = np.arange(len(short))
  np.testing.assert_array_equal(judge(table, ids), y)
  ran = judge.simulated
  np.testing.assert_array_equal(judge(table, ids), y)
  assert judge.simulated == ran and judge.remembered >= len(short)
  k = moved[0]
  p = {name: np.array(v) for name, v in vars(table.params).items()}
  apply(p, k, Move("latency", +2))
  again = judge(_with(table, p), ids)
  users = [i for i in ids if k in judge.keys(i)]
  assert judge.simulated - ran == len(users)
  np.testing.assert_array_equal(again, Judge(table, short)(_with(table, p), ids))
  assert np.any(again[users] != y[users])


def test_search_recovers_perturbed_latencies_and_resumes(short, truth, tmp_path):
  table, y, perturbed, moved = truth
  before = Judge(perturbed, short)(perturbed, np.arange(len(short)))
  err0 = np.mean(np.abs(before - y) / y)
  assert err0 > 0.01  # the perturbation is visible in the labels
  logs = []
  one = refine(perturbed, short, y, MOVES, rounds=1, cap=24, state_dir=tmp_path / "s",
               log=logs.append)
  res = refine(perturbed, short, y, MOVES, rounds=3, cap=24, state_dir=tmp_path / "s",
               log=logs.append)
  assert any("resuming after 3 steps" in line for line in logs)
  assert len(res.history) == 9 and res.history[:3] == one.history
  true_lat = np.asarray(table.params.latency)
  got = np.asarray(res.table.params.latency)
  recovered = [k for k in moved if np.array_equal(got[k], true_lat[k])]
  assert len(recovered) >= len(moved) // 2, (recovered, moved)
  after = Judge(res.table, short)(res.table, np.arange(len(short)))
  assert np.mean(np.abs(after - y) / y) < 0.5 * err0
  # Opcodes nobody perturbed stay where they were, nearly all of them.
  changed = np.flatnonzero(np.any(got != true_lat, axis=1))
  assert len(set(changed.tolist()) - set(moved)) <= 3


def test_port_move_widens_the_execution_group_where_the_labels_say_so():
  """zen5-facts runs LEA on the 4 address units; labels from the same table with LEA on
  the 6 ALUs: the search moves it there, and moves nothing the labels do not show."""
  start = _any_group_needs_one(load_table("zen5-facts"))
  lay, U = start.layout, len(start.layout.units)
  ports = port_moves(start)
  k = lay.keys.index("LEA64r")
  a, b = ports[k]
  assert (lay.groups[a - U], lay.groups[b - U]) == ("Zn3AGU012", "Zn3ALU0123")
  loads = np.flatnonzero(np.asarray(start.structure.may_load))
  assert not set(ports) & set(loads.tolist())  # loads keep their address units
  p = {n: np.array(v) for n, v in vars(start.params).items()}
  assert apply(p, k, Move("port"), ports) and not apply(p, k, Move("port"), ports)
  truth = _with(start, p)
  regs = ["rbx", "rcx", "rdx", "rsi", "rdi", "r8", "r9", "r10"]
  blocks = [parse_asm("\n".join(f"leaq 8(%rax), %{r}" for r in regs[:n])) for n in (4, 6, 7, 8)]
  blocks.append(parse_asm("addq $1, %rbx\naddq $1, %rcx"))
  y = Judge(truth, blocks)(truth, np.arange(len(blocks)))
  assert not np.array_equal(Judge(start, blocks)(start, np.arange(len(blocks))), y)
  res = refine(start, blocks, y, [Move("port")], rounds=1, cap=8, min_blocks=1, log=lambda s: None)
  got = np.asarray(res.table.params.res_cycles)
  assert got[k, b] > 0 and got[k, a] == 0
  others = np.flatnonzero(np.any(got != np.asarray(start.params.res_cycles), axis=1))
  assert others.tolist() == [k]


def test_global_moves_recover_the_dispatch_width(short, truth):
  table, y, *_ = truth  # haswell's labels; haswell dispatches 4 micro-ops a cycle
  p = {k: np.array(v) for k, v in vars(table.params).items()}
  p["dispatch_width"] = np.float32(2)
  narrow = _with(table, p)
  err0 = np.mean(np.abs(Judge(narrow, short)(narrow, np.arange(len(short))) - y) / y)
  assert err0 > 0.05
  moves = (Move("dispatch", +1), Move("dispatch", -1))
  got = refine(narrow, short, y, moves, rounds=1, cap=24, log=lambda *_: None)
  assert float(got.table.params.dispatch_width) == 4
  # and nothing else moved
  np.testing.assert_array_equal(got.table.params.latency, table.params.latency)


def test_anchors_judge_their_opcode_and_outweigh_misleading_blocks(short):
  """Blocks labelled by a table with one opcode 2 cycles slower pull the search to that
  latency; single-instruction anchors labelled by the true table hold it where it is,
  once they weigh enough, and they judge the opcode whatever `cap` samples."""
  table = load_table("haswell")
  judge = Judge(table, short)
  p = {k: np.array(v) for k, v in vars(table.params).items()}
  counts = np.bincount(np.concatenate([judge.keys(i) for i in range(len(short))]),
                       minlength=len(table.layout.keys))
  for k in np.argsort(-counts)[:40]:
    ids = np.array([i for i in range(len(short)) if k in judge.keys(i)])
    alone = [b for b in decode_blocks([ins.hex for i in ids for ins in short[i].instrs
                                       if table.layout.keys[k] == ins.key])][:3]
    slow = {n: a.copy() for n, a in p.items()}
    apply(slow, int(k), Move("latency", +2))
    wrong = _with(table, slow)
    y_alone = Judge(table, alone)(table, np.arange(len(alone)))
    if (len(ids) >= 8 and len(alone) == 3
        and np.all(Judge(wrong, alone)(wrong, np.arange(3)) != y_alone)):
      break
  else:
    pytest.fail("no opcode whose latency one instruction alone shows")
  blocks = [short[i] for i in ids] + alone
  y = np.concatenate([Judge(wrong, blocks[:-3])(wrong, np.arange(len(ids))), y_alone])
  pinned = np.arange(len(blocks)) >= len(ids)
  index = BlockIndex.build(Judge(table, blocks), cap=2, always=pinned)
  assert set(np.flatnonzero(pinned)) <= set(index.judges[int(k)].tolist())
  assert len(index.judges[int(k)]) == 2 + 3

  def latency_after(weight):
    w = np.where(pinned, weight, 1.0)
    got = refine(table, blocks, y, [Move("latency", +2)], rounds=1, cap=len(blocks),
                 min_blocks=1, weights=w, log=lambda *_: None)
    return np.asarray(got.table.params.latency)[k]

  true = np.asarray(table.params.latency)[k]
  assert not np.array_equal(latency_after(1.0), true)  # the blocks win
  np.testing.assert_array_equal(latency_after(float(len(ids))), true)  # the anchors win
