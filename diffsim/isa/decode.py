"""x86-64 machine code (hex) to the Block IR: the decoder's public entry points.

What this models: for every instruction of a basic block, the facts the simulator
needs (see `ir.Instr`): the opcode key and AT&T text that llvm-mca sees, and the
register, flag and memory dataflow, explicit and implicit.

Two decoders are combined, each for what it does best: iced-x86 splits blocks into
instructions and supplies the dataflow (`iced_facts`, whose docstring lists the rules
and simplifications), and llvm-mc supplies the text and the key (`llvmmc`). Assembly
text goes through `asm.parse_asm`, JSON through `blockjson`.

Speed: instructions repeat a lot across a corpus (BHive: ~808k instructions, ~135k
distinct), so every distinct instruction is decoded once and cached by its bytes
(and its re-assembly by its text). llvm-mc runs in two concurrent chunks (one per
core) while the Python side computes iced facts.
"""

from __future__ import annotations

import collections
import concurrent.futures
import sys
from collections.abc import Sequence

from diffsim.isa import iced_facts as iced
from diffsim.isa import idioms, llvmmc
from diffsim.isa.heap import collector_paused
from diffsim.isa.ir import Block, DecodeError, Instr

# Failure categories (`DecodeError.reason`), stable across releases.
REASONS = {
    "empty": "no bytes (empty hex string or assembly without instructions)",
    "odd-length-hex": "the hex string has an odd number of digits",
    "bad-hex": "the hex string has a character that is not a hex digit",
    "invalid-instruction": "iced-x86 cannot decode the bytes at this offset",
    "truncated": "the block ends in the middle of an instruction",
    "llvm-mc-invalid": "llvm-mc cannot disassemble an instruction iced-x86 decodes",
    "llvm-mc-mismatch": "llvm-mc splits an instruction's bytes differently from iced-x86",
    "llvm-mc-asm": "llvm-mc cannot re-assemble its own disassembly (llvm-mca would reject it)",
    "llvm-mc-prefix": ("llvm-mc re-assembles the text as a prefix instruction plus the "
                       "instruction (xacquire, rex64): llvm-mca would simulate two"),
    "asm-error": "parse_asm: llvm-mc rejects a line of the assembly text",
}

Result = Block | DecodeError


# bytes of one instruction -> its Instr, or the DecodeError that it causes.
_CACHE: dict[bytes, Instr | DecodeError] = {}
# The keys of `_CACHE` whose value is a DecodeError.
_FAILED: set[bytes] = set()


def clear_cache() -> None:
  """Forgets every decoded instruction (the cache only grows otherwise)."""
  _CACHE.clear()
  _FAILED.clear()
  iced.SHAPES.clear()
  llvmmc.ASM_CACHE.clear()


def _resolve(new: list[bytes], progress: bool = False) -> None:
  """Decodes the distinct, not yet cached instructions `new` into `_CACHE`."""
  if not new:
    return
  # Two llvm-mc chunks run concurrently (their subprocesses use the second core)
  # while this thread computes iced facts.
  n_chunks = 2 if len(new) >= 2000 else 1
  size = -(-len(new) // n_chunks)
  chunks = [new[i:i + size] for i in range(0, len(new), size)]
  with concurrent.futures.ThreadPoolExecutor(len(chunks)) as pool:
    futures = [pool.submit(llvmmc.opcodes, c) for c in chunks]
    it = new
    if progress:
      it = _tqdm(new, "iced facts")
    facts = [iced.facts(b) for b in it]
    llvm = [x for f in futures for x in f.result()]
  for b, f, lk in zip(new, facts, llvm):
    if isinstance(f, DecodeError) or isinstance(lk, DecodeError):
      _CACHE[b] = f if isinstance(f, DecodeError) else lk
      _FAILED.add(b)
      continue
    rf, mem = f
    encoding_opcode, text, asm = lk
    reads = rf.reads
    if rf.cond_roles and asm.n_regs <= rf.operand_regs:
      # No register operand of the MCInst is tied to the conditional destination
      # (`bsr`; `cmov` has one): LLVM does not read it, so neither does the IR.
      reads = tuple(r for r in reads if r.role not in rf.cond_roles)
    # The two sources an idiom compares are the MCInst's last two register operands
    # (`xor %ecx,%eax`: EAX, ECX; `vpxor`: the two after the destination); LLVM's
    # register numbers tell AH and AL apart.
    key = idioms.variant_key(asm.opcode, list(asm.sources))
    same = key.endswith(idioms.SAME)
    # iced knows the zero idioms (`xor %eax,%eax`) and drops their sources; the IR
    # keeps them, since each CPU's parameter table says whether it ignores them. An
    # `@same` form whose reads iced keeps (`pcmpeqd`, `sbb`) can at most break the
    # dependency, again if the CPU says so.
    zero = same and rf.idiom_reads is not None
    if rf.idiom_reads is not None:  # also where LLVM sees no idiom at all
      reads = rf.idiom_reads
    _CACHE[b] = Instr(
        key=key, text=text, hex=b.hex(), mnemonic=rf.mnemonic, reads=reads,
        writes=rf.writes, flags_read=rf.flags_read, flags_written=rf.flags_written, mem=mem,
        loads=any(m.load for m in mem), stores=any(m.store for m in mem), stack=rf.stack,
        zero_idiom=zero, dep_breaking=same and not zero, lock=rf.lock, rep=rf.rep,
        encoding_opcode=encoding_opcode)


def _tqdm(it, desc):
  try:
    from tqdm import tqdm
  except ImportError:  # progress is a nicety
    return it
  return tqdm(it, desc=desc, file=sys.stderr, mininterval=0.5)


@collector_paused()
def decode_blocks(hexes: Sequence[str], *, progress: bool = False) -> list[Result]:
  """Decodes many blocks; never raises for a bad block.

  Args:
    hexes: [N] blocks as hex strings (case and whitespace are ignored).
    progress: show progress bars on stderr.

  Returns:
    [N] results in input order: a `Block`, or the block's `DecodeError` (reason one of
    `REASONS`; the detail names the instruction index, byte offset and bytes).

  Raises:
    RuntimeError: llvm-mc is missing or misbehaves (an environment problem).

  >>> [type(b).__name__ for b in decode_blocks(["4801d8", "zz"])]
  ['Block', 'DecodeError']
  """
  split: list[tuple[str, list[bytes]] | DecodeError] = []
  new: dict[bytes, None] = {}
  it = _tqdm(hexes, "split") if progress else hexes
  cache = _CACHE
  for h in it:
    sp = iced.split_hex(h)
    split.append(sp)
    if not isinstance(sp, DecodeError):
      for p in sp[1]:
        if p not in cache:
          new[p] = None
  _resolve(list(new), progress)
  bad = _FAILED
  out: list[Result] = []
  for sp in split:
    if isinstance(sp, DecodeError):
      out.append(sp)
      continue
    s, parts = sp
    if bad and not bad.isdisjoint(parts):
      pos = 0
      for k, p in enumerate(parts):
        x = cache[p]
        if isinstance(x, DecodeError):
          out.append(DecodeError(x.reason, f"instruction {k} at byte {pos}: {x.detail}"))
          break
        pos += len(p)
      continue
    out.append(Block(hex=s, instrs=tuple([cache[p] for p in parts])))
  return out


def decode_block(hex: str) -> Block:  # pylint: disable=redefined-builtin
  """Decodes one block.

  Args:
    hex: the block's machine code as a hex string.

  Returns:
    The Block.

  Raises:
    DecodeError: the block cannot be decoded (see `REASONS`).

  >>> decode_block("4801d8").instrs[0].text
  'addq %rbx, %rax'
  """
  res = decode_blocks([hex])[0]
  if isinstance(res, DecodeError):
    raise res
  return res


def summarize(results: Sequence[Result]) -> dict:
  """Counts of a `decode_blocks` result.

  Returns:
    {"blocks": N, "decoded": n, "failed": N - n, "instructions": instructions in the
    decoded blocks, "keys": distinct opcode keys, "by_reason": {reason: count}
    (most frequent first), "examples": {reason: the first failure's detail}}.
  """
  by_reason: collections.Counter = collections.Counter()
  examples: dict[str, str] = {}
  keys: set[str] = set()
  n_instr = 0
  for r in results:
    if isinstance(r, DecodeError):
      by_reason[r.reason] += 1
      examples.setdefault(r.reason, r.detail)
    else:
      n_instr += len(r.instrs)
      keys.update(i.key for i in r.instrs)
  failed = sum(by_reason.values())
  return {
      "blocks": len(results), "decoded": len(results) - failed, "failed": failed,
      "instructions": n_instr, "keys": len(keys), "by_reason": dict(by_reason.most_common()),
      "examples": examples,
  }
