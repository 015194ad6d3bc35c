"""Processor resources: units, groups, buffers, and llvm-mca's resource arithmetic.

llvm-mca never prints resource groups. Their existence and cycles are read from
llvm-exegesis (`WriteProcRes` lists), their *membership* is inferred here from what
llvm-mca does print:

* groups that appear in some resource list: from `-instruction-tables`, which
  spreads every kept group's cycles evenly over its member units. Subtracting the
  contributions of the class's other (known) resources leaves the group's share on
  exactly its members.
* buffered groups that no class names (Haswell's `HWPortAny`, Zen 3's `Zn3Int`):
  from `-scheduler-stats`, simulating each key alone: a buffered resource is used by
  a key iff one of the key's resources lies inside it (LLVM's expansion rule). The
  members are the smallest set that explains every key that used it, completed by
  units that finish a listed group otherwise inside it (`infer_buffered_group`).

The same module re-implements the parts of llvm-mca that turn a resource list into
what the simulator consumes (diffsim/sim/MODEL.md#resource-lists), so that every list can be
checked against llvm-mca's static per-unit pressure before it is written out.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
from collections.abc import Iterable

import numpy as np


def compare_numeric(a: str, b: str) -> int:
  """LLVM's `StringRef::compare_numeric`: digit runs compare as numbers.

  TableGen sorts processor resources this way (`LessRecord`), and llvm-mca gives
  resources their mask bits in that order.
  """
  n = min(len(a), len(b))
  i = 0
  while i < n:
    if a[i].isdigit() and b[i].isdigit():
      j = i + 1
      while True:
        ld = j < len(a) and a[j].isdigit()
        rd = j < len(b) and b[j].isdigit()
        if ld != rd:
          return -1 if rd else 1  # the longer digit run is larger
        if not rd:
          break
        j += 1
      if a[i:j] != b[i:j]:
        return -1 if a[i:j] < b[i:j] else 1
      i = j
      continue
    if a[i] != b[i]:
      return -1 if a[i] < b[i] else 1
    i += 1
  return (len(a) > len(b)) - (len(a) < len(b))


name_key = functools.cmp_to_key(compare_numeric)


@dataclasses.dataclass
class Model:
  """A CPU's processor resources.

  Attributes:
    units: {unit name: NumUnits}, in llvm-mca's order.
    groups: {group name: set of unit names}.
    buffers: {resource name: BufferSize} for resources with a buffer (> 0).
  """

  units: dict
  groups: dict
  buffers: dict

  def members(self, name: str) -> frozenset:
    """The units a resource stands for: itself for a unit, its members for a group."""
    return frozenset(self.groups[name]) if name in self.groups else frozenset([name])

  def subunits(self, name: str) -> int:
    """Number of individual pipes behind a resource (NumUnits summed)."""
    return sum(self.units[u] for u in self.members(name))

  def order(self) -> list[str]:
    """All resources in mask-bit order: units first (in llvm-mca's order), then groups.

    Groups are ordered by plain string comparison of their names: llvm-exegesis'
    reduction of Haswell's MMX_EMMS list only comes out as printed if HWPort015 has
    a lower resource index than HWPort15, which rules out a numeric-aware order.
    """
    return list(self.units) + sorted(self.groups)

  def mask_rank(self, name: str) -> tuple:
    """Sort key of llvm-mca's normalisation: (bits in the mask, mask value).

    A unit has one bit; a group has its own bit plus its members' bits, and group
    bits lie above all unit bits, in name order.
    """
    order = self.order()
    if name not in order:
      raise ValueError(f"resource {name} is neither a unit of this model nor a group that "
                       f"could be inferred from its classes")
    if name in self.groups:
      bits = len(self.groups[name]) + 1
      top = order.index(name)
      return (bits, top, tuple(sorted((order.index(u) for u in self.groups[name]),
                                      reverse=True)))
    return (1, order.index(name), ())


def expand(model: Model, res: Iterable[tuple[str, int]]) -> dict[str, int]:
  """LLVM's expansion of a written resource list: each resource also charges its
  cycles to every group that contains all of its units (diffsim/sim/MODEL.md#resource-lists)."""
  out: dict[str, int] = {}
  for name, cyc in res:
    out[name] = out.get(name, 0) + cyc
    mem = model.members(name)
    for g, gm in model.groups.items():
      if g != name and mem <= gm:
        out[g] = out.get(g, 0) + cyc
  return out


@dataclasses.dataclass
class Normalized:
  """llvm-mca's view of one instruction's resources after its normalisation
  (diffsim/sim/MODEL.md#resource-lists)."""

  kept: list  # [(name, cycles)] in normalisation order
  touched: set  # groups dropped because members cover them
  reserved: set  # kept groups that need more units than they have


def normalize(model: Model, expanded: dict[str, int]) -> Normalized:
  """llvm-mca's de-expansion (diffsim/sim/MODEL.md#resource-lists) of an expanded list."""
  items = sorted(expanded, key=model.mask_rank)
  cyc = dict(expanded)
  need = {n: 1 for n in items}
  kept, touched = [], set()
  for i, a in enumerate(items):
    if cyc[a] <= 0:
      if a in model.groups:
        touched.add(a)
      continue
    kept.append((a, cyc[a]))
    if a in model.groups:
      touched.add(a)
    ma = model.members(a)
    for b in items[i + 1:]:
      if ma <= model.members(b):
        cyc[b] -= cyc[a]
        if b in model.groups:
          need[b] += 1
  reserved = {g for g, _ in kept if g in model.groups and need[g] > len(model.groups[g])}
  return Normalized(kept, touched - {g for g, _ in kept}, reserved)


def static_pressure(model: Model, kept: Iterable[tuple[str, int]]) -> dict[str, float]:
  """What `-instruction-tables` prints, summed over each unit's sub-units: each
  kept resource's cycles spread evenly over the pipes behind it."""
  out: dict[str, float] = {}
  for name, c in kept:
    share = c / model.subunits(name)
    for u in model.members(name):
      out[u] = out.get(u, 0.0) + share * model.units[u]
  return out


def pressure_matches(model: Model, want: dict[str, float], got: dict[str, float]) -> bool:
  """Compares pressures printed with two decimals per sub-unit."""
  for u in set(want) | set(got):
    tol = 0.006 * model.units.get(u, 1) + 1e-9
    if abs(want.get(u, 0.0) - got.get(u, 0.0)) > tol:
      return False
  return True


def buffers_used(model: Model, res: Iterable[tuple[str, int]]) -> set[str]:
  """The buffered resources an instruction takes an entry in (one per resource):
  those in its expanded list (diffsim/sim/MODEL.md#buffers)."""
  return {r for r in expand(model, res) if r in model.buffers}


def _uniform_support(units: dict, resid: dict) -> tuple[frozenset, int] | None:
  """The units a residual pressure sits on, if it is one group's even spread.

  Returns (members, cycles) when the residual is spread evenly over the pipes of
  its support and sums to a whole number of cycles, else None.
  """
  mem = frozenset(u for u, v in resid.items() if v > 0.02)
  if not mem:
    return None
  total = sum(resid[u] for u in mem)
  sub = sum(units[u] for u in mem)
  if abs(total - round(total)) > 0.05 or round(total) < 1:
    return None
  if all(abs(resid[u] - total * units[u] / sub) <= 0.02 * units[u] for u in mem):
    return mem, round(total)
  return None


def infer_listed_groups(units: dict, lists: list[list[tuple[str, int]]],
                        pressures: list[dict[str, float]],
                        idealized: list[dict[str, float]] | None = None
                        ) -> tuple[dict, dict]:
  """Members of every group named in some resource list.

  Two read-outs, both giving a group's members as the units its cycles land on:

  1. llvm-exegesis' idealised pressure of a list that is one group alone: the units
     it lands on.
  2. llvm-mca's `-instruction-tables` pressure, minus the contributions of the
     list's other, already known resources. llvm-exegesis' reduction sometimes
     leaves cycles on an enclosing group that llvm-mca drops (a group that sorts
     before its members), so the residual is tried both with the other groups'
     listed cycles and with the units' alone.

  Args:
    units: {unit: NumUnits}.
    lists: resource lists (llvm-exegesis), one per key.
    pressures: llvm-mca's static per-unit pressure for the same keys.
    idealized: llvm-exegesis' idealised pressure for the same keys.

  Returns:
    ({group: set of units}, {group: note}) with a note for groups whose membership
    could not be pinned down or whose evidence disagrees.
  """
  names = {n for lst in lists for n, _ in lst} - set(units)
  votes: dict[str, dict[frozenset, int]] = {g: {} for g in names}
  for lst, ideal in zip(lists, idealized or []):
    # Only a list that is one group alone: llvm-exegesis fills the least loaded
    # units first, so next to other resources a member may get nothing.
    gs = [(n, c) for n, c in lst if c > 0]
    if len(gs) != 1 or gs[0][0] in units:
      continue
    own = {n: c for n, c in lst if n in units}
    mem = frozenset(u for u, p in ideal.items() if p - own.get(u, 0) > 0.004)
    if mem:
      votes[gs[0][0]][mem] = votes[gs[0][0]].get(mem, 0) + 1
  groups: dict[str, set] = {}
  for g, v in votes.items():
    if v:
      groups[g] = set(max(v, key=v.get))
  pending = names - set(groups)
  progress = True
  while pending and progress:
    progress = False
    for g in sorted(pending):
      v: dict[frozenset, int] = {}
      for lst, pres in zip(lists, pressures):
        if g not in (n for n, _ in lst):
          continue
        others = [(n, c) for n, c in lst if n != g]
        if any(n not in units and n not in groups for n, _ in others):
          continue
        for with_groups in (True, False):
          resid = dict(pres)
          for n, c in others:
            if n in groups and not with_groups:
              continue
            mem = groups.get(n, {n})
            sub = sum(units[u] for u in mem)
            for u in mem:
              resid[u] = resid.get(u, 0.0) - c * units[u] / sub
          got = _uniform_support(units, resid)
          if got:
            v[got[0]] = v.get(got[0], 0) + 1
            break
      if v:
        groups[g] = set(max(v, key=v.get))
        pending.discard(g)
        progress = True
  notes = {g: "membership not inferred" for g in pending}
  for g, v in votes.items():
    if len(v) > 1:
      notes[g] = f"membership evidence disagrees: {sorted(map(sorted, v))}"
  return groups, notes


def infer_buffered_group(units: dict, groups: dict, lists: list[list[tuple[str, int]]],
                         used: list[bool]) -> tuple[set, str | None]:
  """Members of a buffered group that no resource list names.

  A key uses the buffer iff one of its resources lies wholly inside the group. Start
  from every unit and drop units that some non-using key has as a stand-alone unit
  resource; then check the result against every key.

  Args:
    units: {unit: NumUnits}.
    groups: known {group: members}.
    lists: resource lists, one per key.
    used: whether each key took an entry in this buffer.

  Returns:
    (members, note): note says what could not be decided, or is None.
  """
  def mem(n):
    return set(groups.get(n, {n}))
  members = set(units)
  evidenced = set()
  changed = True
  while changed:
    changed = False
    for lst, u in zip(lists, used):
      if u:
        continue
      for n, _ in lst:
        m = mem(n)
        if m <= members and len(m) == 1:
          members -= m
          changed = True
  for lst, u in zip(lists, used):
    if u:
      for n, _ in lst:
        if mem(n) <= members:
          evidenced |= mem(n)
  # Keep the smallest set that still explains every key that used the buffer: a
  # unit that only ever appears next to another member (Haswell's dividers always
  # come with port 0) has no evidence of its own.
  members = set(evidenced)
  for u in sorted(evidenced, key=name_key, reverse=True):
    trial = members - {u}
    if all(any(mem(n) <= trial for n, _ in lst) for lst, used_ in zip(lists, used) if used_):
      members = trial
  # ...but a unit that completes a group whose other members are all in is taken in
  # (Haswell's port 7 of HWPort237, Zen 3's BRU1 of Zn3BRU01).
  changed = True
  while changed:
    changed = False
    for g in groups.values():
      rest = set(g) - members
      if len(rest) == 1 and rest <= evidenced | set(units) and len(g) > 1:
        members |= rest
        changed = True
  unsure = evidenced - members
  bad = 0
  for lst, u in zip(lists, used):
    if any(mem(n) <= members for n, _ in lst) != u:
      bad += 1
  note = None
  if unsure or bad:
    note = (f"units {sorted(unsure, key=name_key)} only ever used together with members; "
            "left out" if unsure else "")
    if bad:
      note += f"; {bad} keys disagree with the inferred membership"
  return members, note


# ----------------------------------------------------------------------------------------
# Checking a resource list against llvm-mca's pressure


def repair(model: Model, listed: list, want: dict) -> list | None:
  """Rebuilds a kept resource list from llvm-mca's static pressure.

  The candidates are the resources llvm-exegesis named (its names are right even
  when its cycles are not), then those plus one or two other known resources. The
  first candidate set whose pressure vectors are independent and reproduce `want`
  with non-negative integer cycles wins.

  Args:
    model: the resource model.
    listed: llvm-exegesis' [(name, cycles)].
    want: llvm-mca's static pressure {unit: cycles}.

  Returns:
    [(name, cycles)] in mask order, or None.
  """
  cols = list(model.units)
  base = [n for n, _ in listed if n in model.units or n in model.groups]
  others = [n for n in model.order() if n not in base]
  target = np.array([want.get(u, 0.0) for u in cols])

  def vec(name):
    v = np.zeros(len(cols))
    sub = model.subunits(name)
    for u in model.members(name):
      v[cols.index(u)] = model.units[u] / sub
    return v

  def candidates():
    # Fewest changes first: drop up to two of llvm-exegesis' names (cycles it left on
    # an enclosing group) and add up to two other known resources.
    for changes in range(5):
      for drop in range(min(changes, 2, len(base)) + 1):
        add = changes - drop
        if add > 2:
          continue
        for dropped in itertools.combinations(base, drop):
          kept_names = [n for n in base if n not in dropped]
          for extra in itertools.combinations(others, add):
            yield kept_names + list(extra)

  for names in candidates():
    if not names:
      continue
    a = np.stack([vec(n) for n in names], axis=1)
    if np.linalg.matrix_rank(a) < len(names):
      continue
    x, *_ = np.linalg.lstsq(a, target, rcond=None)
    xr = np.round(x)
    if np.any(xr < 0) or np.max(np.abs(x - xr)) > 0.05:
      continue
    kept = [(n, int(c)) for n, c in zip(names, xr) if c > 0]
    if pressure_matches(model, want, static_pressure(model, kept)):
      return sorted(kept, key=lambda nc: model.mask_rank(nc[0]))
  return None


def resolve_resources(model: Model, listed: list, want: dict) -> tuple[list, str | None]:
  """The resource list to publish for one key, and a note when it was inferred.

  The list published is llvm-mca's kept list after its normalisation
  (diffsim/sim/MODEL.md#resource-lists) of the expansion of llvm-exegesis' list; for
  ordinary classes that is llvm-exegesis' list itself.
  """
  norm = normalize(model, expand(model, listed))
  if pressure_matches(model, want, static_pressure(model, norm.kept)):
    kept = [(n, c) for n, c in norm.kept]
    note = None
    if sorted(kept) != sorted((n, c) for n, c in listed if c > 0):
      note = f"normalised from llvm-exegesis' {_fmt(listed)}"
    return kept, note
  fixed = repair(model, listed, want)
  if fixed is not None:
    return fixed, f"rebuilt from llvm-mca pressure; llvm-exegesis said {_fmt(listed)}"
  return [(n, c) for n, c in listed if c > 0], (
      f"UNVERIFIED: llvm-exegesis' {_fmt(listed)} does not reproduce llvm-mca pressure")


def _fmt(res: list) -> str:
  return " ".join(f"{n}:{c}" for n, c in res) or "(none)"
