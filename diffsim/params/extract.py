"""Builds a `diffsim-params/1` table (see SCHEMA.md) for one llvm-mca CPU model.

Every value is read from the installed LLVM 14 tools; nothing is copied from LLVM's
TableGen sources. Sources, in order of authority:

1. `llvm-mca -instruction-tables` on the example instance of every key: NumMicroOps,
   MaxLatency, MayLoad/MayStore/HasSideEffects, load/store barriers, and the static
   per-unit pressure that any resource list must reproduce.
2. `llvm-exegesis -mode=analysis` (diffsim/sim/MODEL.md#llvm-exegesis) on the MCInst llvm-mca
   builds from that same text: the scheduling class, its resource list with group
   names and cycles, and its write-latency entries.
3. `llvm-mca` simulations of small regions: buffer sizes and which buffers each key
   uses (`-scheduler-stats`), globals (summary, `-retire-stats`, `-dispatch-stats`,
   `-register-file-stats`), and timeline probes for read-advance, per-write
   latencies, idioms and move elimination (`probes.py`).

Where llvm-exegesis' list does not reproduce llvm-mca's pressure (it reduces the
expanded list in resource-index order, which goes wrong when a group sorts before
its members), the list is rebuilt from llvm-mca's pressure and the key
gets an `evidence` note (`resources.resolve_resources`).

The machine-wide entries come from `mcaglobals`, the variant keys from `variants`;
`diffsim params CPU -o FILE.json` runs this and writes the table.
"""

from __future__ import annotations

import datetime
import os
import sys
import time

from diffsim.llvmtools import llvm_version
from diffsim.params import corpus_keys, exegesis, mcaglobals, mcaviews, mctools, variants
from diffsim.params import resources as R
from diffsim.params.table import FORMAT

# The llvm-mca models whose tables diffsim ships (`table.TABLES_DIR`).
CPUS = ("haswell", "skylake", "znver3", "broadwell", "icelake-client", "znver1", "znver2")


def _log(progress: bool, msg: str, t0: float) -> None:
  if progress:
    print(f"[{time.time() - t0:6.1f}s] {msg}", file=sys.stderr)


def build_table(cpu: str, keys: dict | None = None, *, progress: bool = False,
                probe: bool = True) -> dict:
  """Builds the parameter table of one llvm-mca CPU model.

  Args:
    cpu: llvm-mca `-mcpu` name (`haswell`, `skylake`, `znver3`, ...).
    keys: {key: {"example": AT&T text, ...}} as in corpus_keys.json; the shipped
      corpus_keys.json when None.
    progress: log steps to stderr.
    probe: run the timeline probes (read-advance, per-write latency, idioms, move
      elimination); without them those fields keep their defaults.

  Returns:
    The `diffsim-params/1` JSON object (a dict).
  """
  t0 = time.time()
  if keys is None:
    keys = corpus_keys.load()
  keys = variants.expand(keys)
  wanted = set(keys)
  # Group membership and buffers are inferred from many classes at once, so a small
  # key set is padded with the corpus examples (if shipped) as evidence.
  if os.path.exists(corpus_keys.DEFAULT_OUT):
    keys = {**corpus_keys.load(), **keys}
  lines = {k: v["example"] for k, v in keys.items()}
  supported, unsupported = mcaviews.filter_supported(cpu, lines)
  _log(progress, f"{len(supported)} keys accepted, {len(unsupported)} refused", t0)

  # The MCInst llvm-mca builds from each line is what its class is resolved from
  # (the assembler may pick another opcode than the decoder: XOR32rr for
  # XOR32rr_REV).
  insts = dict(zip(supported, mctools.assemble("\n".join(supported.values()) + "\n")))
  names = mctools.register_names()
  points = {k: i.opcode + " " + " ".join(mctools.exegesis_operand(kind, v, names)
                                         for kind, v in i.operands)
            for k, i in insts.items()}
  rows, units = mcaviews.instruction_tables(cpu, list(supported.values()))
  info = dict(zip(supported, rows))
  classes, refused = exegesis.read_classes(cpu, points)
  _log(progress, f"instruction tables and exegesis classes read ({len(refused)} refused)", t0)

  ks = [k for k in supported if k in classes and classes[k].valid]
  groups, group_notes = R.infer_listed_groups(
      units.counts, [classes[k].resources for k in ks], [info[k].pressure for k in ks],
      [classes[k].pressure for k in ks])
  model = R.Model(dict(units.counts), groups, {})

  # Resource lists, checked against (or rebuilt from) llvm-mca's static pressure.
  kept_lists, notes = {}, {}
  for k in supported:
    sc = classes.get(k)
    if sc is None or not sc.valid:
      fixed = R.repair(model, [], info[k].pressure)
      kept_lists[k] = fixed or []
      notes[k] = [f"no llvm-exegesis class ({refused.get(k, 'invalid class')}); "
                  + ("resources rebuilt from pressure" if fixed is not None
                     else "UNVERIFIED: no resources")]
      continue
    kept_lists[k], note = R.resolve_resources(model, sc.resources, info[k].pressure)
    notes[k] = [note] if note else []

  # Buffers: which buffered resources each key takes an entry in, simulated alone.
  regions = mcaviews.run_regions(cpu, [[supported[k]] for k in supported],
                                 ["-iterations=1", "-scheduler-stats"])
  usage = {k: {b: q[1] > 0 for b, q in mcaviews.parse_scheduler_queues(r).items()}
           for k, r in zip(supported, regions)}
  sizes = {}
  for r in regions[:1]:
    sizes = {b: q[2] for b, q in mcaviews.parse_scheduler_queues(r).items()}
  model.buffers = dict(sizes)
  # -scheduler-stats counts the load/store queue resources by MayLoad/MayStore, not by
  # the buffer entries taken at dispatch, so they are left out of the checks.
  lsq = {b for b in sizes
         if all(usage[k].get(b, False) == info[k].may_load for k in supported)
         or all(usage[k].get(b, False) == info[k].may_store for k in supported)}
  for b in sizes:
    if b in model.units or b in model.groups:
      continue
    mem, note = R.infer_buffered_group(
        units.counts, groups, [kept_lists[k] for k in supported],
        [usage[k].get(b, False) for k in supported])
    groups[b] = mem
    if note:
      group_notes[b] = note
  _log(progress, f"groups {sorted(groups)}; buffers {sizes}; queues {sorted(lsq)}", t0)

  opcodes = {}
  for k in supported:
    if k not in wanted:
      continue
    inf = info[k]
    sc = classes.get(k)
    e = {"uops": inf.uops, "latency": inf.latency}
    ev = list(notes[k])
    res = kept_lists[k]
    e["resources"] = [[n, c] for n, c in res]
    used = {b for b, u in usage[k].items() if u} - lsq
    implied = R.buffers_used(model, res)
    if used != implied - lsq:
      # llvm-mca's entries stand (a list rebuilt from pressure can drop a buffered
      # resource that llvm-exegesis' class names: Zen 1's x87 loads hold ZnAGU/ZnFPU).
      e["buffers"] = sorted(used | (implied & lsq))
      ev.append(f"buffers {e['buffers']} read from -scheduler-stats; the list implies "
                f"{sorted(implied)}")
    for flag in ("may_load", "may_store", "side_effects", "load_barrier", "store_barrier"):
      if getattr(inf, flag):
        e[flag] = True
    if insts[k].opcode != k.split("@")[0]:
      e["llvm_opcode"] = insts[k].opcode
    if sc is not None and sc.valid:
      e["sched_class"] = sc.name
    if ev:
      e["evidence"] = "; ".join(ev)
    opcodes[k] = e

  glob = mcaglobals.read_globals(cpu)
  glob_ev = glob.pop("_evidence")
  _log(progress, "globals read", t0)

  table = {
      "format": FORMAT,
      "cpu": cpu,
      "source": (f"LLVM {llvm_version()}: llvm-mca -instruction-tables/-scheduler-stats/"
                 f"timeline probes and llvm-exegesis analysis, diffsim.params.extract, "
                 f"{datetime.date.today().isoformat()}"),
      "global": glob,
      "resources": _resource_entries(model),
      "opcodes": opcodes,
      "unsupported": dict(sorted((k, v) for k, v in unsupported.items() if k in wanted)),
      "evidence": {"global": glob_ev, "groups": group_notes},
  }
  if probe:
    from diffsim.params import probes  # pylint: disable=import-outside-toplevel
    probes.apply(cpu, table, keys, progress=progress)
    _log(progress, "probes done", t0)
  # Where llvm-exegesis' class still disagrees with llvm-mca (after the probes took
  # forwarding delays out of the printed latency), llvm-mca's values stand.
  for k, e in opcodes.items():
    sc = classes.get(k)
    if sc is not None and sc.valid and (sc.uops != e["uops"] or sc.max_latency != e["latency"]):
      msg = (f"llvm-exegesis class {sc.name} has uops {sc.uops} latency {sc.max_latency}; "
             "llvm-mca's values kept")
      e["evidence"] = msg + ("; " + e["evidence"] if e.get("evidence") else "")
  variants.collapse(opcodes)
  return table


def _resource_entries(model: R.Model) -> list:
  """The `resources` list: units in llvm-mca's order, then groups in mask order."""
  out = []
  for u, n in model.units.items():
    out.append({"name": u, "units": n, "buffer": model.buffers.get(u, -1)})
  for g in sorted(model.groups, key=model.mask_rank):
    members = [u for u in model.units if u in model.groups[g]]
    out.append({"name": g, "members": members, "buffer": model.buffers.get(g, -1)})
  return out
