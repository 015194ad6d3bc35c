"""The two predictors, llvm-mca and the simulator, with one result shape per block
((cycles per 100 iterations | None, error)), and the background decoding that feeds
the simulator."""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator, Sequence

from diffsim.cli.common import CliError, decode_hexes, enable_compile_cache, hex_field, need_llvm


def mca_predict(blocks: Sequence, mcpu: str, iterations: int, throughput: str,
                progress: bool) -> list[tuple[float | None, str | None]]:
  """llvm-mca 14's prediction for each decoded block (errors passed through)."""
  from diffsim.mca import McaError, per_100

  need_llvm("llvm-mca")
  out: list[tuple[float | None, str | None]] = [
    (None, f"decode: {b}") if isinstance(b, Exception) else (None, None) for b in blocks]
  good = [i for i, b in enumerate(blocks) if not isinstance(b, Exception)]
  try:
    results = per_100([blocks[i].text for i in good], mcpu, iterations=iterations,
                      throughput=throughput, progress=progress)
  except McaError as e:
    raise CliError(f"llvm-mca -mcpu={mcpu}: {e}") from None
  for i, result in zip(good, results):
    out[i] = result
  return out


def sim_predict(table, blocks: Sequence, iterations: int, throughput: str,
                progress: bool) -> list[tuple[float | None, str | None]]:
  """The simulator's prediction for each decoded block (errors passed through)."""
  blocks = list(blocks)
  return sim_predict_chunks(table, [blocks], len(blocks), iterations, throughput, progress)


def sim_predict_chunks(table, chunks: Iterable[Sequence], total: int, iterations: int,
                       throughput: str, progress: bool, checkpoint=None
                       ) -> list[tuple[float | None, str | None]]:
  """`sim_predict` of `total` blocks that arrive in chunks (`simulate_chunks`)."""
  enable_compile_cache()
  from diffsim.sim import simulate_chunks

  preds = simulate_chunks(table, chunks, iterations=iterations, throughput=throughput,
                          progress=progress, total=total, checkpoint=checkpoint)
  return [(p.cycles, p.error) for p in preds]


DECODE_CHUNK = 5000  # rows decoded at a time while the simulator runs what is decoded


@contextlib.contextmanager
def decoded_in_background(rows: Sequence) -> Iterator[Iterable[list]]:
  """The rows' decoded blocks, chunk by chunk, decoded by a second process while this
  one starts the simulator (`diffsim.isa.background`). An input of one chunk decodes
  here: a process costs more than it saves."""
  hexes = [hex_field(r) for r in rows]
  if len(hexes) <= DECODE_CHUNK:
    yield [decode_hexes(hexes)]
    return
  from diffsim.isa.background import decode_in_background

  need_llvm("llvm-mc")
  with decode_in_background(hexes, DECODE_CHUNK) as chunks:
    yield environment_errors(chunks)


def environment_errors(chunks: Iterator[list]) -> Iterator[list]:
  try:
    yield from chunks
  except RuntimeError as e:  # llvm-mc missing or broken, or the decoder died
    raise CliError(str(e)) from None


