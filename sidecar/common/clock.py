"""Liveness on one clock: the registry filesystem's.

A rank's own clock (its `heartbeat_at`, `started_at`, step times) may run minutes
apart from the CLI host's: a VM after a suspend, a node whose NTP broke. So no
age the CLI judges a rank by compares one host's clock with another's:

- A rank never stamps its record file's time itself: a write, and a liveness tick
  (`os.utime(path)` with no times), get their mtime from the filesystem (the kernel
  on a local disk, the server on NFS). Where a tick would take the writer's own
  clock (FUSE: sshfs sets "now" from the client), the rank rewrites the record instead.
- The CLI reads that filesystem's time now from a probe file it writes in the
  registry (temp + rename) and reads back (`fs_now`).
- A record's age is `fs_now - its file's mtime` (`record_age`); a record older (or
  newer) than `stale_after(record)` is stale (`is_stale`).

Differences between two readings of one rank's clock are fine as they are: a step
rate from `recent_steps`, the seconds from a rank's last step to its dump
(`profile hang`), `heartbeat_at - last_step_at` (`step_age`).

Where no probe can be written (a read-only registry), this host's clock stands in
for the filesystem's and a warning says so once: record mtimes still come from the
filesystem, so only this host's own offset from it counts, not each rank's.

A record built in memory (not read from a file) has no mtime: its `heartbeat_at`
stands in, on the clock of whoever built it.
"""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Protocol

from sidecar.common.layout import CLOCK_PROBE_TEMPLATE
from sidecar.common.registry import atomic_write


class TimedRecord(Protocol):
    """What the clock reads of a rank record (`sidecar.common.records.RankRecord` is one)."""

    @property
    def heartbeat_at(self) -> float: ...

    @property
    def heartbeat_interval(self) -> float: ...

    @property
    def last_step_at(self) -> float | None: ...

    @property
    def file_mtime(self) -> float | None: ...


# A record whose file has not been written or ticked for this many heartbeat intervals is stale.
STALE_HEARTBEATS = 5.0
MIN_STALE_S = 10.0
# A probe's reading is carried forward on this process's monotonic clock for this long.
PROBE_VALID_S = 60.0

# directory -> (the filesystem's time at the probe, time.monotonic() then); None: no probe there
_PROBES: dict[str, tuple[float, float] | None] = {}


def fs_now(directory: str | os.PathLike[str]) -> float:
    """The time now on the clock of the filesystem holding `directory`: the mtime of a
    probe file written there (temp + rename), read back and removed; carried forward
    on the monotonic clock for PROBE_VALID_S. Where `directory` takes no probe
    (read-only, or missing), this host's `time.time()`, with one warning per directory
    when it exists but refuses the probe."""
    key = os.fspath(directory)
    mono = time.monotonic()
    if key in _PROBES:
        probe = _PROBES[key]
        if probe is None:
            return time.time()
        if mono - probe[1] < PROBE_VALID_S:
            return probe[0] + (mono - probe[1])
    if not os.path.isdir(key):
        return time.time()  # nothing there to judge yet; probed once it exists
    at = _probe(Path(key))
    _PROBES[key] = None if at is None else (at, time.monotonic())
    return time.time() if at is None else at


def _probe(directory: Path) -> float | None:
    path = directory / CLOCK_PROBE_TEMPLATE.format(pid=os.getpid(), token=os.urandom(4).hex())
    try:
        atomic_write(path, b"")
        try:
            return os.lstat(path).st_mtime
        finally:
            os.unlink(path)
    except OSError as exc:
        from sidecar.common.log import log  # logging only where there is something to say: the CLI starts without it

        log.warning("[Profiler] cannot write a clock probe in %s (%s): ranks on other hosts are judged "
                    "alive by this host's clock against their records' mtimes", directory, exc.strerror or exc)
        return None


def written_at(record: TimedRecord) -> float:
    """When `record`'s file was last written or ticked, on its filesystem's clock
    (its `heartbeat_at` for a record built in memory)."""
    mtime = record.file_mtime
    return record.heartbeat_at if mtime is None else mtime


def record_age(record: TimedRecord, now: float) -> float:
    """Seconds since `record`'s file was last written or ticked; `now` from `fs_now`."""
    return now - written_at(record)


def stale_after(record: TimedRecord) -> float:
    return max(MIN_STALE_S, STALE_HEARTBEATS * (record.heartbeat_interval or 2.0))


def is_stale(record: TimedRecord, now: float) -> bool:
    """No write or tick for `stale_after` seconds; or one stamped that far in the
    future of the filesystem's clock, which nothing that writes the record honestly does."""
    return abs(record_age(record, now)) > stale_after(record)


def step_age(record: TimedRecord, now: float, stepped_at: float | None = None) -> float:
    """Seconds since `record`'s rank last stepped (its `last_step_at`, or `stepped_at`:
    a time on its clock), as far as its record tells: the record's age, plus the time
    from that step to its last full write (two readings of the rank's clock). A tick
    leaves both readings as they were, so this is short by at most the time since the
    last full write."""
    stepped_at = record.last_step_at if stepped_at is None else stepped_at
    behind = record.heartbeat_at - stepped_at if stepped_at else 0.0
    return max(0.0, record_age(record, now)) + max(0.0, behind)


def to_fs_clock(record: TimedRecord, t: float) -> float:
    """A time `t` read on `record`'s rank's clock (its `started_at`, say), on the
    filesystem's clock: shifted by the rank's offset, as its last full write shows it
    (`heartbeat_at` against the file's mtime; late by the time since, if ticked)."""
    return t + (written_at(record) - record.heartbeat_at)
