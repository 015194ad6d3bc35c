"""Search on the CPU at hand: evaluations to within 2% of the best measured configuration.

Every valid configuration of each task is measured on this machine with `diffsim
measure`'s harness (`diffsim.search.measured.measure_space`), twice, one run after
the other; a configuration's cost is the mean of its two runs, and their disagreement is
printed (the noise every method searches through). Then each method searches with those
measured costs until it evaluates a configuration within 2% of the measured optimum:
Glimpse (its blueprint from the table named by `--table`, by default the shipped table
closest to this CPU), random search, the AutoTVM-style tuner, plain BO, the transfer
control, `roofline` (configurations in the order of their roofline on the blueprint's
table) and `simulator` (in the order that table simulates them: simulate everything,
measure the favourites).

Printed per task: the measured optimum and the simulator's, where the simulator's
optimum ranks among the measured costs (and why they differ, from the two kernels'
instruction mix), Kendall's tau between simulated and measured costs, the mean
evaluations per method, and the measured speedup of the configuration Glimpse picks
within `--budget` evaluations over the task's untuned default.

  python benchmarks/search_measured.py               # the recorded run (about 10 min)
  python benchmarks/search_measured.py --quick       # toy: dot only, 1 run, 2 seeds
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import time
from pathlib import Path

import numpy as np


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--tasks", nargs="*", default=["gemm", "dot", "axpy"])
  ap.add_argument("--methods", nargs="*", default=["glimpse", "random", "autotvm", "bo",
                                                   "transfer", "roofline", "simulator"])
  ap.add_argument("--table", help="the blueprint's table (default: closest shipped one)")
  ap.add_argument("--seeds", type=int, default=5)
  ap.add_argument("--budget", type=int, default=30)
  ap.add_argument("--runs", type=int, default=2, help="exhaustive measured runs per task")
  ap.add_argument("--cache", default="runs/search", help="enumerations, models, measurements")
  ap.add_argument("--steps", type=int, default=900, help="meta-training steps per model")
  ap.add_argument("--quick", action="store_true", help="toy run: dot, 1 run, 2 seeds")
  ap.add_argument("--json", metavar="FILE", help="also write the measured costs and trials")
  ap.add_argument("--ship", metavar="FILE",
                  help="also write each task's mean measured costs (the notebook's recorded "
                       "run: diffsim/data/shipped/search-measured-xeon6.json)")
  args = ap.parse_args()
  if args.quick:
    args.tasks, args.seeds, args.runs = ["dot"], 2, 1
  cache = Path(args.cache)
  os.environ.setdefault("DIFFSIM_SEARCH_CACHE", str(cache / "enum"))

  from diffsim.cli.common import enable_compile_cache

  enable_compile_cache()
  import jax
  from scipy.stats import kendalltau

  from diffsim.measure.config import MeasureConfig
  from diffsim.measure.cpu import cpu_identity, describe_cpu
  from diffsim.search.measured import MeasuredSpace, measure_space, table_for_cpu
  from diffsim.params.table import load_table
  from diffsim.search.blueprint import blueprint, supported_isas
  from diffsim.search.cpus import training_set
  from diffsim.search.evaluate import Costs, Objective, enumerate_costs
  from diffsim.search.glimpse import meta_train
  from diffsim.search.roofline import roofline
  from diffsim.search.space import get_task
  from diffsim.search.trials import run_method, run_trial

  ident = cpu_identity()
  table_name = args.table or table_for_cpu(ident)
  table = load_table(table_name)
  isas = supported_isas(table)
  bp = blueprint(table)
  t_start = time.time()
  print(f"# machine: {platform.node()} {os.cpu_count()} cores; CPU {describe_cpu(ident)}; "
        f"jax {jax.__version__}; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
  print(f"# blueprint table: {table_name}; ISAs measured: {', '.join(isas)}; budget "
        f"{args.budget}, seeds {args.seeds}; target: within 2% of the measured optimum\n")
  record, shipped = {}, {}
  summary = []
  for task_name in args.tasks:
    task = get_task(task_name)
    runs = []
    for r in range(args.runs):
      path = cache / "measured" / f"{task.name}-run{r}.json"
      runs.append(measure_space(task, isas=isas, path=path, config=MeasureConfig()))
    cost = np.mean([s.costs.cost for s in runs], 0)
    errors = tuple(next((s.costs.errors[i] for s in runs if s.costs.errors[i]), None)
                   for i in range(task.size))
    costs = Costs(cost, errors)
    valid = costs.valid
    sim = enumerate_costs(table, task)
    training = training_set(task)
    training_costs = training.costs
    models = meta_train(task, training, steps=args.steps, cache=cache / "models")
    roof = roofline(task, table)
    opt = int(np.nanargmin(cost))
    sim_opt = int(np.nanargmin(np.where(valid, sim.cost, np.nan)))
    sim_order = np.argsort(np.where(valid, sim.cost, np.inf), kind="stable")
    measured_order = np.argsort(np.where(valid, cost, np.inf), kind="stable")
    both = valid & np.isfinite(sim.cost)
    tau = kendalltau(sim.cost[both], cost[both]).statistic
    secs = sum(s.seconds for s in runs)
    print(f"## {task_name}: {int(valid.sum())} configurations measured, {args.runs} runs, "
          f"{secs:.0f} s of measuring")
    if args.runs > 1:
      a, b = runs[0].costs.cost[valid], runs[1].costs.cost[valid]
      d = np.abs(a - b) / np.minimum(a, b)
      o0, o1 = int(np.nanargmin(runs[0].costs.cost)), int(np.nanargmin(runs[1].costs.cost))
      gap = runs[0].costs.cost[o1] / runs[0].costs.cost[o0] - 1
      print(f"run-to-run difference: median {np.median(d):.2%}, 90th percentile "
            f"{np.percentile(d, 90):.2%}, largest {d.max():.1%}; the two runs' optima "
            + ("agree" if o0 == o1 else f"differ, by {gap:.2%} in the first run"))
    rejected = {}
    for e in errors:
      if e and e.startswith("measure rejected"):
        rejected[e.split(":")[1].strip()] = rejected.get(e.split(":")[1].strip(), 0) + 1
    if rejected:
      print(f"rejected by the harness: {rejected}")
    show = lambda i: ", ".join(f"{k}={v}" for k, v in task.as_dict(task.configs[i]).items())  # noqa: E731
    ops = lambda i: task.useful_ops(task.configs[i])  # noqa: E731
    print(f"measured optimum:  {show(opt)}: {cost[opt]:.4f} c/flop "
          f"({cost[opt] * ops(opt):.2f} cycles/iteration; simulated {sim.cost[opt] * ops(opt):.2f})")
    print(f"simulator optimum: {show(sim_opt)}: measured {cost[sim_opt]:.4f} c/flop "
          f"({cost[sim_opt] / cost[opt]:.3f}x the optimum, rank "
          f"{int(np.flatnonzero(measured_order == sim_opt)[0]) + 1} of {int(valid.sum())}; "
          f"{cost[sim_opt] * ops(sim_opt):.2f} cycles/iteration measured, "
          f"{sim.cost[sim_opt] * ops(sim_opt):.2f} simulated)")
    print(f"Kendall's tau, simulated vs measured costs: {tau:.3f}")
    d = task.configs.index(task.default)
    print(f"default: {show(d)}: {cost[d]:.4f} c/flop")
    print(f"{'method':<10} {'evals to 2% (hit)':>18} {'inval':>6} {'picked/opt':>10} "
          f"{'speedup over default':>21}")
    record[task_name] = {"cost": [None if not np.isfinite(c) else float(c) for c in cost],
                         "runs": [s.to_json(task) for s in runs], "trials": {}}
    short = tuple(None if e is None else e[:48] for e in errors)
    shipped[task_name] = MeasuredSpace(Costs(np.round(cost, 6), short), ident, isas,
                                       runs[0].date, secs).to_json(task)
    for m in args.methods:
      evals, hits, inval, picked = [], 0, [], []
      for seed in range(args.seeds):
        if m == "simulator":
          hit = np.flatnonzero(np.nan_to_num(cost[sim_order], nan=np.inf) <= cost[opt] * 1.02)
          reached = bool(len(hit)) and hit[0] < args.budget
          n = int(hit[0]) + 1 if reached else args.budget
          evals.append(n)
          hits += reached
          inval.append(int((~np.isfinite(cost[sim_order[:n]])).sum()))
          picked.append(np.nanmin(cost[sim_order[:args.budget]]))
          continue
        t = run_trial(m, task, costs, budget=args.budget, seed=seed, bp=bp, models=models,
                      training_costs=training_costs, roofline=roof)
        evals.append(t.evaluations)
        hits += t.reached
        inval.append(t.invalid)
        # What the method picks when it spends the whole budget (no early stop).
        obj = Objective(task, costs=costs)
        run_method(m, task, obj, args.budget, seed=seed, bp=bp, models=models,
                   training_costs=training_costs, roofline=roof)
        picked.append(np.nanmin([c for _, c in obj.history]))
        record[task_name]["trials"].setdefault(m, []).append(t.__dict__)
      summary.append((task_name, m, float(np.mean(evals))))
      print(f"{m:<10} {np.mean(evals):>11.1f} ({hits}/{args.seeds}) {np.mean(inval):>6.1f} "
            f"{np.mean(picked) / cost[opt]:>10.3f} {cost[d] / np.mean(picked):>20.2f}x",
            flush=True)
    print()
  print("## mean evaluations to within 2% of the measured optimum (lower is better)")
  for task_name in args.tasks:
    means = {m: v for t, m, v in summary if t == task_name}
    # The orders that read the blueprint's table (roofline, simulator) are reported
    # beside the baselines, as in search_eval.py.
    base = [m for m in means if m not in ("glimpse", "simulator", "roofline")]
    line = f"{task_name:<6} " + " ".join(f"{m} {v:.1f}" for m, v in means.items())
    if "glimpse" in means and base:
      best = min(base, key=lambda m: means[m])
      line += f"  | best baseline {best}: {means[best] / means['glimpse']:.2f}x glimpse's"
      for m in ("roofline", "simulator"):
        if m in means:
          line += f"; {m} {means[m] / means['glimpse']:.2f}x"
    print(line)
  print(f"# total {time.time() - t_start:.0f} s")
  if args.json:
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(record))
  if args.ship:
    Path(args.ship).write_text(json.dumps(shipped, separators=(",", ":")) + "\n")


if __name__ == "__main__":
  main()
