"""The slowdown watch of one rank, as the sidecar keeps it: armed, fed each step, and its thread.

`sidecar.rank.slowdown` holds what one watch decides; this keeps the current one. `install`
arms a watch (a request's, or the always-on one of `[sidecar] slowdown_factor`), replacing the
last and keeping what it learned of the pace; the training thread feeds it (`on_step`, O(1)
amortized); a thread of its own (`profiler-slowdown`) asks for the capture once it fires; the
watcher thread tells it of the capture that came (`on_request`) or of a cancel (`cancel`).

The training thread reads the watch it feeds through one attribute of the hot path (`HotPath._watch`,
so an idle `step()` costs no more): every change of the current watch sets it (`HotPath.set_watch`).
The watch's changes are made under this room's own lock.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Any

from sidecar.common.records import read_record
from sidecar.common.request import ProfileRequest
from sidecar.rank import slowdown
from sidecar.rank.context import RankContext
from sidecar.rank.threads import Worker

log = logging.getLogger("sidecar")


class Watches:
    """The current slowdown watch of one rank (`current`, while it watches) and the one the record
    shows (`shown`: the current or the last one)."""

    def __init__(self, ctx: RankContext) -> None:
        self.identity = ctx.identity
        self.settings = ctx.settings
        self.registry_root = ctx.registry_root
        self._record_path = ctx.record_path
        self.trace_dir = ctx.trace_dir
        self._lock = threading.Lock()  # guards `current` and `shown`, and the watch's moves made here
        self._steps = ctx.steps
        self._is_capturing = ctx.capture.is_capturing
        self._wake = ctx.wake
        self._hot = ctx.hot
        self.current: slowdown.SlowdownWatch | None = None
        self.shown: slowdown.SlowdownWatch | None = None
        self._worker: Worker | None = None

    def last_capture_at(self) -> float | None:
        """When this rank's always-on watch last captured, from the record a previous run of it left
        (so that a restart does not reset the budget); None when there is none. Read it before
        the first record of this run replaces that one."""
        path = self._record_path
        try:
            watch = read_record(path).slowdown
        except Exception:  # noqa: BLE001 - no record, or one we cannot read: no capture known
            return None
        if isinstance(watch, dict) and watch.get("always_on") and isinstance(watch.get("last_capture_at"), (int, float)):
            return float(watch["last_capture_at"])
        return None

    def install(self, request: ProfileRequest, always_on: bool = False, last_capture_at: float | None = None) -> None:
        """Arm the watch `request` asks for (the watcher thread, or start())."""
        old = self.shown
        last = old.last_capture_at if old is not None else last_capture_at
        watch = slowdown.SlowdownWatch(request, always_on=always_on,
                                       min_interval_s=self.settings.slowdown_min_interval_s,
                                       last_capture_at=last, times=old.times if old is not None else None)
        with self._lock:
            self.shown = watch
            self._set_current(watch)
        if self._worker is None:
            self._worker = Worker("profiler-slowdown", self._loop)
            self._worker.start()
        log.info("[Profiler] rank %d armed slowdown watch %s (%gx the median, %d steps in a row%s)",
                 self.identity.rank, request.id, request.factor, request.consecutive,
                 ", always on" if always_on else f", {request.repeat} repeats")
        self._wake()

    def on_request(self, request: ProfileRequest, step: int) -> None:
        """A request reached this rank (the watcher thread): when it is the capture the watch
        asked for (this rank's or another's), the watch has fired."""
        watch = self.shown
        if watch is not None and not watch.is_done and watch.is_ours(request) and self.identity.rank in request.rank_filter:
            with self._lock:
                watch.on_request(request, step)
            log.warning("[Profiler] rank %d: slowdown watch %s fired: %s", self.identity.rank, watch.id, request.reason)

    def cancel(self, cancel_id: str) -> None:
        """A cancel (the watcher thread) disarms the watch."""
        watch = self.shown
        if watch is not None and not watch.is_done:
            with self._lock:
                self._set_current(None)
                watch.cancel(cancel_id)
            log.info("[Profiler] rank %d: request %s disarms slowdown watch %s", self.identity.rank, cancel_id,
                     watch.id)

    def on_step(self, step: int) -> None:
        """The training thread: one step for the watch (O(1) amortized; see slowdown.StepTimes)."""
        watch = self.current
        if watch is None:  # a cancel (watcher thread) or stop() took it since step() looked
            return
        try:
            if watch.on_step(step, time.perf_counter(), self._is_capturing()):
                if self._worker is not None:
                    self._worker.wake()
            elif watch.is_done and self.current is watch:  # not one armed since
                self._set_current(None)
        except Exception:  # noqa: BLE001 - never into the training loop
            self._set_current(None)
            log.exception("[Profiler] rank %d: the slowdown watch failed and is off", self.identity.rank)

    def stop(self) -> None:
        self._set_current(None)
        if self._worker is not None:
            self._worker.stop()

    def to_json(self) -> dict[str, Any] | None:
        """The record's `slowdown`."""
        with self._lock:
            return self.shown.to_json() if self.shown is not None else None

    def _set_current(self, watch: slowdown.SlowdownWatch | None) -> None:
        self.current = watch
        self._hot.set_watch(watch)

    def _loop(self, worker: Worker) -> None:
        place = slowdown.WatchPlace(self.registry_root, self.identity.replica, self.identity.rank, self.trace_dir,
                                    self.settings.slowdown_min_free_pct, self._steps)
        while not worker.stopping:
            worker.wait(1.0)
            watch = self.current
            if watch is None or watch.state != "firing" or worker.stopping:
                continue
            try:
                slowdown.ask_for_capture(watch, place)
            except Exception as exc:  # noqa: BLE001
                log.exception("[Profiler] rank %d: the slowdown watch could not ask for a capture", self.identity.rank)
                watch.not_captured(f"asking for a capture failed: {type(exc).__name__}: {exc}")
            self._wake()
