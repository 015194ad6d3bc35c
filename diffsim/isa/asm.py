"""x86-64 assembly text to the Block IR: llvm-mc assembles it, the hex path decodes it.

Going through the bytes, rather than reading operands from the text, gives text and
hex the same keys and dataflow, and lets users write blocks by hand (tests, notebooks,
`diffsim.search`'s generated kernels).
"""

from __future__ import annotations

import re

from diffsim.isa import llvmmc
from diffsim.isa.decode import decode_block
from diffsim.isa.ir import Block, DecodeError

_ENCODING = re.compile(r"encoding: \[([^\]]*)\]")


def _encoding_bytes(field: str) -> bytes:
  """`0x48,0x01,A` -> bytes; fixup placeholders (branch targets, labels) become 0."""
  out = bytearray()
  for tok in field.split(","):
    tok = tok.strip()
    if tok.startswith("0x"):
      out.append(int(tok, 16))
    elif tok.startswith("0b"):  # partly known byte, e.g. 0b0100A000
      out.append(int("".join(c if c in "01" else "0" for c in tok[2:]), 2))
    elif tok:
      out.append(0)
  return bytes(out)


def parse_asm(text: str, *, syntax: str = "att") -> Block:
  """Assembles `text` with llvm-mc and decodes the bytes, like the hex path.

  Args:
    text: x86-64 assembly, one instruction per line or `;`-separated; `#` starts a
      comment. Branches may name labels or absolute targets (their displacement is
      encoded as 0; dataflow does not depend on it).
    syntax: "att" (default) or "intel" (GNU `.intel_syntax noprefix`).

  Returns:
    The Block of the assembled bytes (same keys and dataflow as decoding them).

  Raises:
    DecodeError: `asm-error` naming the first rejected line, `empty` for text
      without instructions, or any reason of `decode_block`.
    ValueError: unknown `syntax`.

  >>> [i.key for i in parse_asm("addq %rbx, %rax; imulq %rax, %rax").instrs]
  ['ADD64rr', 'IMUL64rr']
  """
  if syntax not in ("att", "intel"):
    raise ValueError(f"syntax must be 'att' or 'intel', not {syntax!r}")
  stmts: list[tuple[int, str]] = []
  for n, raw in enumerate(text.splitlines(), 1):
    for stmt in raw.split("#", 1)[0].split(";"):
      stmt = stmt.strip()
      if stmt:
        stmts.append((n, stmt))
  if not stmts:
    raise DecodeError("empty", "no instructions in the assembly text")
  head = [".intel_syntax noprefix"] if syntax == "intel" else []
  res = llvmmc.run(["-triple=x86_64", "-show-encoding"],
                     "\n".join(head + [s for _, s in stmts]) + "\n")
  for m in llvmmc.DIAG.finditer(res.stderr):
    if m.group(3) == "error":
      k = int(m.group(1)) - 1 - len(head)
      n, stmt = stmts[k] if 0 <= k < len(stmts) else (0, "?")
      raise DecodeError("asm-error", f"line {n}: {stmt!r}: {m.group(4)}")
  data = b"".join(_encoding_bytes(m.group(1)) for m in _ENCODING.finditer(res.stdout))
  if not data:
    raise DecodeError("empty", "the assembly text encodes no bytes")
  return decode_block(data.hex())
