"""Lowering: a configuration of a task to AT&T assembly, and to the decoder's Block.

The kernels are what a BLIS-style library or an autotuner emits for the loop body:
- gemm: per k step, `mr` vectors of the packed A panel and `nr` broadcast values of
  the packed B panel feed `mr x nr` FMAs into register accumulators; `acc_sets > 1`
  alternates k steps between independent accumulator copies (shorter FMA chains).
- dot: `unroll` vector FMAs into `accumulators` independent accumulators.
- axpy: `unroll` vectors of y[i] += a * x[i] (load, FMA, store).
SSE has no FMA, so each FMA becomes `movaps` (a copy where the multiply would clobber
a live value), `mulps` and `addps`. Pointers are %rsi (A or x), %rdx (B or y), the trip
counter %rcx; the closing branch is left out, as BHive blocks do. All operands are
float32.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence

from diffsim.isa import decode_blocks, parse_asm
from diffsim.llvmtools import LlvmError, run_tool
from diffsim.search.space import ISAS, Config, Task


def _reg(isa: str, n: int) -> str:
  return {"sse": "%xmm", "avx2": "%ymm", "avx512": "%zmm"}[isa] + str(n)


def _mem(offset_floats: int, base: str) -> str:
  off = 4 * offset_floats
  return f"{off}({base})" if off else f"({base})"


def _load(isa: str, mem: str, dst: str) -> str:
  return f"movups {mem}, {dst}" if isa == "sse" else f"vmovups {mem}, {dst}"


def _store(isa: str, src: str, mem: str) -> str:
  return f"movups {src}, {mem}" if isa == "sse" else f"vmovups {src}, {mem}"


def _broadcast(isa: str, mem: str, dst: str) -> list[str]:
  if isa == "sse":  # SSE has no broadcast from memory: load a scalar, then splat it
    return [f"movss {mem}, {dst}", f"shufps $0, {dst}, {dst}"]
  return [f"vbroadcastss {mem}, {dst}"]


def _fma(isa: str, a: str, b: str, acc: str, tmp: str | None) -> list[str]:
  """acc += a * b; `a` may be a memory operand. SSE clobbers `tmp`."""
  if isa == "sse":
    return [f"movaps {b}, {tmp}", f"mulps {a}, {tmp}", f"addps {tmp}, {acc}"]
  return [f"vfmadd231ps {a}, {b}, {acc}"]


def _gemm(c: dict) -> list[str]:
  isa, mr, nr = c["isa"], c["mr"], c["nr"]
  lanes = ISAS[isa][1]
  acc = lambda s, i, j: _reg(isa, s * mr * nr + i * nr + j)  # noqa: E731
  nxt = mr * nr * c["acc_sets"]
  a_regs = [_reg(isa, nxt + i) for i in range(mr)] if c["form"] == "broadcast" else []
  nxt += len(a_regs)
  grouped = c["order"] == "grouped"
  b_regs = [_reg(isa, nxt + j) for j in range(nr if grouped else 1)]
  nxt += len(b_regs)
  tmp = _reg(isa, nxt) if isa == "sse" else None
  out: list[str] = []
  for k in range(c["k_unroll"]):
    s = k % c["acc_sets"]
    a_at = lambda i: _mem((k * mr + i) * lanes, "%rsi")  # noqa: E731
    b_at = lambda j: _mem(k * nr + j, "%rdx")  # noqa: E731
    a_src = a_regs if a_regs else [a_at(i) for i in range(mr)]
    out += [_load(isa, a_at(i), a_regs[i]) for i in range(len(a_regs))]
    if grouped:
      for j in range(nr):
        out += _broadcast(isa, b_at(j), b_regs[j])
      for j in range(nr):
        for i in range(mr):
          out += _fma(isa, a_src[i], b_regs[j], acc(s, i, j), tmp)
    else:
      for j in range(nr):
        out += _broadcast(isa, b_at(j), b_regs[0])
        for i in range(mr):
          out += _fma(isa, a_src[i], b_regs[0], acc(s, i, j), tmp)
  out += [f"addq ${4 * c['k_unroll'] * mr * lanes}, %rsi",
          f"addq ${4 * c['k_unroll'] * nr}, %rdx", "subq $1, %rcx"]
  return out


def _dot(c: dict) -> list[str]:
  isa, u, n_acc = c["isa"], c["unroll"], c["accumulators"]
  lanes = ISAS[isa][1]
  accs = [_reg(isa, i) for i in range(n_acc)]
  grouped = c["order"] == "grouped"
  slots = u if grouped else 1
  xs = [_reg(isa, n_acc + i) for i in range(slots)]
  ys = [_reg(isa, n_acc + slots + i) for i in range(slots)] if c["form"] == "load" else []
  loads, maths = [], []
  for v in range(u):
    x, x_at, y_at = xs[v % slots], _mem(v * lanes, "%rsi"), _mem(v * lanes, "%rdx")
    ld = [_load(isa, x_at, x)]
    if ys:
      ld.append(_load(isa, y_at, ys[v % slots]))
    y = ys[v % slots] if ys else y_at
    if isa == "sse":  # x is a scratch copy already: multiply in place, then accumulate
      math = [f"mulps {y}, {x}", f"addps {x}, {accs[v % n_acc]}"]
    else:
      math = [f"vfmadd231ps {y}, {x}, {accs[v % n_acc]}"]
    if grouped:
      loads += ld
      maths += math
    else:
      maths += ld + math
  step = 4 * u * lanes
  return loads + maths + [f"addq ${step}, %rsi", f"addq ${step}, %rdx", "subq $1, %rcx"]


def _axpy(c: dict) -> list[str]:
  isa, u = c["isa"], c["unroll"]
  lanes = ISAS[isa][1]
  a = _reg(isa, 0)  # the broadcast scalar, set before the loop
  grouped = c["order"] == "grouped"
  slots = u if grouped else 1
  ys = [_reg(isa, 1 + i) for i in range(slots)]
  xs = [_reg(isa, 1 + slots + i) for i in range(slots)] if c["form"] == "load" else []
  loads, maths, stores = [], [], []
  for v in range(u):
    y, x_at, y_at = ys[v % slots], _mem(v * lanes, "%rsi"), _mem(v * lanes, "%rdx")
    if isa == "sse":
      if xs:  # x loaded, scaled in place, y added from memory
        ld = [_load(isa, x_at, xs[v % slots])]
        math = [f"mulps {a}, {xs[v % slots]}", f"addps {y_at}, {xs[v % slots]}"]
        st = [_store(isa, xs[v % slots], y_at)]
      else:  # a copied, multiplied by x from memory, y added from memory
        ld = [f"movaps {a}, {y}"]
        math = [f"mulps {x_at}, {y}", f"addps {y_at}, {y}"]
        st = [_store(isa, y, y_at)]
    else:
      ld = [_load(isa, y_at, y)]
      if xs:
        ld.append(_load(isa, x_at, xs[v % slots]))
      math = [f"vfmadd231ps {xs[v % slots] if xs else x_at}, {a}, {y}"]
      st = [_store(isa, y, y_at)]
    if grouped:
      loads += ld
      maths += math
      stores += st
    else:
      maths += ld + math + st
  step = 4 * u * lanes
  return loads + maths + stores + [f"addq ${step}, %rsi", f"addq ${step}, %rdx",
                                   "subq $1, %rcx"]


_LOWER = {"gemm": _gemm, "dot": _dot, "axpy": _axpy}


def assembly(task: Task, config: Config) -> str:
  """The loop body of `config` as AT&T assembly, one instruction per line.

  Raises:
    ValueError: the configuration is invalid for every target (`Task.static_error`).
  """
  err = task.static_error(config)
  if err:
    raise ValueError(f"{task.name} {task.as_dict(config)}: {err}")
  return "\n".join(_LOWER[task.name](task.as_dict(config))) + "\n"


@functools.lru_cache(maxsize=None)
def lower(task: Task, config: Config):
  """The decoded Block of `config` (cached: the decoder runs llvm-mc once per config)."""
  return parse_asm(assembly(task, config))


_ENCODING = re.compile(r"encoding: \[([^\]]*)\]")


def lower_many(task: Task, configs: Sequence[Config]) -> list:
  """Blocks of many configurations, with one llvm-mc run and one batched decode.

  The same bytes and Blocks as `lower` (which assembles each text separately), but
  fast enough to lower a whole space: every instruction is assembled in one pass, the
  bytes are regrouped per configuration, and `decode_blocks` decodes them together.
  A configuration that fails gets its DecodeError in place of a Block.
  """
  texts = [assembly(task, c).splitlines() for c in configs]
  res = run_tool("llvm-mc", ["-triple=x86_64", "-show-encoding"],
                 "\n".join(line for t in texts for line in t) + "\n")
  if "error:" in res.stderr:
    raise LlvmError(f"llvm-mc rejected generated assembly: {res.stderr[:500]}")
  encodings = [bytes(int(x, 16) for x in m.group(1).split(","))
               for m in _ENCODING.finditer(res.stdout)]
  if len(encodings) != sum(len(t) for t in texts):
    raise RuntimeError("llvm-mc printed a different number of encodings than lines")
  hexes, at = [], 0
  for t in texts:
    hexes.append(b"".join(encodings[at:at + len(t)]).hex())
    at += len(t)
  return decode_blocks(hexes)


_INTRIN = {  # isa -> (vector type, load, broadcast from memory, fma(a, b, c), add, zero)
  "sse": ("__m128", "_mm_loadu_ps", "_mm_load1_ps", "_mm_add_ps(_mm_mul_ps({a}, {b}), {c})",
          "_mm_add_ps", "_mm_setzero_ps", "_mm_storeu_ps"),
  "avx2": ("__m256", "_mm256_loadu_ps", "_mm256_broadcast_ss", "_mm256_fmadd_ps({a}, {b}, {c})",
           "_mm256_add_ps", "_mm256_setzero_ps", "_mm256_storeu_ps"),
  "avx512": ("__m512", "_mm512_loadu_ps", "_mm512_set1_ps(*{p})", "_mm512_fmadd_ps({a}, {b}, {c})",
             "_mm512_add_ps", "_mm512_setzero_ps", "_mm512_storeu_ps"),
}
_CFLAGS = {"sse": "-msse2", "avx2": "-mavx2 -mfma", "avx512": "-mavx512f"}


def c_kernel(task: Task, config: Config, *, name: str | None = None) -> str:
  """The GEMM micro-kernel of `config` as a C function with intrinsics, to paste.

  `name(k, A, B, C, ldc)` adds the product of a packed A panel (k steps of mr x lanes
  floats, step after step) and a packed B panel (k steps of nr floats) into the
  column-major tile C[mr x lanes, nr] (leading dimension ldc); k must be a multiple of
  k_unroll. The register blocking, unroll and accumulator sets are the configuration's;
  the exact instruction order (`form`, `order`) is the compiler's, so the loop body
  `assembly` prints is the measured one.

  Raises:
    ValueError: not a gemm configuration, or one that cannot compile.
  """
  if task.name != "gemm":
    raise ValueError(f"C intrinsics are emitted for gemm only, not {task.name}")
  err = task.static_error(config)
  if err:
    raise ValueError(f"{task.name} {task.as_dict(config)}: {err}")
  c = task.as_dict(config)
  isa, mr, nr, ku, sets = c["isa"], c["mr"], c["nr"], c["k_unroll"], c["acc_sets"]
  lanes = ISAS[isa][1]
  vec, load, bcast, fma, add, zero, store = _INTRIN[isa]
  name = name or f"gemm_{isa}_{mr * lanes}x{nr}_k{ku}_s{sets}"
  acc = lambda s, i, j: f"c{s}_{i}_{j}"  # noqa: E731
  bc = (lambda p: bcast.format(p=p)) if "{p}" in bcast else (lambda p: f"{bcast}({p})")  # noqa: E731
  setting = ", ".join(f"{k}={v}" for k, v in c.items())
  out = [f"/* diffsim search gemm: {setting}.",
         f"   C[{mr * lanes} x {nr}] (column-major, leading dimension ldc) += A * B over k steps;",
         f"   A packed {mr * lanes} floats per step, B packed {nr} per step; k % {ku} == 0.",
         f"   Compile with {_CFLAGS[isa]} (or -march=native). */",
         "#include <immintrin.h>",
         f"static inline void {name}(long k, const float *restrict A, const float *restrict B,",
         f"{' ' * (len(name) + 19)}float *restrict C, long ldc) {{"]
  for s in range(sets):
    for i in range(mr):
      out.append(f"  {vec} " + ", ".join(f"{acc(s, i, j)} = {zero}()" for j in range(nr)) + ";")
  out.append(f"  for (long p = 0; p < k; p += {ku}) {{")
  for k in range(ku):
    s = k % sets
    out.append(f"    {{  /* k step {k}, accumulator set {s} */")
    out.append(f"      {vec} " + ", ".join(f"a{i} = {load}(A + {(k * mr + i) * lanes})"
                                          for i in range(mr)) + ";")
    for j in range(nr):
      out.append(f"      {vec} b{j} = {bc(f'B + {k * nr + j}')};")
      for i in range(mr):
        out.append(f"      {acc(s, i, j)} = {fma.format(a=f'a{i}', b=f'b{j}', c=acc(s, i, j))};")
    out.append("    }")
  out.append(f"    A += {ku * mr * lanes};")
  out.append(f"    B += {ku * nr};")
  out.append("  }")
  for i in range(mr):
    for j in range(nr):
      total = acc(0, i, j)
      for s in range(1, sets):
        total = f"{add}({total}, {acc(s, i, j)})"
      at = f"C + {i * lanes} + {j} * ldc"
      out.append(f"  {store}({at}, {add}({load}({at}), {total}));")
  out.append("}")
  return "\n".join(out) + "\n"
