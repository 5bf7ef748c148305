"""Which rank, and where: a hung multi-rank job's flight recorders and stacks, lined up across ranks.

Every selected rank answers a kind "hang" request from its watcher thread with its
Python stacks and its flight recorder (`sidecar.rank.flightrec`). Per process group, the
flight recorder's `pg_status` says the last collective sequence number the rank
entered (enqueued) and completed. Here, per process group:

- the collective S that ranks wait in: the highest sequence number entered and not completed;
- suspects: the members that have not entered S (they are behind), or that entered a
  different collective at S (another op or other sizes); where the rank answered without
  a flight recorder and every rank that has one waits, the ranks without one;
- a suspect that itself waits in another hung process group, for other suspects, is
  passed over for the ranks it waits for (the root of the chain).

How long the others have waited: from the flight recorder's `time_created_ns` of the
entry they wait in (it is set on gloo and NCCL alike), else from the rank's stacks dump
time minus its last step time. Where no rank has a flight recorder, the report says
why and falls back to step counters (ranks behind the others) and stacks (ranks whose
main thread is not in torch.distributed while the others are; else the ranks that
stand apart from the largest group of identical stacks).

Where torch's own analysis runs (`sidecar.fleet.torch_fr`: torch's fr_trace on the same moment's
dumps, matched across ranks by torch), its answer names the suspects of a group: the members
that did not join the collective the others wait in, or that joined another. Ours stays for what
it lacks: `pg_status` (entered against completed: on gloo every entry stays "scheduled"), the
wait, the ranks that sent no flight recorder, the stacks and the step of each rank, and the
fallback without any recorder.

`analyze` is pure; `read_dump` reads one rank's file; `find_hang` asks the ranks
through `sidecar.fleet.control.dump_stacks` (the `profile stacks` path: its request, wait
and fallbacks) and analyzes what came back. Standard library only.
"""

from __future__ import annotations

import json
import os
import time
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sidecar.common import storeurl
from sidecar.common.registry import open_regular
from sidecar.common.request import RankFilter

if TYPE_CHECKING:
    from sidecar.common.roster import ControllerReplica
    from sidecar.fleet.answers import RankStacks
    from sidecar.fleet.torch_fr import TorchAnalysis, TorchFinding

MAX_DUMP_BYTES = 256 << 20
MAX_FRAMES_SHOWN = 6
COLLECTIVE_FRAME = "torch/distributed/"
DEFAULT_PG_DESC = "default_pg"


# --- one rank's flight recorder ------------------------------------------------------


@dataclass(frozen=True)
class Collective:
    """One flight recorder entry."""

    process_group: str  # "<recorder>:<pg name>", e.g. "cpu:0"
    seq: int
    op: str  # profiling_name, e.g. "gloo:all_reduce"
    input_sizes: Any = None
    output_sizes: Any = None
    created_at: float | None = None  # epoch seconds, when the rank entered it
    retired: bool = False


@dataclass
class GroupState:
    """One rank in one process group, per its flight recorder."""

    process_group: str
    desc: str
    enqueued: int
    completed: int
    pending: Collective | None = None  # the entry of `enqueued` when it has not completed
    entries: dict[int, Collective] = field(default_factory=dict)  # seq -> entry

    @property
    def in_flight(self) -> bool:
        return self.enqueued > self.completed


def read_dump(path: str | os.PathLike[str]) -> dict[str, Any]:
    """A flight recorder file written by `sidecar.rank.flightrec.dump`.

    Raises:
        OSError: it cannot be read. ValueError: it is not such a file.
    """
    with open_regular(path) as f:
        data = f.read(MAX_DUMP_BYTES + 1)
    if len(data) > MAX_DUMP_BYTES:
        raise ValueError(f"it is larger than {MAX_DUMP_BYTES} bytes")
    doc = json.loads(data)
    if not isinstance(doc, dict) or not isinstance(doc.get("recorders"), dict):
        raise ValueError("it is not a cosmos-profiler flight recorder dump (no 'recorders')")
    return doc


def group_states(doc: dict[str, Any]) -> dict[str, GroupState]:
    """Per process group ("<recorder>:<pg name>"), where this rank stands (pure)."""
    states: dict[str, GroupState] = {}
    for recorder, dump in (doc.get("recorders") or {}).items():
        if not isinstance(dump, dict):
            continue
        entries: dict[str, dict[int, Collective]] = {}
        op_ids: dict[str, dict[int, int]] = {}  # pg -> op_id -> collective_seq_id
        descs: dict[str, str] = {}
        for e in dump.get("entries") or []:
            if not isinstance(e, dict) or e.get("is_p2p"):
                continue
            pg = e.get("process_group") or ["?", ""]
            name = str(pg[0]) if pg else "?"
            descs[name] = str(pg[1]) if len(pg) > 1 else ""
            created = e.get("time_created_ns")
            seq = _int(e.get("collective_seq_id"))
            if seq is None:
                continue
            op_id = _int(e.get("op_id"))
            if op_id is not None:
                op_ids.setdefault(name, {})[op_id] = seq
            entries.setdefault(name, {})[seq] = Collective(
                f"{recorder}:{name}", seq, str(e.get("profiling_name") or "?"), e.get("input_sizes"),
                e.get("output_sizes"), created / 1e9 if isinstance(created, (int, float)) and created > 0 else None,
                bool(e.get("retired")),
            )
        for name, status in (dump.get("pg_status") or {}).items():
            if not isinstance(status, dict):
                continue
            enqueued = _int(status.get("last_enqueued_collective"))
            completed = _int(status.get("last_completed_collective"))
            if enqueued is None or completed is None or enqueued < 0:
                continue  # a group this rank never used
            key = f"{recorder}:{name}"
            mine = entries.get(str(name), {})
            ops = op_ids.get(str(name), {})
            if _counts_ops(ops, enqueued, completed):
                enqueued, completed = _seq_of(ops, enqueued), _seq_of(ops, completed)
            last = mine.get(enqueued)
            if completed < enqueued and last is not None and last.retired:
                # gloo's worker threads race to set `last_completed`: it can stay one behind for good
                # (torch 2.13). The entry itself says the collective finished.
                completed = enqueued
            state = GroupState(key, descs.get(str(name), ""), enqueued, completed, entries=mine)
            if state.in_flight:
                state.pending = mine.get(enqueued)
            states[key] = state
    return states


def _counts_ops(ops: dict[int, int], enqueued: int, completed: int) -> bool:
    """Whether `pg_status` counts op ids, not collective sequence numbers: gloo's does (torch 2.13), and
    a point-to-point op, which its recorder does not keep, moves it too. Counted in sequence numbers,
    the last entered is the newest entry's (the ring keeps the newest); anything else is op ids."""
    return bool(ops) and enqueued != max(ops.values())


def _seq_of(ops: dict[int, int], op_id: int) -> int:
    """The collective sequence number reached at op `op_id`: that of the newest collective at or before it."""
    return max((seq for op, seq in ops.items() if op <= op_id), default=0)


def _int(value: Any) -> int | None:
    try:
        return int(value)
    except (TypeError, ValueError):
        return None


# --- the ranks, lined up ----------------------------------------------------------------


@dataclass
class RankView:
    """What one rank sent, as the analysis reads it."""

    rank: int
    phase: str = "saved"  # the answer's phase ("saved" when it answered)
    host: str = ""
    step: int | None = None
    dumped_at: float | None = None
    last_step_at: float | None = None
    frames: list[str] = field(default_factory=list)  # main thread, outermost first
    groups: dict[str, GroupState] | None = None  # None: no flight recorder data
    fr_error: str | None = None  # why `groups` is None
    error: str | None = None  # why the rank did not answer
    stacks_path: str | None = None
    flight_recorder: str | None = None
    fr_trace: dict[str, str] = field(default_factory=dict)  # recorder -> its file for torch's fr_trace


@dataclass
class GroupVerdict:
    """One process group where a collective is in flight."""

    process_group: str
    desc: str
    seq: int  # the collective the waiting ranks are in
    op: str
    input_sizes: Any
    output_sizes: Any
    waiting: list[int]  # entered `seq`, not completed
    behind: list[int]  # have not entered `seq`
    different: list[int]  # entered `seq` as another collective
    unknown: list[int]  # members by assumption (the default group) with no flight recorder data
    suspects: list[int]
    positions: dict[int, tuple[int, int]]  # rank -> (entered, completed)
    waited_s: float | None  # the longest wait among `waiting`
    waited_from: str  # "flight recorder" or "last step"
    suspects_from: str = "flight recorder positions"  # or "fr_trace": torch's analysis named them
    fr_trace: str | None = None  # what torch's fr_trace says of this collective, in words; None: not run

    @property
    def label(self) -> str:
        recorder, _, name = self.process_group.partition(":")
        return f"pg {name}" + (f" {self.desc}" if self.desc and self.desc != "undefined" else "")


@dataclass
class RankVerdict:
    """One rank in the report."""

    rank: int
    role: str  # suspect | waiting | ok | no answer (a rank that did not answer may be a suspect too)
    where: str  # in words
    host: str = ""
    phase: str = "saved"
    step: int | None = None
    last_step_at: float | None = None
    since_last_step_s: float | None = None
    in_flight: list[dict[str, Any]] = field(default_factory=list)
    process_groups: list[dict[str, Any]] = field(default_factory=list)
    main_stack: list[str] = field(default_factory=list)
    stacks_path: str | None = None
    flight_recorder_path: str | None = None
    flight_recorder_error: str | None = None
    error: str | None = None

    @property
    def suspect(self) -> bool:
        return self.role == "suspect"


@dataclass
class HangReport:
    """`profile hang`: the suspects, the collective they hold up, and every rank."""

    replica: str
    request_id: str | None
    suspects: list[int]
    verdict: str
    flight_recorder: bool  # whether any rank sent flight recorder data
    fallback: str | None  # why the verdict comes from stacks and step counters, when it does
    collective: GroupVerdict | None  # the collective the most ranks wait in
    groups: list[GroupVerdict]
    ranks: list[RankVerdict]
    fr_trace: TorchAnalysis | None = None  # torch's analysis of the same dumps, or why it did not run


def analyze(views: Sequence[RankView], replica: str = "", request_id: str | None = None,
            now: float | None = None, theirs: TorchAnalysis | None = None) -> HangReport:
    """Line the ranks up (pure; see the module docstring), with torch's fr_trace answer where it ran."""
    answered = [v for v in views if v.phase == "saved"]
    silent = [v.rank for v in views if v.phase != "saved"]
    with_fr = [v for v in answered if v.groups is not None]
    groups = _hung_groups(views, with_fr, theirs) if with_fr else []
    fallback = None
    if with_fr:
        suspects = _root_suspects(groups)
        if not groups:
            verdict = "No collective is in flight on any rank that answered: this is not a hang in a collective."
            if silent:
                suspects = list(silent)
                verdict += f" {_ranks_phrase(silent)} did not answer."
        else:
            verdict = _verdict_text(groups, suspects)
    else:
        reasons = sorted({v.fr_error or "no flight recorder dump" for v in answered})
        fallback = "no flight recorder data: " + ("; ".join(reasons) if reasons else "no rank answered")
        suspects, verdict = _fallback(answered, silent)
    collective = max(groups, key=lambda g: (len(g.waiting), -_pg_order(g.process_group)), default=None)
    ranks = [_rank_verdict(v, groups, suspects, now) for v in sorted(views, key=lambda v: v.rank)]
    return HangReport(replica, request_id, sorted(suspects), verdict, bool(with_fr), fallback, collective,
                      groups, ranks, theirs)


def _pg_order(key: str) -> int:
    name = key.partition(":")[2]
    return int(name) if name.isdigit() else 1 << 30


def _hung_groups(views: Sequence[RankView], with_fr: Sequence[RankView],
                 theirs: TorchAnalysis | None = None) -> list[GroupVerdict]:
    keys = sorted({k for v in with_fr for k in (v.groups or {})}, key=lambda k: (k.partition(":")[0], _pg_order(k)))
    no_fr = [v.rank for v in views if v.groups is None]
    result = []
    for key in keys:
        members = {v.rank: v.groups[key] for v in with_fr if v.groups and key in v.groups}
        top = max(s.enqueued for s in members.values())
        waiting = sorted(r for r, s in members.items() if s.enqueued == top and s.completed < top)
        if not waiting:
            continue
        behind = sorted(r for r, s in members.items() if s.enqueued < top)
        at_top = {r: s.entries.get(top) for r, s in members.items() if s.enqueued == top}
        shapes = Counter((c.op, _freeze(c.input_sizes)) for c in at_top.values() if c is not None)
        common = shapes.most_common(1)[0][0] if shapes else None
        different = sorted(r for r, c in at_top.items()
                           if c is not None and common is not None and (c.op, _freeze(c.input_sizes)) != common)
        desc = next((s.desc for s in members.values() if s.desc), "")
        # Members of the default group that sent no flight recorder: not known to have entered.
        unknown = sorted(no_fr) if desc == DEFAULT_PG_DESC else []
        suspects = sorted(set(behind) | set(different)) or unknown
        entry = next((at_top[r] for r in waiting if at_top.get(r) is not None), None)
        waited, source = _waited(views, members, waiting, top)
        group = GroupVerdict(
            key, desc, top, entry.op if entry else "?", entry.input_sizes if entry else None,
            entry.output_sizes if entry else None, waiting, behind, different, unknown, suspects,
            {r: (s.enqueued, s.completed) for r, s in sorted(members.items())}, waited, source,
        )
        if theirs is not None and theirs.ran and key.partition(":")[0] in theirs.ranks:
            no_dump = sorted({v.rank for v in views} - set(theirs.ranks[key.partition(":")[0]]))
            _take_torch(group, theirs.finding(key, top), no_dump)
        result.append(group)
    return result


def _take_torch(group: GroupVerdict, finding: TorchFinding | None, no_dump: Sequence[int]) -> None:
    """Where torch's fr_trace names the ranks that did not join `group`'s collective, or joined
    another, they are the suspects; where it flags nothing there, ours stand, and it says so."""
    if finding is None or not finding.ranks:
        why = (f"it names a rank that did not join only when every member sent a dump, and "
               f"{_ranks_phrase(no_dump)} sent none" if no_dump else "every member joined it alike")
        group.fr_trace = f"flags nothing at {group.op} seq {group.seq} ({why})"
        return
    parts = []
    if finding.missing_ranks:
        parts.append(f"{_ranks_phrase(finding.missing_ranks)} did not join it")
    if finding.mismatched_ranks:
        parts.append(f"{_ranks_phrase(finding.mismatched_ranks)} joined another ({finding.mismatch or 'mismatch'})")
    group.fr_trace = f"{finding.op} seq {finding.seq}: " + "; ".join(parts)
    group.suspects = finding.ranks
    group.suspects_from = "fr_trace"


def _freeze(value: Any) -> str:
    return json.dumps(value, sort_keys=True)


def _waited(views: Sequence[RankView], members: dict[int, GroupState], waiting: list[int],
            seq: int) -> tuple[float | None, str]:
    by_rank = {v.rank: v for v in views}
    from_fr = []
    from_steps = []
    for rank in waiting:
        view = by_rank[rank]
        entry = members[rank].entries.get(seq)
        if entry is not None and entry.created_at is not None and view.dumped_at is not None:
            from_fr.append(max(0.0, view.dumped_at - entry.created_at))
        elif view.dumped_at is not None and view.last_step_at is not None:
            from_steps.append(max(0.0, view.dumped_at - view.last_step_at))
    if from_fr:
        return round(max(from_fr), 3), "flight recorder"
    if from_steps:
        return round(max(from_steps), 3), "last step"
    return None, ""


def _root_suspects(groups: Sequence[GroupVerdict]) -> list[int]:
    """Every group's suspects, less those that themselves wait in a group held up by other ranks."""
    everyone = {r for g in groups for r in g.suspects}
    passed = {r for r in everyone for g in groups if r in g.waiting and set(g.suspects) - {r}}
    root = everyone - passed
    return sorted(root or everyone)


def _verdict_text(groups: Sequence[GroupVerdict], suspects: Sequence[int]) -> str:
    if not suspects:
        g = max(groups, key=lambda g: len(g.waiting))
        return (f"Every rank entered {g.op} ({g.label}, seq {g.seq}) and none completed it: no rank holds it up "
                "from outside; the collective itself does not finish (a rank failed inside it, or the network).")
    noun = "is the suspect" if len(suspects) == 1 else "are the suspects"
    return f"{_ranks_phrase(suspects).capitalize()} {noun}."


# Without a flight recorder: a rank whose last step is this recent is still stepping.
STEPPING_S = 3.0


def _fallback(answered: Sequence[RankView], silent: Sequence[int]) -> tuple[list[int], str]:
    """Suspects from step counters and stacks, when no rank has a flight recorder."""
    since = [v.dumped_at - v.last_step_at for v in answered if v.dumped_at is not None and v.last_step_at is not None]
    if answered and not silent and len(since) == len(answered) and max(since) < STEPPING_S:
        # Ranks run apart between collectives: different step counters on a job that steps are no hang.
        return [], (f"No hang: every rank stepped within the last {STEPPING_S:g} s "
                    "(ask again if the job stays stuck).")
    steps = {v.rank: v.step for v in answered if v.step is not None}
    if len(set(steps.values())) > 1:
        top = max(steps.values())
        behind = sorted(r for r, s in steps.items() if s < top)
        verb = "is" if len(behind) == 1 else "are"
        return behind, f"From step counters: {_ranks_phrase(behind)} {verb} behind step {top}."
    in_collective = {v.rank: any(COLLECTIVE_FRAME in f for f in v.frames) for v in answered}
    if any(in_collective.values()) and not all(in_collective.values()):
        out = sorted(r for r, inside in in_collective.items() if not inside)
        return out, (f"From stacks: {_ranks_phrase(out)} {'is' if len(out) == 1 else 'are'} not in torch.distributed "
                     "while the others are.")
    groups = Counter(tuple(v.frames) for v in answered)
    if len(groups) > 1:
        (biggest, size), (_, second) = groups.most_common(2)
        if size > second:
            apart = sorted(v.rank for v in answered if tuple(v.frames) != biggest)
            return apart, f"From stacks: {_ranks_phrase(apart)} stand apart from the others."
    if silent:
        return list(silent), f"{_ranks_phrase(silent).capitalize()} did not answer; every rank that did looks alike."
    return [], "Stacks and step counters alike on every rank: no suspect."


def _ranks_phrase(ranks: Sequence[int]) -> str:
    ranks = sorted(ranks)
    return f"rank {ranks[0]}" if len(ranks) == 1 else f"ranks {RankFilter(frozenset(ranks))}"


def _rank_verdict(v: RankView, groups: Sequence[GroupVerdict], suspects: Sequence[int],
                  now: float | None) -> RankVerdict:
    in_flight = []
    for state in (v.groups or {}).values():
        if state.in_flight:
            entry = state.pending
            waited = None
            if entry is not None and entry.created_at is not None and v.dumped_at is not None:
                waited = round(max(0.0, v.dumped_at - entry.created_at), 3)
            in_flight.append({"process_group": state.process_group, "desc": state.desc, "seq": state.enqueued,
                              "op": entry.op if entry else None, "waited_s": waited})
    positions = [{"process_group": s.process_group, "desc": s.desc, "entered": s.enqueued, "completed": s.completed}
                 for s in (v.groups or {}).values()]
    # Both readings of the rank's own clock (sidecar.common.clock): never `now`, another host's.
    since = round(max(0.0, v.dumped_at - v.last_step_at), 3) if v.dumped_at and v.last_step_at else None
    if v.phase != "saved":
        role = "suspect" if v.rank in suspects else "no answer"
        where = f"no answer ({v.phase}: {v.error})" if v.error else f"no answer ({v.phase})"
    elif v.rank in suspects:
        role, where = "suspect", _suspect_where(v, groups, in_flight)
    elif in_flight:
        role = "waiting"
        where = "; ".join(f"in {f['op'] or '?'} ({_pg_label(f)}, seq {f['seq']})"
                          + (f" for {f['waited_s']:.1f}s" if f["waited_s"] is not None else "") for f in in_flight)
    elif v.groups is None and any(COLLECTIVE_FRAME in f for f in v.frames):
        role, where = "waiting", "in torch.distributed: " + _innermost(v.frames)  # no flight recorder to say which
    else:
        role, where = "ok", _innermost(v.frames)
    return RankVerdict(
        v.rank, role, where, v.host, v.phase, v.step, v.last_step_at, since, in_flight, positions,
        list(v.frames), v.stacks_path, v.flight_recorder, v.fr_error, v.error,
    )


def _pg_label(item: dict[str, Any]) -> str:
    name = str(item["process_group"]).partition(":")[2]
    desc = item.get("desc")
    return f"pg {name}" + (f" {desc}" if desc and desc != "undefined" else "")


def _suspect_where(v: RankView, groups: Sequence[GroupVerdict], in_flight: list[dict[str, Any]]) -> str:
    held = [g for g in groups if v.rank in g.suspects]
    parts = []
    for g in held:
        if v.rank in g.different:
            mine = (v.groups or {}).get(g.process_group)
            entry = mine.entries.get(g.seq) if mine else None
            parts.append(f"entered {entry.op if entry else '?'} as seq {g.seq} of {g.label}, where the others "
                         f"entered {g.op}")
        elif v.rank in g.behind:
            entered, _ = g.positions[v.rank]
            parts.append(f"has not entered {g.op} ({g.label}, seq {g.seq}; it entered up to seq {entered})")
        elif v.rank in g.unknown:
            parts.append(f"no flight recorder ({v.fr_error or 'none sent'}) while the others wait in {g.op} "
                         f"({g.label}, seq {g.seq})")
    if in_flight:
        parts.append("itself in " + ", ".join(f"{f['op'] or '?'} ({_pg_label(f)}, seq {f['seq']})" for f in in_flight))
    else:
        parts.append("not in a collective: " + _innermost(v.frames))
    return "; ".join(parts)


def _innermost(frames: Sequence[str]) -> str:
    """`in f (file.py:12)` for the innermost frame of a stack."""
    if not frames:
        return "no Python frames"
    last = frames[-1]
    # 'File "/x/y.py", line 12, in f'
    try:
        path = last.split('"', 2)[1]
        line = last.split(", line ", 1)[1].split(",", 1)[0]
        func = last.rsplit(", in ", 1)[1]
        return f"in {func} ({os.path.basename(path)}:{line})"
    except IndexError:
        return last


# --- asking the ranks -----------------------------------------------------------------------


def view_of(answer: RankStacks) -> RankView:
    """What one rank's answer to a hang request says, its flight recorder file read (I/O)."""
    main = answer.main
    view = RankView(answer.rank, answer.phase, answer.host, answer.step, answer.dumped_at, answer.last_step_at,
                    list(main.frames) if main is not None else [], error=answer.error, stacks_path=answer.path,
                    flight_recorder=answer.flight_recorder, fr_error=answer.flight_recorder_error)
    if answer.phase != "saved":
        return view
    if answer.flight_recorder is None:
        view.fr_error = view.fr_error or "no flight recorder dump with this answer"
        return view
    try:
        doc = read_dump(storeurl.dump_copy(answer.flight_recorder))
    except OSError as exc:
        view.fr_error = f"cannot read {answer.flight_recorder}: {exc.strerror or exc}"
        return view
    except ValueError as exc:
        view.fr_error = f"{answer.flight_recorder} is unreadable: {exc}"
        return view
    meta = doc.get("cosmos_profiler") or {}
    if view.dumped_at is None and isinstance(meta.get("dumped_at"), (int, float)):
        view.dumped_at = float(meta["dumped_at"])
    if view.last_step_at is None and isinstance(meta.get("last_step_at"), (int, float)):
        view.last_step_at = float(meta["last_step_at"])
    if isinstance(meta.get("fr_trace"), dict):
        view.fr_trace = {str(k): str(v) for k, v in meta["fr_trace"].items() if isinstance(v, str)}
    if doc.get("available"):
        view.groups = group_states(doc)
    else:
        view.fr_error = str(doc.get("reason") or view.fr_error or "the flight recorder is unavailable")
    return view


def find_hang(root: Path, name: str, rank_filter: RankFilter | str | None = None,
              controller: list[ControllerReplica] | None = None, timeout: float | None = None,
              observer: Any = None, fr_trace: bool = True) -> HangReport:
    """Ask every selected live rank of `name` for its stacks and flight recorder, and line them up,
    with torch's fr_trace on the same dumps unless `fr_trace` is False.
    `observer` sees each waiting rank at each poll (`follow.Observer`: the CLI's live progress).

    Raises:
        as `sidecar.fleet.control.request_stacks`.
    """
    from sidecar.fleet import control
    from sidecar.fleet.defaults import DEFAULT_STACKS_TIMEOUT_S

    result = control.dump_stacks(root, name, rank_filter, controller,
                                 DEFAULT_STACKS_TIMEOUT_S if timeout is None else timeout, kind="hang",
                                 observer=observer)
    from sidecar.fleet import torch_fr

    views = [view_of(a) for a in result.ranks]
    theirs = None
    if fr_trace:
        theirs = torch_fr.analyze({v.rank: v.fr_trace for v in views if v.fr_trace}, {v.rank for v in views})
    return analyze(views, name, result.request_id, now=time.time(), theirs=theirs)
