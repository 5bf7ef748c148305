"""One rank's captures, run: started, advanced and stopped at step boundaries, then saved.

The training thread calls `on_boundary` at a step boundary with work to do: it starts the armed
request through the profiler driver (`sidecar.rank.driver`, created on first use: the only torch
import), advances the running one, and at the end of its schedule (or at a cancel) hands the
result to the saver; it never touches the filesystem. The saver thread (`rank.saver`) tells
`_on_file_saved` what it saved: the record, the trace-dir report to a controller (`rank.report`),
the S3 copy (`rank.upload`, whose thread answers `_on_uploaded`) and the `on_saved` listeners.
The decisions live in `capture`; every change is made under the sidecar's lock and wakes the
heartbeat.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sidecar.common.config import JobConfig
from sidecar.common.identity import RankIdentity
from sidecar.common.request import ProfileRequest
from sidecar.common.version import __version__
from sidecar.rank import capture
from sidecar.rank.controller_post import TraceDirReporter
from sidecar.rank.saver import Saver
from sidecar.rank.upload import TraceUploader

if TYPE_CHECKING:
    from sidecar.rank.driver import ProfilerDriver

log = logging.getLogger("sidecar")

LogOnce = Callable[[str, int, str], None]
OnSaved = Callable[[str, Path, ProfileRequest], None]


class CaptureRunner:
    """Runs and saves the captures of one rank (see the module docstring).

    Args:
        lock: the sidecar's lock, held while the capture state changes.
        steps: the step counter.
        wake: wake the heartbeat (a state change to publish).
    """

    def __init__(self, identity: RankIdentity, job: JobConfig, trace_dir: Path, capture_state: capture.CaptureState,
                 lock: threading.RLock, steps: Callable[[], int], wake: Callable[[], None], log_once: LogOnce) -> None:
        self.identity = identity
        self._capture = capture_state
        self._lock = lock
        self._steps = steps
        self._wake = wake
        self.trace_paths: list[str] = []
        # Called on the saver thread after each file is saved: (kind, path, request).
        self.on_saved: list[OnSaved] = []
        self.saver = Saver(trace_dir, identity.rank, self._on_file_saved, self._on_save_failed)
        self._reporter = TraceDirReporter(job.sidecar.controller_url, identity.replica, identity.rank)
        # [train.ckpt] upload_s3: each saved trace, copied to S3 on a thread of its own (sidecar.rank.upload).
        self.uploader = TraceUploader(job.s3, identity.rank, self._on_uploaded, log_once) if job.s3 else None
        self.trace_url: str | None = None
        self.upload_error: str | None = None
        self._driver: ProfilerDriver | None = None  # created on first use

    @property
    def profiler(self) -> Any:
        """The running `torch.profiler.profile`, or None."""
        driver = self._driver
        return driver.profiler if driver is not None and self._capture.active is not None else None

    def check_upload(self) -> None:
        """At start: whether uploads can run (boto3 missing: said once, now)."""
        if self.uploader is not None:
            self.upload_error = self.uploader.check()

    # -- the training thread ------------------------------------------------

    def on_boundary(self, step: int) -> None:
        """A step boundary: start, advance or stop the capture. Raises (the caller calls `abort`)."""
        cs = self._capture
        pending = cs.pending  # read once: a cancel may disarm it meanwhile
        if cs.active is not None:
            assert self._driver is not None  # a capture is active only once the driver started it
            if cs.stop_requested is not None:
                self._stop_for_cancel()
            elif self._driver.step():
                self.finish()
        elif pending is not None:
            start = pending.start_step
            if start is None or step >= start:
                self.begin(pending, step, misaligned=start is not None and step > start)

    def begin(self, request: ProfileRequest, step: int, misaligned: bool) -> None:
        """Start `request`'s schedule at `step` (unless a cancel took it, or another profiler runs)."""
        from sidecar.rank import driver as driver_module

        with self._lock:
            if not capture.claim(self._capture, request):
                return  # cancelled since the caller looked
        if driver_module.external_profiler_active():
            with self._lock:
                self.fail(
                    f"request {request.id} refused: another torch.profiler is already running in this process; "
                    "stop it first (the sidecar never interferes with your own profile)"
                )
                # Counted as refused like any other refusal, so num_requests = captures + refused holds.
                self._capture.num_refused += 1
                self._capture.refused = self._capture.error
            return
        if self._driver is None:
            self._driver = driver_module.ProfilerDriver()
        rank = self.identity.rank
        log.info("[Profiler] init profiler for rank %d", rank)
        self._driver.start(
            request,
            step,
            metadata=self._trace_metadata(request),
            distributed_info={"rank": rank, "world_size": self.identity.world_size},
        )
        log.info("[Profiler] start to trace for rank: %d", rank)
        with self._lock:
            capture.begin(self._capture, step, misaligned)
        self._wake()
        if misaligned:
            log.warning(
                "[Profiler] rank %d saw request %s late: start_step %s had passed, tracing from step %d",
                rank, request.id, request.start_step, step,
            )

    def finish_now(self) -> bool:
        """Stop the running capture early and save what it recorded; True when a save was started."""
        with self._lock:
            active = self._capture.active
            if active is None or self._driver is None:
                return False
            if not self._driver.has_recorded():
                self._driver.abort()
                self.fail(f"capture {active.id} stopped at step {self._steps()} before any step was recorded")
                return False
        self.finish()
        return True

    def finish(self, cancelled_by: ProfileRequest | None = None) -> None:
        """The schedule ended (or a cancel stopped it): hand the results to the saver."""
        assert self._driver is not None  # the driver runs only while a capture is active
        result = self._driver.take()
        step = self._steps()
        with self._lock:
            start = self._capture.capture_start
            request = capture.finish(self._capture, step, cancelled_by)
        assert request is not None  # the driver runs only while a capture is active
        self._wake()
        self.saver.save(result, request, step - (start if start is not None else step))

    def abort(self, message: str) -> None:
        """Drop the running capture, if any, and fail with `message` (caller holds the lock)."""
        if self._driver is not None:
            self._driver.abort()
        self.fail(message)

    def close(self, step: int) -> None:
        """At close: abort an unfinished capture, disarm the armed one, wait for the saves and uploads."""
        with self._lock:
            active = self._capture.active
            if active is not None and self._driver is not None:
                self.abort(f"capture {active.id} aborted: the sidecar closed at step {step} "
                           "before its schedule finished")
            self._capture.pending = None
        self.saver.join()
        self._reporter.join()
        if self.uploader is not None:
            self.uploader.close()

    def fail(self, message: str) -> None:
        """(caller holds the lock)"""
        capture.fail(self._capture, message, self._steps())
        self._wake()

    def _stop_for_cancel(self) -> None:
        """A cancel reached the running capture: save what it recorded, or drop it when nothing was."""
        assert self._driver is not None  # called only while a capture is active
        if self._driver.has_recorded():
            self.finish(cancelled_by=self._capture.stop_requested)
            return
        self._driver.abort()
        step = self._steps()
        with self._lock:
            capture.stopped_empty(self._capture, step)
        self._wake()
        log.info("[Profiler] rank %d: capture stopped at step %d before any step was recorded; nothing saved",
                 self.identity.rank, step)

    def _trace_metadata(self, request: ProfileRequest) -> dict[str, Any]:
        ident = self.identity
        return {
            "cosmos_profiler": {
                "replica": ident.replica,
                "role": ident.role,
                "rank": ident.rank,
                "world_size": ident.world_size,
                "host": ident.host,
                "pid": ident.pid,
                "job": ident.job,
                "request_id": request.id,
                "start_step": self._steps(),
                "version": __version__,
            }
        }

    # -- the saver and upload threads ------------------------------------------

    def _on_file_saved(self, kind: str, path: Path, request: ProfileRequest, steps: int) -> None:
        with self._lock:
            self.trace_paths.append(str(path))
            capture.saved(self._capture, kind, str(path), request, self._steps())
        self._wake()
        if kind == "trace":
            self._reporter.report(path.parent)
            if self.uploader is not None:
                self.uploader.upload(path)
        for callback in self.on_saved:
            try:
                callback(kind, path, request)
            except Exception:  # noqa: BLE001 - a listener's failure is not the save's
                log.exception("[Profiler] rank %d: a listener of saved files failed", self.identity.rank)

    def _on_uploaded(self, path: Path, url: str | None, error: str | None) -> None:
        """The upload thread: `path` is at `url`, or not (`error`)."""
        with self._lock:
            if url is not None:
                self.trace_url = url
            self.upload_error = error
            # The history ties the outcome to its trace, for `profile status` (answers.capture_of).
            if url is not None:
                capture.note(self._capture, self._steps(), upload=str(path), url=url)
            else:
                capture.note(self._capture, self._steps(), upload=str(path), upload_error=error)
        self._wake()

    def _on_save_failed(self, message: str) -> None:
        with self._lock:
            self.fail(message)
