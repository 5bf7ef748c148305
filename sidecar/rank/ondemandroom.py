"""The runner's on-demand half: which request goes to kineto's on-demand path, and its run.

`CaptureRunner` (`rank.runner`) asks this room at each step boundary:

- while a request is armed (`on_armed`): post its config to the responder as soon as the request
  is seen, aimed at its start step (a request with no start step gets one a poll's wait ahead), and
  keep kineto's step count in step with ours;
- at the start step (`begin`): kineto took the config (the capture runs here), or it did not, and
  the offer is withdrawn (the Python path runs it, as before);
- while it runs (`tick`): step kineto and mark the step; a pre-emption by another torch.profiler
  session fails it, said once;
- at its end (`take`): what the saver waits for.

A config kineto took for a request that went away (a cancel while armed) leaves kineto holding a
window nobody will step into: from then on every capture of this process takes the Python path
(`stale`). Each failure is logged once and written to the rank record (`error`), and shown by `lsr`.
"""

from __future__ import annotations

import logging
import time
from typing import Any

from sidecar.common.request import ProfileRequest
from sidecar.rank import ondemand, ondemand_env
from sidecar.rank.context import RankContext

log = logging.getLogger("sidecar")


class OnDemandRoom:
    """One rank's captures on the on-demand path (see the module docstring)."""

    def __init__(self, ctx: RankContext) -> None:
        self._ctx = ctx
        self.rank = ctx.identity.rank
        self.capture: ondemand.OnDemandCapture | None = None  # posted, or running
        self.running = False  # the capture's schedule has begun (the request is claimed)
        self.stale: str | None = None
        self._stopped_said: str | None = None
        self._watching = False

    def start(self) -> None:
        """At the sidecar's start: the responder reads kineto's polls from now on; say which path captures."""
        why = ondemand_env.why_not()
        if why is None and ondemand.responder() is not None:
            log.info("[Profiler] rank %d: captures on kineto's on-demand path (%s)", self.rank,
                     ondemand_env.ENV_OPT + "=off turns it off")
        else:
            log.info("[Profiler] rank %d: captures on the Python path: %s", self.rank, why)

    # -- armed ---------------------------------------------------------------------------

    def on_armed(self, request: ProfileRequest, step: int) -> int | None:
        """A boundary while `request` is armed: post it, or keep the posted one's count. Returns the
        step its schedule begins at on this path (None: the Python path's rule applies)."""
        od = self.capture
        if od is not None and od.request is not request:
            self._forget(od)
            od = None
        if od is None:
            why = self.unavailable(request, step)
            if why is not None:
                return request.start_step
            responder = ondemand.responder()
            prepared = ondemand_env.prepared()
            assert responder is not None and prepared is not None  # unavailable() said so
            begin = request.start_step
            if begin is None:
                begin = step + ondemand.lead_steps(self._ctx.heartbeat.recent_rate())
            od = ondemand.OnDemandCapture(responder, request, begin, prepared.directory)
            od.tick(step)
            od.post(step)
            self.capture = od
            self._watch(responder)
            return od.begin_step
        od.tick(step)
        return od.begin_step

    def unavailable(self, request: ProfileRequest, step: int, begin_now: bool = False) -> str | None:
        """Why `request` takes the Python path (None: this one)."""
        if self.stale is not None:
            return self.stale
        why = ondemand.unavailable(request, begin_now)
        if why is None and request.start_step is not None and step >= request.start_step:
            why = "the request came at or after its start step"
        return why

    # -- running ---------------------------------------------------------------------------

    def begin(self, request: ProfileRequest) -> bool:
        """The claimed `request`'s start step: True when kineto has its config (this path runs it),
        False when the offer was withdrawn (the Python path runs it)."""
        od = self.capture
        if od is None or od.request is not request:
            return False
        if not od.taken and od.withdraw():
            self.capture = None
            self._ctx.log.once(f"ondemand-late-{request.id}", logging.WARNING,
                               f"[Profiler] rank {self.rank}: kineto did not take request {request.id}'s on-demand "
                               f"config before step {od.begin_step}; captured on the Python path")
            return False
        self.running = True
        return True

    def tick(self, step: int) -> bool:
        """A boundary while this path's capture runs. Returns True at the one that ends its window.
        Raises PreEmpted when another torch.profiler session took kineto."""
        od = self.capture
        assert od is not None and self.running
        from sidecar.rank.driver import external_profiler_active

        if external_profiler_active():
            raise PreEmpted(f"capture {od.request.id} lost at step {step}: another torch.profiler session in this "
                            "process pre-empted the on-demand capture (kineto writes nothing for it); "
                            "nothing saved")
        if self._stopped_said is not None:
            self._ctx.capture.clear_error(self._stopped_said)
            self._stopped_said = None
        return od.tick(step)

    def take(self) -> tuple[str, Any]:
        """The window ended: what the saver waits for (`exporter.export`)."""
        od = self.capture
        assert od is not None
        self.capture, self.running = None, False
        request_id = od.request.id
        if od.steps_off:
            self._on_checked(request_id, od.steps_off)
        return "trace", od.result(lambda verdict: self._on_checked(request_id, verdict))

    def abort(self, why: str, exiting: bool = False, dropped: bool = False) -> None:
        """Drop this path's capture (a cancel before its window, a failure; the exit: nothing more to say;
        `dropped`: kineto dropped the window itself, as a pre-emption does)."""
        od, self.capture, self.running = self.capture, None, False
        if od is None:
            return
        od.abort()
        if od.taken and not exiting and not dropped and not od.written.exists():
            self.stale = ("kineto holds an on-demand window no step will reach: "
                          "this process's captures take the Python path")
            self._ctx.log.once("ondemand-stale", logging.WARNING, f"[Profiler] rank {self.rank}: {self.stale}")

    def end_now(self, step: int, exiting: bool = False) -> tuple[str, Any]:
        """End the window at `step` (a cancel, an early stop, the exit): step kineto to the window's end
        at once (a window ends only on a step, and kineto has no cancel; one left open at exit has crashed
        the process in kineto's teardown), so it writes what it recorded. Returns what the saver waits
        for (`take`); its steps check expects the steps that ran, and, at the exit, says why they are few."""
        od = self.capture
        assert od is not None and self.running
        od.end_now()
        kind, result = self.take()
        if exiting:
            result.note = f"the process exited at step {step} inside the window, which was ended there"
        else:
            result.num_steps = max(0, min(step, od.end_step) - od.first_step)
        return kind, result

    def has_recorded(self, step: int) -> bool:
        od = self.capture
        return od is not None and self.running and step > od.first_step

    def metadata(self, metadata: dict[str, Any], distributed_info: dict[str, Any]) -> None:
        od = self.capture
        if od is not None:
            od.metadata, od.distributed_info = dict(metadata), dict(distributed_info)

    # -- what is said -------------------------------------------------------------------------

    def _forget(self, od: ondemand.OnDemandCapture) -> None:
        if self.capture is od:
            self.abort(f"request {od.request.id} went away before its start step")

    def _on_checked(self, request_id: str, verdict: str | None) -> None:
        if verdict is None:
            return
        message = f"capture {request_id} (on-demand path): {verdict}"
        log.warning("[Profiler] rank %d: %s", self.rank, message)
        self._ctx.capture.warn(message, self._ctx.steps())
        self._ctx.wake()

    def _watch(self, responder: ondemand.Responder) -> None:
        if not self._watching:
            self._watching = True
            responder.watchers.append(self._check_stopped)

    def _check_stopped(self) -> None:
        """The responder's thread: a window whose steps stopped is said once, in the log and the record."""
        od = self.capture
        if od is None or not self.running or self._stopped_said is not None:
            return
        if od.first_step <= od.last_step < od.end_step and od.stopped_for(time.monotonic()) >= ondemand.STEPS_STOPPED_S:
            message = (f"capture {od.request.id} waits at step {od.last_step}: the steps stopped inside the on-demand "
                       f"window ({od.first_step}..{od.end_step - 1}); kineto writes it only once the window's last "
                       "step ends, and nothing if the process exits first")
            self._stopped_said = message
            log.warning("[Profiler] rank %d: %s", self.rank, message)
            self._ctx.capture.warn(message, self._ctx.steps())
            self._ctx.wake()


class PreEmpted(Exception):
    """Another torch.profiler session took kineto during an on-demand capture."""
