"""The model's maths: gradients against finite differences, and the uarch-vector fit."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
from jax.test_util import check_grads

from diffsim.isa import parse_asm
from diffsim.params.table import load_table
from diffsim.perfvec.reuse import Trained, fit_uarch
from diffsim.perfvec.features import encode_sequences, opcode_id
from diffsim.perfvec.model import ModelConfig, PerfVec, log_error, log_predict, predict
from diffsim.perfvec.uarch import (GLOBALS, MAX_RESOURCES, PER_OPCODE, RESOURCE_FEATURES,
                                   reference_costs, uarch_features)


def _model():
  cfg = ModelConfig(dim=16, layers=2, embed=8, train_tables=2, references=("haswell", "znver3"))
  blocks = [parse_asm("addq $1, %rax\nimulq %rax, %rbx"), parse_asm("movq (%rdi), %rdi")]
  seq = encode_sequences(blocks, 16)
  per, glob = uarch_features(load_table("haswell"))
  per, glob = per[None], glob[None]
  variables = PerfVec(cfg).init(jax.random.key(0), seq, per, glob)
  return cfg, seq, per, glob, variables


def test_gradients_match_finite_differences():
  cfg, seq, per, glob, variables = _model()
  y = jnp.array([[2.0, 3.0], [1.5, 4.0]])
  mask = jnp.array([[True, True], [True, False]])

  def loss(uarch_table, instr_kernel):
    v = jax.tree.map(lambda x: x, variables)
    v["params"]["uarch_table"] = uarch_table
    v["params"]["program"]["instruction"]["kernel"] = instr_kernel
    prog, _, tab = PerfVec(cfg).apply(v, seq, per, glob)
    return log_error(log_predict(prog, tab), y, mask)

  with jax.enable_x64():
    args = (jnp.asarray(variables["params"]["uarch_table"], jnp.float64),
            jnp.asarray(variables["params"]["program"]["instruction"]["kernel"], jnp.float64))
    check_grads(loss, args, order=1, modes=("rev",), eps=1e-4, atol=1e-3, rtol=1e-3)


def test_program_vector_is_the_sum_over_one_iteration():
  cfg, seq, per, glob, variables = _model()
  prog, instr = PerfVec(cfg).apply(variables, seq, method=lambda m, s: m.program(s))
  np.testing.assert_allclose(prog, instr.sum(1), rtol=1e-6)
  assert np.all(np.asarray(instr)[~np.asarray(seq.counted)] == 0)


def test_reference_costs_are_each_tables_numbers_for_the_opcode():
  costs = reference_costs(("haswell", "znver3"))
  F = len(PER_OPCODE)
  latency = lambda key, t: np.rint(np.expm1(costs[opcode_id(key), t * F]))  # noqa: E731
  # llvm-mca 14: 64-bit IMUL takes 3 cycles on both; DIV64r 98 on haswell, 17 on znver3.
  assert latency("IMUL64rr", 0) == latency("IMUL64rr", 1) == 3
  assert (latency("DIV64r", 0), latency("DIV64r", 1)) == (98, 17)
  assert np.all(costs[0] == 0)  # the unknown opcode knows nothing
  # The program encoder reads them: another reference table moves the program vector.
  cfg, seq, per, glob, variables = _model()
  other = ModelConfig(**{**cfg.__dict__, "references": ("znver3", "haswell")})
  a, b = (PerfVec(c).apply(variables, seq, method=PerfVec.embed) for c in (cfg, other))
  assert not np.allclose(a, b)


def test_fit_uarch_recovers_a_planted_vector():
  rng = np.random.default_rng(0)
  programs = rng.normal(size=(64, 16)).astype(np.float32)
  target = rng.normal(size=16).astype(np.float32)
  y = np.asarray(predict(programs, target[None]))[:, 0] * 100.0
  trained = Trained({}, ModelConfig(dim=16), [], {})
  start = np.zeros(16, np.float32) + 0.01
  u = fit_uarch(trained, programs, y, start, steps=800, lr=0.05, prior=0.0)
  before = np.mean(np.abs(trained.predict(programs, start) - y) / y)
  after = np.mean(np.abs(trained.predict(programs, u) - y) / y)
  assert after < 0.05 < before


def test_fit_uarch_chooses_its_pull_towards_the_start_by_cross_validation():
  """Many clean labels: the cross-validated pull is weak and the planted vector is found
  (held-out programs predicted well). A few labels of pure noise: it stays near the
  start, nearer than a weak pull leaves it."""
  rng = np.random.default_rng(1)
  dim = 16
  trained = Trained({}, ModelConfig(dim=dim), [], {})
  # Throughputs of real blocks' size: a constant feature sets the level (about 3 cycles
  # per iteration), the others move it.
  start = rng.normal(size=dim).astype(np.float32)
  target = start + rng.normal(size=dim).astype(np.float32)
  start[0] = target[0] = 3.0
  programs = (0.3 * rng.normal(size=(300, dim))).astype(np.float32)
  programs[:, 0] = 1.0
  y = trained.predict(programs, target)
  u = fit_uarch(trained, programs[:200], y[:200], start, steps=800, lr=0.05, prior="cv")
  assert np.mean(np.abs(trained.predict(programs[200:], u) - y[200:]) / y[200:]) < 0.05

  noise = np.exp(rng.normal(size=6)).astype(np.float32) * 100.0
  cv = fit_uarch(trained, programs[:6], noise, start, steps=800, lr=0.05, prior="cv")
  weak = fit_uarch(trained, programs[:6], noise, start, steps=800, lr=0.05, prior=1e-4)
  assert np.linalg.norm(cv - start) < 0.75 * np.linalg.norm(weak - start)


def test_keyed_sum_is_the_sum_of_projected_opcodes():
  cfg, seq, per, glob, variables = _model()
  enc = variables["params"]["uarch"]

  def dense(x, p):
    return x @ p["kernel"] + p["bias"].reshape((1,) * (x.ndim - 1) + (-1,))

  # The port structure: opcodes pooled into resources by their resource-cycle weights,
  # resources pooled back into opcodes.
  P, G, F = len(PER_OPCODE), len(GLOBALS), len(RESOURCE_FEATURES)
  incidence = per[..., P:]
  res = glob[..., G:].reshape(glob.shape[:-1] + (MAX_RESOURCES, F))
  valid = res[..., :1] > 0
  st = enc["structure"]
  into = jnp.einsum("uvr,vw->urw", incidence, st["key"]) / np.sqrt(cfg.vocab)
  hr = jnp.where(valid, jax.nn.gelu(dense(jnp.concatenate([into, res], -1), st["resource"])),
                 0.0)
  msg = dense(jnp.einsum("uvr,urw->uvw", incidence, hr), st["opcode"])
  pooled = hr.sum(1) / valid.sum(1)
  per_in = jnp.concatenate([per[..., :P], msg], -1)
  direct = jnp.einsum("uvd,vd->ud", dense(per_in, enc["per_opcode"]), enc["opcode"])
  h = jnp.concatenate([direct / np.sqrt(cfg.vocab), dense(glob[..., :G], enc["globals"]),
                       dense(pooled, enc["resources"])], -1)
  want = dense(jax.nn.gelu(dense(h, enc["hidden"])), enc["out"])
  got = PerfVec(cfg).apply(variables, per, glob, method=PerfVec.encode_uarch)
  np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)


def test_refit_encoder_fits_the_tables_with_the_programs_frozen():
  from diffsim.perfvec.data import Uarch, uarch_params
  from diffsim.perfvec.learn import Data, program_vectors, refit_encoder

  cfg, _, _, _, variables = _model()
  asm = ["addq $1, %rax", "imulq %rax, %rbx", "movq (%rdi), %rdi", "divq %rcx",
         "addq %rax, %rbx\naddq %rbx, %rcx", "vaddpd %ymm0, %ymm1, %ymm2"]
  blocks = [parse_asm(a) for a in asm]
  uarchs = [Uarch("haswell")] + [Uarch("haswell", i) for i in range(5)]
  per, glob = uarch_features(*uarch_params(uarchs))
  # Labels from the same model with another table encoder: reachable by the refit alone.
  teacher = PerfVec(cfg).init(jax.random.key(7), encode_sequences(blocks[:1], 16),
                              per[:1], glob[:1])["params"]["uarch"]
  taught = {**variables, "params": {**variables["params"], "uarch": teacher}}
  programs = program_vectors(variables, cfg, blocks)
  vectors = PerfVec(cfg).apply(taught, per, glob, method=PerfVec.encode_uarch)
  y = np.asarray(predict(programs, vectors)).T * 100.0
  # Encoder tables are labelled on some blocks only, and the refit takes two tables of a
  # role per step: both must still reach every table.
  sparse = y.copy()
  sparse[2:, 4:] = np.nan
  data = Data(blocks, np.zeros(len(blocks), np.int8), uarchs, ["train"] * 2 + ["encoder"] * 4,
              sparse, per, glob)

  def error(v):
    u = PerfVec(cfg).apply(v, per, glob, method=PerfVec.encode_uarch)
    return float(np.mean(np.abs(np.asarray(predict(programs, u)).T * 100.0 - y) / y))

  refit = refit_encoder(variables, cfg, data, 400, lr=3e-3, tables_per_step=2, progress=False,
                        log=lambda _: None)
  assert error(refit) < 0.2 * error(variables)
  same = jax.tree.map(np.array_equal, refit["params"]["program"], variables["params"]["program"])
  assert all(jax.tree.leaves(same))
