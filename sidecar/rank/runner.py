"""One rank's captures, run: started, advanced and stopped at step boundaries, then handed to the saver.

The training thread calls `on_boundary` at a step boundary with work to do: it starts the armed
request through the profiler driver (`sidecar.rank.driver`, created on first use: the only torch
import), advances the running one, and at the end of its schedule (or at a cancel) hands the
result to the saver (`rank.saver`), which writes it on its own thread; it never touches the
filesystem. Each change of state is one call to the capture owner (`CaptureOwner`, which takes
the lock), and wakes the heartbeat.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any

from sidecar.common.request import ProfileRequest
from sidecar.common.version import __version__
from sidecar.rank.context import RankContext
from sidecar.rank.ondemandroom import OnDemandRoom, PreEmpted
from sidecar.rank.saver import Saver

if TYPE_CHECKING:
    from sidecar.rank.driver import ProfilerDriver

log = logging.getLogger("sidecar")


class CaptureRunner:
    """Runs the captures of one rank (see the module docstring)."""

    def __init__(self, ctx: RankContext, saver: Saver) -> None:
        self._ctx = ctx
        self.identity = ctx.identity
        self._capture = ctx.capture
        self.saver = saver
        self._driver: ProfilerDriver | None = None  # created on first use
        # kineto's on-demand path (`rank.ondemandroom`): where it serves, a capture runs there instead.
        self.ondemand = OnDemandRoom(ctx)

    @property
    def profiler(self) -> Any:
        """The running `torch.profiler.profile`, or None."""
        driver = self._driver
        return driver.profiler if driver is not None and self._capture.active is not None else None

    # -- the training thread ------------------------------------------------

    def on_boundary(self, step: int) -> None:
        """A step boundary: start, advance or stop the capture. Raises (the caller calls `abort`)."""
        owner = self._capture
        pending = owner.pending  # read once: a cancel may disarm it meanwhile
        if owner.active is not None and self.ondemand.running:
            self._ondemand_boundary(step)
        elif owner.active is not None:
            assert self._driver is not None  # a capture is active only once the driver started it
            if owner.stop_requested is not None:
                self._stop_for_cancel()
            elif self._driver.step():
                self.finish()
        elif pending is not None:
            start = self.ondemand.on_armed(pending, step)
            if start is None or step >= start:
                self.begin(pending, step, misaligned=start is not None and step > start)

    def begin(self, request: ProfileRequest, step: int, misaligned: bool) -> None:
        """Start `request`'s schedule at `step` (unless a cancel took it, or another profiler runs)."""
        from sidecar.rank import driver as driver_module

        if not self._capture.claim(request):
            return  # cancelled since the caller looked
        if driver_module.external_profiler_active():
            self._capture.refuse_claimed(
                f"request {request.id} refused: another torch.profiler is already running in this process; "
                "stop it first (the sidecar never interferes with your own profile)", self._ctx.steps())
            self._ctx.wake()
            return
        rank = self.identity.rank
        distributed_info = {"rank": rank, "world_size": self.identity.world_size}
        if self.ondemand.begin(request):
            log.info("[Profiler] init profiler for rank %d", rank)
            self.ondemand.metadata(self._trace_metadata(request), distributed_info)
            log.info("[Profiler] start to trace for rank: %d", rank)
            self._capture.begin(step, misaligned, path="ondemand")
            self._ctx.wake()
            return
        if self._driver is None:
            self._driver = driver_module.ProfilerDriver()
        log.info("[Profiler] init profiler for rank %d", rank)
        self._driver.start(
            request,
            step,
            metadata=self._trace_metadata(request),
            distributed_info=distributed_info,
        )
        log.info("[Profiler] start to trace for rank: %d", rank)
        self._capture.begin(step, misaligned)
        self._ctx.wake()
        if misaligned:
            log.warning(
                "[Profiler] rank %d saw request %s late: start_step %s had passed, tracing from step %d",
                rank, request.id, request.start_step, step,
            )

    def finish_now(self) -> bool:
        """Stop the running capture early and save what it recorded; True when a save was started."""
        active = self._capture.active
        if active is not None and self.ondemand.running:
            step = self._ctx.steps()
            if not self.ondemand.has_recorded(step):
                self.ondemand.abort(f"capture {active.id} stopped before its window")
                self.fail(f"capture {active.id} stopped at step {step} before any step was recorded")
                return False
            result = self.ondemand.end_now(step)
            finished = self._capture.finish(step)
            self._ctx.wake()
            self.saver.save(result, finished.request, finished.num_steps)
            return True
        if active is None or self._driver is None:
            return False
        if not self._driver.has_recorded():
            self._driver.abort()
            self.fail(f"capture {active.id} stopped at step {self._ctx.steps()} before any step was recorded")
            return False
        self.finish()
        return True

    def finish(self, cancelled_by: ProfileRequest | None = None) -> None:
        """The schedule ended (or a cancel stopped it): hand the results to the saver."""
        assert self._driver is not None  # the driver runs only while a capture is active
        result = self._driver.take()
        finished = self._capture.finish(self._ctx.steps(), cancelled_by)
        self._ctx.wake()
        self.saver.save(result, finished.request, finished.num_steps)

    def abort(self, message: str, settle: bool = False) -> None:
        """Drop the running capture, if any, and fail with `message` (`settle`: as `CaptureOwner.fail`)."""
        self.ondemand.abort(message)
        if self._driver is not None:
            self._driver.abort()
        self.fail(message, settle)

    def close(self, step: int) -> None:
        """At close: abort an unfinished capture, disarm the armed one, wait for the saves and uploads."""
        active = self._capture.active
        message = None
        if active is not None and self.ondemand.running:
            # kineto writes a window only once its last step ends: end it now and save what it recorded.
            log.warning("[Profiler] rank %d: the process exits at step %d inside capture %s's on-demand window; "
                        "its window is ended now and what it recorded saved", self.identity.rank, step, active.id)
            result = self.ondemand.end_now(step, exiting=True)
            finished = self._capture.finish(self._ctx.steps())
            self._ctx.wake()
            self.saver.save(result, finished.request, finished.num_steps)
        elif active is not None and self._driver is not None:
            self._driver.abort()
            message = f"capture {active.id} aborted: the sidecar closed at step {step} before its schedule finished"
        self._capture.close(self._ctx.steps(), message)
        if message is not None:
            self._ctx.wake()
        self.saver.close()

    def fail(self, message: str, settle: bool = False) -> None:
        self._capture.fail(message, self._ctx.steps(), settle)
        self._ctx.wake()

    def _ondemand_boundary(self, step: int) -> None:
        """A boundary while the on-demand path's capture runs: a cancel, a pre-emption, its end."""
        od = self.ondemand
        if self._capture.stop_requested is not None:
            if not od.has_recorded(step):
                od.abort(f"request {self._capture.active.id if self._capture.active else '?'} cancelled")
                self._capture.stopped_empty(step)
                self._ctx.wake()
                return
            # kineto has no cancel: its window is stepped to its end now, and what it recorded saved
            result = od.end_now(step)
            finished = self._capture.finish(step, self._capture.stop_requested)
            self._ctx.wake()
            self.saver.save(result, finished.request, finished.num_steps)
            return
        try:
            done = od.tick(step)
        except PreEmpted as exc:
            log.warning("[Profiler] rank %d: %s", self.identity.rank, exc)
            od.abort(str(exc), dropped=True)
            self.fail(str(exc))
            return
        if done:
            result = od.take()
            finished = self._capture.finish(self._ctx.steps(), self._capture.stop_requested)
            self._ctx.wake()
            self.saver.save(result, finished.request, finished.num_steps)

    def _stop_for_cancel(self) -> None:
        """A cancel reached the running capture: save what it recorded, or drop it when nothing was."""
        assert self._driver is not None  # called only while a capture is active
        if self._driver.has_recorded():
            self.finish(cancelled_by=self._capture.stop_requested)
            return
        self._driver.abort()
        step = self._ctx.steps()
        self._capture.stopped_empty(step)
        self._ctx.wake()
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
                "start_step": self._ctx.steps(),
                "version": __version__,
            }
        }
