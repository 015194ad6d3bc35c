"""Which blocks a user-space harness can time: the rest are rejected before any run.

A block is rejected when the decoder cannot read it, or when an instruction traps to
the kernel or hypervisor, needs privileges, leaves the block's straight-line flow, or
reads the clock the harness times with (`UNTIMEABLE`).
"""

from __future__ import annotations

from collections.abc import Sequence

# Instructions that a user-space harness cannot time (category, reason per mnemonic):
# they trap to the kernel or hypervisor, need privileges, end the block's straight-line
# flow, or read the very clock the harness times with.
_SYSTEM = ("syscall sysenter sysexit sysret int int1 int3 into iret iretd iretq "
           "ud0 ud1 ud2 ud2b")
_PRIVILEGED = ("hlt in insb insw insd out outsb outsw outsd cli sti clts lgdt lidt lldt ltr "
               "lmsw invd wbinvd wbnoinvd invlpg invlpga invpcid rdmsr wrmsr rdpmc swapgs "
               "xsetbv monitor mwait monitorx mwaitx vmcall vmmcall vmlaunch vmresume vmxoff "
               "vmxon vmrun vmload vmsave stgi clgi skinit sgdt sidt sldt str smsw "
               "wrfsbase wrgsbase rdfsbase rdgsbase")
_CONTROL_FLOW = ("call jmp ret retf loop loope loopne jrcxz jecxz ja jae jb jbe je jg jge jl jle "
                 "jne jno jnp jns jo jp js")
# cpuid and rdrand/rdseed may exit to the hypervisor; TSX aborts or is absent.
_UNTIMEABLE = "cpuid rdtsc rdtscp rdpid rdrand rdseed xbegin xend xabort xtest"
_SEGMENT_REGISTERS = ("%cs", "%ds", "%es", "%fs", "%gs", "%ss")
UNTIMEABLE: dict[str, str] = {}
for _cat, _names in (("untimeable", _UNTIMEABLE), ("control-flow", _CONTROL_FLOW),
                     ("privileged", _PRIVILEGED), ("system", _SYSTEM)):
  UNTIMEABLE.update((name, _cat) for name in _names.split())


def untimeable_reason(block) -> str | None:
  """`category: mnemonic (text)` when a decoded block cannot be timed in user space."""
  for k, ins in enumerate(block.instrs):
    category = UNTIMEABLE.get(ins.mnemonic)
    if category is None and ins.mnemonic == "mov" and ("%cr" in ins.text or "%db" in ins.text
                                                       or "%dr" in ins.text):
      category = "privileged"  # moves to and from control and debug registers
    if category is None and ins.mnemonic in ("mov", "pop") and ins.text.rstrip().endswith(
        _SEGMENT_REGISTERS):
      category = "privileged"  # loading a segment register: the thread's own fs, say
    if category is not None:
      return f"{category}: instruction {k} `{ins.text}` cannot be timed in user space"
  return None


def prefilter(hexes: Sequence[str], *, progress: bool = False) -> list[str | None]:
  """Why each block cannot be measured (None when it can), from the decoder.

  Undecodable blocks keep the decoder's reason; decoded ones are rejected when an
  instruction is system, privileged, control flow or untimeable (`UNTIMEABLE`).
  """
  from diffsim.isa import decode_blocks

  out: list[str | None] = []
  for blk in decode_blocks(list(hexes), progress=progress):
    if isinstance(blk, Exception):
      out.append(f"undecodable: {blk}")
    else:
      out.append(untimeable_reason(blk))
  return out
