"""Anchors: single instructions measured alone, the clean evidence a fit needs.

A table fitted on real blocks alone can buy a lower training error with wrong
per-opcode numbers: an opcode that is rarely critical absorbs errors made elsewhere.
One instruction run alone in a loop shows its own latency (when it reads what it
writes) or its throughput, so a few such micro-benchmarks per opcode, measured on the
same CPU (or labelled by the same reference), pin what the blocks leave loose. The
exact search weighs them (`refine(weights=...)`) and lets each judge its opcode.
"""

from __future__ import annotations

import re
from collections import Counter, defaultdict

from diffsim.isa.roles import GPR_NAMES

_REG = re.compile(r"%[a-z0-9]+")
_NUM = re.compile(r"-?\$?(0x)?[0-9a-f]+\b")

# Each general-purpose register name: (its width, its position in `GPR_NAMES`).
_GPR = {name: (width, row) for width, names in GPR_NAMES.items()
        for row, name in enumerate(names)}


def _kind(reg: str):
  """What a register operand can be swapped with: (gpr, width) or the vector kind."""
  if reg in _GPR:
    return ("gpr", _GPR[reg][0])
  m = re.fullmatch(r"([xyz]mm|k)\d+", reg)
  return m and m.group(1)


def _operands(text: str) -> tuple[str, list[str]]:
  """Mnemonic and operands of an AT&T instruction (commas inside parentheses kept)."""
  mnemonic, _, rest = text.strip().partition(" ")
  ops, depth, cur = [], 0, ""
  for ch in rest:
    depth += (ch == "(") - (ch == ")")
    if ch == "," and depth == 0:
      ops.append(cur.strip())
      cur = ""
    else:
      cur += ch
  return mnemonic, ops + [cur.strip()] if cur.strip() else ops


def operand_form(text: str) -> str:
  """An instruction's shape with registers and numbers blanked: `leaq N(R,R,N), R`."""
  return _NUM.sub("N", _REG.sub("R", text))


def chained(text: str) -> str | None:
  """The instruction rewritten to read its own destination register, so that alone in
  a loop it runs at its latency, not its throughput: a register source of the
  destination's kind becomes the destination (`imulq %rcx, %r9` -> `imulq %r9, %r9`),
  else a load's base register becomes the destination's (a pointer chase, safe under
  the harness, which fills memory with the value every register starts with). None
  when neither applies. The caller checks that the result assembles.

  >>> chained("vaddpd %ymm1, %ymm2, %ymm0"), chained("movl 420(%r13), %edx")
  ('vaddpd %ymm0, %ymm2, %ymm0', 'movl 420(%rdx), %edx')
  """
  mnemonic, ops = _operands(text)
  if len(ops) < 2 or not ops[-1].startswith("%"):
    return None
  dest = ops[-1][1:]
  kind = _kind(dest)
  if kind is None:
    return None
  for i, op in enumerate(ops[:-1]):
    if op.startswith("%") and op[1:] != dest and _kind(op[1:]) == kind:
      return f"{mnemonic} " + ", ".join(ops[:i] + [ops[-1]] + ops[i + 1:])
  if kind in (("gpr", 64), ("gpr", 32)):
    for i, op in enumerate(ops[:-1]):
      m = re.search(r"\((%[a-z0-9]+)", op)
      if m and m.group(1)[1:] in _GPR:
        wide = "%" + GPR_NAMES[64][_GPR[dest][1]]
        if wide != m.group(1):
          swapped = op[:m.start(1)] + wide + op[m.end(1):]
          return f"{mnemonic} " + ", ".join(ops[:i] + [swapped] + ops[i + 1:])
  return None


def _reads_own_write(ins) -> bool:
  written = {w.reg for w in ins.writes if w.role != "flags"}
  return bool(written & {r.reg for r in ins.reads if r.role != "flags"})


def chains(rows) -> list[tuple[str, str, str]]:
  """(opcode key, hex, text) of the chained form (`chained`) of each picked
  instruction (`pick`'s rows) that does not already read what it writes; forms that
  llvm-mc rejects, or that change the opcode key, are dropped."""
  from diffsim.isa import DecodeError, decode_blocks, parse_asm

  out, seen = [], set()
  for (key, _, text), alone in zip(rows, decode_blocks([h for _, h, _ in rows])):
    if isinstance(alone, Exception) or _reads_own_write(alone.instrs[0]):
      continue
    new = chained(text)
    if new is None or new in seen:
      continue
    seen.add(new)
    try:
      block = parse_asm(new)
    except DecodeError:
      continue
    if len(block.instrs) == 1 and block.instrs[0].key == key and \
        _reads_own_write(block.instrs[0]):
      out.append((key, block.hex, block.instrs[0].text))
  return out


def pick(blocks, forms: int = 4, per_key: int = 4) -> list[tuple[str, str, str]]:
  """(opcode key, hex, text) of the most common instructions of each opcode key's
  `forms` most common operand forms, about `per_key` instructions per key.

  >>> from diffsim.isa import parse_asm
  >>> [t for _, _, t in pick([parse_asm("addq $1, %rax\\naddq $2, %rax\\nleaq 8(%rax), %rcx")])]
  ['addq $1, %rax', 'addq $2, %rax', 'leaq 8(%rax), %rcx']
  """
  seen: dict = defaultdict(lambda: defaultdict(Counter))
  for b in blocks:
    for ins in b.instrs:
      seen[ins.key][operand_form(ins.text)][(ins.hex, ins.text)] += 1
  rows = []
  for key, by_form in seen.items():
    top = sorted(by_form.values(), key=lambda c: -sum(c.values()))[:forms]
    each = max(1, per_key // len(top))
    for c in top:
      rows += [(key, h, t) for (h, t), _ in c.most_common(each)]
  return rows
