"""Publishing a rank's record: the heartbeat thread, and the writer that notices a second job.

`Heartbeat` samples the step counter every `startstep.SAMPLE_INTERVAL_S` while the rank
steps (in memory; only at heartbeats once the counter stood still), and calls
`publish()` every `interval`, at once when woken by a state change, and early when
the steps run ahead of the pace the record shows, so the CLI's start step stays
ahead of every rank.

`RecordWriter` writes the record atomically (or, when only its heartbeat moved,
sets the file's mtime to now: a liveness tick of one utime, stamped by the
filesystem's clock, never the rank's: see sidecar.common.clock) and, before each write, notices
another live process writing the same record (a second job under this replica
name with an overlapping rank): it logs that once per writer and publishes it as
the record's `conflict`, which `replica ls` shows.
"""

from __future__ import annotations

import json
import logging
import os
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from sidecar.common import clock, startstep
from sidecar.common.identity import RankIdentity
from sidecar.common.records import RECORD_FIELDS, RankRecord, RecordError, is_alive, read_record
from sidecar.common.registry import atomic_write, ensure_dir
from sidecar.rank.threads import Worker

log = logging.getLogger("sidecar")

FULL_EVERY = 6  # an idle rank's record is built and compared at every 6th heartbeat, ticked in between


class Heartbeat:
    """The thread that keeps a rank's record fresh, and the rank's recent pace."""

    def __init__(self, interval: float, steps: Callable[[], int], publish: Callable[[], None],
                 idle_tick: Callable[[], None] | None = None) -> None:
        self.interval = interval
        self._steps = steps
        self._publish = publish
        # A heartbeat with nothing new to say (`_run` decides): `idle_tick()` may only set the
        # record's mtime, sparing the build of a record that would say the same again.
        self._idle_tick = idle_tick
        self._tick = min(startstep.SAMPLE_INTERVAL_S, interval)
        self._samples: deque[startstep.Sample] = deque(maxlen=int(startstep.WINDOW_S / self._tick) + 2)
        self._lock = threading.Lock()
        self._publish_lock = threading.Lock()  # one publisher at a time: this thread, or `publish_now`'s caller
        self.published_steps: list[startstep.Sample] = []  # the samples in the record last written
        self._early_publish_at = 0.0
        self._worker = Worker("cosmos-profiler-heartbeat", self._run)
        self._publishing_after = threading.local()  # .active: this thread publishes once it is done
        self._failed = False
        # Wall-clock time at which the step counter was last seen to move (or this started):
        # within one sample interval of the last step while the rank steps.
        self.last_step_at = time.time()

    def start(self) -> None:
        self._worker.start()

    def wake(self) -> None:
        """Publish at once (a state change); inside `publishing_after`, by that thread's publish."""
        if getattr(self._publishing_after, "active", False):
            return
        self._worker.wake()

    @contextmanager
    def publishing_after(self) -> Iterator[None]:
        """Handle a change on the calling thread (the watcher's, a request), then publish from
        it (`publish_now`). A `wake()` on this thread meanwhile is that one publish, not also a
        hand-off to the heartbeat thread: that would write the same record a second time, its
        thread competing for the GIL while this one publishes."""
        self._publishing_after.active = True
        try:
            yield
        finally:
            self._publishing_after.active = False
            self.publish_now()

    def stop(self) -> None:
        self._worker.stop()

    def publish_now(self) -> None:
        """Publish on the calling thread (the watcher's, after a request), sparing the
        hand-off to this thread: under a busy training thread each thread that must
        take the GIL waits up to `sys.getswitchinterval()` for it. Never raises."""
        try:
            with self._publish_lock:
                self._publish()
        except Exception:  # noqa: BLE001
            self._failed_once()

    def _failed_once(self) -> None:
        """Log the first failure with its traceback; the heartbeat goes on either way."""
        if not self._failed:
            self._failed = True
            log.exception("[Profiler] heartbeat failed")

    def recent(self) -> list[startstep.Sample]:
        """The recent samples a record publishes (`recent_steps`)."""
        with self._lock:
            return startstep.thin(list(self._samples))

    def recent_rate(self) -> float | None:
        return startstep.recent_rate(self.recent())

    def _run(self, worker: Worker) -> None:
        last_step, moved_at = self._steps(), time.monotonic()
        due = moved_at + self.interval
        full_step, ticks = None, 0  # the step of the last full publish here; ticks since
        while not worker.stopping:
            now = time.monotonic()
            still = now - moved_at >= startstep.STILL_AFTER_S
            woken = worker.wait(due - now if still else min(self._tick, due - now))
            if worker.stopping:
                return
            try:
                now = time.monotonic()
                early = self._sample(now)
                step = self._steps()
                if step != last_step:
                    last_step, moved_at = step, now
                    self.last_step_at = time.time()
                if woken or early or now >= due:
                    due = now + self.interval
                    # Only time moved: no wake (every state change wakes us), no step since the
                    # last full publish, and the pace window has passed since the last step, so
                    # the record would say the same. Every FULL_EVERY-th heartbeat is full anyway.
                    quiet = (not woken and not early and step == full_step and ticks < FULL_EVERY - 1
                             and now - moved_at > startstep.WINDOW_S + self.interval)
                    with self._publish_lock:
                        if quiet and self._idle_tick is not None:
                            self._idle_tick()
                            ticks += 1
                        else:
                            self._publish()
                            full_step, ticks = step, 0
            except Exception:  # noqa: BLE001
                self._failed_once()

    def _sample(self, now: float) -> bool:
        """Sample the step counter; True when the record should be rewritten before its
        heartbeat is due: the first measurable pace, or steps running ahead of the published pace."""
        sample = (time.time(), self._steps())
        with self._lock:
            self._samples.append(sample)
            first = self._samples[0]
        if now - self._early_publish_at < startstep.PUBLISHED_SPACING_S:
            return False
        published = self.published_steps
        if len(published) >= 2:
            early = startstep.ran_ahead(published, sample)
        else:  # the first pace: samples far enough apart that show steps (a rank standing still has none)
            early = sample[0] - first[0] >= startstep.PUBLISHED_SPACING_S and sample[1] != first[1]
        if early:
            self._early_publish_at = now
        return early


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
