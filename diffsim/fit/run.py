"""A whole fit as the `diffsim fit` command runs it: fit (and grow, and fit again),
export the table, plot the loss curves and report held-out accuracy beside llvm-mca."""

from __future__ import annotations

import dataclasses
import datetime
import json
from collections.abc import Callable, Sequence
from pathlib import Path

import numpy as np

from diffsim.fit import grow as growth
from diffsim.fit.learn import FitConfig, fit
from diffsim.params.export import to_json
from diffsim.params.table import Table, from_json, write_json
from diffsim.sim import hosts

Predictor = Callable[[Sequence], list]  # decoded blocks -> [(cycles or None, error)]


def plot_history(histories: dict[str, list[dict]], path: Path) -> None:
  """Training and validation MAPE per epoch, one colour per fit phase."""
  import matplotlib

  matplotlib.use("Agg")
  import matplotlib.pyplot as plt

  fig, ax = plt.subplots(figsize=(6, 4))
  offset = 0
  for k, (phase, hist) in enumerate(histories.items()):
    ep = [h["epoch"] + offset for h in hist]
    color = f"C{k}"
    ax.plot([e for e, h in zip(ep, hist) if h["train"] is not None],
            [h["train"] for h in hist if h["train"] is not None], "--", color=color,
            label=f"{phase}: train (soft)")
    ax.plot(ep, [h["val_soft"] for h in hist], ":", color=color, label=f"{phase}: val (soft)")
    ax.plot(ep, [h["val_hard"] for h in hist], "-o", ms=3, color=color,
            label=f"{phase}: val (rounded table)")
    offset = ep[-1]
  ax.set_xlabel("epoch")
  ax.set_ylabel("MAPE")
  ax.set_ylim(bottom=0)
  ax.grid(alpha=0.3)
  ax.legend(fontsize=7)
  fig.tight_layout()
  fig.savefig(path, dpi=120)
  plt.close(fig)


def held_out_report(dataset, predictors: dict[str, Predictor], decode,
                    subsets: dict[str, np.ndarray] | None = None) -> list[dict]:
  """Steady-state accuracy of each predictor on a labelled dataset.

  `subsets` ({name: [N] bool mask}) adds each predictor's metrics on those blocks to
  its row as `row["subsets"][name]`, from the same predictions (nothing runs twice).
  """
  from diffsim.data import metrics

  def scores(pred, y):
    s = metrics.summary(pred, y)
    return dict(mape=s["mape"], kendall_tau=s["kendall_tau"], within_5pct=s["within_5pct"],
                n=s["n"], n_failed=int(np.sum(~np.isfinite(pred))))

  blocks = decode(list(dataset.hex))
  rows = []
  for name, predict in predictors.items():
    preds = predict(blocks)
    pred = np.array([np.nan if v is None else v for v, _ in preds], np.float64)
    row = dict(name=name, **scores(pred, dataset.y))
    if subsets:
      row["subsets"] = {k: scores(pred[m], dataset.y[m]) for k, m in subsets.items()}
    rows.append(row)
  return rows


def format_report(rows: list[dict], title: str) -> str:
  lines = [title, f"  {'':34}{'MAPE':>8} {'Kendall tau':>12} {'within 5%':>10} {'n':>6}"]
  for r in rows:
    lines.append(f"  {r['name']:34}{100 * r['mape']:7.1f}% {r['kendall_tau']:12.3f} "
                 f"{100 * r['within_5pct']:9.1f}% {r['n']:6d}")
  return "\n".join(lines)


def fit_and_report(table: Table, train, val, test, out: Path, config: FitConfig, *,
                   init_name: str, name: str, grow: bool, predictors: dict[str, Predictor],
                   simulate: Callable[[Table], Predictor], decode, held_out: str,
                   progress: bool, log=print,
                   subsets: dict[str, np.ndarray] | None = None,
                   exact_rounds: int = 0, exact_cap: int = 48,
                   anchors=None, anchor_weight: float = 4.0) -> dict:
  """Fits, exports DIR/params.json, DIR/loss.png and DIR/report.json; returns the report.

  The gradient fit (`config.epochs` > 0, then growth with `grow`) comes first; then
  `exact_rounds` rounds of the exact per-opcode search (`diffsim.fit.recipe`) on the
  training blocks, each weighted by its measurement's confidence
  (`diffsim.data.weights`), with the single instructions of `anchors` (a labelled dataset) beside them, the best round
  by validation error kept.

  Args:
    predictors: llvm-mca (or other) predictors reported beside diffsim's.
    simulate: table -> predictor (steady state, exact hard simulator).
    decode: hexes -> decoded blocks.
    subsets: named masks over the held-out blocks, also scored (`held_out_report`).
  """
  out.mkdir(parents=True, exist_ok=True)
  histories: dict[str, list] = {}
  final_table, final_params, applied = table, table.params, {}
  if config.epochs:
    result = fit(table, train, val, out / "phase1", config, progress=progress, log=log)
    histories = {"fit": result.history}
    final_params = result.params
  if grow and config.epochs:
    histories = {"phase 1": result.history}
    plan = growth.suggest(table, result.params, table.params, result.counts)
    log(f"growth: {plan or 'no resource group asks for more units'}")
    if plan:
      grown, params, applied = growth.grow(table, result.params, table.params, plan)
      log(f"grew {applied}: {len(table.layout.units)} -> {len(grown.layout.units)} units")
      result = fit(dataclasses.replace(grown, params=params), train, val, out / "phase2",
                   config, progress=progress, log=log)
      histories["phase 2 (grown)"] = result.history
      final_table, final_params = grown, result.params
  exact_history = []
  if exact_rounds:
    from diffsim.data.weights import confidence_weights
    from diffsim.fit.learn import rounded
    from diffsim.fit.recipe import Rows, fit_measured

    start = dataclasses.replace(final_table, params=rounded(final_params))
    rows = Rows.of(decode(list(train.hex)), train.y, confidence_weights(train))
    val_rows = Rows.of(decode(list(val.hex)), val.y) if val is not None else None
    anchor_rows = (Rows.of(decode(list(anchors.hex)), anchors.y,
                        confidence_weights(anchors))
                   if anchors is not None else None)
    refined = fit_measured(start, rows, anchors=anchor_rows, anchor_weight=anchor_weight,
                           val=val_rows, rounds=exact_rounds, cap=exact_cap,
                           state_dir=out / "exact", log=log)
    final_table, final_params, exact_history = refined.table, refined.table.params, \
        refined.history
  n_train = len(train)
  doc = to_json(final_table, final_params, cpu=name,
                source=f"diffsim fit from {init_name} on {n_train} measured blocks"
                       f"{f', grown {applied}' if applied else ''}, "
                       f"{datetime.date.today().isoformat()}")
  primary = hosts.primary()  # process 0 writes a multi-process run's files
  if primary:
    write_json(doc, out / "params.json")
  if histories and primary:
    plot_history(histories, out / "loss.png")
  learned = from_json(doc)
  target = test if test is not None else val
  report = dict(init=init_name, name=name, train_blocks=n_train, grown=applied,
                held_out=held_out, history=histories, exact=exact_history)
  if target is not None and len(target):
    runs = dict(predictors)
    runs[f"diffsim {init_name} (initial table)"] = simulate(table)
    runs[f"diffsim {name} (learned, rounded)"] = simulate(learned)
    rows = held_out_report(target, runs, decode, subsets)
    report["held_out_results"] = rows
    print(format_report(rows, f"held-out blocks ({held_out}), steady state vs measured:"))
  if primary:
    (out / "report.json").write_text(json.dumps(report, indent=1, default=float))
  log(f"wrote {out / 'params.json'} (use: --params {out / 'params.json'}), "
      + (f"{out / 'loss.png'}, " if histories else "") + f"{out / 'report.json'}")
  return report
