"""How does a sweep and a fit epoch scale over processes, and what would 16 hosts give?

Runs the same work with 1, 2 and 4 local processes of one multi-process run
(`diffsim.sim.hosts`, JAX's distributed runtime over loopback), each process pinned to
its share of this machine's cores (one XLA device per core it holds; where there are
more processes than cores, processes share a core):
  - a sweep: P sampled tables x B blocks (`simulate_sweep`), steady state;
  - a fit epoch: N measured blocks in minibatches of 128 (`diffsim.fit.fit`),
    data-parallel (each process takes its part of every minibatch).
Each process runs each part twice and times the second (the first compiles). Every
process counts what its collectives moved (`hosts.TRAFFIC`).

The cores stay the same for every row, so the ideal is a constant time; the rows
measure what distribution costs (dealing, padding, gathering, per-step overheads).
The projection to H hosts, each like this machine, is

  sweep:  T(H) = T1 / H + collectives x latency + bytes(H) / bandwidth
  fit:    T(H) = steps x (a + b x 128 / H + latency + grad_bytes x H / bandwidth)

where T1 is one process's time, a and b a step's fixed and per-block cost (from the
1-process epoch at minibatches of 128 and of 32), and latency and bandwidth those of
the network (--latency-ms, --gbits; default 0.5 ms and 10 Gbit/s Ethernet).

  python benchmarks/scaling.py [--procs 1 2 4] [--tables 16] [--blocks 512] [--fit-n 1024]
"""

from __future__ import annotations

import argparse
import json
import os
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

WORKER = "_scaling_worker"


def _port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def run(k: int, args, out: Path, batch: int) -> list[dict]:
  """The work in k processes; each process's figures."""
  cores = sorted(os.sched_getaffinity(0))
  port = _port()
  procs = []
  for i in range(k):
    mine = [cores[j % len(cores)] for j in range(i * len(cores) // k, max(
        (i + 1) * len(cores) // k, i * len(cores) // k + 1))]
    env = dict(os.environ, JAX_COORDINATOR_ADDRESS=f"127.0.0.1:{port}",
               JAX_NUM_PROCESSES=str(k), JAX_PROCESS_ID=str(i),
               XLA_FLAGS=f"--xla_force_host_platform_device_count={len(mine)}")
    cmd = ["taskset", "-c", ",".join(map(str, mine)), sys.executable, __file__, WORKER,
           json.dumps(dict(vars(args), out=str(out / f"k{k}-b{batch}-p{i}.json"),
                           batch=batch, cores=len(mine)))]
    procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE,
                                  stderr=subprocess.STDOUT, text=True))
  for p in procs:
    text = p.communicate(timeout=3600)[0]
    if p.returncode:
      raise SystemExit(f"a process of {k} failed:\n{text[-3000:]}")
  return [json.loads((out / f"k{k}-b{batch}-p{i}.json").read_text()) for i in range(k)]


def worker(spec: dict) -> None:
  """One process of the run: the sweep and the fit epoch, each twice, the second timed."""
  from diffsim.sim import hosts

  hosts.initialize()
  from diffsim.cli import tune_xla
  from diffsim.cli.common import enable_compile_cache

  tune_xla()
  enable_compile_cache()
  import jax
  import numpy as np

  from diffsim.data import load_csv, shared_data_dir, shipped
  from diffsim.fit import FitConfig, fit
  from diffsim.isa import decode_blocks
  from diffsim.params.sample import sample_params
  from diffsim.params.table import load_table
  from diffsim.sim import encode, simulate_sweep

  shared = shared_data_dir()
  data = shared / "measured" / "zen5-measured.csv" if shared else shipped("zen5-small.csv")
  ds = load_csv(data)
  table = load_table("znver3")
  figures = dict(process=hosts.index(), processes=hosts.count(), cores=spec["cores"],
                 devices=len(jax.local_devices()))
  if spec["batch"] == 128:  # the sweep once per process count
    blocks = [b for b in decode_blocks(list(ds.hex[:4 * spec["blocks"]]))
              if not isinstance(b, Exception) and 0 < len(b.instrs) <= 8][:spec["blocks"]]
    batch = encode(table, blocks, length=8)
    params = sample_params(table, spec["tables"], 0)
    for timed in (False, True):
      before = dict(hosts.TRAFFIC)
      t0 = time.perf_counter()
      c1 = simulate_sweep(table, batch, params=params, iterations=100, throw=False)
      c2 = simulate_sweep(table, batch, params=params, iterations=200, throw=False)
      seconds = time.perf_counter() - t0
    figures["sweep"] = dict(seconds=seconds, pairs=spec["tables"] * len(blocks),
                            checksum=int((c2.total - c1.total).sum()),
                            **{k: hosts.TRAFFIC[k] - before[k] for k in before})
  pick = np.sort(np.random.default_rng(0).permutation(len(ds))[:spec["fit_n"]])
  train = ds.take(pick)
  with tempfile.TemporaryDirectory() as tmp:
    # 2 epochs: the first compiles, the second is timed (its history entry); the same
    # seed in every run, so every process count fits the same table.
    before = dict(hosts.TRAFFIC)
    result = fit(table, train, None, tmp, FitConfig(epochs=2, batch_size=spec["batch"],
                                                    patience=10), progress=False, log=lambda m: None)
  last = result.history[-1]
  figures["fit"] = dict(seconds=last["seconds"], blocks=len(train),
                        steps=-(-len(train) // spec["batch"]), train=last["train"],
                        # per epoch (of the two run)
                        **{k: (hosts.TRAFFIC[k] - before[k]) / 2 for k in before})
  Path(spec["out"]).write_text(json.dumps(figures))


def main(argv=None) -> int:
  ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
  ap.add_argument("--procs", type=int, nargs="+", default=[1, 2, 4])
  ap.add_argument("--tables", type=int, default=16)
  ap.add_argument("--blocks", type=int, default=512)
  ap.add_argument("--fit-n", type=int, default=1024)
  ap.add_argument("--hosts", type=int, default=16, help="the projection's host count")
  ap.add_argument("--latency-ms", type=float, default=0.5)
  ap.add_argument("--gbits", type=float, default=10.0)
  ap.add_argument("--no-step-model", action="store_true",
                  help="skip the 1-process epoch at minibatches of 32 (then a step's fixed "
                       "cost is taken as what the 2-process run added per step)")
  ap.add_argument("--report", metavar="DIR", help="only print, from an earlier run's DIR")
  args = ap.parse_args(argv)
  out = Path(args.report or tempfile.mkdtemp(prefix="diffsim-scaling-"))
  rows, small = {}, None
  for k in args.procs:
    if args.report:
      rows[k] = [json.loads(p.read_text()) for p in sorted(out.glob(f"k{k}-b128-p*.json"))]
      continue
    t0 = time.time()
    rows[k] = run(k, args, out, 128)
    print(f"# {k} process(es) done in {time.time() - t0:.0f} s", file=sys.stderr, flush=True)
  if args.report and (out / "k1-b32-p0.json").exists():
    small = json.loads((out / "k1-b32-p0.json").read_text())["fit"]
  elif not args.report and not args.no_step_model:
    small = run(1, args, out, 32)[0]["fit"]  # a step's fixed and per-block costs
  rows = {k: v for k, v in rows.items() if v}
  report(rows, small, args, out)
  return 0


def report(rows: dict, small: dict | None, args, out: Path) -> None:
  cores = len(os.sched_getaffinity(0))
  one = rows[min(rows)][0]
  print(f"# scaling on this machine: {cores} cores; sweep {args.tables} tables x "
        f"{args.blocks} blocks (steady, 100 + 200 iterations); fit epoch {one['fit']['blocks']} "
        "blocks, minibatches of 128; times of the second pass (the first compiles)")
  print(f"{'processes':>9} {'cores/proc':>10} {'sweep s':>8} {'pairs/s':>8} {'vs 1':>5} "
        f"{'sweep kB':>9} {'fit s':>7} {'blocks/s':>9} {'vs 1':>5} {'fit kB/step':>12}")
  for k, figs in rows.items():
    sw = max(f["sweep"]["seconds"] for f in figs)  # the run ends with its slowest process
    ft = max(f["fit"]["seconds"] for f in figs)
    f0 = figs[0]
    assert all(f["sweep"]["checksum"] == one["sweep"]["checksum"] for f in figs)
    print(f"{k:9d} {f0['cores']:10d} {sw:8.2f} {f0['sweep']['pairs'] / sw:8.0f} "
          f"{one['sweep']['seconds'] / sw:5.2f} {f0['sweep']['bytes_received'] / 1e3:9.1f} "
          f"{ft:7.2f} {f0['fit']['blocks'] / ft:9.1f} {one['fit']['seconds'] / ft:5.2f} "
          f"{f0['fit']['bytes_received'] / f0['fit']['steps'] / 1e3:12.1f}")

  # The projection to H hosts like this machine.
  H, lat, bw = args.hosts, args.latency_ms / 1e3, args.gbits * 1e9 / 8
  sweep1, fit1 = one["sweep"], one["fit"]
  k2 = min((k for k in rows if k > 1), default=None)
  if k2 is None:
    print("# (no multi-process run: no projection)")
    return
  multi = rows[k2][0]
  colls = multi["sweep"]["collectives"]
  per_pair = multi["sweep"]["bytes_sent"] / (sweep1["pairs"] / k2)  # bytes a pair adds
  sweep_h = sweep1["seconds"] / H + colls * lat + per_pair * sweep1["pairs"] * (H - 1) / H / bw
  steps = fit1["steps"]
  t128 = fit1["seconds"] / steps
  if small is not None:  # a + 128 b = a step of 128 blocks; a + 32 b = one of 32
    b = (t128 - small["seconds"] / small["steps"]) / (128 - 32)
    a = t128 - 128 * b
    how = "from the 1-process epochs at minibatches of 128 and 32"
  else:  # what distributing added per step, measured, as the fixed part
    a = max(0.0, (max(f["fit"]["seconds"] for f in rows[k2]) - fit1["seconds"]) / steps)
    b = (t128 - a) / 128
    how = f"the fixed part taken as what {k2} processes added per step"
  # What a process sends per step (the gradient, the step's status codes, its share of
  # the epoch's scoring): every other host receives it.
  grad = multi["fit"]["bytes_sent"] / steps
  fit_h = steps * (a + b * 128 / H + 2 * lat + grad * (H - 1) / bw)
  print(f"\n# projection to {H} hosts like this one ({args.latency_ms} ms per collective, "
        f"{args.gbits} Gbit/s):")
  print(f"sweep: {sweep1['seconds']:.2f} s -> {sweep_h:.3f} s ({sweep1['seconds'] / sweep_h:.1f}x;"
        f" {colls} collectives, {per_pair:.1f} bytes per pair)")
  print(f"fit epoch: {fit1['seconds']:.2f} s -> {fit_h:.3f} s ({fit1['seconds'] / fit_h:.1f}x; "
        f"a step costs {1e3 * a:.0f} ms + {1e3 * b:.1f} ms per block, {how}; "
        f"{grad / 1e3:.0f} kB sent per host and step)")
  print(f"# raw figures: {out}")


if __name__ == "__main__":
  if len(sys.argv) > 2 and sys.argv[1] == WORKER:
    worker(json.loads(sys.argv[2]))
  else:
    sys.exit(main())
