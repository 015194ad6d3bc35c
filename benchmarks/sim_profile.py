"""Where does `simulate` spend its time? Kernel time by simulator stage and source line.

Runs `simulate` once to compile, then once under `jax.profiler`, and maps every XLA
kernel the trace shows to the Python lines it was fused from (through the stack-frame
table of the optimised HLO, dumped for the purpose). Prints three tables: time by
stage file, by source line, and by how often a kernel runs (per step of the loop, per
resource step), with kernels per step (a step is one issue round: `pipeline.step`). The profiler adds about
a microsecond to every kernel, so small kernels look dearer than they are: compare
shares between versions, not against wall time.

  python benchmarks/sim_profile.py [--n 600] [--cpu haswell] [--lengths 5-8] [--top 30]

Blocks come from ../shared/data/bhive (seeded sample) when present, else from the
shipped mca-small.csv. One XLA device (the profile of one cycle loop).
"""

from __future__ import annotations

import argparse
import collections
import glob
import gzip
import json
import os
import re
import shutil
import sys
import tempfile

from diffsim.cli import tune_xla

ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
ap.add_argument("--n", type=int, default=600)
ap.add_argument("--cpu", default="haswell")
ap.add_argument("--lengths", default="5-8", help="block lengths, LO-HI instructions")
ap.add_argument("--top", type=int, default=30)
ARGS = ap.parse_args()
WORK = tempfile.mkdtemp(prefix="sim_profile_")
os.environ["XLA_FLAGS"] = (os.environ.get("XLA_FLAGS", "")
                           + " --xla_force_host_platform_device_count=1"
                           f" --xla_dump_to={WORK}/hlo --xla_dump_hlo_as_text")
tune_xla()  # and the command's other options

import jax  # noqa: E402
import numpy as np  # noqa: E402

from diffsim.data import corpus_hexes  # noqa: E402

from diffsim.isa import decode_blocks  # noqa: E402
from diffsim.isa.encode import BUCKETS  # noqa: E402
from diffsim.params.table import load_table  # noqa: E402
from diffsim.sim import encode, simulate  # noqa: E402

STAGES = ("issue.py", "dispatch.py", "retire.py", "pipeline.py", "period.py", "facts.py")
SECTIONS = ("FileNames", "FunctionNames", "FileLocations", "StackFrames")


def kernel_times(trace_dir: str):
  """{kernel name: (total microseconds, runs)} from the profiler's trace."""
  path = sorted(glob.glob(f"{trace_dir}/**/*.trace.json.gz", recursive=True))[-1]
  events = json.load(gzip.open(path))["traceEvents"]
  total, runs = collections.Counter(), collections.Counter()
  for e in events:
    name = e.get("name", "")
    if e.get("ph") == "X" and not name.startswith(("ThunkExecutor", "$", "while", "cond")):
      total[name] += e.get("dur", 0)
      runs[name] += 1
  return total, runs


def source_of_kernels(hlo_path: str):
  """{kernel name: [(file, function, line) of the innermost simulator frame, ...]}."""
  lines = open(hlo_path).read().splitlines()
  tables = {s: {} for s in SECTIONS}
  section = None
  for line in lines:
    if line in SECTIONS:
      section = line
    elif not line.strip():
      section = None
    elif section:
      key, rest = line.split(" ", 1)
      tables[section][int(key)] = rest
  files = {k: v.strip('"').rsplit("/", 1)[-1] for k, v in tables["FileNames"].items()}
  funcs = {k: v.strip('"') for k, v in tables["FunctionNames"].items()}
  locs = {}
  for k, v in tables["FileLocations"].items():
    m = re.search(r"file_name_id=(\d+) function_name_id=(\d+) line=(\d+)", v)
    locs[k] = (files[int(m[1])], funcs[int(m[2])], int(m[3]))
  frames = {k: tuple(map(int, re.search(r"file_location_id=(\d+) parent_frame_id=(\d+)",
                                        v).groups())) for k, v in tables["StackFrames"].items()}

  def innermost(frame):
    seen = set()
    while frame in frames and frame not in seen:
      seen.add(frame)
      loc, frame = frames[frame]
      if locs[loc][0] in STAGES:  # state.py's helpers count for their caller
        return locs[loc]
    return None

  bodies, current = {}, None
  for line in lines:
    if line and not line.startswith(" ") and line.rstrip().endswith("{"):
      current = line.split()[1 if line.startswith("ENTRY") else 0].lstrip("%")
      bodies[current] = []
    elif current is not None:
      bodies[current].append(line)
  out = {}
  for body in bodies.values():
    for line in body:
      m = re.match(r"\s*(?:ROOT )?%?([\w.\-]+) = ", line)
      if not m:
        continue
      called = re.search(r"calls=%?([\w.\-]+)", line)
      inner = bodies.get(called[1], []) if called else [line]
      ids = [int(x) for x in re.findall(r"stack_frame_id=(\d+)", "\n".join(inner))]
      out[m[1]] = [s for s in map(innermost, ids) if s]
  return out


def share_table(title: str, totals: collections.Counter, top: int):
  whole = sum(totals.values())
  print(f"\n# {title}")
  for key, us in totals.most_common(top):
    print(f"{us / whole:6.1%}  {us / 1e3:9.1f} ms  {key}")


def main():
  try:
    return report()
  finally:
    shutil.rmtree(WORK, ignore_errors=True)  # the trace and HLO dumps: hundreds of MB


def report():
  table = load_table(ARGS.cpu)
  lo, hi = map(int, ARGS.lengths.split("-"))
  hexes, source = corpus_hexes(20 * ARGS.n)
  blocks = [b for b in decode_blocks(hexes)
            if not isinstance(b, Exception) and lo <= len(b.instrs) <= hi]
  runnable = []
  for b in blocks:
    try:
      encode(table, [b])
    except Exception:  # noqa: BLE001 (unsupported opcode: not this benchmark's concern)
      continue
    runnable.append(b)
    if len(runnable) == ARGS.n:
      break
  L = next(x for x in BUCKETS if hi <= x)
  batch = encode(table, runnable, length=L)
  its = np.full(len(runnable), 100, np.int32)
  simulate(table, batch, iterations=its)  # compile
  jax.profiler.start_trace(f"{WORK}/trace")
  simulate(table, batch, iterations=its)
  jax.profiler.stop_trace()

  total, runs = kernel_times(f"{WORK}/trace")
  hlo = max(glob.glob(f"{WORK}/hlo/*.cpu_after_optimizations.txt"),
            key=os.path.getsize)
  sources = source_of_kernels(hlo)
  by_file, by_line, by_runs = (collections.Counter() for _ in range(3))
  kernels_by_runs, retire_runs = collections.Counter(), collections.Counter()
  for name, us in total.items():
    where = collections.Counter(sources.get(name, []))
    unplaced = ("(no source line: copies of loop carries)", "", 0)
    f, fn, line = where.most_common(1)[0][0] if where else unplaced
    by_file[f] += us
    by_line[f"{f}:{line} {fn}"] += us
    by_runs[runs[name]] += us
    kernels_by_runs[runs[name]] += 1
    if f == "retire.py":
      retire_runs[runs[name]] += 1
  # The retire stage runs exactly once per step of the loop.
  per_step = retire_runs.most_common(1)[0][0]
  events = sum(runs.values())
  print(f"# simulate profile: {len(runnable)} blocks of {lo}-{hi} instructions ({source}), "
        f"{ARGS.cpu}, 100 iterations, 1 device; {per_step} batched steps traced, "
        f"{events / per_step:.0f} kernel runs per step")
  share_table("kernel time by stage", by_file, ARGS.top)
  share_table("kernel time by source line (innermost simulator frame)", by_line, ARGS.top)
  print("\n# kernels by how often they run (per traced step)")
  print(f"{'runs/step':>10s} {'kernels':>8s} {'share':>7s}")
  whole = sum(by_runs.values())
  merged, count = collections.Counter(), collections.Counter()
  for r, us in by_runs.items():  # a round's kernels run 1,323 or 1,324 times: one class
    merged[round(r / per_step, 1)] += us
    count[round(r / per_step, 1)] += kernels_by_runs[r]
  for r, us in merged.most_common(8):
    print(f"{r:10.1f} {count[r]:8d} {us / whole:7.1%}")
  return 0


if __name__ == "__main__":
  sys.exit(main())
