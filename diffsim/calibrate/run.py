"""`calibrate`: a table for the CPU at hand, from probes, anchors and blocks measured on it.

The stages (`diffsim.calibrate.stages` lists the files each leaves):
1. structure probes (`probes`): micro-benchmarks whose throughputs decide the table's
   widths, unit counts and mechanisms;
2. anchors: every opcode key of the shipped corpus sample, alone and chained
   (`diffsim.fit.anchors`);
3. blocks: corpus-sample blocks, split by block hash into training, validation and
   test parts;
4. base: each candidate table with the probed structure applied, scored on the
   training rows; the best is the start;
5. fit: the exact search from it (`diffsim.fit.recipe.fit_measured`) in the time left;
6. report: the test part, the calibrated table beside its start, llvm-mca's closest
   model, the nearest shipped table and trees on opcode counts trained on the same
   blocks.
"""

from __future__ import annotations

import dataclasses
import functools
import json
import time
from pathlib import Path

import numpy as np

from diffsim.calibrate import probes as probing
from diffsim.calibrate.stages import (CalibrateConfig, CalibrateError, Manifest,
                                      candidate_bases, check_out_dir, measure_rows,
                                      read_rows, weights_of, write_atomic, write_rows)

# llvm-mca 14's closest model and the project's nearest measured table, by vendor.
CLOSEST_MCA = {"AuthenticAMD": "znver3", "GenuineIntel": "icelake-server"}
NEAREST_SHIPPED = {"AuthenticAMD": "zen5", "GenuineIntel": "graniterapids"}
BASE_SAMPLE = 800  # training blocks that score the candidate bases (with every anchor)


def _value(r: dict) -> float:
  v = r["cycles_per_100_iterations"]
  return np.nan if v is None else v


def _table_json(name: str) -> dict:
  from diffsim.params.table import TABLES_DIR

  path = Path(name) if name.endswith(".json") else TABLES_DIR / f"{name}.json"
  if not path.exists():
    raise CalibrateError(f"no table {name!r} (shipped tables: diffsim params --list)")
  return json.loads(path.read_text())


def _predict(table, blocks) -> np.ndarray:
  """The exact simulator's steady-state cycles per 100 iterations (NaN where it fails)."""
  from diffsim.sim import simulate_chunks

  if not blocks:
    return np.zeros(0)
  preds = simulate_chunks(table, [list(blocks)], iterations=100, throughput="steady",
                          total=len(blocks))
  return np.array([np.nan if p.cycles is None else p.cycles for p in preds])


def _weighted_error(pred, y, w) -> float:
  e = np.abs(pred - y) / y
  e = np.where(np.isfinite(e), e, 1.0)
  return float((e * w).sum() / w.sum())


class Calibration:
  """One calibration's state: its folder, manifest, budget and decoded rows."""

  def __init__(self, out: Path, config: CalibrateConfig, progress: bool, log):
    from diffsim.measure import MeasureConfig, cpu_identity
    from diffsim.measure.build import check_platform, runner_path

    check_platform()
    check_out_dir(out)
    runner_path()  # no C compiler: the message says which to install, before any work
    try:
      out.mkdir(parents=True, exist_ok=True)
    except OSError as e:
      raise CalibrateError(f"cannot create {out}: {e.strerror}") from None
    self.out, self.config, self.progress, self.log = out, config, progress, log
    self.cpu = cpu_identity()
    self.manifest = Manifest(out, self.cpu, config)
    self.manifest.save()
    spent = sum(s["seconds"] for s in self.manifest.doc["stages"].values())
    self.deadline = time.time() + 60 * config.minutes - spent
    self.measure_config = MeasureConfig.quick() if config.quick else MeasureConfig()

  def stage(self, name: str, run) -> dict:
    """Runs a stage unless the manifest says it ended; returns what it recorded."""
    if (done := self.manifest.done(name)) is not None:
      self.log(f"[{name}] done before ({done['seconds']:.0f} s): kept")
      return done
    self.log(f"[{name}] ...")
    t0 = time.time()
    facts = run() or {}
    seconds = time.time() - t0
    self.manifest.finish(name, seconds, **facts)
    self.log(f"[{name}] {seconds:.0f} s" + (f": {facts['summary']}" if "summary" in facts
                                            else ""))
    return self.manifest.done(name)

  # ---- measuring stages ---------------------------------------------------------------

  def probes(self) -> dict:
    ps = probing.probes()
    rows = measure_rows(self.out, "probe", [p.name for p in ps], probing.probe_hexes(ps),
                        self.measure_config, self.progress)
    measured = {r["name"]: _value(r) / 100 for r in rows if np.isfinite(_value(r))}
    vs = probing.verdicts(measured)
    write_atomic(self.out / "structure.json",
                 json.dumps([dataclasses.asdict(v) for v in vs], indent=1, default=float))
    self.log(probing.probe_report(vs))
    return dict(probes=len(ps), measured=len(measured), verdicts=len(vs),
                summary=f"{len(vs)} verdicts from {len(measured)} of {len(ps)} probes")

  def corpus(self) -> list:
    """The shipped corpus sample, in a seeded order (so `blocks=N` takes a prefix)."""
    from diffsim.data import load_csv, shipped

    ds = load_csv(shipped("corpus-sample.csv"))
    order = np.random.default_rng(self.config.seed).permutation(len(ds))
    return [ds.hex[i] for i in order]

  def anchors(self) -> dict:
    from diffsim.fit.anchors import chains, pick
    from diffsim.isa import decode_blocks

    blocks = [b for b in decode_blocks(self.corpus()) if not isinstance(b, Exception)]
    rows = pick(blocks, self.config.forms, self.config.per_key)
    rows += chains(rows)
    measured = measure_rows(self.out, "anchor", [f"{k} {t}" for k, _, t in rows],
                            [h for _, h, _ in rows], self.measure_config, self.progress)
    ok = sum(np.isfinite(_value(r)) for r in measured)
    return dict(anchors=len(rows), measured=int(ok),
                summary=f"{ok} of {len(rows)} instructions of "
                        f"{len({k for k, _, _ in rows})} opcode keys measured")

  def blocks(self) -> dict:
    hexes = self.corpus()[:self.config.blocks]
    measured = measure_rows(self.out, "block", [""] * len(hexes), hexes,
                            self.measure_config, self.progress)
    ok = sum(np.isfinite(_value(r)) for r in measured)
    return dict(blocks=len(hexes), measured=int(ok),
                summary=f"{ok} of {len(hexes)} corpus-sample blocks measured")

  def merge(self) -> None:
    """`measured.csv`: every row the calibration measured, with its kind."""
    rows = []
    for kind in ("probe", "anchor", "block"):
      path = self.out / f"{kind}s.csv"
      if path.exists():
        rows += read_rows(path)
    write_rows(self.out / "measured.csv", rows)

  # ---- fitting stages -----------------------------------------------------------------

  @functools.cached_property
  def rows(self):
    """(train, val, test, anchors) as `Rows`, weighted by their measurements."""
    from diffsim.data.split import split_ids
    from diffsim.fit.recipe import Rows
    from diffsim.isa import decode_blocks

    blocks = read_rows(self.out / "blocks.csv")
    anchors = read_rows(self.out / "anchors.csv")
    decoded = decode_blocks([r["hex"] for r in blocks + anchors])
    y = np.array([_value(r) for r in blocks + anchors])
    w = weights_of(blocks + anchors)
    nb = len(blocks)
    part = split_ids([r["hex"] for r in blocks], seed=self.config.seed)
    take = lambda ids: Rows.of([decoded[i] for i in ids], y[ids], w[ids])  # noqa: E731
    train = take(np.flatnonzero(part == 0))
    val = take(np.flatnonzero(part == 1))
    # The test part keeps every measured block, trusted or not: it is what a user sees.
    test = Rows.of([decoded[i] for i in np.flatnonzero(part == 2)],
                   y[np.flatnonzero(part == 2)])
    anchor_rows = take(np.arange(nb, len(decoded)))
    return train, val, test, anchor_rows

  def start_table(self, name: str) -> tuple[dict, list[str]]:
    vs = [probing.Verdict(**v) for v in json.loads((self.out / "structure.json").read_text())]
    doc, changes = probing.apply(_table_json(name), vs)
    doc["cpu"] = f"calibrate start ({name} with the probed structure)"
    return doc, changes

  def base(self) -> dict:
    from diffsim.params.table import from_json

    train, _, _, anchors = self.rows
    rng = np.random.default_rng(self.config.seed)
    ids = np.sort(rng.choice(len(train), min(BASE_SAMPLE, len(train)), replace=False))
    blocks = [train.blocks[i] for i in ids] + anchors.blocks
    y = np.concatenate([train.y[ids], anchors.y])
    w = np.concatenate([train.weights[ids], anchors.weights * self.config.anchor_weight])
    scores, docs = {}, {}
    for name in self.config.bases or candidate_bases(self.cpu):
      doc, changes = docs[name] = self.start_table(name)
      t0 = time.time()
      pred = _predict(from_json(doc), blocks)
      scores[name] = dict(weighted_mape=_weighted_error(pred, y, w),
                          blocks_mape=_weighted_error(pred[:len(ids)], y[:len(ids)],
                                                      np.ones(len(ids))),
                          anchors_mape=_weighted_error(pred[len(ids):], y[len(ids):],
                                                       np.ones(len(anchors))),
                          changes=changes, seconds=time.time() - t0)
      self.log(f"  base {name}: weighted MAPE {100 * scores[name]['weighted_mape']:.1f}% "
               f"(blocks {100 * scores[name]['blocks_mape']:.1f}%, anchors "
               f"{100 * scores[name]['anchors_mape']:.1f}%)")
    best = min(scores, key=lambda k: scores[k]["weighted_mape"])
    write_atomic(self.out / "start.json", json.dumps(docs[best][0]) + "\n")
    write_atomic(self.out / "base.json", json.dumps(dict(chosen=best, candidates=scores),
                                                    indent=1, default=float))
    return dict(chosen=best, summary=f"{best} with the probed structure "
                f"(weighted MAPE {100 * scores[best]['weighted_mape']:.1f}%)")

  def fit(self) -> dict:
    from diffsim.fit.recipe import fit_measured
    from diffsim.params.export import to_json
    from diffsim.params.table import from_json, write_json

    train, val, _, anchors = self.rows
    start = from_json(json.loads((self.out / "start.json").read_text()))
    deadline = self.deadline - 60 * self.config.report_minutes
    refined = fit_measured(start, train, anchors=anchors,
                           anchor_weight=self.config.anchor_weight, val=val,
                           rounds=self.config.rounds, cap=self.config.cap,
                           state_dir=self.out / "exact", deadline=deadline, log=self.log)
    base = self.manifest.done("base")["chosen"]
    doc = to_json(refined.table, cpu=_cpu_label(self.cpu),
                  source=f"diffsim calibrate on {_cpu_label(self.cpu)}: {base} with the "
                         f"probed structure, exact search on {len(train)} measured blocks "
                         f"and {len(anchors)} anchors, "
                         f"{time.strftime('%Y-%m-%d', time.gmtime())}")
    write_json(doc, self.out / "params.json")
    rounds = len({h["round"] for h in refined.history})
    return dict(val_mape=refined.val_mape, steps=len(refined.history), rounds=rounds,
                summary=f"validation MAPE {100 * (refined.val_mape or float('nan')):.2f}% "
                        f"after {len(refined.history)} move kinds")

  def report(self) -> dict:
    from diffsim.calibrate.report import held_out, write_report

    rows = held_out(self)
    write_report(self, rows)
    return dict(summary="wrote report.md and report.json")


def _cpu_label(cpu: dict) -> str:
  return (f"{cpu.get('model_name') or cpu.get('vendor')} (family {cpu.get('family')} "
          f"model {cpu.get('model')} stepping {cpu.get('stepping')})")


STAGES = ("probes", "anchors", "blocks", "base", "fit", "report")


def calibrate(out: str | Path, config: CalibrateConfig = CalibrateConfig(), *,
              until: str = "report", progress: bool = False, log=print) -> dict:
  """Calibrates a table for this machine's CPU into `out` (resumable).

  Args:
    out: the calibration's folder (new, empty, or an earlier calibration's).
    config: what to measure and the time budget.
    until: the last stage to run (`STAGES`); a later call goes on from there.

  Returns:
    The manifest (`DIR/calibrate.json`: the CPU, the settings, each stage's record),
    with the report (`DIR/report.json`) under "report" once that stage has run.

  Raises:
    CalibrateError, MeasureError: with a message a person can act on.
  """
  if until not in STAGES:
    raise CalibrateError(f"until={until!r}: one of {', '.join(STAGES)}")
  c = Calibration(Path(out), config, progress, log)
  for name in STAGES[:STAGES.index(until) + 1]:
    c.stage(name, getattr(c, name))
    if name == "blocks":
      c.merge()
  doc = dict(c.manifest.doc)
  if (c.out / "report.json").exists() and "report" in doc["stages"]:
    doc["report"] = json.loads((c.out / "report.json").read_text())
  return doc
