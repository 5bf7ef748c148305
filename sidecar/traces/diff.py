"""What changed between two captures: step time, compute vs collective wait, the ops and kernels
whose self time per step changed most, ops that appeared or vanished, and the ranks that stand out.

    result = diff_traces("r1")                  # replica r1's last two captures, the older as base
    result = diff_traces("r1:3", "r1:7", root)  # two captures by number (or two paths, or two replicas)
    print(sidecar.cli.render_traces.diff_text(result, 10))   # the CLI's text
    result.to_json()                            # what `profile diff --json` prints

Each side is read by `traces.summary.summarize_found` (one streamed pass per trace, every op kept;
a rank whose trace is on another machine's disk, from the summary it published: there only
its top ops are known, and the warnings say so), so a diff costs two summaries and no second reader. Ranks are matched by the rank the traces say
they are; by default every rank present on both sides is compared.

Per rank, an op's time per step is its self time over the whole trace divided by the rank's
captured steps (the summary's self time: a span's duration minus its direct children on the
same thread); a side's number is the mean over the compared ranks (a rank without the op counts
zero). A rank stands out when the change of its compute per step differs from the others'
(`stand_out`): in synchronous training every rank's step grows when one rank's compute does,
so step time would not tell them apart.

Which two captures are compared is `traces.catalog.find_pair`'s to say (`default_pair` there is
the one place that chooses what a bare replica means: after a slowdown watch fired
(sidecar.rank.slowdown), its slow capture and the baseline it took when armed, as long as no
capture came after the slow one; else the replica's last two captures).
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sidecar.common.capturesummary import is_cut
from sidecar.common.exceptions import TraceError
from sidecar.common.request import RankFilter
from sidecar.common.roster import ControllerReplica
from sidecar.traces.catalog import FoundCapture, find_pair
from sidecar.traces.straggler import NOISE_FLOOR_US, NOISE_FRACTION
from sidecar.traces.summary import RankSummary, TraceSummary, summarize_found

__all__ = ["Change", "CaptureDiff", "DiffSide", "OpChange", "RankChange", "diff_summaries", "diff_traces",
           "stand_out", "top_changes"]

TOP_K = 10  # changes shown per list (`top_changes`; the page's, and `profile diff --top`'s default)


@dataclass
class Change:
    """One number on both sides, in seconds (None where a side has no steps)."""

    base: float | None
    new: float | None

    @property
    def delta(self) -> float | None:
        return None if self.base is None or self.new is None else self.new - self.base

    def to_json(self) -> dict[str, float | None]:
        return {"base": self.base, "new": self.new, "delta": self.delta}


@dataclass
class OpChange:
    """One op or kernel name: its mean self time per step on each side, in seconds."""

    name: str
    base_s: float
    new_s: float

    @property
    def delta_s(self) -> float:
        return self.new_s - self.base_s

    def to_json(self) -> dict[str, Any]:
        return {"name": self.name, "base_s": self.base_s, "new_s": self.new_s, "delta_s": self.delta_s}


@dataclass
class RankChange:
    """One compared rank: its step, compute and collective wait per step (mean), base -> new."""

    rank: int
    host: str | None
    step_s: Change
    compute_s: Change
    collective_wait_s: Change
    stands_out: bool = False

    def to_json(self) -> dict[str, Any]:
        return {"rank": self.rank, "host": self.host, "stands_out": self.stands_out,
                "step_s": self.step_s.to_json(), "compute_s": self.compute_s.to_json(),
                "collective_wait_s": self.collective_wait_s.to_json()}


@dataclass
class DiffSide:
    """One side of a diff: what was asked for, the capture it resolved to, and its summary."""

    name: str  # `REPLICA:CAPTURE` when the traces are in the sidecar's layout, else the target as given
    target: str
    replica: str | None
    capture: int | None
    summary: TraceSummary

    def to_json(self, ranks: Sequence[int]) -> dict[str, Any]:
        return {"name": self.name, "replica": self.replica, "capture": self.capture,
                "ranks": [{"rank": r.rank, "trace_path": r.path, "source": r.source, "trace_url": r.trace_url}
                          for r in self.summary.ranks if r.rank in ranks]}


@dataclass
class CaptureDiff:
    """What changed from `base` to `new` over the compared `ranks`. Op lists are sorted by
    `delta_s`, largest growth first; `appeared`/`vanished` name ops and kernels on one side only."""

    base: DiffSide
    new: DiffSide
    ranks: list[RankChange]
    mean_step_s: Change
    compute_s: Change
    collective_wait_s: Change
    ops: list[OpChange]
    kernels: list[OpChange]
    appeared: dict[str, list[str]]  # {"ops": [...], "kernels": [...]}
    vanished: dict[str, list[str]]
    noise_s: float  # a rank stands out when its compute change is this far from the others'
    warnings: list[str] = field(default_factory=list)

    @property
    def rank_numbers(self) -> list[int]:
        return [r.rank for r in self.ranks]

    @property
    def standing_out(self) -> list[RankChange]:
        return [r for r in self.ranks if r.stands_out]

    def to_json(self) -> dict[str, Any]:
        """`profile diff --json` (docs/json.md): times in seconds, means per step."""
        ranks = self.rank_numbers
        return {
            "base": self.base.to_json(ranks), "new": self.new.to_json(ranks),
            "ranks": [r.to_json() for r in self.ranks],
            "mean_step_s": self.mean_step_s.to_json(), "compute_s": self.compute_s.to_json(),
            "collective_wait_s": self.collective_wait_s.to_json(),
            "ops": [o.to_json() for o in self.ops], "kernels": [k.to_json() for k in self.kernels],
            "appeared": self.appeared, "vanished": self.vanished,
            "stand_out": [r.rank for r in self.standing_out], "noise_s": self.noise_s,
            "warnings": list(self.warnings),
            "from_summaries": {"base": [k for k in self.base.summary.from_summaries if k in ranks],
                               "new": [k for k in self.new.summary.from_summaries if k in ranks]},
        }


def diff_traces(
    base: str,
    new: str | None = None,
    root: Path | None = None,
    controller: list[ControllerReplica] | None = None,
    ranks: RankFilter | None = None,
) -> CaptureDiff:
    """`profile diff BASE [NEW]`: resolve both sides, summarize each, and diff them.

    Each side is anything `find_traces` takes (a trace file, a directory, a replica name: its
    latest capture), or `REPLICA:CAPTURE`. Without `new`, `base` names one capture (a replica:
    its latest) and the diff is from the capture before it (`default_pair`) to it: `find_pair`.

    Raises:
        as `find_pair`; TraceError: one capture only, no rank in both, a selected rank not in both.
    """
    found_base, found_new = find_pair(base, new, root, controller)
    warnings_base, warnings_new = list(found_base.warnings), list(found_new.warnings)
    warnings = [f"base: {w}" for w in warnings_base] + [f"new: {w}" for w in warnings_new]
    sides = []
    for found in (found_base, found_new):
        summary = summarize_found(found, top_k=None)
        name = f"{found.replica}:{found.capture}" if found.replica and found.capture is not None else found.target
        sides.append(DiffSide(name, found.target, found.replica, found.capture, summary))
    warnings += [f"base: {w}" for w in found_base.warnings[len(warnings_base):]]
    warnings += [f"new: {w}" for w in found_new.warnings[len(warnings_new):]]
    result = diff_summaries(sides[0], sides[1], ranks, warnings)
    _drop_unknown(result, _cut_ranks(found_base), _cut_ranks(found_new))
    return result


def _cut_ranks(found: FoundCapture) -> dict[str, set[int]]:
    """"ops", "kernels" -> the ranks of `found` read from a summary that lists only its top ones."""
    return {kind: {rank for rank, s in found.summaries.items() if is_cut(s, key)}
            for kind, key in (("ops", "top_cpu_ops"), ("kernels", "top_kernels"))}


def _drop_unknown(diff: CaptureDiff, cut_base: dict[str, set[int]], cut_new: dict[str, set[int]]) -> None:
    """Leave out the op changes that cut summaries cannot tell: a name that a compared rank read from
    a summary holding only its top ops does not list (it may be there, below them: its time there is
    not known). What is left is what the traces give. Said in the warnings."""
    compared = set(diff.rank_numbers)
    for kind in ("ops", "kernels"):
        cut_b, cut_n = cut_base[kind] & compared, cut_new[kind] & compared
        if not cut_b and not cut_n:
            continue
        kernels = kind == "kernels"
        known_b, known_n = _listed(diff.base, cut_b, kernels), _listed(diff.new, cut_n, kernels)
        changes = diff.kernels if kernels else diff.ops
        changes[:] = [c for c in changes if (known_b is None or c.name in known_b)
                      and (known_n is None or c.name in known_n)]
        if cut_n:
            diff.vanished[kind] = []
        if cut_b:
            diff.appeared[kind] = []
        diff.warnings.append(f"{kind}: a summary holds only its top {kind}, so the {kind} it does not list are left "
                             "out of the changes, and none is said to have appeared or vanished")


def _listed(side: DiffSide, cut: set[int], kernels: bool) -> set[str] | None:
    """The op (or kernel) names that every rank in `cut` lists (None: no rank of this side is cut)."""
    if not cut:
        return None
    lists = [{op.name for op in (r.top_kernels if kernels else r.top_cpu_ops)} for r in side.summary.ranks
             if r.rank in cut]
    return set.intersection(*lists)


def _select(base: TraceSummary, new: TraceSummary, selected: RankFilter | None) -> tuple[list[int], list[str]]:
    have_base = {r.rank for r in base.ranks}
    have_new = {r.rank for r in new.ranks}
    both = have_base & have_new
    listed = f"base has {_ranks(have_base)}, new has {_ranks(have_new)}"
    if selected is not None and not selected.is_all:
        absent = sorted(set(selected.ranks or ()) - both)
        if absent:
            raise TraceError(f"rank{'s' if len(absent) > 1 else ''} {RankFilter(frozenset(absent))} "
                             f"{'are' if len(absent) > 1 else 'is'} not in both captures ({listed}); "
                             "pick ranks in both with --rank")
        return sorted(set(selected.ranks or ())), []
    if not both:
        raise TraceError(f"no rank is in both captures ({listed}); compare captures of the same ranks")
    warnings = []
    for side, only in (("base", have_base - both), ("new", have_new - both)):
        if only:
            warnings.append(f"{_ranks(only)} only in {side}: left out (the diff compares the ranks in both)")
    return sorted(both), warnings


def _ranks(ranks: set[int] | Sequence[int]) -> str:
    return f"rank{'s' if len(ranks) != 1 else ''} {RankFilter(frozenset(ranks))}" if ranks else "no ranks"


def _per_step(ranks: Sequence[RankSummary], kernels: bool) -> dict[str, float]:
    """Name -> mean over `ranks` of its self time per captured step (seconds); a rank without it counts 0."""
    totals: dict[str, float] = {}
    for r in ranks:
        steps = len(r.steps) or 1
        for op in (r.top_kernels if kernels else r.top_cpu_ops):
            totals[op.name] = totals.get(op.name, 0.0) + op.self_us / steps
    return {name: us / 1e6 / len(ranks) for name, us in totals.items()}


def _changes(base: dict[str, float], new: dict[str, float]) -> list[OpChange]:
    out = [OpChange(name, base.get(name, 0.0), new.get(name, 0.0)) for name in base.keys() | new.keys()]
    out.sort(key=lambda o: (-o.delta_s, o.name))
    return out


def _mean(values: Sequence[float | None]) -> float | None:
    known = [v for v in values if v is not None]
    return statistics.fmean(known) / 1e6 if known else None


def stand_out(changes: Sequence[RankChange], noise_s: float) -> None:
    """Mark the ranks whose compute-per-step change differs from the rest's by more than `noise_s`.

    The rest's change is the lower median by size of every rank's change (with two ranks, the
    smaller one; with many, what most ranks did), so one rank that changed alone stands out and
    ranks that all changed alike do not.
    """
    known = [c for c in changes if c.compute_s.delta is not None]
    if len(known) < 2:
        return
    by_size = sorted((c.compute_s.delta for c in known), key=abs)  # type: ignore[arg-type]
    reference = by_size[(len(by_size) - 1) // 2]
    for c in known:
        c.stands_out = abs(c.compute_s.delta - reference) > noise_s  # type: ignore[operator]


def diff_summaries(base: DiffSide, new: DiffSide, ranks: RankFilter | None = None,
                   warnings: Sequence[str] = ()) -> CaptureDiff:
    """Diff two summarized captures (`summarize(..., top_k=None)`: every op) over the ranks in both
    (or `ranks`, each of which must be in both).

    Raises:
        TraceError: no rank in both; a selected rank not in both.
    """
    chosen, left_out = _select(base.summary, new.summary, ranks)
    b = {r.rank: r for r in base.summary.ranks if r.rank in chosen}
    n = {r.rank: r for r in new.summary.ranks if r.rank in chosen}
    bs, ns = [b[k] for k in chosen], [n[k] for k in chosen]
    changes = [
        RankChange(k, n[k].host or b[k].host, Change(_mean([b[k].mean_step_us]), _mean([n[k].mean_step_us])),
                   Change(_mean([b[k].mean_compute_us]), _mean([n[k].mean_compute_us])),
                   Change(_mean([b[k].mean_wait_us]), _mean([n[k].mean_wait_us])))
        for k in chosen
    ]
    base_steps = [r.mean_step_us for r in bs if r.mean_step_us is not None]
    noise_us = max(NOISE_FRACTION * statistics.median(base_steps), NOISE_FLOOR_US) if base_steps else NOISE_FLOOR_US
    stand_out(changes, noise_us / 1e6)
    notes = list(warnings) + left_out
    for side, rs in (("base", bs), ("new", ns)):
        stepless = [r.rank for r in rs if not r.steps]
        if stepless:
            notes.append(f"{side}: {_ranks(stepless)} captured no ProfilerStep#N spans; their op times are per "
                         "capture, not per step")
    ops_b, ops_n = _per_step(bs, False), _per_step(ns, False)
    ker_b, ker_n = _per_step(bs, True), _per_step(ns, True)
    return CaptureDiff(
        base=base, new=new, ranks=changes,
        mean_step_s=Change(_mean([r.mean_step_us for r in bs]), _mean([r.mean_step_us for r in ns])),
        compute_s=Change(_mean([r.mean_compute_us for r in bs]), _mean([r.mean_compute_us for r in ns])),
        collective_wait_s=Change(_mean([r.mean_wait_us for r in bs]), _mean([r.mean_wait_us for r in ns])),
        ops=_changes(ops_b, ops_n), kernels=_changes(ker_b, ker_n),
        appeared={"ops": sorted(ops_n.keys() - ops_b.keys()), "kernels": sorted(ker_n.keys() - ker_b.keys())},
        vanished={"ops": sorted(ops_b.keys() - ops_n.keys()), "kernels": sorted(ker_b.keys() - ker_n.keys())},
        noise_s=noise_us / 1e6, warnings=notes,
    )


# --- which changes to show -------------------------------------------------------------------


def top_changes(changes: Sequence[OpChange], k: int = TOP_K) -> list[OpChange]:
    """The `k` whose time per step changed most either way, largest growth first."""
    picked = sorted(changes, key=lambda o: (-abs(o.delta_s), o.name))[:k]
    return sorted(picked, key=lambda o: (-o.delta_s, o.name))


