"""x86-64 decoding and the Block IR (see `ir`, `decode`, `idioms`, `roles`).

The decoder (iced-x86, llvm-mc) loads on first use, so that modules which only need
the IR or the dataflow vocabulary (`roles`) stay light to import.
"""

from diffsim.isa.ir import FLAGS, FPCW, FPSW, Block, DecodeError, Instr, Mem, Read, Write

_DECODE = ("REASONS", "block_from_json", "block_to_json", "clear_cache", "decode_block",
           "decode_blocks", "parse_asm", "summarize")

__all__ = ["FLAGS", "FPCW", "FPSW", "Block", "DecodeError", "Instr", "Mem", "Read", "Write",
           *_DECODE]


def __getattr__(name: str):
  if name in _DECODE:
    from diffsim.isa import decode

    return getattr(decode, name)
  raise AttributeError(f"module 'diffsim.isa' has no attribute {name!r}")
