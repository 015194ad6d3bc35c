"""The Block IR as JSON and back (`diffsim decode` writes it).

Every `Instr` field is written, so a block read back equals the decoded one; the
atoms are interned as the decoder's are (`ir.shared_read`).
"""

from __future__ import annotations

from diffsim.isa.ir import Block, Instr, Mem, shared_read, shared_write


def _instr_to_json(i: Instr) -> dict:
  return {
      "key": i.key, "text": i.text, "hex": i.hex, "mnemonic": i.mnemonic,
      "reads": [[r.reg, r.role, r.width] for r in i.reads],
      "writes": [[w.reg, w.role, w.merge, w.width] for w in i.writes],
      "flags_read": list(i.flags_read), "flags_written": list(i.flags_written),
      "mem": [{"base": m.base, "index": m.index, "scale": m.scale, "disp": m.disp,
               "size": m.size, "load": m.load, "store": m.store, "segment": m.segment}
              for m in i.mem],
      "loads": i.loads, "stores": i.stores, "stack": i.stack,
      "zero_idiom": i.zero_idiom, "dep_breaking": i.dep_breaking,
      "lock": i.lock, "rep": i.rep, "encoding_opcode": i.encoding_opcode,
  }


def block_to_json(block: Block) -> dict:
  """A JSON-ready dict: `{"hex": ..., "instrs": [...]}` with every Instr field.

  Reads are `[reg, role, width]`, writes `[reg, role, merge, width]`, memory
  operands objects.

  >>> from diffsim.isa import parse_asm
  >>> sorted(block_to_json(parse_asm("addq %rbx, %rax")))
  ['hex', 'instrs']
  """
  return {"hex": block.hex, "instrs": [_instr_to_json(i) for i in block.instrs]}


def block_from_json(d: dict) -> Block:
  """Inverse of `block_to_json` (also reads the older `[reg, role]` and
  `[reg, role, merge]` lists, as width 0)."""
  instrs = []
  for j in d["instrs"]:
    instrs.append(Instr(
        key=j["key"], text=j["text"], hex=j["hex"], mnemonic=j["mnemonic"],
        reads=tuple(shared_read(r[0], r[1], int(r[2]) if len(r) > 2 else 0) for r in j["reads"]),
        writes=tuple(shared_write(w[0], w[1], bool(w[2]), int(w[3]) if len(w) > 3 else 0)
                     for w in j["writes"]),
        flags_read=tuple(j.get("flags_read", ())),
        flags_written=tuple(j.get("flags_written", ())),
        mem=tuple(Mem(**m) for m in j.get("mem", ())),
        loads=j.get("loads", False), stores=j.get("stores", False),
        stack=j.get("stack", False), zero_idiom=j.get("zero_idiom", False),
        dep_breaking=j.get("dep_breaking", False), lock=j.get("lock", False),
        rep=j.get("rep", False), encoding_opcode=j.get("encoding_opcode", "")))
  return Block(hex=d["hex"], instrs=tuple(instrs))
