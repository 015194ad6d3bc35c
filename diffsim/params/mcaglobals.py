"""The table's machine-wide entries (`global`), read from llvm-mca runs: dispatch
width, ROB, retire width, load and store queues, register files.

Most are printed by llvm-mca's statistics views; the rest are measured with small
regions behind a long divide, which holds retirement while the rest dispatches.
"""

from __future__ import annotations

from diffsim.params import mcaviews, mctools


def read_globals(cpu: str) -> dict:
  """Dispatch width, ROB, retire width, LQ/SQ and register files, from llvm-mca.

  Returns:
    The table's `global` object, plus `_evidence` notes.
  """
  ev = {}
  runs = mcaviews.run_regions(cpu, [
      ["nop"],
      ["divq %rcx"] + ["nop"] * 150,
      ["divq %rcx"] + ["movq (%rdi), %rax"] * 150,
      ["divq %rcx"] + ["movq %rax, (%rdi)"] * 150,
  ], ["-iterations=1", "-retire-stats", "-dispatch-stats", "-register-file-stats"])
  summ = mcaviews.parse_summary(runs[0])
  ret = mcaviews.parse_retire(runs[0])
  g = {"dispatch_width": summ["Dispatch Width"], "rob_size": ret["rob"]}
  # Retire width: 150 executed nops wait behind a divide; when it retires they all
  # go at once unless MaxRetirePerCycle caps the burst.
  burst = max(mcaviews.parse_retire(runs[1])["hist"])
  g["retire_width"] = 0 if burst >= 100 else burst
  ev["retire_width"] = f"largest retire burst behind a divide: {burst} of 150 nops"
  # LQ/SQ: loads/stores executed behind a divide cannot retire; with a queue, dispatch
  # stalls on LQ/SQ and the number dispatched before the divide retires is its size.
  for field, run, kind in (("load_queue", 2, "LQ"), ("store_queue", 3, "SQ")):
    stalls = mcaviews.parse_dispatch_stalls(runs[run])
    if stalls.get(kind, 0) == 0:
      g[field] = 0
      ev[field] = f"no {kind} stall with 150 in flight"
    else:
      g[field] = _queue_size(cpu, run == 2)
      ev[field] = f"{kind} stalls; entries in flight before the divide retires"
  g["register_files"] = _register_files(cpu)
  g["_evidence"] = ev
  return g


def _queue_size(cpu: str, loads: bool) -> int:
  """Loads (or stores) dispatched before a blocking divide retires."""
  op = "movq (%rdi), %rax" if loads else "movq %rax, (%rdi)"
  reg = mcaviews.run_regions(cpu, [["divq %rcx"] + [op] * 200],
                             ["-iterations=1", "-timeline", "-timeline-max-iterations=1",
                              "-timeline-max-cycles=0"], as_json=True)[0]
  tl = reg["TimelineView"]["TimelineInfo"]
  head_retire = tl[0]["CycleRetired"]
  return sum(1 for e in tl[1:] if e["CycleDispatched"] < head_retire)


# Register kinds and one instruction that writes a register of that kind (and
# nothing else that a register file could rename, except where noted).
_KIND_PROBES = {
    "gpr": "movq $1, %rax",
    "flags": "cmpq %rax, %rbx",
    "vec": "vaddps %ymm1, %ymm2, %ymm3",
    "mmx": "paddd %mm1, %mm2",
    "mask": "kmovw %k1, %k2",
    "x87": "fadd %st(1), %st",
}
# One write of each vector width: a file may take more than one register for a wide one
# (llvm-mca's RegisterCost; Zen 1/2 take two for a YMM register).
_COST_PROBES = {
    "xmm": "vaddps %xmm1, %xmm2, %xmm3",
    "ymm": "vaddps %ymm1, %ymm2, %ymm3",
    "zmm": "vaddps %zmm1, %zmm2, %zmm3",
}


def _register_files(cpu: str) -> list:
  """Named register files with their sizes, kinds, costs of wide writes and
  move-elimination limits."""
  kinds = list(_KIND_PROBES)
  bodies = [[_KIND_PROBES[k]] for k in kinds]
  # Eight independent moves per file: the largest number eliminated in one cycle is
  # the per-cycle budget when it is below 8 (dispatch width permitting).
  moves_gpr = [f"movq %r{a}, %r{b}" for a, b in zip(range(8, 16, 2), range(9, 16, 2))] + [
      "movq %rax, %rbx", "movq %rcx, %rdx", "movq %rsi, %rdi", "movq %rbp, %rsp"]
  moves_vec = [f"vmovaps %xmm{a}, %xmm{a + 1}" for a in range(0, 16, 2)]
  bodies += [moves_gpr, moves_vec] + [[_COST_PROBES[f]] for f in _COST_PROBES]
  try:
    runs = mcaviews.run_regions(cpu, bodies, ["-iterations=1", "-register-file-stats"])
  except mctools.ToolError:  # a kind the CPU cannot model (mask registers): probe apart
    runs = []
    for b in bodies:
      try:
        runs.extend(mcaviews.run_regions(cpu, [b], ["-iterations=1", "-register-file-stats"]))
      except mctools.ToolError:
        runs.append("")
  files = {f["name"]: {"name": f["name"], "size": f.get("Number of physical registers", 0),
                       "classes": [], "max_moves_per_cycle": 0, "zero_moves_only": False}
           for f in mcaviews.parse_register_files(runs[0])}
  for kind, text in zip(kinds, runs):
    for f in mcaviews.parse_register_files(text):
      if f.get("Total number of mappings created", 0) > 0:
        files[f["name"]]["classes"].append(kind)
  for family, text in zip(_COST_PROBES, runs[len(kinds) + 2:]):
    for f in mcaviews.parse_register_files(text):
      regs = f.get("Total number of mappings created", 0)
      if regs > 1:
        files[f["name"]].setdefault("costs", {})[family] = regs
  for text in runs[len(kinds):len(kinds) + 2]:
    for f in mcaviews.parse_register_files(text):
      if f.get("Number of optimizable moves", 0) > 0:
        files[f["name"]]["max_moves_per_cycle"] = max(
            files[f["name"]]["max_moves_per_cycle"], f.get("Max moves eliminated per cycle", 0))
        # The probe's moves copy registers not known to be zero: a file that
        # eliminates none of them restricts elimination to zero moves.
        files[f["name"]]["zero_moves_only"] = f.get("Number of moves eliminated", 0) == 0
  return list(files.values())
