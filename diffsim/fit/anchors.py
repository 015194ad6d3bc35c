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

_REG = re.compile(r"%[a-z0-9]+")
_NUM = re.compile(r"-?\$?(0x)?[0-9a-f]+\b")


def operand_form(text: str) -> str:
  """An instruction's shape with registers and numbers blanked: `leaq N(R,R,N), R`."""
  return _NUM.sub("N", _REG.sub("R", text))


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
