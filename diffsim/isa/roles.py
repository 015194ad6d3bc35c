"""The dataflow vocabulary: how an instruction's register writes and reads are classed.

Each write role has its own latency column in a CPU table, each read class its own
read-advance column, and each register kind may be renamed by a register file. The
decoder and encoder classify dataflow by these names; `diffsim.params.table` sizes its
arrays by them. They live here, beside the instructions, so that decoding and encoding
need no CPU table.
"""

# Write roles with their own latency column. `op*` are explicit destinations; implicit
# writes are keyed by register; everything else falls into "other".
# "MEM" is a store's result as a later load sees it through memory (store-to-load
# forwarding, `diffsim.isa.memory`): used only by tables with memory dependences on.
WRITE_ROLES = ("op0", "op1", "op2", "EFLAGS", "RSP", "RAX", "RDX", "RCX", "RSI", "RDI", "RBX",
               "other", "MEM")
# Pseudo roles past the table's columns: an edge of role FIXED_ROLE + w weighs exactly
# w cycles from the producer's issue, whatever the table says (`diffsim.isa.memory.
# bank_edges`: a load's issue as its L1 banks' later loads see it).
FIXED_ROLE = len(WRITE_ROLES)
# Read classes with their own read-advance column: explicit register sources by
# operand index, then the EFLAGS read, other implicit reads, address registers and a
# load's read of what an older store wrote ("mem", with memory dependences on).
READ_CLASSES = ("op0", "op1", "op2", "op3", "op4", "flags", "implicit", "addr", "mem")
# Register kinds that a register file can rename (`global.register_files[].classes`).
REG_KINDS = ("gpr", "flags", "vec", "mmx", "mask", "x87", "other")
# AT&T names of the general-purpose registers by operand width: entry i of every width
# is the same register (rax, eax, ax, al). The high bytes (ah ... dh) have no other widths.
GPR_NAMES = {
    64: ("rax", "rbx", "rcx", "rdx", "rsi", "rdi", "rbp", "rsp")
        + tuple(f"r{i}" for i in range(8, 16)),
    32: ("eax", "ebx", "ecx", "edx", "esi", "edi", "ebp", "esp")
        + tuple(f"r{i}d" for i in range(8, 16)),
    16: ("ax", "bx", "cx", "dx", "si", "di", "bp", "sp") + tuple(f"r{i}w" for i in range(8, 16)),
    8: ("al", "bl", "cl", "dl", "sil", "dil", "bpl", "spl") + tuple(f"r{i}b" for i in range(8, 16)),
}
HIGH_BYTES = ("ah", "bh", "ch", "dh")
