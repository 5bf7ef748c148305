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
     "ranks": [{<rank record fields>, "pace": {"t", "step", "rate"} | null, "fresh": bool}, ...]}

`fresh` is false for a rank whose own record went quiet (hung, the GIL held, killed): its
entry then keeps the time of its last heartbeat, and ages from there, not from the ticks.

Pure: data in, data out; the reads and writes are the callers' (`read_node_record`,
`sidecar.rank.nodeagent`).
"""

from __future__ import annotations

import errno
import json
import math
import os
import stat
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from sidecar.common.records import RECORD_FIELDS, RankRecord, RecordError, parse_record_object

NODE_FORMAT = 1
MAX_NODE_BYTES = 16 << 20
# A rank more than this many seconds of its pace ahead of its anchor, or this far behind,
# gets a new anchor: ahead is what would make a start step come too early, so it is tight.
AHEAD_S = 0.5
BEHIND_S = 2.0
MIN_DRIFT_STEPS = 3
# Fields of a rank record that move without a change of state: the anchor stands for them.
VOLATILE = ("heartbeat_at", "step", "recent_steps", "last_step_at")
# Keys of a rank's slowdown watch that move with every step.
VOLATILE_SLOWDOWN = ("median_s", "steps_seen")


@dataclass(frozen=True)
class Pace:
    """A rank's step `step` at time `t` (the node's clock), running at `rate` steps per second."""

    t: float
    step: int
    rate: float

    def at(self, t: float) -> float:
        return self.step + self.rate * max(0.0, t - self.t)

    def to_json(self) -> dict[str, float]:
        return {"t": round(self.t, 4), "step": self.step, "rate": round(self.rate, 4)}


def drifted(pace: Pace | None, step: float, now: float) -> bool:
    """Whether a rank that has probably reached `step` at `now` ran away from `pace`."""
    if pace is None:
        return True
    expected = pace.at(now)
    rate = pace.rate
    ahead = max(MIN_DRIFT_STEPS, rate * AHEAD_S)
    behind = max(MIN_DRIFT_STEPS, rate * BEHIND_S)
    return step - expected > ahead or expected - step > behind


def entry(record: RankRecord, pace: Pace | None, fresh: bool) -> dict[str, Any]:
    """One rank's entry: its record with the volatile fields as of its anchor."""
    fields = {name: getattr(record, name) for name in RECORD_FIELDS}
    if pace is not None:
        fields["step"] = pace.step
        fields["heartbeat_at"] = pace.t
        # The samples move at every heartbeat: the anchor stands for them (`expand` makes two of it).
        fields["recent_steps"] = [[round(pace.t, 4), pace.step]]
        if pace.rate > 0:
            fields["last_step_at"] = round(pace.t, 4)
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
    node = {"node_format": NODE_FORMAT, "replica": replica, "host": host, "agent": agent,
            "written_at": round(written_at, 4), "clock_offset": clock_offset,
            "heartbeat_interval": heartbeat_interval, "ranks": list(entries)}
    return (json.dumps(node, sort_keys=True) + "\n").encode()


# --- reading ---------------------------------------------------------------

_OPEN_FLAGS = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0)


def read_node_file(path: str | os.PathLike[str]) -> tuple[dict[str, Any], float]:
    """(the node record's object, its file's mtime), read the safe way (as `records.read_record`).

    Raises:
        FileNotFoundError: it is gone.
        RecordError: anything else; the message names the file.
    """
    try:
        fd = os.open(path, _OPEN_FLAGS)
    except FileNotFoundError:
        raise
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise RecordError(f"node record {path} is a symlink; refusing to follow it") from None
        raise RecordError(f"cannot open node record {path}: {exc.strerror or exc}") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise RecordError(f"node record {path} is not a regular file (a FIFO, socket, device or directory)")
        if st.st_size > MAX_NODE_BYTES:
            raise RecordError(f"node record {path} is {st.st_size} bytes; the limit is {MAX_NODE_BYTES}")
        chunks, left = [], st.st_size + 1
        while left > 0:
            chunk = os.read(fd, left)
            if not chunk:
                break
            chunks.append(chunk)
            left -= len(chunk)
        data = b"".join(chunks)
    except OSError as exc:
        raise RecordError(f"cannot read node record {path}: {exc.strerror or exc}") from None
    finally:
        os.close(fd)
    try:
        node = json.loads(data)
    except ValueError as exc:
        raise RecordError(f"node record {path} is not JSON ({exc})") from None
    if not isinstance(node, dict) or node.get("node_format") != NODE_FORMAT or not isinstance(node.get("ranks"), list):
        raise RecordError(f"node record {path} is not a node record of format {NODE_FORMAT}")
    return node, st.st_mtime


def _number(value: Any, default: float) -> float:
    return float(value) if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) \
        else default


def expand(node: dict[str, Any], mtime: float, path: str = "") -> tuple[list[RankRecord], list[tuple[int | None, str]]]:
    """The rank records a node record stands for, each as a record ticked at the file's `mtime`
    (see the module docstring); and the entries that are no good, as (rank or None, why)."""
    interval = _number(node.get("heartbeat_interval"), 2.0)
    written = _number(node.get("written_at"), mtime)
    offset_value = node.get("clock_offset")
    # The filesystem's clock less the node's: measured, else as the write shows it (late by the
    # time since, when ticked).
    offset = _number(offset_value, mtime - written) if offset_value is not None else mtime - written
    tick = mtime - offset  # the last tick, on the node's clock
    records: list[RankRecord] = []
    problems: list[tuple[int | None, str]] = []
    for raw in node["ranks"]:
        if not isinstance(raw, dict):
            problems.append((None, f"node record {path}: an entry is not an object"))
            continue
        obj = {k: v for k, v in raw.items() if k in RECORD_FIELDS}
        pace = raw.get("pace")
        fresh = raw.get("fresh") is True
        try:
            record = parse_record_object(obj)
        except ValueError as exc:
            rank = raw.get("rank") if isinstance(raw.get("rank"), int) else None
            problems.append((rank, f"node record {path}: rank {rank}: {exc}"))
            continue
        if fresh and record.exited_at is None:
            record.heartbeat_interval = interval
            record.mtime_heartbeat = True
            record.file_mtime = mtime
            if isinstance(pace, dict) and _number(pace.get("rate"), 0.0) > 0:
                anchor = Pace(_number(pace.get("t"), tick), int(_number(pace.get("step"), record.step)),
                              _number(pace.get("rate"), 0.0))
                record.step = math.floor(anchor.at(tick))
                record.recent_steps = [[round(anchor.t, 4), anchor.step], [round(tick, 4), record.step]]
                record.last_step_at = tick
            record.heartbeat_at = tick
        else:
            record.file_mtime = record.heartbeat_at + offset  # its own last heartbeat, on the filesystem's clock
        records.append(record)
    return records, problems


def node_ranks(entries: Iterable[dict[str, Any]]) -> list[int]:
    return sorted(e["rank"] for e in entries if isinstance(e.get("rank"), int))
