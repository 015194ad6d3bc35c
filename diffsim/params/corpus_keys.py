"""Collects every opcode key of the BHive corpus, with one example instance each.

The parameter tables must cover every instruction the simulator will meet, so the
keys are exactly the decoder's: every block is decoded with
`diffsim.isa.decode.decode_blocks`, whose `Instr.key` is the opcode of the MCInst
llvm-mc's assembler (llvm-mca's parser) builds from the instruction's text, with the
`@same` variant (`diffsim.isa.idioms`). Blocks the decoder rejects are never
simulated, so their instructions are not counted. The examples are printed by
`llvm-mc -show-inst` from the example text (tabs as llvm-mc prints them), and the
output is `corpus_keys.json`:

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
import csv
import json
import os
import sys
from collections.abc import Iterable

from diffsim.isa.decode import decode_blocks
from diffsim.isa.ir import DecodeError
from diffsim.params import mctools

HERE = os.path.dirname(os.path.abspath(__file__))
DEFAULT_OUT = os.path.join(HERE, "corpus_keys.json")


def _example_rank(instr) -> int:
  """Prefers plain examples: canonical bytes (the encoding llvm-mca's assembler
  picks), no RIP-relative address, no segment override."""
  text = instr.text
  return (2 * (instr.encoding_opcode != instr.opcode) + ("%rip" in text) + (":" in text))


def collect(hex_blocks: Iterable[str], *, progress: bool = False) -> dict:
  """Decodes blocks and tallies their opcode keys.

  Args:
    hex_blocks: block bytes as hex strings.
    progress: progress bars and a summary on stderr.

  Returns:
    key -> {"example", "count", "operands", "hex"}, sorted by key.

  Raises:
    mctools.ToolError: llvm-mc rejects an example text (the decoder checked them all).
    RuntimeError: an example does not assemble to its key's opcode.
  """
  counts: dict[str, int] = {}
  best: dict[str, tuple[int, object]] = {}
  for block in decode_blocks(list(hex_blocks), progress=progress):
    if isinstance(block, DecodeError):
      continue
    for i in block.instrs:
      counts[i.key] = counts.get(i.key, 0) + 1
      rank = _example_rank(i)
      if i.key not in best or rank < best[i.key][0]:
        best[i.key] = (rank, i)
  keys = sorted(counts)
  insts = mctools.assemble("\n".join(best[k][1].text for k in keys) + "\n")
  if len(insts) != len(keys):
    raise RuntimeError(f"llvm-mc made {len(insts)} instructions of {len(keys)} examples")
  names = dict(mctools.register_names())
  unknown = [m for m in insts if any(n and n not in names for n in m.reg_numbers())]
  if unknown:  # registers the probe file did not name are learned from the examples
    names = mctools.learn_register_names(unknown, names)
  out = {}
  for k, m in zip(keys, insts):
    instr = best[k][1]
    if m.opcode != instr.opcode:
      raise RuntimeError(f"{k}: example {instr.text!r} assembles to {m.opcode}")
    out[k] = {"example": m.text, "count": counts[k], "hex": instr.hex,
              "operands": " ".join(mctools.exegesis_operand(kind, v, names)
                                   for kind, v in m.operands)}
  if progress:
    print(f"{len(out)} keys", file=sys.stderr)
  return out


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
  ap.add_argument("csv", nargs="?", default=None,
                  help="BHive blocks.csv (default: the shared data folder's, if present)")
  ap.add_argument("-o", "--out", default=DEFAULT_OUT)
  args = ap.parse_args(argv)
  if args.csv is None:
    from diffsim.data import shared_data_dir

    shared = shared_data_dir()
    if shared is None:
      print("no shared data folder (../shared/data or $DIFFSIM_SHARED); nothing to do",
            file=sys.stderr)
      return 0
    args.csv = str(shared / "bhive" / "blocks.csv")
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
