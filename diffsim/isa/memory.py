"""Which loads read what an earlier store wrote, in the measurement harness's setting.

llvm-mca never compares addresses. Real CPUs do: a load that reads bytes an older
store wrote gets them forwarded from the store (or, with memory renaming, from the
store's source register), so a store, a load and the operations between them can form
a dependence chain through memory, across iterations too. Both the Zen 5 data's
harness and `diffsim measure` start every general-purpose register except rsp at one
address A and fill memory with A, so which accesses overlap is decidable: every
register value is tracked as a linear form `a*A + s*S + c` (S: the initial rsp) through
the looped block, and unknown once an instruction computes anything else.

`memory_edges` gives, per load, the store it reads from: the youngest older store
(this iteration, or the previous one) whose bytes overlap the load's. The simulator
turns each into a dependence edge when the CPU table enables memory dependences.
"""

from __future__ import annotations

import collections
import functools
import re
from typing import Optional

from diffsim.isa.ir import Block, Instr

Value = Optional[tuple[int, int, int]]  # (a, s, c): a*A + s*S + c; None = unknown

_IMM = re.compile(r"\$(-?(?:0x[0-9a-f]+|\d+))")
_ADDR = re.compile(r"(-?(?:0x[0-9a-f]+|\d+))?\(")
_SCALE = re.compile(r",(\d)\)")
_GPRS = ("RAX", "RBX", "RCX", "RDX", "RSI", "RDI", "RBP", "RSP") + tuple(f"R{i}" for i in range(8, 16))


def _num(text: str) -> int:
  return int(text, 16) if "0x" in text else int(text)


def _add(x: Value, y: Value, k: int = 1) -> Value:
  if x is None or y is None:
    return None
  return (x[0] + k * y[0], x[1] + k * y[1], x[2] + k * y[2])


def _const(c: int) -> Value:
  return (0, 0, c)


def start_state() -> dict[str, Value]:
  """Register values when a measured block starts: every GPR A, rsp S."""
  state = {r: (1, 0, 0) for r in _GPRS}
  state["RSP"] = (0, 1, 0)
  return state


def _address(base: Optional[str], index: Optional[str], scale: int, disp: int,
             state: dict[str, Value]) -> Value:
  if base in ("RIP", "EIP") or (base and base not in state) or (index and index not in state):
    return None
  v: Value = _const(disp)
  if base:
    v = _add(v, state[base])
  if index:
    v = _add(v, state[index], scale)
  return v


def _imm(ins: Instr) -> Optional[int]:
  m = _IMM.search(ins.text)
  return _num(m.group(1)) if m else None


def _result(ins: Instr, state: dict[str, Value], dst: str) -> Value:
  """The value `ins` writes to GPR `dst`, where it is a linear form of known values."""
  srcs = [r.reg for r in ins.reads if r.role.startswith("op") and r.reg != dst and r.reg in state]
  name = ins.mnemonic
  if ins.zero_idiom:
    return _const(0)
  if ins.loads and name in ("mov", "pop") and not ins.mem[0].store:
    # Memory holds A everywhere (the harness fills it so); a byte or word load does not.
    return (1, 0, 0) if ins.mem and ins.mem[0].size in (4, 8) else None
  imm = _imm(ins)
  if name == "mov" and not ins.mem:
    if imm is not None:
      return _const(imm)
    return state[srcs[0]] if len(srcs) == 1 else None
  if name == "lea":
    base = next((r.reg for r in ins.reads if r.role == "base"), None)
    index = next((r.reg for r in ins.reads if r.role == "index"), None)
    m, s = _ADDR.search(ins.text), _SCALE.search(ins.text)
    return _address(base, index, int(s.group(1)) if s else 1,
                    _num(m.group(1)) if m and m.group(1) else 0, state)
  if ins.mem:  # read-modify-write of a register from memory: not tracked
    return None
  if name in ("add", "sub"):
    k = 1 if name == "add" else -1
    if imm is not None:
      return _add(state[dst], _const(imm), k)
    return _add(state[dst], state[srcs[0]], k) if len(srcs) == 1 else None
  if name in ("inc", "dec"):
    return _add(state[dst], _const(1 if name == "inc" else -1))
  return None


def step(ins: Instr, state: dict[str, Value]) -> None:
  """Advances the register values over one instruction."""
  new = {}
  for w in ins.writes:
    if w.reg not in state or w.reg in new:
      continue
    if w.reg == "RSP" and ins.stack:
      delta = -8 if ins.mnemonic in ("push", "call") else 8 if ins.mnemonic in ("pop", "ret") \
          else None
      new["RSP"] = _add(state["RSP"], _const(delta)) if delta is not None else None
    elif w.merge or (w.width and w.width < 32):
      new[w.reg] = None  # a partial write leaves a value we do not track
    else:
      new[w.reg] = _result(ins, state, w.reg)
  state.update(new)


def accesses(block: Block, iterations: int = 2) -> list[list[list[tuple]]]:
  """[iteration][instruction] -> [(value, size, load, store, operand)] of its memory
  operands whose address is known; operand = (base, index, scale, displacement)."""
  state = start_state()
  out = []
  for _ in range(iterations):
    mine = []
    for ins in block.instrs:
      acc = []
      for m in ins.mem:
        if m.segment not in (None, "", "ds", "ss", "DS", "SS"):
          continue
        base = m.base
        v = _address(base, m.index, m.scale, m.disp, state)
        if v is not None:
          acc.append((v, m.size or 8, m.load, m.store, (base, m.index, m.scale, m.disp)))
      mine.append(acc)
      step(ins, state)
    out.append(mine)
  return out


def _overlap(x: tuple, y: tuple) -> bool:
  (vx, nx, *_), (vy, ny, *_) = x, y
  return vx[:2] == vy[:2] and vx[2] < vy[2] + ny and vy[2] < vx[2] + nx


_LATE = 7  # the iteration whose edges must match the second's (`memory_edges`)


@functools.lru_cache(maxsize=1)
def _steady(block: Block) -> list[list[list[tuple]]]:
  """`accesses` up to iteration `_LATE`, what steady edges are judged on: encoding asks
  `memory_edges`, `bank_edges`, `commit_cycles` and `commit_edges` about the same block
  in turn, so the last block's are kept."""
  return accesses(block, iterations=_LATE + 1)


# How a CPU renames memory (`global.memory_renaming`), measured on the CPUs the project
# has data for with blocks like `movq %rax,8(%rbx); movq 8(%rcx),%rax; imulq %rax,%rax`:
# - "operand" (Zen 2's documented rule; Zen 5): the same address written the same way
#   through unmodified base and index registers, or a pop of what a push stored;
# - "address" (Intel Golden Cove / Redwood Cove, measured on the Xeon 6 with
#   `diffsim measure`): the same address through any base register and a displacement,
#   for 1, 4 and 8-byte general-purpose data. Indexed addresses, 16-bit and vector data
#   and the store of a read-modify-write with a register source are forwarded instead
#   (5, 5, 6 and 6 cycles more than renamed), while `addq $1,8(%rbx)` runs at 1 cycle.
RENAMING = ("operand", "address")


def _renamable(block: Block, p: int, dist: int, c: int, s: tuple, x: tuple,
               policy: str = "operand") -> bool:
  """Whether load c can take store p's value without going through memory (memory
  renaming; `RENAMING` gives the policies and their evidence). Renamed pairs cost no
  forwarding: on Zen 5, `orb $16, 31(%rbx)` and a read-modify-write of one stack slot
  run 1 cycle an iteration, while the same bytes through another register cost about 7."""
  store, load = block.instrs[p], block.instrs[c]
  if policy == "address":
    return _renamed_by_address(store, load, s, x)
  if s[:2] != x[:2]:
    return False  # another start or width
  if store.stack and load.stack:
    return True  # push then pop: the stack engine's offsets name the slot
  if s[4] != x[4] or s[4][0] in ("RIP", "EIP"):
    return False
  n = len(block.instrs)
  between = range(p, c) if dist == 0 else [*range(p, n), *range(c)]
  regs = {r for r in s[4][:2] if r}
  return not any(w.reg in regs for i in between for w in block.instrs[i].writes)


_VECTOR = ("XMM", "YMM", "ZMM")


def _renamed_by_address(store: Instr, load: Instr, s: tuple, x: tuple) -> bool:
  """The "address" policy of `RENAMING` for one (store access s, load access x)."""
  if s[0] != x[0] or x[1] > s[1] or s[1] == 2 or x[1] == 2:
    return False  # another start, a wider load or 16-bit data
  if any(a[4][1] or a[4][0] in ("RIP", "EIP") for a in (s, x)):
    return False  # indexed or RIP-relative
  if any(r.reg.startswith(_VECTOR) for ins in (store, load) for r in (*ins.reads, *ins.writes)):
    return False
  rmw_source = store.loads and any(r.role.startswith("op") for r in store.reads)
  return not rmw_source


def memory_edges(block: Block, renaming: str = "operand") -> list[list[tuple[int, int, bool]]]:
  """Per instruction: [(store, distance, renamable)] for each of its loads that reads
  bytes an older store wrote (the youngest such store; distance 0 this iteration, 1
  the previous one), in the steady state: pointers that move at different strides
  meet only in the first iterations, so an edge counts only when it holds in the
  second iteration and in the eighth. renamable: see `_renamable` (renaming: a
  policy of `RENAMING`)."""
  acc = _steady(block)
  n = len(block.instrs)

  def edges(k: int, c: int) -> list[tuple[int, int, tuple, tuple]]:
    found = []
    for load in (a for a in acc[k][c] if a[2]):
      older = [(p, 0) for p in range(c - 1, -1, -1)] + [(p, 1) for p in range(n - 1, c - 1, -1)]
      for p, dist in older:
        hit = [a for a in acc[k - dist][p] if a[3] and _overlap(a, load)]
        if hit:
          if (p, dist) not in [e[:2] for e in found]:
            found.append((p, dist, hit[0], load))
          break
    return found

  out: list[list[tuple[int, int, bool]]] = []
  for c in range(n):
    late = {e[:2] for e in edges(_LATE, c)}
    out.append([(p, dist, _renamable(block, p, dist, c, s, x, renaming))
                for p, dist, s, x in edges(1, c) if (p, dist) in late])
  return out


# The L1 data cache as the Xeon 6 shows it (`diffsim measure`, cycles an iteration):
# a 64-byte line of 4-byte banks, each read by at most 2 loads a cycle. One load of a
# fixed address runs at 0.50 (its own next instances share its bank), loads 64 bytes
# apart at 1.00 for two, a byte at 8 and one at 9 at 1.00, while 4-byte loads at 8
# and 12 take 0.73 and six 8-byte loads at 0..40 take 2.00 (3 load ports).
LINE_BYTES, BANK_BYTES = 64, 4


def _banks(access: tuple) -> frozenset:
  """The banks of a line that an access's bytes cover."""
  (_, _, c), size = access[0], access[1]
  n = LINE_BYTES // BANK_BYTES
  first, last = c // BANK_BYTES, (c + max(size, 1) - 1) // BANK_BYTES
  return frozenset(b % n for b in range(first, min(last, first + n - 1) + 1))


def bank_edges(block: Block, loads_per_bank: int) -> list[list[tuple[int, int, int]]]:
  """Per instruction: [(itself, distance, cycles)], the edge that keeps its L1 banks
  within `loads_per_bank` loads a cycle: a load whose banks take n loads an iteration
  issues at least n cycles after its own instance `loads_per_bank` iterations back, so
  each bank runs at its rate and loads of one bank keep no order among themselves (an
  order could chain a load behind a younger one whose address it computes). Only loads
  whose banks are the same in every iteration take part; a pointer that moves through
  the line spreads its loads over banks."""
  acc = _steady(block)
  banks: list[frozenset] = []
  for c in range(len(block.instrs)):
    loads = [frozenset().union(*(_banks(a) for a in acc[k][c] if a[2]))
             for k in range(1, _LATE + 1)]
    banks.append(loads[0] if all(x == loads[0] for x in loads) else frozenset())
  count = collections.Counter(b for bs in banks for b in bs)
  return [[(c, loads_per_bank, max(count[b] for b in bs))] if bs else []
          for c, bs in enumerate(banks)]


# The L1 data cache as the Xeon 6 takes stores (`diffsim measure`, cycles an iteration):
# in program order, up to 2 consecutive stores to one 64-byte line a cycle, else one a
# cycle. `movq $1,(%rbx); movq $2,8(%rbx)` runs at 1.00 and the same 64 bytes apart at
# 2.00; four stores to two lines at 2.00 in pairs and 4.00 alternating; a store across
# a line boundary at 2.00 alone; one store at 0.50 (it pairs with its next instance).
COMMIT_ITERATIONS = 4  # the iterations whose stores are counted (`commit_edges`)


def commit_cycles(block: Block, stores_per_line: int) -> int:
  """Cycles the L1 takes to commit the stores of `COMMIT_ITERATIONS` steady iterations:
  a new cycle at each store to another line than the previous store's (or past
  `stores_per_line` in one), and two for a store across a line boundary. Stores of
  unknown address count for nothing."""
  acc = _steady(block)
  stream: list = []
  for k in range(1, 1 + COMMIT_ITERATIONS):
    for per_instr in acc[k]:
      for v, size, _, store, _ in per_instr:
        if store and v is not None:
          first, last = v[2] // LINE_BYTES, (v[2] + max(size, 1) - 1) // LINE_BYTES
          stream += [(v[0], v[1], first)] if first == last else [None, None]
  cycles, run, prev = 0, 0, None
  for line in stream:
    if line is not None and line == prev and run < stores_per_line:
      run += 1
    else:
      cycles, run = cycles + 1, 1
    prev = line
  return cycles


def commit_edges(block: Block, stores_per_line: int) -> list[list[tuple[int, int, int]]]:
  """Per instruction: [(itself, distance, cycles)], the edge that keeps the stores within
  the L1's commit rate (`commit_cycles`): each store of known address issues at least
  `cycles` after its own instance `distance` iterations back, so the stores run at
  most at the rate the L1 commits them (a store waits in the store buffer until it
  commits; a full buffer stalls dispatch, which the issue order stands for here). The
  distance is the fewest iterations whose cycles are whole: an edge to an instance that
  has retired when its consumer dispatches binds nothing, so it must not reach far."""
  acc = _steady(block)
  cycles = commit_cycles(block, stores_per_line)
  distance = next(d for d in (1, 2, COMMIT_ITERATIONS) if cycles * d % COMMIT_ITERATIONS == 0)
  w = cycles * distance // COMMIT_ITERATIONS
  return [[(c, distance, w)] if any(a[3] and a[0] is not None for a in acc[1][c])
          else [] for c in range(len(block.instrs))]
