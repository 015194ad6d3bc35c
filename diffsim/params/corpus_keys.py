"""Collects every opcode key of the BHive corpus, with one example instance each.

The parameter tables must cover every instruction the simulator will meet. This
script disassembles all BHive blocks with `llvm-mc -show-inst` (one process per
chunk of blocks, `ud2` between blocks), keys each instruction the way the decoder
does (`diffsim.isa.idioms.variant_key` on the MCInst's last two register operands),
and writes `corpus_keys.json`:

```
{"ADD64rm": {"example": "addq\t8(%rdi), %rax",   # AT&T text as llvm-mc prints it
             "count": 1234,                       # occurrences in the corpus
             "operands": "RAX RAX RDI i_0x1 i_0x0 i_0x8 i_0x0",  # exegesis spelling
             "hex": "48034708"},                  # the example's bytes
 ...}
```
Usage: `python -m diffsim.params.corpus_keys [blocks.csv] [-o corpus_keys.json]`.
Without the corpus (no `../shared` next to the checkout) it prints a note and exits 0.
"""

from __future__ import annotations

import argparse
import concurrent.futures
import csv
import json
import os
import sys
from collections.abc import Iterable

from diffsim.isa import idioms
from diffsim.params import mctools

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_OUT = os.path.join(HERE, "corpus_keys.json")
DEFAULT_CSV = os.path.normpath(
    os.path.join(HERE, "..", "..", "..", "shared", "data", "bhive", "blocks.csv"))
CHUNK = 8000  # blocks per llvm-mc process: large enough to amortise start-up


def key_of(inst: mctools.McInst, names: dict[int, str]) -> str:
  """The opcode key of one MCInst (see `diffsim.isa.idioms.variant_key`)."""
  regs = [n for n in inst.reg_numbers() if n]
  return idioms.variant_key(inst.opcode, [names.get(n, str(n)) for n in regs[-2:]])


def _instr_hexes(block_hex: str, n: int) -> list[str] | None:
  """Each instruction's bytes, from iced-x86, when it splits the block into `n`."""
  import iced_x86  # pylint: disable=import-outside-toplevel
  data = bytes.fromhex(block_hex)
  out = []
  for ins in iced_x86.Decoder(64, data):
    out.append(data[ins.ip:ins.ip + ins.len].hex())
  return out if len(out) == n else None


def _decodes(block_hex: str) -> bool:
  """True when iced-x86 decodes every instruction of the block."""
  import iced_x86  # pylint: disable=import-outside-toplevel
  return all(ins.code != iced_x86.Code.INVALID
             for ins in iced_x86.Decoder(64, bytes.fromhex(block_hex)))


def _example_rank(text: str) -> int:
  """Prefers plain examples: no RIP-relative address, no segment override."""
  return ("%rip" in text) + (":" in text)


def collect(hex_blocks: Iterable[str], *, workers: int = 2, progress: bool = False) -> dict:
  """Disassembles blocks and tallies their opcode keys.

  Args:
    hex_blocks: block bytes as hex strings.
    workers: llvm-mc processes run at once.
    progress: print one line per chunk to stderr.

  Returns:
    key -> {"example", "count", "operands", "hex"}, sorted by key.
  """
  # Blocks that iced-x86 cannot decode are never simulated (the decoder rejects them),
  # so their keys are not wanted; BHive has one such block, with truncated bytes.
  hexes = [h.lower() for h in hex_blocks if _decodes(h)]
  chunks = [hexes[i:i + CHUNK] for i in range(0, len(hexes), CHUNK)]
  names = dict(mctools.register_names())
  keys: dict[str, dict] = {}
  with concurrent.futures.ThreadPoolExecutor(workers) as pool:
    results = pool.map(mctools.disassemble_checked, chunks)
    for ci, (chunk, blocks) in enumerate(zip(chunks, results)):
      if len(blocks) != len(chunk):
        raise mctools.ToolError(f"chunk {ci}: {len(blocks)} blocks back for {len(chunk)}")
      # Registers that the probe file did not name are learned from the corpus text.
      unknown = [i for b in blocks for i in b if any(n and n not in names
                                                     for n in i.reg_numbers())]
      if unknown:
        names = mctools.learn_register_names(unknown, names)
      for block_hex, insts in zip(chunk, blocks):
        hx = None
        for j, inst in enumerate(insts):
          k = key_of(inst, names)
          e = keys.get(k)
          if e is None:
            e = keys[k] = {"example": None, "count": 0, "operands": None, "hex": None,
                           "_rank": 99}
          e["count"] += 1
          rank = _example_rank(inst.text)
          if rank < e["_rank"]:
            if hx is None:
              hx = _instr_hexes(block_hex, len(insts)) or []
            if j < len(hx):
              e.update(example=inst.text, _rank=rank, hex=hx[j], operands=" ".join(
                  mctools.exegesis_operand(kind, v, names) for kind, v in inst.operands))
      if progress:
        print(f"chunk {ci + 1}/{len(chunks)}: {len(keys)} keys", file=sys.stderr)
  for e in keys.values():
    e.pop("_rank")
  return dict(sorted(keys.items()))


def read_blocks(path: str) -> list[str]:
  """The `hex` column of a BHive-format CSV."""
  with open(path, newline="") as f:
    return [row["hex"] for row in csv.DictReader(f)]


def load(path: str = DEFAULT_OUT) -> dict:
  """Reads a corpus_keys.json file."""
  with open(path) as f:
    return json.load(f)


def main(argv: list[str] | None = None) -> int:
  """Command-line entry: regenerates corpus_keys.json."""
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("csv", nargs="?", default=DEFAULT_CSV)
  ap.add_argument("-o", "--out", default=DEFAULT_OUT)
  args = ap.parse_args(argv)
  if not os.path.exists(args.csv):
    print(f"corpus not found at {args.csv}; nothing to do", file=sys.stderr)
    return 0
  keys = collect(read_blocks(args.csv), progress=True)
  with open(args.out, "w") as f:
    json.dump(keys, f, indent=0, sort_keys=True)
    f.write("\n")
  print(f"{len(keys)} keys, {sum(e['count'] for e in keys.values())} instructions -> "
        f"{args.out}", file=sys.stderr)
  return 0


if __name__ == "__main__":
  sys.exit(main())
