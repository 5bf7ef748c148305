"""The rank record: built in one place from every room, written by one writer, kept fresh by the heartbeat.

`RecordPublisher` builds this rank's `RankRecord` (`record`): who the rank is, where it stands
with its requests (`CaptureOwner.record_fields`), the step and pace (`rank.heartbeat`), the
signal trigger, the stall and slowdown watches, faulthandler's stacks and the uploads. It
owns the `Heartbeat` that publishes it (`publish`, at every heartbeat and at once when a
state change wakes it), and sends an idle heartbeat to `idle_tick`, which only sets the file's
mtime while nothing changed.

`RecordWriter` writes the record atomically (or, when only its heartbeat moved, sets the
file's mtime to now: a liveness tick of one utime, stamped by the filesystem's clock, never
the rank's: see sidecar.common.clock) and, before each write, notices another live process
writing the same record (a second job under this replica name with an overlapping rank): it
logs that once per writer and publishes it as the record's `conflict`, which `replica ls` shows.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sidecar.common import capturesummary, clock, layout
from sidecar.common.identity import RankIdentity
from sidecar.common.records import (
    RECORD_FIELDS,
    RankRecord,
    RecordError,
    State,
    is_alive,
    read_record,
    start_since_boot,
)
from sidecar.common.registry import atomic_write, ensure_dir
from sidecar.common.version import __version__
from sidecar.rank.context import RankContext
from sidecar.rank.faulthandler_stacks import FaultStacks
from sidecar.rank.heartbeat import Heartbeat
from sidecar.rank.saver import Saver
from sidecar.rank.signalowner import SignalOwner
from sidecar.rank.stall import StallWatch, stall_json
from sidecar.rank.triggers.file import FileTrigger
from sidecar.rank.watches import Watches

log = logging.getLogger("sidecar")


class RecordPublisher:
    """Builds and publishes one rank's record (see the module docstring). Built last, from the
    rooms it reads; it builds the heartbeat and gives it to the context (`RankContext.wake`).

    `identity` is the one the record shows: the Cosmos-RL profiler widens its `world_size` to
    its parallel dims' after the rooms were built (`Sidecar.identity`).
    """

    def __init__(self, ctx: RankContext, *, signals: SignalOwner, watches: Watches, saver: Saver,
                 file_trigger: FileTrigger, fault_stacks: FaultStacks, stall_watch: StallWatch | None) -> None:
        self._ctx = ctx
        self.identity = ctx.identity
        self._signals = signals
        self._watches = watches
        self._saver = saver
        self._file_trigger = file_trigger
        self._fault_stacks = fault_stacks
        self._stall_watch = stall_watch
        self.started_at = time.time()
        self._create_time = _process_create_time()
        self._start_since_boot = start_since_boot(os.getpid())
        self._published_signals = 0  # the count of signals in the record last written
        self._published_summaries: list[dict[str, Any]] = []  # the summaries file last written
        self._published_trigger = False  # whether that record named a trigger signal
        self.writer = RecordWriter(ctx.record_path, ctx.identity, ctx.trace_dir, ctx.log.once, ctx.log.forget)
        self.heartbeat = Heartbeat(ctx.settings.heartbeat_interval, ctx.steps, self.publish, self.idle_tick)
        ctx.heartbeat = self.heartbeat

    def record(self, exited: bool = False) -> RankRecord:
        """A snapshot of this rank's record."""
        ctx, settings = self._ctx, self._ctx.settings
        recent = self.heartbeat.recent()
        stall = self._stall_watch
        fault_stacks = self._fault_stacks.info() if self._fault_stacks.check() else None
        trigger = self._signals.check()
        capture = ctx.capture.record_fields()
        state = capture.pop("state")
        return RankRecord(
            **identity_fields(self.identity),
            **capture,
            create_time=self._create_time,
            start_since_boot=self._start_since_boot,
            started_at=self.started_at,
            heartbeat_at=time.time(),
            heartbeat_interval=settings.heartbeat_interval,
            mtime_heartbeat=True,
            step=ctx.steps(),
            state=State.STALLED.value if stall is not None and stall.is_stalled else state,
            enabled=ctx.enabled,
            watch=self._file_trigger.mode,
            poll_interval=settings.poll_interval,
            defaults={k: (v.to_json() if k == "rank_filter" else v) for k, v in ctx.defaults.items()},
            output_dir=str(ctx.output_dir),
            recent_steps=[[round(t, 4), n] for t, n in recent],
            last_step_at=round(self.heartbeat.last_step_at, 3),
            num_signals=self._signals.count,
            signal=trigger.name if trigger is not None else None,
            num_coalesced=self._signals.num_coalesced,
            version=__version__,
            exited_at=time.time() if exited else None,
            conflict=dict(self.writer.conflict) if self.writer.conflict else None,
            fault_stacks=fault_stacks,
            stall_after_s=settings.stall_after_s,
            stall=stall_json(stall.shown) if stall is not None else None,
            **self._saver.upload_fields(),
            counts_steps_by=ctx.counts_steps_by,
            cannot_trace=ctx.cannot_trace,
            slowdown=self._watches.to_json(),
        )

    def publish(self, exited: bool = False) -> None:
        """Build the record and write it (`RecordWriter.publish`); a failure is logged once."""
        ctx = self._ctx
        self.writer.check()
        record = self.record(exited=exited)
        self.heartbeat.published_steps = [(t, int(n)) for t, n in record.recent_steps]
        self._published_signals = record.num_signals
        self._published_trigger = record.signal is not None
        try:
            self.writer.publish(record)
            ctx.log.forget("publish")
        except OSError as exc:
            ctx.log.once("publish", logging.ERROR,
                         f"[Profiler] cannot write rank record under {ctx.registry_root}: {exc}")
        self._publish_summaries()

    def _publish_summaries(self) -> None:
        """The summaries of the last captures (`Saver.summaries`) beside the record, when they changed
        (after a capture is summarized, or its upload ends): a file of their own, since every
        `replica ls` reads the record and only the analysis commands read these."""
        summaries = self._saver.summaries()
        if not summaries or summaries == self._published_summaries:
            return
        ctx, identity = self._ctx, self.identity
        path = layout.carried_summaries_path(ctx.registry_root, identity.replica, identity.rank)
        try:
            ensure_dir(path.parent)
            atomic_write(path, capturesummary.carried_file(identity.replica, identity.rank, summaries))
            self._published_summaries = summaries
            ctx.log.forget("summaries")
        except OSError as exc:
            ctx.log.once("summaries", logging.WARNING, f"[Profiler] cannot write {path}: {exc}")

    def idle_tick(self) -> None:
        """An idle heartbeat (see Heartbeat._run): the record file's mtime only, unless the
        file is not ours any more, faulthandler's handler was replaced, the trigger's signal
        changed hands or a signal came (its handler only counts it, without a wake); then in full."""
        stacks_on = self._fault_stacks.installed
        trigger_on = self._signals.check() is not None
        if (self._fault_stacks.check() != stacks_on or trigger_on != self._published_trigger
                or self._signals.count != self._published_signals or not self.writer.tick()):
            self.publish()


def identity_fields(identity: RankIdentity) -> dict[str, Any]:
    """replica, role, rank, local_rank, world_size, host, pid, job."""
    return {"replica": identity.replica, "role": identity.role, "rank": identity.rank,
            "local_rank": identity.local_rank, "world_size": identity.world_size, "host": identity.host,
            "pid": identity.pid, "job": identity.job}


def _process_create_time() -> float:
    try:
        import psutil

        return psutil.Process().create_time()
    except Exception:  # noqa: BLE001
        return time.time()


class RecordWriter:
    """Writes one rank's record, and notices a second live writer of it."""

    def __init__(self, path: Path, identity: RankIdentity, trace_dir: Path,
                 log_once: Callable[[str, int, str], None], forget: Callable[[str], None]) -> None:
        self.path = Path(path)
        self.identity = identity
        self.trace_dir = trace_dir
        self._log_once = log_once
        self._forget = forget
        self._inode: int | None = None  # of the record file as we last wrote it
        self._ours = False  # the file at `path` is the one we last wrote (as of `check`)
        self._last_content: bytes | None = None  # what we last wrote, less what a tick may change (`_content`)
        self.conflict: dict[str, Any] | None = None  # another live writer (RankRecord.conflict)
        # A tick is `os.utime(path)`: "now" by the filesystem's clock. Not on FUSE, where sshfs
        # takes "now" from this host's clock (SFTP sets no server time): there the record is rewritten.
        self._ticks = not _on_fuse(self.path.parent)

    def check(self) -> None:
        """Before each write, one lstat: a record file that is not the one we last
        wrote (a rename gives a new inode) was written by someone else; it is read
        (safely) and, when its writer is alive and not this process, the conflict
        is logged once per writer. It ends when the other writer exits, or writes
        nothing for as long as a dead rank's heartbeat takes to go stale."""
        ident = self.identity
        now = time.time()
        try:
            inode = os.lstat(self.path).st_ino
        except OSError:
            inode = None
        other = None
        self._ours = inode is not None and inode == self._inode
        if inode is not None and inode != self._inode:
            try:
                other = read_record(self.path)
            except (OSError, RecordError):
                other = None
        if other is not None and (other.host, other.pid) != (ident.host, ident.pid):
            fs_now = clock.fs_now(self.path.parent) if other.host != ident.host else now  # psutil decides otherwise
            if other.exited_at is None and is_alive(other, ident.host, fs_now):
                self._on_conflict(other, now)
                return
            if self.conflict and (other.host, other.pid) == (self.conflict["host"], self.conflict["pid"]):
                self._end_conflict("it exited")
                return
        conflict = self.conflict
        if conflict:
            limit = max(clock.MIN_STALE_S, clock.STALE_HEARTBEATS * float(conflict.get("heartbeat_interval") or 2.0))
            if now - conflict["seen_at"] > limit:  # two readings of this rank's clock
                self._end_conflict(f"it has not written the record for {now - conflict['seen_at']:.0f}s")

    def write(self, record: RankRecord) -> None:
        """Raises OSError."""
        self._last_content = None
        data = record.to_json()
        try:
            self._inode = atomic_write(self.path, data)
        except FileNotFoundError:  # the directory is gone (a registry deleted under the job): again
            ensure_dir(self.path.parent)
            self._inode = atomic_write(self.path, data)
        self._last_content = _content(record)

    def tick(self) -> bool:
        """Set the record file's mtime to now (the filesystem's clock) without building a
        record: when the file is still the one we last wrote (one lstat), no conflict is
        being followed and the filesystem stamps it itself (not FUSE). False when it is
        not; the caller then publishes in full."""
        if not self._ticks or self.conflict is not None or self._inode is None or self._last_content is None:
            return False
        try:
            if os.lstat(self.path).st_ino != self._inode:
                return False
            os.utime(self.path, None, follow_symlinks=False)
        except OSError:
            return False
        return True

    def publish(self, record: RankRecord) -> bool:
        """Write `record`, or, when it says nothing new since the last write (only its
        heartbeat moved) and the file is still ours (`check` ran just before), set the
        file's mtime to now instead (see `tick`): one utime, where a rewrite creates,
        writes and renames a file. Readers judge a record's age by its mtime
        (sidecar.common.clock). True when it only ticked.

        Raises OSError."""
        content = _content(record) if record.mtime_heartbeat and self._ticks else None
        if content is not None and self._ours and content == self._last_content:
            try:
                os.utime(self.path, None, follow_symlinks=False)
                return True
            except OSError:
                pass  # gone meanwhile: write it again
        self.write(record)
        return False

    def _on_conflict(self, other: RankRecord, now: float) -> None:
        ident = self.identity
        self.conflict = {"pid": other.pid, "host": other.host, "job": other.job, "seen_at": round(now, 3),
                         "heartbeat_interval": other.heartbeat_interval}
        same_job = bool(other.job) and other.job == ident.job
        who = f"another live process of this job ({ident.job})" if same_job else (
            f"a live process of another job ({other.job or 'unknown job'}; this one is {ident.job})")
        self._log_once(f"conflict-{other.host}-{other.pid}", logging.WARNING,
                       f"[Profiler] replica {ident.replica} rank {ident.rank} is also held by {who}: "
                       f"pid {other.pid} on {other.host or 'an unknown host'}. Both write "
                       f"{self.path} and save traces to {self.trace_dir}; `replica ls` shows the conflict. "
                       f"Give one of them another replica name (COSMOS_PROFILER_REPLICA or --replica).")

    def _end_conflict(self, why: str) -> None:
        conflict, self.conflict = self.conflict, None
        if conflict:
            self._forget(f"conflict-{conflict['host']}-{conflict['pid']}")
            log.info("[Profiler] rank %d: the conflict with pid %s on %s is over (%s)",
                     self.identity.rank, conflict["pid"], conflict["host"], why)


def _on_fuse(directory: Path) -> bool:
    from sidecar.common.registry import filesystem_type

    fstype = filesystem_type(directory)
    return fstype is not None and fstype.startswith("fuse")


def _content(record: RankRecord) -> bytes:
    """What a liveness tick leaves as it is: the record less its heartbeat, and less
    the times of `recent_steps` samples that show no steps (a rank standing still)."""
    fields = {name: getattr(record, name) for name in RECORD_FIELDS}
    fields["heartbeat_at"] = 0.0
    if all(int(n) == record.step for _, n in record.recent_steps):
        fields["recent_steps"] = []
    return json.dumps(fields, sort_keys=True).encode()  # a copy: later changes to the record's lists do not show
