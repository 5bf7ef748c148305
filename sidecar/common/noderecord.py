"""Node records: one file on shared storage for all the ranks of one node.

    <registry>/replicas/<replica>/nodes/<shard>/<host>.json   (sidecar.common.layout.node_record_path)

Where the registry sits on shared storage, the ranks of a node keep their own records in a
node-local registry (tmpfs), and one of them, the node's agent (sidecar.rank.nodeagent),
rolls them up into this file. It is rewritten only when what it says changes; while nothing
does, the agent sets its mtime to now (a liveness tick, stamped by the filesystem's clock, as
a rank's own record is: sidecar.common.clock).

A moving step counter is not a change. Each rank's entry holds a pace anchor: its step
`step` at time `t` (on the node's clock) and its rate `rate`, steps per second. The agent
checks the anchor against the rank's own record at every tick and writes a new one only when
the rank ran away from it (`AHEAD_S`, `BEHIND_S`). A reader projects the anchor to the
file's last tick (`expand`), so each rank reads as a rank record ticked then.

    {"node_format": 1, "replica", "host",
     "agent": {"rank", "pid", "epoch"},
     "written_at": the node's clock at the write,
     "clock_offset": the filesystem's clock less the node's (measured by a probe), or null,
     "heartbeat_interval": how often the agent ticks the file,
     "common": {what every entry holds alike, less the record fields at their defaults},
     "ranks": [{<rank record fields>, "pace": {"t", "step", "rate"} | null, "fresh": bool}, ...]}

An entry is `common`, the defaults, and its own keys (`build` factors them out, `node_entries`
puts them back); a reader checks `common` once and each field of the entries a column at a time.

`fresh` is false for a rank whose own record went quiet (hung, the GIL held, killed): its
entry then keeps the time of its last heartbeat, and ages from there, not from the ticks.

Pure: data in, data out; the reads and writes are the callers' (`read_node_record`,
`sidecar.rank.nodeagent`).
"""

from __future__ import annotations

import functools
import itertools
import json
import math
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any, NamedTuple

from sidecar.common.recordcheck import MAX_FLOAT, MAX_SAFE_INT, loads
from sidecar.common.records import RECORD_FIELDS, RECORD_SCHEMA, RankRecord, RecordError, read_capped

_SCHEMA = RECORD_SCHEMA

NODE_FORMAT = 1
MAX_NODE_BYTES = 16 << 20
# A rank more than this many seconds of its pace ahead of its anchor, or this far behind,
# gets a new anchor: ahead is what would make a start step come too early, so it is tight.
AHEAD_S = 0.5
BEHIND_S = 5.0
MIN_DRIFT_STEPS = 3
# Fields of a rank record that move without a change of state: the anchor stands for them.
VOLATILE = ("heartbeat_at", "step", "recent_steps", "last_step_at")
# Keys of a rank's slowdown watch that move with every step.
VOLATILE_SLOWDOWN = ("median_s", "steps_seen")


class Pace(NamedTuple):
    """A rank's step `step` at time `t` (the node's clock), running at `rate` steps per second.
    A named tuple, not a frozen dataclass: `replica ls` makes one per rank, 10,000 at a time, and a
    frozen dataclass's constructor sets each field through object.__setattr__."""

    t: float
    step: int
    rate: float

    def at(self, t: float) -> float:
        return self.step + self.rate * max(0.0, t - self.t)

    def to_json(self) -> dict[str, float]:
        return {"t": round(self.t, 4), "step": self.step, "rate": round(self.rate, 4)}


def ahead_slack(rate: float) -> float:
    """How many steps a rank at `rate` may run ahead of its anchor before it gets a new one: a
    reader plans a start step that far later (`RankRecord.step_slack`)."""
    return max(MIN_DRIFT_STEPS, rate * AHEAD_S)


def behind_slack(rate: float) -> float:
    """How many steps a rank at `rate` may fall behind its anchor before it gets a new one (at the
    node record's next tick: a start step planned from it only comes later than it need)."""
    return max(MIN_DRIFT_STEPS, rate * BEHIND_S)


def entry(record: RankRecord, pace: Pace | None, fresh: bool) -> dict[str, Any]:
    """One rank's entry: its record with the volatile fields as of its anchor (a reader projects
    the anchor: `expand`). Its samples (`recent_steps`) and, while it steps, the time of its last
    step are the anchor's too: they move with every step, and would make every tick a rewrite."""
    fields = {name: getattr(record, name) for name in RECORD_FIELDS}
    if pace is not None:
        fields["step"] = pace.step
        fields["heartbeat_at"] = pace.t
        fields["recent_steps"] = []
        if pace.rate > 0:
            fields["last_step_at"] = pace.t
    slowdown = fields.get("slowdown")
    if isinstance(slowdown, dict):
        fields["slowdown"] = slowdown = dict(slowdown)
    fields["pace"] = pace.to_json() if pace is not None else None
    fields["fresh"] = fresh
    return fields


def content_key(entries: Sequence[dict[str, Any]], agent: dict[str, Any], clock_offset: float | None,
                heartbeat_interval: float) -> bytes:
    """What a rewrite would change: the entries less the slowdown watch's moving keys."""
    def stable(e: dict[str, Any]) -> dict[str, Any]:
        slowdown = e.get("slowdown")
        if isinstance(slowdown, dict):
            e = dict(e, slowdown={k: v for k, v in slowdown.items() if k not in VOLATILE_SLOWDOWN})
        return e

    offset = None if clock_offset is None else round(clock_offset, 1)
    return json.dumps([[stable(e) for e in entries], agent, offset, heartbeat_interval],
                      sort_keys=True, default=str).encode()


def build(replica: str, host: str, agent: dict[str, Any], entries: Sequence[dict[str, Any]],
          written_at: float, clock_offset: float | None, heartbeat_interval: float) -> bytes:
    """The node record's bytes. What every entry holds alike (the replica, the host, the job's
    settings, the fields at their defaults) is written once, as `common`; each entry keeps the
    rest (`factor`): a reader merges the two (`node_entries`)."""
    common, own = factor(entries)
    node = {"node_format": NODE_FORMAT, "replica": replica, "host": host, "agent": agent,
            "written_at": round(written_at, 4), "clock_offset": clock_offset,
            "heartbeat_interval": heartbeat_interval, "common": common, "ranks": own}
    return (json.dumps(node, sort_keys=True) + "\n").encode()


def factor(entries: Sequence[dict[str, Any]]) -> tuple[dict[str, Any], list[dict[str, Any]]]:
    """(the keys and values every entry holds alike, less the record fields at their defaults,
    which a reader fills in; each entry less those)."""
    if not entries:
        return {}, []
    first, rest = entries[0], entries[1:]
    alike = {key: value for key, value in first.items()
             if all(key in e and type(e[key]) is type(value) and e[key] == value for e in rest)}
    common = {key: value for key, value in alike.items() if not _is_default(key, value)}
    return common, [{k: v for k, v in e.items() if k not in alike} for e in entries]


def _is_default(key: str, value: Any) -> bool:
    default = _DEFAULTS.get(key, _DEFAULTS)  # _DEFAULTS itself: no default (a required field, or no field)
    return default is not _DEFAULTS and type(value) is type(default) and value == default


def node_entries(node: dict[str, Any]) -> list[dict[str, Any]]:
    """A node record's entries, whole (the defaults and `common` merged into each), as `entry` made them."""
    common = node.get("common") or {}
    fresh = RECORD_SCHEMA.factories  # lists of their own, not _DEFAULTS'
    return [{**_DEFAULTS, **{name: factory() for name, factory in fresh}, **common, **raw} if isinstance(raw, dict)
            else raw for raw in node["ranks"]]


# The record fields with a default (a fresh empty list for the default factories): left out of `common`.
_DEFAULTS: dict[str, Any] = {**RECORD_SCHEMA.defaults, **{name: factory() for name, factory in RECORD_SCHEMA.factories}}


# --- reading ---------------------------------------------------------------


def read_node_file(path: str | os.PathLike[str]) -> tuple[dict[str, Any], float]:
    """(the node record's object, its file's mtime), read the safe way (as `records.read_record`).

    Raises:
        FileNotFoundError: it is gone.
        RecordError: anything else; the message names the file.
    """
    data, st = read_node_bytes(path)
    return parse_node_bytes(data, path), st.st_mtime


def read_node_bytes(path: str | os.PathLike[str]) -> tuple[bytes, os.stat_result]:
    """A node record file's bytes and its stat (from the open descriptor), read the safe way
    (`records.read_capped`: O_NOFOLLOW, O_NONBLOCK, a regular file only, at most MAX_NODE_BYTES).

    Raises:
        FileNotFoundError: it is gone.
        RecordError: anything else; the message names the file.
    """
    return read_capped(path, "node record", MAX_NODE_BYTES)


def parse_node_bytes(data: bytes, path: str | os.PathLike[str] = "") -> dict[str, Any]:
    """A node record's object from its file's bytes, its envelope checked (the entries are `parse_node`'s).

    Raises:
        RecordError: not JSON, or not a node record of this format; the message names the file.
    """
    try:
        node = loads(data)
    except (ValueError, RecursionError) as exc:
        raise RecordError(f"node record {path} is not JSON ({exc})") from None
    if not isinstance(node, dict) or node.get("node_format") != NODE_FORMAT or not isinstance(node.get("ranks"), list) \
            or not isinstance(node.get("common", {}), dict):
        raise RecordError(f"node record {path} is not a node record of format {NODE_FORMAT}")
    return node


def _number(value: Any, default: float) -> float:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) \
        else default


@dataclass
class ParsedNode:
    """A node record's entries, each checked once (`parse_node`); `project` turns them into rank
    records as of one mtime of the file, as often as the file is ticked, without checking again."""

    interval: float  # the agent's heartbeat interval
    written: float | None  # when it was written, on the node's clock
    clock_offset: float | None  # measured: the filesystem's clock less the node's
    # Each good entry: its record as written (the volatile fields as of its anchor), its pace
    # (None: none, or a rank standing still), and whether the rank's own record was fresh.
    entries: list[tuple[RankRecord, Pace | None, bool]]
    problems: list[tuple[int | None, str]]  # the entries that are no good: (rank or None, why)


def parse_node(node: dict[str, Any], path: str = "") -> ParsedNode:
    """Check a node record's entries (a record from `read_node_file`), once per content: the
    fields the entries share (`common`) once, then each entry's own. The entries are taken
    over (their `pace` and `fresh` taken out): the caller must not use `node` afterwards."""
    return parse_nodes([(node, path)])[0]


def parse_nodes(nodes: Sequence[tuple[dict[str, Any], str]]) -> list[ParsedNode]:
    """`parse_node` of each (node, path), checked together: the node records whose entries hold
    the same keys (and whose `common` does: those of one job) a field at a time for all of them,
    a column of 10,000 ranks' values at once rather than a node's 8 at a time; each node alone
    (`_parse_alone`) where a column does not pass, so that a problem names its entry."""
    parsed: list[ParsedNode | None] = [None] * len(nodes)
    groups: dict[tuple[tuple[str, ...], tuple[str, ...]], list[int]] = {}
    for i, (node, _) in enumerate(nodes):
        raws = node["ranks"]
        first = raws[0] if raws else None
        if type(first) is dict:
            same = first.keys()
            if all(type(raw) is dict and raw.keys() == same for raw in raws):
                groups.setdefault((tuple(node.get("common") or {}), tuple(first)), []).append(i)
    for (common_keys, keys), members in groups.items():
        anchors = _group_anchors([nodes[i][0] for i in members], common_keys, keys)
        if anchors is not None:
            at = 0
            for i in members:
                node = nodes[i][0]
                parsed[i] = _parse_alike(node, keys, anchors[at:at + len(node["ranks"])])
                at += len(node["ranks"])
    return [_parse_alone(node, path) if got is None else got for got, (node, path) in zip(parsed, nodes, strict=True)]


_NOT_FIELDS = frozenset(("pace", "fresh"))  # an entry's keys that are no fields of a record


def _group_anchors(group: list[dict[str, Any]], common_keys: tuple[str, ...],
                   keys: tuple[str, ...]) -> list[Pace | None] | None:
    """The pace anchors of every entry of the node records `group`, in order, where every entry
    is good (their `common`s hold the keys `common_keys`, each of their entries `keys`): each
    field checked a column at a time for all of them, the required ones present, the paces
    good; None where one is not."""
    if not set(keys) - _NOT_FIELDS <= _SCHEMA.names or any(name not in keys and name not in common_keys
                                                            for name in _SCHEMA.required):
        return None
    commons = [node.get("common") or {} for node in group]
    if common_keys and not _SCHEMA.columns_pass(commons):
        return None
    rows = [raw for node in group for raw in node["ranks"]]
    if not _SCHEMA.columns_pass(rows):
        return None
    paces = [raw["pace"] for raw in rows] if "pace" in keys else \
        [common.get("pace") for node, common in zip(group, commons, strict=True) for _ in node["ranks"]]
    return _pace_column(paces)


def _parse_alike(node: dict[str, Any], keys: tuple[str, ...], anchors: list[Pace | None]) -> ParsedNode:
    """`parse_node` of a node record whose entries are all good, hold the keys `keys` and have
    the pace anchors `anchors` (`_group_anchors`): each record made from one copy of the values
    its entries share, and its own."""
    common = node.get("common") or {}
    common.pop("pace", None)  # no fields of a record: the pace is in `anchors`
    common_fresh = common.pop("fresh", None)
    base, _, shared = _SCHEMA.base(common)
    # The entries' own fields first under the field names themselves: `update` keeps a key it has.
    base.update(dict.fromkeys(_SCHEMA.canonical[name] for name in keys if name not in _NOT_FIELDS))
    raws = node["ranks"]
    if "pace" in keys:
        for raw in raws:
            del raw["pace"]
    fresh = [raw.pop("fresh") is True for raw in raws] if "fresh" in keys else [common_fresh is True] * len(raws)
    copies = tuple(name for name in shared if name not in keys)  # lists and objects: each record its own
    cls = _SCHEMA.cls
    new = cls.__new__
    records = []
    for raw in raws:
        values = base.copy()
        for name in copies:
            values[name] = values[name].copy()
        values.update(raw)
        record = new(cls)
        record.__dict__ = values
        records.append(record)
    return _envelope(node, list(zip(records, anchors, fresh, strict=True)), [])


def _envelope(node: dict[str, Any], entries: list[tuple[RankRecord, Pace | None, bool]],
              problems: list[tuple[int | None, str]]) -> ParsedNode:
    offset = _number(node.get("clock_offset"), math.nan)
    written = _number(node.get("written_at"), math.nan)
    return ParsedNode(interval=_number(node.get("heartbeat_interval"), 2.0),
                      written=None if math.isnan(written) else written,
                      clock_offset=None if math.isnan(offset) else offset, entries=entries, problems=problems)


def _parse_alone(node: dict[str, Any], path: str) -> ParsedNode:
    """`parse_node` of one node record, each entry on its own where a column does not pass."""
    entries: list[tuple[RankRecord, Pace | None, bool]] = []
    problems: list[tuple[int | None, str]] = []
    common = node.get("common") or {}
    common_pace, common_fresh = common.pop("pace", None), common.pop("fresh", None)  # no fields of a record
    try:
        _SCHEMA.check_fields(common)
        shared_error = ""
    except ValueError as exc:
        shared_error = f"{exc} (in the fields its ranks share)"
    base, required, shared = _SCHEMA.base(common)
    raws = node["ranks"]
    for raw in raws:
        if type(raw) is dict:
            raw["\0"] = (raw.pop("pace", common_pace), raw.pop("fresh", common_fresh))  # no fields of a record
    # The entries' fields a column at a time (one check for all when they share their keys, as
    # the entries of one node do); each entry alone only when a column does not pass.
    keys = {tuple(raw) for raw in raws if type(raw) is dict}
    checked = len(keys) == 1 and _SCHEMA.columns_pass([raw for raw in raws if type(raw) is dict])
    for raw in raws:
        if type(raw) is not dict:
            problems.append((None, f"node record {path}: an entry is not an object"))
            continue
        pace, fresh = raw.pop("\0")
        try:
            if shared_error:
                raise ValueError(shared_error)
            if not checked:
                _SCHEMA.check_fields(raw)
            record = _SCHEMA.assemble(base, raw, required, shared)
            anchor = _pace(pace)
        except ValueError as exc:
            rank = raw.get("rank", common.get("rank"))
            rank = rank if type(rank) is int else None
            problems.append((rank, f"node record {path}: rank {rank}: {exc}"))
            continue
        entries.append((record, anchor, fresh is True))
    return _envelope(node, entries, problems)


def _pace_column(paces: list[Any]) -> list[Pace | None] | None:
    """Each entry's pace anchor (`_pace`) where every one of them is good, checked a column at a
    time; None where one is not (`_pace` on each says which)."""
    objs = [pace for pace in paces if pace is not None]
    if not objs:
        return [None] * len(paces)
    if not all(type(pace) is dict for pace in objs):
        return None
    ts: list[Any] = list(map(dict.get, objs, itertools.repeat("t")))
    steps: list[Any] = list(map(dict.get, objs, itertools.repeat("step")))
    rates: list[Any] = list(map(dict.get, objs, itertools.repeat("rate")))
    if not set(map(type, ts)) <= {float} or not set(map(type, steps)) <= {int} \
            or not set(map(type, rates)) <= {float, int}:
        return None  # ints as times: checked one by one (their bounds are not a float's)
    total = sum(ts)  # NaN if any is NaN
    if total != total or min(ts) < -MAX_FLOAT or max(ts) > MAX_FLOAT or min(steps) < 0 or max(steps) > MAX_SAFE_INT:
        return None
    total = sum(rates)
    if total != total or min(rates) < 0 or max(rates) > MAX_RATE:
        return None
    if len(objs) == len(paces) and set(map(type, rates)) == {float} and min(rates) > 0:
        return list(map(_new_pace, zip(ts, steps, rates, strict=True)))  # every rank steps, each a Pace of its 3 values
    made = iter([Pace(t, step, float(rate)) if rate > 0 else None for t, step, rate in
                 zip(ts, steps, rates, strict=True)])
    return [None if pace is None else next(made) for pace in paces]


_new_pace = functools.partial(tuple.__new__, Pace)  # Pace(*values), without a call of Python code each


# A pace past this many steps per second is no training job's: the entry is bad.
MAX_RATE = 1e6


def _pace(pace: Any) -> Pace | None:
    """An entry's pace anchor; None when it has none, or runs at no rate (a rank standing still).

    Raises:
        ValueError: not a pace (says why).
    """
    if pace is None:
        return None
    if type(pace) is not dict:
        raise ValueError("its pace is not an object")
    t, step, rate = pace.get("t"), pace.get("step"), pace.get("rate")
    if type(t) is not float or not -MAX_FLOAT <= t <= MAX_FLOAT:  # NaN fails this too
        if type(t) is not int or not -MAX_SAFE_INT <= t <= MAX_SAFE_INT:
            raise ValueError(f"its pace's time must be a finite number, got {t!r}")
    if type(step) is not int or not 0 <= step <= MAX_SAFE_INT:
        raise ValueError(f"its pace's step must be an integer between 0 and {MAX_SAFE_INT}, got {step!r}")
    if (type(rate) is not float and type(rate) is not int) or not 0 <= rate <= MAX_RATE:
        raise ValueError(f"its pace's rate must be a number between 0 and {MAX_RATE:g}, got {rate!r}")
    return Pace(float(t), step, float(rate)) if rate > 0 else None


def project(parsed: ParsedNode, mtime: float, copy: bool = True) -> list[RankRecord]:
    """The rank records `parsed` stands for, each as a record ticked at the file's `mtime`: new
    objects every call, the parsed ones left as they are for the next tick (`copy`; without
    it, the parsed ones themselves, for a caller that reads the file once)."""
    # The filesystem's clock less the node's: measured, else as the write shows it (late by the
    # time since, when ticked).
    offset = parsed.clock_offset if parsed.clock_offset is not None else (
        0.0 if parsed.written is None else mtime - parsed.written)
    tick = mtime - offset  # the last tick, on the node's clock
    # What every fresh entry of the file reads alike, set in one update each.
    ticked = {"heartbeat_interval": parsed.interval, "mtime_heartbeat": True, "heartbeat_at": tick, "file_mtime": mtime}
    stepping = {**ticked, "last_step_at": tick}  # and for a rank with a pace
    slack: dict[float, float] = {}  # by rate: the ranks of a node mostly run at one
    floor = math.floor
    records: list[RankRecord] = []
    for template, anchor, fresh in parsed.entries:
        if copy:
            record = template.__class__.__new__(template.__class__)
            record.__dict__ = values = template.__dict__.copy()
        else:
            record, values = template, template.__dict__
        if fresh and template.exited_at is None:
            if anchor is None:
                values.update(ticked)
            else:
                values.update(stepping)
                t0, step0, rate = anchor
                step = floor(step0 + rate * (tick - t0)) if tick > t0 else step0
                values["step"] = step = step if step <= MAX_SAFE_INT else MAX_SAFE_INT
                # Two (time, step) samples on the anchor's line that give its rate exactly to a reader
                # (`startstep.recent_rate`, which counts whole steps): the anchor, and the moment the
                # projection reached `step`; or, for a step not past the anchor's, the step before it.
                values["recent_steps"] = ([[t0, step0], [t0 + (step - step0) / rate, step]] if step > step0
                                          else [[t0 - 1.0 / rate, step0 - 1], [t0, step0]])
                values["step_slack"] = slack.get(rate) or slack.setdefault(rate, ahead_slack(rate))
        else:
            values["file_mtime"] = template.heartbeat_at + offset  # its own last heartbeat, on the filesystem's clock
        records.append(record)
    return records


def expand(node: dict[str, Any], mtime: float, path: str = "") -> tuple[list[RankRecord], list[tuple[int | None, str]]]:
    """The rank records a node record stands for, each as a record ticked at the file's `mtime`
    (see the module docstring); and the entries that are no good, as (rank or None, why)."""
    parsed = parse_node(node, path)
    return project(parsed, mtime, copy=False), parsed.problems


def node_ranks(entries: Iterable[dict[str, Any]]) -> list[int]:
    return sorted(e["rank"] for e in entries if isinstance(e.get("rank"), int))
