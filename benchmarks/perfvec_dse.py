"""Design-space exploration with the pretrained PerfVec against the simulator: speed per
(block, table) pair and agreement on the ranking of candidate tables.

M candidate tables sampled around a base (seed 1; the model trained on seed 0's), N BHive
blocks the model never trained on. PerfVec embeds the blocks once, encodes each table
once, then predicts every pair with one [N, d] x [d, M] product. The simulator's side is
`simulate_sweep` (steady state, as the labels: 20 and 40 iterations), timed on a
subsample of pairs and extrapolated to N x M. Agreement: the simulator's mean cycles of
each of `--check-tables` candidates over `--check-blocks` of the blocks, against
PerfVec's on the same blocks: Kendall's tau of the means, and how many of the
simulator's 10 best are among PerfVec's 10 best.

  python benchmarks/perfvec_dse.py [--tables 1000] [--blocks 10000] [--base zen5]
"""

from __future__ import annotations

import argparse
import csv
import json
import time
from pathlib import Path

import jax
import numpy as np

from diffsim.cli import tune_xla
from diffsim.cli.common import enable_compile_cache
from diffsim.data import metrics, shared_data_dir


def main() -> None:
  ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
  ap.add_argument("--tables", type=int, default=1000)
  ap.add_argument("--blocks", type=int, default=10000)
  ap.add_argument("--base", default="zen5")
  ap.add_argument("--seed", type=int, default=1)
  ap.add_argument("--time-tables", type=int, default=16, help="simulator timing subsample")
  ap.add_argument("--time-blocks", type=int, default=256)
  ap.add_argument("--check-tables", type=int, default=100, help="agreement subsample")
  ap.add_argument("--check-blocks", type=int, default=100)
  ap.add_argument("--out", default="runs/perfvec-dse")
  ap.add_argument("--labels-only", action="store_true",
                  help="only label the agreement subsample (cached; no model needed)")
  args = ap.parse_args()
  tune_xla()
  enable_compile_cache()
  from diffsim.isa import decode_blocks
  from diffsim.params.table import load_table
  from diffsim.perfvec import load
  from diffsim.perfvec.data import Uarch, runnable, sweep_labels
  from diffsim.perfvec.dse import candidates, encode_tables, predict_pairs, rank_tables
  from diffsim.sim.api import encode, simulate_sweep

  out = Path(args.out)
  out.mkdir(parents=True, exist_ok=True)
  import sys

  sys.path.insert(0, str(Path(__file__).parent))
  from perfvec_pretrain import corpus

  seen = set(corpus(8000, 0))  # the rows the pretrained model drew its blocks from
  with open(shared_data_dir() / "bhive" / "blocks.csv") as f:
    rows = list(csv.DictReader(f))
  pick = np.random.default_rng(args.seed).permutation(len(rows))[:int(args.blocks * 1.3)]
  hexes = [rows[i]["hex"].lower() for i in pick]
  t = time.time()
  decoded = decode_blocks(hexes)
  base = load_table(args.base)
  ok = runnable(decoded, [base], 32)
  blocks = [b for b, o in zip(decoded, ok) if o and b.hex not in seen][:args.blocks]
  print(f"{len(blocks)} BHive blocks (<= 32 instructions, runnable on {args.base}; seed "
        f"{args.seed}), decoded in {time.time() - t:.0f} s")
  N, M = len(blocks), args.tables
  ct = np.random.default_rng(args.seed + 1).permutation(M)[:args.check_tables]
  cb = np.arange(min(args.check_blocks, N))

  def check_labels():
    return sweep_labels([blocks[i] for i in cb],
                        [Uarch(args.base, int(i), args.seed) for i in ct], out / "labels",
                        chunk=8, progress=False)

  if args.labels_only:
    check_labels()
    return
  trained = load()

  # PerfVec: embed once, encode once, one product.
  trained.embed(blocks[:64])  # compile the buckets' programs outside the timing
  t = time.time()
  programs = trained.embed(blocks)
  t_embed = time.time() - t
  cands = candidates(args.base, M, seed=args.seed)
  encode_tables(trained, cands)  # compile
  t = time.time()
  uarchs = encode_tables(trained, cands)
  t_encode = time.time() - t
  rank_tables(programs, uarchs)  # compile the product
  best = np.inf
  for _ in range(3):
    t = time.time()
    order, score = rank_tables(programs, uarchs)
    best = min(best, time.time() - t)
  t_rank = best

  # The simulator on a subsample of the same pairs, timed after compiling.
  tb = blocks[:args.time_blocks]
  sub = jax.tree.map(lambda x: np.asarray(x)[:args.time_tables], cands.params)
  by_len: dict[int, list] = {}
  from diffsim.isa.encode import BUCKETS

  for b in tb:
    by_len.setdefault(next(L for L in BUCKETS if len(b.instrs) <= L), []).append(b)
  batches = [encode(base, bs, length=L) for L, bs in by_len.items()]

  def sweep():
    for batch in batches:
      for its in (20, 40):
        simulate_sweep(base, batch, params=sub, iterations=its, throw=False)

  sweep()
  t = time.time()
  sweep()
  t_sim = time.time() - t
  sim_pairs = args.time_tables * len(tb)
  sim_per_pair = t_sim / sim_pairs
  pv_per_pair = t_rank / (N * M)
  pv_all_per_pair = (t_embed + t_encode + t_rank) / (N * M)

  # Agreement on a subsample of tables x blocks, labelled by the simulator (cached).
  t = time.time()
  y = check_labels()
  t_check = time.time() - t
  sim_mean = np.nanmean(y, 1)
  pv_same = predict_pairs(programs[cb], uarchs[ct]).mean(0)
  pv_all = score[ct]
  top = lambda s: set(np.argsort(s)[:10].tolist())  # noqa: E731
  agree = dict(tau_same_blocks=metrics.kendall_tau(pv_same, sim_mean),
               tau_all_blocks=metrics.kendall_tau(pv_all, sim_mean),
               top10_same=len(top(pv_same) & top(sim_mean)),
               top10_all=len(top(pv_all) & top(sim_mean)),
               mape_pairs=metrics.mape(predict_pairs(programs[cb], uarchs[ct]).T.ravel(),
                                       y.ravel()),
               mape_means=metrics.mape(pv_same, sim_mean))
  print(f"\nDSE: {M:,} tables sampled around {args.base} x {N:,} blocks "
        f"({jax.devices()[0].device_kind}, jax {jax.__version__})")
  print("| step | time | per (block, table) pair |\n|---|---|---|")
  print(f"| PerfVec: embed {N:,} blocks (once) | {t_embed:.1f} s | - |")
  print(f"| PerfVec: encode {M:,} tables (once) | {t_encode:.2f} s | - |")
  print(f"| PerfVec: product and means, {N * M:,} pairs | {t_rank:.3f} s | "
        f"{1e9 * pv_per_pair:.2f} ns |")
  print(f"| PerfVec: all of it | {t_embed + t_encode + t_rank:.1f} s | "
        f"{1e9 * pv_all_per_pair:.1f} ns |")
  print(f"| simulate_sweep, steady (20 + 40 its), timed on {sim_pairs:,} pairs | "
        f"{N * M * sim_per_pair / 3600:.1f} h extrapolated | {1e6 * sim_per_pair:.0f} us |")
  print(f"\nspeed ratio per pair once the blocks are embedded: "
        f"{sim_per_pair / ((t_encode + t_rank) / (N * M)):,.0f}x (tables encoded included), "
        f"{sim_per_pair / pv_per_pair:,.0f}x (the product alone); embedding included: "
        f"{sim_per_pair / pv_all_per_pair:,.0f}x")
  print(f"\nagreement with the simulator on {len(ct)} of the tables x {len(cb)} blocks "
        f"({len(ct) * len(cb):,} pairs simulated in {t_check:.0f} s):")
  print(f"Kendall tau of the tables' mean cycles: {agree['tau_same_blocks']:.3f} (PerfVec on "
        f"the same blocks), {agree['tau_all_blocks']:.3f} (PerfVec on all {N:,}); top-10 "
        f"overlap {agree['top10_same']}/10 ({agree['top10_all']}/10); MAPE per pair "
        f"{100 * agree['mape_pairs']:.1f}%, of the means {100 * agree['mape_means']:.1f}%")
  (out / "report.json").write_text(json.dumps(dict(
      N=N, M=M, embed_s=t_embed, encode_s=t_encode, rank_s=t_rank, sim_s=t_sim,
      sim_pairs=sim_pairs, **agree), indent=1, default=float))


if __name__ == "__main__":
  main()
