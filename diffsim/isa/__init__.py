"""x86-64 decoding and the Block IR (see `ir`, `decode`, `idioms`, `roles`).

The decoder (iced-x86, llvm-mc) loads on first use, so that modules which only need
the IR or the dataflow vocabulary (`roles`) stay light to import.
"""

from diffsim.isa.ir import FLAGS, FPCW, FPSW, Block, DecodeError, Instr, Mem, Read, Write

from diffsim.lazy import exports

# Public names that load their module on first use, and that module.
_LAZY = {
    "REASONS": "decode", "clear_cache": "decode", "decode_block": "decode",
    "decode_blocks": "decode", "summarize": "decode", "parse_asm": "asm",
    "block_from_json": "blockjson", "block_to_json": "blockjson",
}

__all__ = ["FLAGS", "FPCW", "FPSW", "Block", "DecodeError", "Instr", "Mem", "Read", "Write",
           *sorted(_LAZY)]


__getattr__, __dir__ = exports(__name__, {k: f"diffsim.isa.{m}" for k, m in _LAZY.items()})
