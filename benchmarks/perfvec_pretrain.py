"""Trains the PerfVec model that ships in the package (diffsim/perfvec/pretrained/).

Blocks: a seeded draw from the BHive corpus (../shared/data/bhive), never one that the
measured datasets' split holds out (the validation and test parts of
`diffsim.data.split.split_ids` seed 0, and redis-server, `benchmarks/fit_zen5.py`'s
held-out application), so that Zen 5 and Xeon 6 evaluations never see a block that the
program encoder trained on.

Tables: four shipped tables (haswell, skylake, znver3 and the learned zen5), with tables
sampled around each; the other shipped tables (llvm-mca's broadwell, icelake-client,
znver1 and znver2, and the learned graniterapids) and a few sampled tables per base are
held out for the report. The sizes fit labels and training in about an hour of a shared
2-core VM.

Stages (each resumable; rerunning the command skips what is done):
  1. labels (simulator sweeps, cached chunk by chunk) and the joint training of the
     program encoder with a free vector per training table (epoch checkpoints);
  2. labels of the encoder's extra sampled tables and the table encoder's refit on the
     frozen program vectors;
  3. the held-out report, and the model written to --ship (default: the package).

  python benchmarks/perfvec_pretrain.py [--out runs/perfvec-pretrained] [--ship DIR]
      [--corpus 8000] [--blocks 1000] [--extra-blocks 2000] [--encoder-tables 32]
      [--from-model DIR]

`--from-model DIR` takes stage 1's result from a saved model (its program encoder and
training tables' vectors) and runs stages 2 and 3 only: a new table encoder for the same
program vectors, so that what adapting to a measured CPU uses stays as it was.
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import json
import re
import shutil
import sys
import time
from pathlib import Path

import numpy as np

from diffsim.cli import tune_xla
from diffsim.cli.common import enable_compile_cache
from diffsim.data import load_csv, shared_data_dir

TRAIN_BASES = ("haswell", "skylake", "znver3", "zen5")
HELDOUT_MODELS = ("broadwell", "icelake-client", "znver1", "znver2", "graniterapids")


def experiment(**kw):
  from diffsim.perfvec import Experiment

  return Experiment(**{**dict(
      train_bases=TRAIN_BASES, heldout_models=HELDOUT_MODELS, samples=6, heldout_samples=2,
      extra_blocks=2000, extra_tables=2, max_len=32, blocks=1000, heldout_app="",
      app_blocks=0, iterations=20, seed=0, dim=128, layers=2, epochs=20, batch_size=64,
      lr=3e-3, patience=8, encoder_steps=3000, encoder_tables=32, encoder_blocks=100), **kw})


def heldout_hexes() -> set[str]:
  """Blocks that the measured datasets' split keeps from training."""
  from diffsim.data.split import split_ids

  out: set[str] = set()
  for name in ("zen5-measured.csv", "graniterapids-measured.csv"):
    ds = load_csv(shared_data_dir() / "measured" / name)
    apps = np.asarray(ds.extra.get("source_app", [""] * len(ds)))
    part = split_ids(ds.hex, seed=0)
    out |= {h for h, p, a in zip(ds.hex, part, apps) if p != 0 or a == "redis-server"}
  return out


def corpus(limit: int, seed: int) -> list[str]:
  with open(shared_data_dir() / "bhive" / "blocks.csv") as f:
    rows = list(csv.DictReader(f))
  pick = np.random.default_rng(seed).permutation(len(rows))[:limit]
  return [rows[i]["hex"].lower() for i in pick]


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--out", default="runs/perfvec-pretrained")
  ap.add_argument("--corpus", type=int, default=8000, help="BHive rows drawn from (seeded)")
  ap.add_argument("--stage", type=int, default=3, help="stop after this stage (1-3)")
  ap.add_argument("--ship", default="", help="write the model here (default: the package)")
  ap.add_argument("--report-only", action="store_true",
                  help="only stage 3, on the model already written to --ship")
  ap.add_argument("--blocks", type=int, default=None,
                  help="BHive blocks split into train/validation/test (default 1,000)")
  ap.add_argument("--extra-blocks", type=int, default=None,
                  help="more training blocks, labelled on fewer tables (default 2,000)")
  ap.add_argument("--encoder-tables", type=int, default=None,
                  help="sampled tables per base for the table encoder's refit (default 32)")
  ap.add_argument("--from-model", metavar="DIR", default="",
                  help="stage 1's result from this saved model (e.g. the shipped one)")
  ap.add_argument("--epochs", type=int, default=0,
                  help="stop the joint training after this many epochs (0: the experiment's); "
                       "a rerun with fewer epochs than done finishes at once")
  args = ap.parse_args()
  tune_xla()
  enable_compile_cache()
  from diffsim.perfvec import build_data, train
  from diffsim.perfvec.learn import refit_encoder
  from diffsim.perfvec.reuse import PRETRAINED, read_variables, save, write_variables

  out = Path(args.out)
  out.mkdir(parents=True, exist_ok=True)
  hexes = corpus(args.corpus, 0)
  exclude = heldout_hexes()
  t0 = time.time()
  joint = out / "joint.npz"
  sizes = {k: v for k, v in (("blocks", args.blocks), ("extra_blocks", args.extra_blocks),
                             ("encoder_tables", args.encoder_tables)) if v is not None}
  if args.from_model and not joint.exists():
    shutil.copy(Path(args.from_model) / "model.npz", joint)
    joint_epochs = re.search(r"(\d+) epochs of joint training",
                             (Path(args.from_model) / "README.md").read_text())
    (out / "joint-epochs.txt").write_text(joint_epochs.group(1) if joint_epochs else "?")
  exp1 = experiment(**sizes)
  exp1 = dataclasses.replace(exp1, encoder_tables=0, encoder_steps=0)
  if args.epochs:
    exp1 = dataclasses.replace(exp1, epochs=args.epochs)
  if not joint.exists():
    # Training needs its own tables' labels alone; the held-out models' come in stage 2.
    data = build_data(hexes, None, exp1, out / "labels", exclude=exclude,
                      label_roles=("train", "heldout_sampled"), progress=False)
    print(f"stage 1 labels: {time.time() - t0:.0f} s", flush=True)
    variables, cfg = train(data, exp1, out, progress=False)
    write_variables(joint, variables, cfg)
    print(f"stage 1 done: {time.time() - t0:.0f} s", flush=True)
  if args.stage < 2:
    return
  exp = experiment(**sizes)
  ship = Path(args.ship) if args.ship else PRETRAINED
  if args.report_only:
    report(ship, out, hexes, exclude, exp, t0)
    return
  # The refit needs the training and encoder tables; the held-out models come in stage 3.
  data = build_data(hexes, None, exp, out / "labels", exclude=exclude,
                    label_roles=("train", "heldout_sampled", "encoder"), progress=False)
  print(f"stage 2 labels: {time.time() - t0:.0f} s", flush=True)
  variables, cfg = read_variables(joint)
  # The jointly trained model as a model of its own: what adapting to a measured CPU
  # uses (program encoder, training tables' vectors) is already final.
  save(out / "joint", variables, cfg, exp, data)
  # 64 tables a step: the port-structure encoder costs about 15x the summary-only one
  # per table.
  variables = refit_encoder(variables, cfg, data, exp.encoder_steps, seed=exp.seed,
                            tables_per_step=64, progress=False)
  save(ship, variables, cfg, exp, data)
  print(f"stage 2 done: {time.time() - t0:.0f} s", flush=True)
  if args.stage < 3:
    return
  report(ship, out, hexes, exclude, exp, t0)


def report(ship: Path, out: Path, hexes, exclude, exp, t0: float) -> None:
  """Stage 3: the held-out report (report.json, README.md) beside the shipped model."""
  from diffsim.perfvec import build_data, evaluate
  from diffsim.perfvec.reuse import load

  trained = load(ship)
  data = build_data(hexes, None, exp, out / "labels", exclude=exclude, progress=False)
  rows = evaluate(trained, data, (0, 256))
  doc = dict(rows=rows, command=" ".join(["python", *sys.argv]),
                blocks=dict(train=int((data.part == 0).sum()), val=int((data.part == 1).sum()),
                            test=int((data.part == 2).sum())),
                experiment=dataclasses.asdict(exp), seconds=time.time() - t0)
  (ship / "report.json").write_text(json.dumps(doc, indent=1, default=float))
  table = ["| against the simulator's labels | MAPE | Kendall tau | pairs |", "|---|---|---|---|"]
  table += [f"| {r['what']} | {100 * r['mape']:.2f}% | {r['kendall_tau']:.3f} | {r['n']:,} |"
            for r in rows]
  print("\n".join(table))
  sizes = {p.name: p.stat().st_size for p in ship.iterdir() if p.suffix in (".npz", ".json")}
  (ship / "README.md").write_text(README.format(
      bases=", ".join(exp.train_bases), heldout=", ".join(exp.heldout_models),
      samples=exp.samples, heldout_samples=exp.heldout_samples, blocks=exp.blocks,
      extra=exp.extra_blocks, extra_tables=exp.extra_tables, enc=exp.encoder_tables,
      enc_blocks=exp.encoder_blocks, dim=exp.dim, layers=exp.layers,
      epochs=len(json.loads((out / "history.json").read_text()))
      if (out / "history.json").exists() else (out / "joint-epochs.txt").read_text(),
      parts=doc["blocks"], table="\n".join(table),
      size=sum(sizes.values()) / 1e6, minutes=doc["seconds"] / 60, command=doc["command"]))


README = """# The pretrained PerfVec model

`diffsim.perfvec.load()` (and `diffsim perfvec embed|predict|adapt|dse` without `--model`)
read this model: `model.npz` (the variables and config), `model.json` (training uarchs,
experiment, probe blocks), `report.json` (the held-out report below). {size:.1f} MB.

Trained by `{command}` (resumable; {minutes:.0f} minutes for the last
stages on a 2-core Xeon 6 VM; see benchmarks/RESULTS.md, PerfVec).

- Tables: {bases} and {samples} tables sampled around each (seed 0) for training; {heldout_samples}
  more sampled tables per base and the shipped tables {heldout} held out entirely. The
  table encoder is refitted on {enc} more sampled tables per base, each labelled on
  {enc_blocks} training blocks.
- Blocks: {blocks} BHive blocks of at most 32 instructions split by hash (seed 0)
  {parts}, plus {extra} more training blocks labelled on {extra_tables} tables per base; never a
  block that the measured datasets' split holds out (validation, test, redis-server).
- Labels: the simulator's steady state, 100 x (cycles(40) - cycles(20)) / 20.
- Model: width {dim}, {layers} LSTM layers, {epochs} epochs of joint training; the table encoder reads
  the port structure (which opcodes share which resources).

{table}
"""


if __name__ == "__main__":
  main()
