"""`diffsim search TASK --target CPU_OR_PARAMS.json --budget N`: tune a kernel's knobs.

Searches the task's configurations with the simulator as the cost function and prints
the best configuration, its assembly and its cost. With `--measure` it times each
candidate on this machine's CPU instead (`diffsim.search.measured`: the `diffsim
measure` harness, its canaries, passes and rejections), the table (`--target`, by
default the shipped one closest to this CPU) giving only the blueprint; it prints the
configuration's measured cycles, its speedup over the untuned default, its distance to
the best of an exhaustive measured run when one is cached (`--exhaustive` makes one),
and the command that reproduces it. `--emit c` prints a gemm configuration as a C
function with intrinsics. Glimpse (the default method) uses the meta-trained models the
package ships (`diffsim/search/pretrained`); `--train-samples N` meta-trains them anew
instead, on the training CPUs with N tables sampled around each base, enumerating the
task on every one of them (tens of minutes on 2 cores; cached in
`~/.cache/diffsim/search`, or `$DIFFSIM_SEARCH_CACHE`).
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

from diffsim.cli.common import CliError, add_hosts, enable_compile_cache, positive_int, say


def add_subcommand(subparsers) -> None:
  from diffsim.search import ALL_METHODS
  from diffsim.search.space import TASKS

  p = subparsers.add_parser("search", help="tune a kernel's code-generation knobs for a CPU")
  p.add_argument("task", choices=sorted(TASKS), metavar="TASK",
                 help=f"the kernel: {', '.join(sorted(TASKS))}")
  p.add_argument("--target", "--params", metavar="CPU_OR_PARAMS.json",
                 help="a shipped table (haswell, skylake, znver3, zen5, graniterapids...), one "
                      "changed in what binds (zen5/narrow, skylake/fp-half...: "
                      "diffsim.search.cpus.VARIANTS) or a JSON table file (`diffsim calibrate`'s "
                      "DIR/params.json, `diffsim fit`'s); needed unless --measure, which "
                      "defaults to the shipped table closest to this CPU")
  p.add_argument("--measure", action="store_true",
                 help="time each candidate on this CPU with the `diffsim measure` harness "
                      "instead of simulating it")
  p.add_argument("--exhaustive", action="store_true",
                 help="with --measure: also measure every valid configuration (cached per "
                      "CPU and task) and report the pick's distance to the best")
  p.add_argument("--emit", choices=("asm", "c"), default="asm",
                 help="print the loop body as assembly (default) or, for gemm, a C function "
                      "with intrinsics")
  p.add_argument("--budget", type=positive_int, default=30, metavar="N",
                 help="most configurations evaluated (default 30)")
  p.add_argument("--method", choices=ALL_METHODS, default="glimpse",
                 help="search method (default glimpse)")
  p.add_argument("--seed", type=int, default=0)
  p.add_argument("--train-samples", type=int, default=None, metavar="N",
                 help="meta-train Glimpse anew with N sampled tables per training base "
                      "instead of using the shipped models (which used 7)")
  p.add_argument("--syntax", choices=("att", "intel"), default="att",
                 help="syntax of the printed assembly (default att)")
  p.add_argument("--progress", action="store_true", default=None,
                 help="progress bar on stderr (default: when stderr is a terminal)")
  add_hosts(p)  # the enumerations that meta-train Glimpse are shared out
  p.set_defaults(func=cmd_search)


def _enumerations(task, samples: int | None, progress: bool):
  """Glimpse's shipped models when they serve; else its training set (`TrainingSet`:
  the task enumerated on every training table, shared out in a multi-process run)."""
  from diffsim.search.cpus import training_groups, training_set
  from diffsim.search.glimpse import load_models

  if samples is None:
    shipped = load_models(task)
    if shipped is not None:
      return shipped
    say(f"no shipped Glimpse models for this {task.name} space: meta-training anew")
    samples = 7
  return training_set(task, training_groups(samples), log=say if progress else None)


def _glimpse_models(task, training, progress: bool):
  from diffsim.search.evaluate import cache_dir
  from diffsim.search.glimpse import GlimpseModels, meta_train

  if isinstance(training, GlimpseModels):  # the shipped ones
    return training
  return meta_train(task, training, steps=900, cache=cache_dir() / "models",
                    log=say if progress else None)


def _intel(text: str) -> str:
  """AT&T text in Intel syntax, via llvm-mc's printer."""
  from diffsim.llvmtools import run_tool

  res = run_tool("llvm-mc", ["-triple=x86_64", "-output-asm-variant=1"], text)
  lines = [ln.strip() for ln in res.stdout.splitlines()
           if ln.strip() and not ln.strip().startswith(".")]
  return "\n".join(lines) + "\n"


def _objective(args: argparse.Namespace, task):
  """(table, objective, cpu description or None) for the simulated or measured search."""
  from diffsim.search.evaluate import Objective

  target, cpu = args.target, None
  if args.measure:
    from diffsim.measure.build import MeasureError, check_platform, runner_path
    from diffsim.measure.cpu import cpu_identity, describe_cpu
    from diffsim.search.measured import MeasuredObjective, table_for_cpu

    try:
      check_platform()
      runner_path()
    except MeasureError as e:
      raise CliError(f"--measure: {e}") from None
    ident = cpu_identity()
    cpu = describe_cpu(ident)
    if target is None:
      target = table_for_cpu(ident)
      say(f"blueprint and roofline from the shipped table {target}, the closest to {cpu}; "
          "`diffsim calibrate --out DIR` learns this CPU's own (30 minutes), then give "
          "--params DIR/params.json")
  elif target is None:
    raise CliError("--target is needed (a shipped table or a JSON file), unless --measure")
  elif args.exhaustive:
    raise CliError("--exhaustive goes with --measure")
  from diffsim.search.cpus import load_cpu

  try:
    table = load_cpu(target)
  except (OSError, ValueError, KeyError) as e:
    raise CliError(f"--target {target}: {e}") from None
  if args.measure:
    from diffsim.search.blueprint import supported_isas

    return table, MeasuredObjective(task, isas=supported_isas(table)), cpu
  return table, Objective(task, table=table), None


def _reproduce(args: argparse.Namespace, table) -> str:
  parts = ["diffsim search", args.task, "--target", args.target or table.layout.cpu]
  parts += ["--measure"] if args.measure else []
  parts += ["--budget", str(args.budget), "--method", args.method, "--seed", str(args.seed)]
  parts += ["--train-samples", str(args.train_samples)] if args.train_samples else []
  return " ".join(parts)


def cmd_search(args: argparse.Namespace) -> int:
  enable_compile_cache()
  from diffsim.search.space import get_task

  task = get_task(args.task)
  if args.emit == "c" and task.name != "gemm":
    raise CliError(f"--emit c: C intrinsics are emitted for gemm only, not {task.name}")
  table, objective, cpu = _objective(args, task)
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
    return _search(args, task, table, objective, cpu, training, on_step, bar)


def _search(args, task, table, objective, cpu, training, on_step, bar) -> int:
  from diffsim.search.baselines import METHODS
  from diffsim.search.blueprint import blueprint
  from diffsim.search.codegen import assembly, c_kernel
  from diffsim.search.glimpse import glimpse_search
  from diffsim.search.roofline import roofline

  if args.method == "glimpse":
    models = _glimpse_models(task, training, bool(args.progress))
    glimpse_search(task, blueprint(table), objective, args.budget, models=models,
                   seed=args.seed, on_step=on_step, roofline=roofline(task, table))
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
  if cpu:
    print(f"CPU: {cpu}")
  where = f"this CPU (blueprint {table.layout.cpu})" if cpu else table.layout.cpu
  print(f"task {task.name} on {where}: best of {objective.evaluations} evaluations "
        f"({args.method}{', measured' if cpu else ', simulated'})")
  print("config: " + ", ".join(f"{k}={v}" for k, v in task.as_dict(config).items()))
  what = "measured" if cpu else "cost"
  print(f"{what}: {cost:.4f} cycles per flop ({cost * flops:.2f} cycles per iteration, "
        f"{flops} flops, {1 / cost:.2f} flops per cycle)")
  if cpu:
    _measured_report(args, task, objective, best, cost)
  print(f"reproduce: {_reproduce(args, table)}")
  if args.emit == "c":
    print("C:")
    print(c_kernel(task, config), end="")
  else:
    print("assembly (loop body, without its closing branch):")
    print(_intel(text) if args.syntax == "intel" else text, end="")
  return 0


def _measured_report(args: argparse.Namespace, task, objective, best: int, cost: float) -> None:
  """The default's measured cost and the speedup; the distance to the exhaustive best."""
  from diffsim.search.measured import cached_space, measure_space

  d = task.configs.index(task.default)
  seen = dict(objective.history)
  default = seen[d] if d in seen else float(objective([d])[0])  # measured now if not yet
  if np.isfinite(default):
    print(f"default ({', '.join(f'{k}={v}' for k, v in task.as_dict(task.default).items())}): "
          f"{default:.4f} cycles per flop; the pick is {default / cost:.2f}x faster")
  space = (measure_space(task, isas=objective.isas) if args.exhaustive
           else cached_space(task))
  if space is None or tuple(space.isas) != tuple(objective.isas):
    say("no exhaustive measured run of this task on this CPU is cached: "
        "--exhaustive makes one (about a minute for gemm)")
    return
  opt = space.costs.optimum
  i = int(np.nanargmin(space.costs.cost))
  print(f"exhaustive measured run ({space.date}, {int(space.costs.valid.sum())} configurations): "
        f"best {opt:.4f} cycles per flop ("
        + ", ".join(f"{k}={v}" for k, v in task.as_dict(task.configs[i]).items())
        + f"); the pick measured {cost / opt - 1:+.1%} from it now, "
        f"{space.costs.cost[best] / opt - 1:+.1%} in that run")
