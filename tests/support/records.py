"""Rank records: written by hand for CLI tests, and read back as the CLI reads them.

A record made by `alive_record` points at this test process (pid and create
time), so `is_alive` holds, and its file's mtime is its `heartbeat_at` (a record's age); `dead_record` points at a pid whose create time
does not match; `remote_record` lives on another host with a chosen heartbeat age (its file's mtime).
`record` and `wait_record` read what a running sidecar wrote.
"""

from __future__ import annotations

import dataclasses
import os
import time
from pathlib import Path
from typing import Any

import psutil

from sidecar.common.identity import host_name
from sidecar.common.layout import record_path
from sidecar.common.records import RankRecord, start_since_boot, write_record

from .files import read_json
from .wait import wait_for

_CREATE_TIME = psutil.Process().create_time()
_START_SINCE_BOOT = start_since_boot(os.getpid())


def alive_record(registry: Path, replica: str, rank: int, **fields: Any) -> RankRecord:
    now = time.time()
    values: dict[str, Any] = {
        "replica": replica, "role": "policy", "rank": rank, "world_size": 2, "host": host_name(),
        "pid": os.getpid(), "create_time": _CREATE_TIME, "start_since_boot": _START_SINCE_BOOT,
        "started_at": now - 10.0, "heartbeat_at": now,
        "step": 1000, "watch": "inotify",
    }
    values.update(fields)
    record = RankRecord(**values)
    _write(registry, record)
    return record


def _write(registry: Path, record: RankRecord) -> None:
    """Write `record`, its file as old as its heartbeat: a record's age is its file's mtime (sidecar.common.clock)."""
    path = write_record(registry, record)
    os.utime(path, (record.heartbeat_at, record.heartbeat_at))


def dead_record(registry: Path, replica: str, rank: int, **fields: Any) -> RankRecord:
    """Same host, a pid that exists but with another create time: a reused pid, so dead."""
    assert _START_SINCE_BOOT is not None
    return alive_record(registry, replica, rank, create_time=_CREATE_TIME - 1000.0,
                        start_since_boot=_START_SINCE_BOOT - 1000.0, **fields)


def remote_record(registry: Path, replica: str, rank: int, heartbeat_age: float, **fields: Any) -> RankRecord:
    """A rank on another host, last heard `heartbeat_age` seconds ago: its record file's mtime
    (what liveness is judged by, sidecar.common.clock) and its own `heartbeat_at` both that old."""
    return alive_record(registry, replica, rank, host="node-elsewhere", pid=4242,
                        heartbeat_at=time.time() - heartbeat_age, **fields)


def update_record(registry: Path, record: RankRecord, **fields: Any) -> RankRecord:
    record = dataclasses.replace(record, heartbeat_at=time.time(), **fields)
    _write(registry, record)
    return record


def record(registry: Path, replica: str = "r1", rank: int = 0) -> dict:
    """The rank record as the CLI would read it, or {} when absent or half-written."""
    return read_json(record_path(registry, replica, rank)) or {}


def wait_record(registry: Path, pred, replica: str = "r1", rank: int = 0, timeout: float = 60.0, what: str = "") -> dict:
    def check():
        rec = record(registry, replica, rank)
        return rec if rec and pred(rec) else None

    return wait_for(check, timeout, what=what or f"a record of {replica} rank {rank} matching {pred}")


def wait_saved_and_idle(registry: Path, num_captures: int, replica: str = "r1", rank: int = 0,
                        timeout: float = 60.0) -> dict:
    """Wait until the rank has saved `num_captures` captures and is idle again, and return its record.

    A trace file on disk is not enough before the next request: the rank is still `saving` a moment
    after the file lands, and a busy rank refuses a request."""
    return wait_record(registry, lambda r: r.get("num_captures") == num_captures and r.get("state") == "idle",
                       replica, rank, timeout, what=f"{replica} rank {rank} to have saved {num_captures} "
                                                   "capture(s) and be idle")


def node_record(registry: Path, replica: str, host: str, records: list[RankRecord], *, mtime: float,
                written_at: float | None = None, clock_offset: float | None = 0.0, interval: float = 2.0,
                paces: dict[int, Any] | None = None, stale: tuple[int, ...] = (), world_size: int | None = None) -> Path:
    """Write the node record of `host` (sidecar.common.noderecord, as a node agent writes it) for
    `records`, and set its mtime to `mtime` (its last tick, on the filesystem's clock).

    Args:
        written_at: the node's clock at the write (default: `mtime - clock_offset`).
        paces: rank -> its pace anchor (`noderecord.Pace`); the others have none.
        stale: the ranks whose own records went quiet (`fresh` false).
    """
    from sidecar.common import noderecord
    from sidecar.common.layout import node_record_path

    offset = 0.0 if clock_offset is None else clock_offset
    entries = [noderecord.entry(r, (paces or {}).get(r.rank), r.rank not in stale) for r in records]
    data = noderecord.build(replica, host, {"rank": records[0].rank if records else 0, "pid": 1, "epoch": 1}, entries,
                            mtime - offset if written_at is None else written_at, clock_offset, interval)
    world = world_size if world_size is not None else max([r.world_size for r in records] + [1])
    path = node_record_path(registry, replica, host, world)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(data)
    os.utime(path, (mtime, mtime))
    return path
