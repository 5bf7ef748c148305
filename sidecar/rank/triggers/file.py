"""The file trigger: watch one control file and deliver each new request.

Two backends, as in watchdog: inotify on the control directory (events from
this kernel only; `triggers.inotify`, read by the watcher thread itself), and
polling, an open and fstat of the one control file per interval, which also sees writes made on other NFS/Lustre/sshfs clients (an
lstat would be answered from the client's attribute cache, stale for up to
tens of seconds after another machine replaced the file). `auto`
picks polling when the registry sits on a network or FUSE filesystem, and
inotify otherwise; when inotify cannot start (ENOSPC/EMFILE: watch or instance
limits), it warns and falls back to polling.

In inotify mode a slow safety stat still runs, so a missed event is noticed
within `safety_interval`; a control directory deleted or moved away is seen
by its own inotify event and watched again once it is back.

A version read empty or as incomplete JSON may be a writer between its
truncate and its write (`echo ... > file`): it is read again every
`SETTLE_POLL_S` until it is complete or `settle_time` has passed, and only
then delivered as it is; with inotify, a version whose last event says its
writer is done (closed after writing, renamed in, or only touched) is
delivered at once. A version with the same bytes as the one before (a
bare `touch`) is delivered with `repeat=True`.
"""

from __future__ import annotations

import dataclasses
import hashlib
import logging
import os
import time
from collections.abc import Callable
from pathlib import Path

from sidecar.common.exceptions import RequestError
from sidecar.common.registry import (
    ControlFile,
    control_signature,
    ensure_dir,
    filesystem_type,
    is_network_fs,
    read_control,
)
from sidecar.common.request import is_complete
from sidecar.rank.threads import Worker
from sidecar.rank.triggers.base import Trigger
from sidecar.rank.triggers.inotify import InotifyWatch, WakePipe, at_rest

log = logging.getLogger("sidecar")

SETTLE_POLL_S = 0.02
# After inotify said the control directory went away: when to look for it again
# (a `rm -rf` and a `mkdir` of the same path are not raced).
GONE_RECHECK_S = 0.1
MAX_STABLE_READS = 3


def choose_mode(requested: str, directory: Path) -> tuple[str, str]:
    """Resolve "auto" to "inotify" or "poll". Returns (mode, reason)."""
    if requested in ("inotify", "poll"):
        return requested, "forced by configuration"
    fstype = filesystem_type(directory)
    if is_network_fs(fstype):
        return "poll", f"registry is on a {fstype} filesystem"
    return "inotify", f"registry is on a local {fstype or 'unknown'} filesystem"


class FileTrigger(Trigger):
    """Watches `path`; calls `on_file(ControlFile)` for each new version of it,
    or `on_error(RequestError)` when a new version is unsafe to read.

    A new version is a new mtime, size, inode or type. What exists when the
    trigger starts is the baseline and is not delivered. A version that is
    empty or not whole JSON is settled first (see the module docstring).
    """

    def __init__(
        self,
        path: Path,
        on_file: Callable[[ControlFile], None],
        on_error: Callable[[RequestError], None],
        *,
        mode: str = "auto",
        poll_interval: float = 1.0,
        safety_interval: float = 2.0,
        max_bytes: int = 64 * 1024,
        allowed_uids: tuple[int, ...] = (),
        allowed_gids: tuple[int, ...] = (),
        settle_time: float = 0.2,
        is_complete: Callable[[bytes], bool] = is_complete,
        baseline: tuple[tuple[int, int, int, int] | None, bytes | None] | None = None,
        thread_name: str = "cosmos-profiler-watch",
    ) -> None:
        self.path = Path(path)
        self.settle_time = settle_time
        self.is_complete = is_complete
        self.on_file = on_file
        self.on_error = on_error
        self.requested_mode = mode
        self.poll_interval = poll_interval
        self.safety_interval = safety_interval
        self.max_bytes = max_bytes
        self.allowed_uids = allowed_uids
        self.allowed_gids = allowed_gids
        self.mode = ""
        self.mode_reason = ""
        self._worker = Worker(thread_name, self._run, on_wake=self._poke)
        # (signature, sha256 digest) of the version taken as already seen, instead of the one there
        # at start: a node agent that takes over from another resumes from what that one relayed.
        self._baseline = baseline
        self._observer: InotifyWatch | None = None
        self._wake: WakePipe | None = None  # wakes the watcher's poll
        self._watched_dir_inode: int | None = None
        self._last = control_signature(self.path)
        self._last_digest: bytes | None = None
        # inotify saw the file's writer finish (closed, renamed in, touched): an empty
        # or incomplete version is what it is, with no settling.
        self._at_rest = False
        self.num_deliveries = 0
        self.num_content_checks = 0
        self.num_settle_reads = 0

    # -- lifecycle --------------------------------------------------------

    def start(self) -> None:
        try:
            ensure_dir(self.path.parent)
        except OSError as exc:
            log.warning("[Profiler] cannot create control directory %s: %s", self.path.parent, exc)
        self.mode, self.mode_reason = choose_mode(self.requested_mode, self.path.parent)
        if self.mode == "inotify" and self._wake is None:
            self._wake = WakePipe()
        if self.mode == "inotify" and not self._start_observer():
            self.mode = "poll"
        if self._baseline is not None:
            self._last, self._last_digest = self._baseline
        else:
            self._last = control_signature(self.path, fresh=self.mode == "poll")
            self._last_digest = self._baseline_digest()
        log.info(
            "[Profiler] watching %s by %s (%s)",
            self.path,
            "inotify" if self.mode == "inotify" else f"polling every {self.poll_interval:g}s",
            self.mode_reason,
        )
        self._worker.start()

    @property
    def seen(self) -> tuple[tuple[int, int, int, int] | None, bytes | None]:
        """(signature, sha256 digest) of the last version seen (the baseline until one is delivered)."""
        return self._last, self._last_digest

    def stop(self) -> None:
        # The watcher thread first: it may start a new observer (the directory was replaced).
        self._worker.stop()
        self._stop_observer()
        wake, self._wake = self._wake, None
        if wake is not None:
            wake.close()

    # -- inotify ----------------------------------------------------------

    def _poke(self) -> None:
        """Wake a watcher thread that waits in `InotifyWatch.wait` (Worker's on_wake)."""
        wake = self._wake
        if wake is not None:
            wake.poke()

    def _start_observer(self) -> bool:
        try:
            observer = InotifyWatch(self.path.parent)
        except OSError as exc:
            log.warning(
                "[Profiler] inotify cannot start on %s (%s); falling back to polling every %gs. "
                "Raise fs.inotify.max_user_watches / max_user_instances to use inotify.",
                self.path.parent, exc, self.poll_interval,
            )
            self.mode_reason = f"inotify failed: {exc}"
            return False
        self._observer = observer
        try:
            self._watched_dir_inode = os.stat(self.path.parent).st_ino
        except OSError:
            self._watched_dir_inode = None
        return True

    def _stop_observer(self) -> None:
        observer, self._observer = self._observer, None
        if observer is not None:
            observer.close()

    def _rewatch_if_replaced(self) -> None:
        """Re-establish the inotify watch when the control dir was deleted or replaced."""
        try:
            inode = os.stat(self.path.parent).st_ino
        except OSError:
            inode = None
        if inode == self._watched_dir_inode and self._observer is not None and not self._observer.gone:
            return
        self._stop_observer()
        if inode is None:
            try:
                ensure_dir(self.path.parent)
            except OSError:
                return
        if not self._start_observer():
            self.mode = "poll"

    # -- the watcher thread -----------------------------------------------

    def _run(self, worker: Worker) -> None:
        safety_due = time.monotonic() + self.safety_interval
        while not worker.stopping:
            observer = self._observer if self.mode == "inotify" else None
            if observer is not None and self._wake is not None:
                # inotify: this thread reads the events itself; a check at once for
                # an event on the control file, a safety look every safety_interval.
                names = observer.wait(safety_due - time.monotonic(), self._wake.fd)
                woken = worker.wait(0.0) or self.path.name in names or "" in names
                mask = names.get(self.path.name)
                self._at_rest = mask is not None and at_rest(mask)
                if worker.stopping:
                    return
                if observer.gone:  # the directory went (deleted, moved): look again soon, not at once
                    safety_due = min(safety_due, time.monotonic() + min(GONE_RECHECK_S, self.safety_interval))
                safety = time.monotonic() >= safety_due
                if not (woken or safety):
                    continue  # another file of the directory (a temp name, another replica)
                if safety:
                    safety_due = time.monotonic() + self.safety_interval
            else:
                self._at_rest = False
                woken = worker.wait(self.poll_interval if self.mode == "poll" else self.safety_interval)
                if worker.stopping:
                    return
            try:
                if self.mode == "inotify" and (not woken or self._observer is None or self._observer.gone):
                    self._rewatch_if_replaced()  # not on an event: the directory is there, watched
                self._check(by_event=woken)
            except Exception:  # noqa: BLE001 - the watcher must outlive any one bad look
                log.exception("[Profiler] control file watcher failed; continuing")

    def _check(self, by_event: bool = False) -> None:
        signature = control_signature(self.path, fresh=self.mode == "poll")
        if signature == self._last:
            # An event with an unchanged signature: two same-size writes within
            # one timestamp tick (coarse-clock kernels) reusing an inode. Only
            # the content can tell them apart.
            if by_event and signature is not None:
                self._check_content()
            return
        self._last = signature
        if signature is None:
            return  # deleted: nothing to deliver
        try:
            control = self._read_settled()
        except FileNotFoundError:
            return
        except RequestError as exc:
            self.num_deliveries += 1
            self.on_error(exc)
            return
        if control is None:
            return  # stopping
        # Remember what was read, not what was stat'ed before: a write between
        # the two must not be delivered twice.
        self._last = control.signature
        self._deliver(control)

    def _read_settled(self) -> ControlFile | None:
        """Read the file; while it is empty or half-written JSON, read it again until it
        is complete or `settle_time` has passed. None when the trigger stops meanwhile."""
        control = read_control(self.path, self.max_bytes, self.allowed_uids, self.allowed_gids)
        at_rest = self._at_rest and (self.is_complete(control.data) or self._events_say_at_rest(0.0) is not False)
        deadline = time.monotonic() + self.settle_time
        while not at_rest and not self.is_complete(control.data):
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                break
            if self._observer is not None and self._wake is not None:
                # inotify: wait for the writer to close the file, reading it again meanwhile
                at_rest = self._events_say_at_rest(min(SETTLE_POLL_S, remaining)) is True
                if self._worker.stopping:
                    return None
            elif self._worker.sleep(min(SETTLE_POLL_S, remaining)):
                return None
            self.num_settle_reads += 1
            try:
                control = read_control(self.path, self.max_bytes, self.allowed_uids, self.allowed_gids)
            except FileNotFoundError:
                break  # removed meanwhile: deliver what was there
        # A write between the open's fstat and the read leaves bytes newer than the
        # signature; read again until they agree, else that write would come back
        # later as a version with the same bytes: a `touch`, and a second request.
        for _ in range(MAX_STABLE_READS):
            if control_signature(self.path) in (control.signature, None):
                break
            try:
                control = read_control(self.path, self.max_bytes, self.allowed_uids, self.allowed_gids)
            except FileNotFoundError:
                break
        return control

    def _events_say_at_rest(self, timeout: float) -> bool | None:
        """Wait up to `timeout` for inotify events on the control file: True when the last
        one says its writer is done, False when a writer is at it, None when there was none."""
        observer, wake = self._observer, self._wake
        if observer is None or wake is None:
            return False
        mask = observer.wait(timeout, wake.fd).get(self.path.name)
        if self._worker.woken:
            self._poke()  # a wake-up this drained (stop) is kept for the watcher loop
        return None if mask is None else at_rest(mask)

    def _baseline_digest(self) -> bytes | None:
        try:
            return hashlib.sha256(
                read_control(self.path, self.max_bytes, self.allowed_uids, self.allowed_gids).data
            ).digest()
        except (OSError, RequestError):
            return None

    def _check_content(self) -> None:
        self.num_content_checks += 1
        try:
            control = read_control(self.path, self.max_bytes, self.allowed_uids, self.allowed_gids)
        except (OSError, RequestError):
            return  # the next change of signature reports it
        if hashlib.sha256(control.data).digest() != self._last_digest:
            self._deliver(control)

    def _deliver(self, control: ControlFile) -> None:
        digest = hashlib.sha256(control.data).digest()
        if digest == self._last_digest:
            control = dataclasses.replace(control, repeat=True)
        self._last_digest = digest
        self.num_deliveries += 1
        self.on_file(control)
