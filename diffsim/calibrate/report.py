"""What a calibration reports: its time per stage, the probed structure, and accuracy on
the measured blocks it kept out of the fit, beside the tables a user could have used."""

from __future__ import annotations

import json
import time

import numpy as np


def held_out(c) -> list[dict]:
  """Each predictor's MAPE, Kendall tau and within-5% on the calibration's test part
  (`Calibration.rows`): the calibrated table, its start, the nearest shipped measured
  table, llvm-mca's closest model, and trees on opcode counts trained on the same
  training blocks."""
  from diffsim.calibrate.run import CLOSEST_MCA, NEAREST_SHIPPED, _predict
  from diffsim.data import metrics
  from diffsim.fit.trees import OpcodeTrees
  from diffsim.params.table import load_table

  train, _, test, _ = c.rows
  vendor = c.cpu.get("vendor")
  runs = {"calibrated (params.json)": lambda b: _predict(load_table(str(c.out / "params.json")), b),
          "start (base with the probed structure)":
              lambda b: _predict(load_table(str(c.out / "start.json")), b)}
  if vendor in NEAREST_SHIPPED:
    shipped = NEAREST_SHIPPED[vendor]
    runs[f"shipped {shipped}"] = lambda b: _predict(load_table(shipped), b)
  if vendor in CLOSEST_MCA:
    mcpu = CLOSEST_MCA[vendor]
    runs[f"llvm-mca -mcpu={mcpu}"] = lambda b: _mca(b, mcpu)

  def trees(b):
    return OpcodeTrees().fit(train.blocks, train.y).predict(b)

  runs["trees on opcode counts (same training blocks)"] = trees
  rows = []
  for name, predict in runs.items():
    t0 = time.time()
    pred = np.asarray(predict(test.blocks), np.float64)
    s = metrics.summary(pred, test.y)
    rows.append(dict(name=name, mape=s["mape"], kendall_tau=s["kendall_tau"],
                     within_5pct=s["within_5pct"], n=s["n"],
                     failed=int(np.sum(~np.isfinite(pred))), seconds=time.time() - t0))
    c.log(f"  {name}: MAPE {100 * s['mape']:.1f}%, tau {s['kendall_tau']:.3f} "
          f"({s['n']} blocks)")
  return rows


def _mca(blocks, mcpu: str) -> np.ndarray:
  """llvm-mca 14's steady-state cycles per 100 iterations (NaN where it has none)."""
  from diffsim.mca import per_100

  return np.array([np.nan if v is None else v for v, _ in
                   per_100([b.text for b in blocks], mcpu, throughput="steady")])


def write_report(c, rows: list[dict]) -> None:
  """`report.json` (everything) and `report.md` (what a person reads)."""
  from diffsim.calibrate import probes as probing
  from diffsim.calibrate.run import _cpu_label
  from diffsim.calibrate.stages import write_atomic

  stages = c.manifest.doc["stages"]
  structure = json.loads((c.out / "structure.json").read_text())
  base = json.loads((c.out / "base.json").read_text())
  doc = dict(cpu=c.cpu, cpu_label=_cpu_label(c.cpu), started=c.manifest.doc["started"],
             stages={k: v["seconds"] for k, v in stages.items()},
             structure=structure, base=base, held_out=rows,
             config=c.manifest.doc["config"])
  write_atomic(c.out / "report.json", json.dumps(doc, indent=1, default=float) + "\n")
  total = sum(v["seconds"] for v in stages.values())
  lines = [f"# diffsim calibrate: {_cpu_label(c.cpu)}", "",
           f"Table: `{c.out / 'params.json'}` (use `--params {c.out / 'params.json'}`).", "",
           "## Time per stage", "", "| stage | seconds | what |", "|---|---|---|"]
  lines += [f"| {k} | {v['seconds']:.0f} | {v.get('summary', '')} |" for k, v in stages.items()]
  lines += [f"| all so far | {total:.0f} | |", "", "## Probed structure", "",
            probing.probe_report([probing.Verdict(**v) for v in structure]), "",
            "## Base", "", f"Chosen: {base['chosen']}.", "",
            "| candidate | weighted MAPE | blocks | anchors |", "|---|---|---|---|"]
  lines += [f"| {k} | {100 * v['weighted_mape']:.1f}% | {100 * v['blocks_mape']:.1f}% | "
            f"{100 * v['anchors_mape']:.1f}% |" for k, v in base["candidates"].items()]
  n = rows[0]["n"] if rows else 0
  lines += ["", f"## Held out: the {n} measured blocks of the test part (never fitted)", "",
            "| predictor | MAPE | Kendall tau | within 5% |", "|---|---|---|---|"]
  lines += [f"| {r['name']} | {100 * r['mape']:.1f}% | {r['kendall_tau']:.3f} | "
            f"{100 * r['within_5pct']:.1f}% |" for r in rows]
  write_atomic(c.out / "report.md", "\n".join(lines) + "\n")
  c.log("\n".join(lines))
