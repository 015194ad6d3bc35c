"""x86-64 decoding and the Block IR (see `ir`, `decode`, `idioms`)."""

from diffsim.isa.decode import (
  REASONS,
  block_from_json,
  block_to_json,
  clear_cache,
  decode_block,
  decode_blocks,
  parse_asm,
  summarize,
)
from diffsim.isa.ir import FLAGS, FPCW, FPSW, Block, DecodeError, Instr, Mem, Read, Write

__all__ = [
  "FLAGS",
  "FPCW",
  "FPSW",
  "REASONS",
  "Block",
  "DecodeError",
  "Instr",
  "Mem",
  "Read",
  "Write",
  "block_from_json",
  "block_to_json",
  "clear_cache",
  "decode_block",
  "decode_blocks",
  "parse_asm",
  "summarize",
]
