"""Evaluations to reach within 2% of the exhaustive optimum, per method.

For each held-out CPU (llvm-mca's skylake and the learned zen5 table, each as shipped
and changed in what binds: `diffsim.search.cpus.VARIANTS`; tables sampled around both)
and each task (gemm, dot, axpy), the true optimum is known by simulating
every configuration (`diffsim.search.evaluate.enumerate_costs_stack`, cached). Each
method then searches with the simulator's costs until it evaluates a configuration
within 2% of that optimum, or exhausts the budget (counted as the budget). Printed per
(CPU, task, method): mean evaluations over seeds, how many seeds reached the line, and
the invalid configurations evaluated on the way, and for the `transfer` baseline
(configurations in the order of their mean log cost over the training CPUs, each
relative to its optimum, blind to the target: `baselines.transfer_order`) the rank of the target's optimum in that order and how far its first pick is
from the optimum. The `roofline` control evaluates configurations in the order of their
roofline on the target (`diffsim.search.roofline`: the table's analytic reading, which
Glimpse's initial design and acquisition also use; `--no-roofline` meta-trains Glimpse
without it). It reads the target's table, so it is an ablation of Glimpse (its prior
alone, no search), reported beside the baselines rather than among them.
`--perfvec` appends the shipped PerfVec model's uarch vector of each table (its table
encoder, zero-shot) to every Blueprint. Then, per task, over all held-out CPUs and over
the "moved" ones (where transfer's first pick is not within 2%), the mean evaluations
and Glimpse's ratio to the best baseline, transfer included.

Glimpse's models are meta-trained on haswell, znver3, their variants and tables sampled
around them, and cached; so are the enumerations (`--cache`, default runs/search).
`--no-variants` runs the earlier setting (no variants in training or held out).

  python benchmarks/search_eval.py --seeds 3 --focus --heldout-samples 4 --ship
                                                   # the recorded run, and the shipped models
  python benchmarks/search_eval.py --quick         # toy: dot only, 2 CPUs, 2 seeds
"""

from __future__ import annotations

import argparse
import dataclasses
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
                                                   "transfer", "roofline"])
  ap.add_argument("--seeds", type=int, default=3)
  ap.add_argument("--budget", type=int, default=100)
  ap.add_argument("--heldout-samples", type=int, default=2,
                  help="sampled held-out tables per base (skylake, zen5) evaluated")
  ap.add_argument("--cache", default="runs/search", help="enumerations and models")
  ap.add_argument("--steps", type=int, default=900, help="meta-training steps per model")
  ap.add_argument("--quick", action="store_true", help="toy run: dot, 2 CPUs, 2 seeds")
  ap.add_argument("--json", metavar="FILE", help="also write every trial as JSON")
  ap.add_argument("--focus", action="store_true",
                  help="run the blind baselines (random, AutoTVM, BO) only on skylake, zen5 "
                       "and where transfer's first pick is more than 2%% off (the rest: "
                       "Glimpse and transfer only; 2 cores cannot afford more)")
  ap.add_argument("--no-roofline", action="store_true",
                  help="meta-train and run Glimpse without the roofline input")
  ap.add_argument("--perfvec", action="store_true",
                  help="append the PerfVec uarch vector to every Blueprint")
  ap.add_argument("--ship", action="store_true",
                  help="write each task's meta-trained models where the package ships them "
                       "(diffsim/search/pretrained), for `diffsim search`")
  ap.add_argument("--no-variants", action="store_true",
                  help="neither train nor test on the variants (the earlier setting)")
  args = ap.parse_args()
  if args.quick:
    args.tasks, args.seeds, args.heldout_samples, args.budget = ["dot"], 2, 0, 60
  cache = Path(args.cache)
  os.environ.setdefault("DIFFSIM_SEARCH_CACHE", str(cache / "enum"))

  from diffsim.cli.common import enable_compile_cache

  enable_compile_cache()
  import jax

  from diffsim.search.baselines import transfer_order
  from diffsim.search.blueprint import blueprint
  from diffsim.search.cpus import heldout_groups, training_groups, training_set
  from diffsim.search.evaluate import enumerate_costs_stack
  from diffsim.search.glimpse import PRETRAINED, meta_train, save_models
  from diffsim.search.roofline import roofline
  from diffsim.search.space import get_task
  from diffsim.search.trials import run_trial

  t_start = time.time()
  extra = _perfvec_vectors() if args.perfvec else (lambda g: [[]] * len(g.names))
  train = training_groups(variants=not args.no_variants)
  train_vectors = [extra(g) for g in train] if args.perfvec else None  # the same for every task
  held = heldout_groups(4, variants=not args.no_variants)
  held_names, held_tables, held_groups = [], [], []
  for g in held:
    sampled = "~" in g.names[0]
    keep = min(args.heldout_samples, len(g.names)) if sampled else len(g.names)
    if args.quick:
      keep = 0 if sampled else min(keep, 2)
    tables, vectors = g.tables(), extra(g)
    for i in range(keep):
      held_names.append(g.names[i])
      held_tables.append(tables[i])
      held_groups.append((g, i, vectors[i]))
  print(f"# machine: {platform.node()} {os.cpu_count()} cores; jax {jax.__version__} "
        f"{jax.devices()[0].device_kind}; {time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}")
  print(f"# training CPUs: {sum(len(g.names) for g in train)} "
        f"({', '.join(g.names[0] + f' +{len(g.names) - 1} variants and sampled' for g in train)})")
  print(f"# held-out CPUs: {', '.join(held_names)}")
  print(f"# budget {args.budget}, seeds {args.seeds}, target: within 2% of the optimum\n")
  results = []
  summary = {}
  for task_name in args.tasks:
    task = get_task(task_name)
    t0 = time.time()
    training = training_set(task, train, extra=train_vectors)
    if args.no_roofline:
      training = dataclasses.replace(training, rooflines=None)
    held_costs = {}
    for g in held:
      if any(gg is g for gg, *_ in held_groups):
        for i, c in enumerate(enumerate_costs_stack(g.base, g.stacked, task)):
          held_costs[(id(g), i)] = c
    t_enum = time.time() - t0
    t0 = time.time()
    models = meta_train(task, training, steps=args.steps, cache=cache / "models")
    if args.ship:
      if args.perfvec or args.no_variants:
        raise SystemExit("--ship: the shipped models use the default setting")
      print(f"# shipped {save_models(models, task, PRETRAINED / f'glimpse-{task_name}.msgpack')}")
    training_costs = training.costs
    t_meta = time.time() - t0
    print(f"## {task_name}: {task.size} configurations; enumeration {t_enum:.0f} s "
          f"(cached), meta-training {t_meta:.0f} s (cached when 0)")
    order = transfer_order(training_costs)
    print(f"{'cpu':<20} {'valid':>5} {'opt c/flop':>10} {'opt rank':>8} {'pick/opt':>8} "
          + " ".join(f"{m + ' evals (hit) inval':>26}" for m in args.methods))
    for name, table, (g, i, v) in zip(held_names, held_tables, held_groups):
      costs = held_costs[(id(g), i)]
      bp = np.concatenate([blueprint(table), v]).astype(np.float32)
      roof = roofline(task, table)
      rank = int(np.flatnonzero(order == int(np.nanargmin(costs.cost)))[0]) + 1
      pick = float(np.nan_to_num(costs.cost[order[0]], nan=np.inf) / costs.optimum)
      moved = pick > 1.02
      row = (f"{name:<20} {int(costs.valid.sum()):>5} {costs.optimum:>10.4f} {rank:>8} "
             f"{pick:>8.3f} ")
      for m in args.methods:
        if (args.focus and not moved and name not in ("skylake", "zen5")
            and m not in ("glimpse", "transfer", "roofline")):
          row += f"{'-':>14} {'':>5} {'':>7} "
          continue
        trials = [run_trial(m, task, costs, budget=args.budget, seed=s, bp=bp, models=models,
                            training_costs=training_costs, roofline=roof)
                  for s in range(args.seeds)]
        ev = float(np.mean([t.evaluations for t in trials]))
        hit = sum(t.reached for t in trials)
        inv = float(np.mean([t.invalid for t in trials]))
        summary.setdefault((task_name, m), []).append(ev)
        if moved:
          summary.setdefault((task_name, m, "moved"), []).append(ev)
        row += f"{ev:>14.1f} ({hit}/{args.seeds}) {inv:>7.1f} "
        results += [{"task": task_name, "cpu": name, "moved": moved, **t.__dict__}
                    for t in trials]
      print(row, flush=True)
    print()
  baselines = [m for m in args.methods if m not in ("glimpse", "roofline")]
  for subset, title in (((), "all held-out CPUs"),
                        (("moved",), "held-out CPUs where transfer's first pick is not within 2%")):
    print(f"## mean evaluations to within 2%, {title} (lower is better)")
    ratios = []
    for task_name in args.tasks:
      if (task_name, args.methods[0], *subset) not in summary:
        print(f"{task_name:<6} none")
        continue
      runs = summary[(task_name, args.methods[0], *subset)]
      means = {m: float(np.mean(summary[(task_name, m, *subset)])) for m in args.methods
               if len(summary.get((task_name, m, *subset), ())) == len(runs)}
      line = f"{task_name:<6} ({len(runs)} CPUs) " + " ".join(
          f"{m} {v:.1f}" for m, v in means.items())
      if "glimpse" in means and any(m in means for m in baselines):
        best = min((m for m in baselines if m in means), key=lambda m: means[m])
        ratio = means[best] / means["glimpse"]
        ratios.append(ratio)
        line += f"  | best baseline {best}: {ratio:.2f}x glimpse's evaluations"
        if "roofline" in means:
          line += f"; roofline alone {means['roofline'] / means['glimpse']:.2f}x"
      print(line)
    if ratios:
      print(f"geometric mean ratio (best baseline, transfer included / glimpse): "
            f"{float(np.exp(np.mean(np.log(ratios)))):.2f}x; goal 3x: "
            f"{'met' if min(ratios) >= 3 else 'not met on every task'}\n")
  print(f"# total {time.time() - t_start:.0f} s")
  if args.json:
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(results))


def _perfvec_vectors():
  """group -> [P, dim] the shipped PerfVec model's uarch vector of each of its tables,
  doubled: its entries then spread across CPUs about as the Blueprint's do."""
  from diffsim.perfvec.dse import Candidates, encode_tables
  from diffsim.perfvec.reuse import load

  trained = load()

  def vectors(g):
    return 2.0 * encode_tables(trained, Candidates(g.base, g.stacked, list(g.names)))
  return vectors


if __name__ == "__main__":
  main()
