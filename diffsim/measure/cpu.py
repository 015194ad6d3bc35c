"""Which CPU this is, from /proc/cpuinfo: measurements belong to one CPU model."""

from __future__ import annotations

import os


def cpu_identity() -> dict[str, object]:
  """The CPU this process runs on, from /proc/cpuinfo (vendor, family, model, ...)."""
  info: dict[str, str] = {}
  try:
    with open("/proc/cpuinfo") as f:
      for line in f:
        if not line.strip():
          break  # the first processor is enough
        key, _, value = line.partition(":")
        info[key.strip()] = value.strip()
  except OSError:
    pass

  def as_int(key: str) -> int | None:
    try:
      return int(info[key])
    except (KeyError, ValueError):
      return None

  flags = info.get("flags", "").split()
  return {"vendor": info.get("vendor_id", "unknown"), "family": as_int("cpu family"),
          "model": as_int("model"), "stepping": as_int("stepping"),
          "model_name": info.get("model name", "unknown"),
          "virtualised": "hypervisor" in flags, "logical_cpus": os.cpu_count()}


def describe_cpu(cpu: dict[str, object]) -> str:
  """`AuthenticAMD family 25 model 17 stepping 1 (AMD EPYC), a VM`."""
  fam, model = cpu.get("family"), cpu.get("model")

  def hx(v: object) -> str:
    return "?" if v is None else f"{v} (0x{v:x})"

  s = (f"{cpu.get('vendor')} family {hx(fam)} model {hx(model)} stepping "
       f"{cpu.get('stepping')} ({cpu.get('model_name')})")
  return s + (", virtualised" if cpu.get("virtualised") else "")


def same_model(a: dict[str, object], b: dict[str, object]) -> bool:
  """Whether two identities name the same CPU model (vendor, family, model, stepping)."""
  return all(a.get(k) == b.get(k) for k in ("vendor", "family", "model", "stepping"))
