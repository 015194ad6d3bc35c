"""`diffsim search TASK --target CPU_OR_PARAMS.json --budget N`: tune a kernel's knobs.

Searches the task's configurations with the simulator as the cost function and prints
the best configuration, its assembly and its cost. Glimpse (the default method) needs
its meta-trained models: they are loaded from `~/.cache/diffsim/search/models` (or
`$DIFFSIM_SEARCH_CACHE/models`), and trained there the first time, which enumerates
the task on every training CPU (minutes; `--train-samples` trades quality for time).
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

from diffsim.cli.common import (
  CliError,
  add_hosts,
  enable_compile_cache,
  load_table_arg,
  positive_int,
  say,
)


def add_subcommand(subparsers) -> None:
  from diffsim.search import ALL_METHODS
  from diffsim.search.space import TASKS

  p = subparsers.add_parser("search", help="tune a kernel's code-generation knobs for a CPU")
  p.add_argument("task", choices=sorted(TASKS), metavar="TASK",
                 help=f"the kernel: {', '.join(sorted(TASKS))}")
  p.add_argument("--target", required=True, metavar="CPU_OR_PARAMS.json",
                 help="a shipped table (haswell, skylake, znver3, zen5) or a JSON table file")
  p.add_argument("--budget", type=positive_int, default=30, metavar="N",
                 help="most configurations evaluated (default 30)")
  p.add_argument("--method", choices=ALL_METHODS, default="glimpse",
                 help="search method (default glimpse)")
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--train-samples", type=int, default=7, metavar="N",
                 help="sampled tables per llvm-mca base used to meta-train Glimpse when its "
                      "models are not cached yet (default 7)")
  p.add_argument("--syntax", choices=("att", "intel"), default="att",
                 help="syntax of the printed assembly (default att)")
  p.add_argument("--progress", action="store_true", default=None,
                 help="progress bar on stderr (default: when stderr is a terminal)")
  add_hosts(p)  # the enumerations that meta-train Glimpse are shared out
  p.set_defaults(func=cmd_search)


def _enumerations(task, samples: int, progress: bool):
  """Glimpse's training data: the task enumerated on every training table (shared out
  in a multi-process run)."""
  from diffsim.search.blueprint import blueprint
  from diffsim.search.cpus import training_groups
  from diffsim.search.evaluate import enumerate_costs_stack

  training = []
  for g in training_groups(samples):
    if progress:
      say(f"enumerating {task.name} on {g.names[0]} and {len(g.names) - 1} sampled tables")
    for t, c in zip(g.tables(), enumerate_costs_stack(g.base, g.stacked, task)):
      training.append((blueprint(t), c.cost))
  return training


def _glimpse_models(task, training, progress: bool):
  from diffsim.search.evaluate import cache_dir
  from diffsim.search.glimpse import meta_train

  return meta_train(task, training, steps=900, cache=cache_dir() / "models",
                    log=say if progress else None)


def _intel(text: str) -> str:
  """AT&T text in Intel syntax, via llvm-mc's printer."""
  import subprocess

  from diffsim.llvmtools import find_llvm_tool

  res = subprocess.run([find_llvm_tool("llvm-mc"), "-triple=x86_64", "-output-asm-variant=1"],
                       input=text, capture_output=True, text=True, check=False)
  lines = [ln.strip() for ln in res.stdout.splitlines()
           if ln.strip() and not ln.strip().startswith(".")]
  return "\n".join(lines) + "\n"


def cmd_search(args: argparse.Namespace) -> int:
  enable_compile_cache()
  from diffsim.search.evaluate import Objective
  from diffsim.search.space import get_task

  try:
    table = load_table_arg(args.target)
  except CliError as e:
    raise CliError(str(e).replace("--params", "--target")) from None
  task = get_task(args.task)
  objective = Objective(task, table=table)
  bar = None
  if args.progress:
    from tqdm.auto import tqdm

    bar = tqdm(total=args.budget, unit="eval", desc=f"search {task.name}", file=sys.stderr)

  def on_step(step, i, c, best):
    if bar is not None:
      bar.update(1)
      bar.set_postfix(best=f"{best:.4f} c/flop" if np.isfinite(best) else "none")

  from diffsim.sim import hosts

  # The enumerations are what is worth sharing out; a multi-process run's other processes
  # leave after them, and process 0 meta-trains and searches alone (`hosts.alone`).
  training = _enumerations(task, args.train_samples, bool(args.progress)) \
      if args.method == "glimpse" else None
  if not hosts.primary():
    return 0
  with hosts.alone():
    return _search(args, task, table, objective, training, on_step, bar)


def _search(args, task, table, objective, training, on_step, bar) -> int:
  from diffsim.search.baselines import METHODS
  from diffsim.search.blueprint import blueprint
  from diffsim.search.codegen import assembly
  from diffsim.search.glimpse import glimpse_search

  if args.method == "glimpse":
    models = _glimpse_models(task, training, bool(args.progress))
    glimpse_search(task, blueprint(table), objective, args.budget, models=models,
                   seed=args.seed, on_step=on_step)
  else:
    # The baselines evaluate through the objective; the bar follows its log.
    class Watched:
      def __init__(self, inner):
        self.inner = inner

      def __call__(self, ids):
        out = self.inner(ids)
        for i, c in zip(ids, out):
          on_step(0, i, c, min([x for _, x in self.inner.history if np.isfinite(x)],
                               default=np.inf))
        return out

      def __getattr__(self, name):
        return getattr(self.inner, name)

    METHODS[args.method](task, Watched(objective), args.budget, seed=args.seed)
  if bar is not None:
    bar.close()
  valid = [(c, i) for i, c in objective.history if np.isfinite(c)]
  say(f"{objective.evaluations} configurations evaluated, {objective.invalid} invalid")
  if not valid:
    print(f"no valid configuration found for {task.name} on {table.layout.cpu} in "
          f"{objective.evaluations} evaluations")
    first = next(iter(objective.errors.values()), None)
    if first:
      print(f"first failure: {first}")
    return 1
  cost, best = min(valid)
  config = task.configs[best]
  text = assembly(task, config)
  flops = task.useful_ops(config)
  print(f"task {task.name} on {table.layout.cpu}: best of {objective.evaluations} evaluations "
        f"({args.method})")
  print("config: " + ", ".join(f"{k}={v}" for k, v in task.as_dict(config).items()))
  print(f"cost: {cost:.4f} cycles per flop ({cost * flops:.2f} cycles per iteration, "
        f"{flops} flops, {1 / cost:.2f} flops per cycle)")
  print("assembly:")
  print(_intel(text) if args.syntax == "intel" else text, end="")
  return 0
