"""Requests into one rank: read, admitted or refused, and the ones answered at once.

Every way in ends here: the control file (the file trigger's watcher thread: `on_watched_file`,
`on_watched_error`), the signal (a request built at the next step boundary: `on_signal`) and
the training thread's own (`Sidecar.request_capture`). `accept` asks the capture owner
(`CaptureOwner.admit`) what to do with a request, and does the rest: the training thread starts
an armed one at a step boundary; a refusal is logged; a cancel goes to the owner too
(`CaptureOwner.cancel`); a watch request arms a slowdown watch (`rank.watches`); a "stacks" or
"hang" request is answered at once, from this thread, never the training thread, which may be
the one stuck (`rank.dumps`). Every answer wakes the heartbeat, so the record says it.
"""

from __future__ import annotations

import logging
from collections import deque
from pathlib import Path
from typing import Any

from sidecar.common.config import SidecarSettings
from sidecar.common.exceptions import RequestError
from sidecar.common.registry import ControlFile
from sidecar.common.request import ProfileRequest, RankFilter, check_counts, file_request_id, parse_request
from sidecar.rank import capture, dumps, slowdown
from sidecar.rank.context import RankContext
from sidecar.rank.noderelay import RankRelay, envelope_limit
from sidecar.rank.saver import Saver
from sidecar.rank.triggers.file import FileTrigger
from sidecar.rank.watches import Watches

log = logging.getLogger("sidecar")

MAX_SEEN_IDS = 64
INOTIFY_SAFETY_S = 30.0
# Where the node dir takes no inotify (a node_dir on a network filesystem): polled this often.
RELAY_POLL_S = 0.2


class RequestIntake:
    """Admits the requests of one rank (see the module docstring).

    Args:
        watches: the slowdown watch, told of each request (a capture it asked for, a cancel).
        saver: names and writes the dumps answered at once.
    """

    def __init__(self, ctx: RankContext, watches: Watches, saver: Saver) -> None:
        self._ctx = ctx
        self.identity = ctx.identity
        self.defaults = ctx.defaults
        self.enabled = ctx.enabled
        self._capture = ctx.capture
        self._watches = watches
        self._saver = saver
        self._seen_ids: deque[str] = deque(maxlen=MAX_SEEN_IDS)  # request ids delivered by the control file

    # -- the ways in ----------------------------------------------------------

    def file_trigger(self, control_path: Path, settings: SidecarSettings) -> FileTrigger:
        """The file trigger on the replica's control file, as `settings` say, delivering here."""
        return FileTrigger(
            control_path,
            self.on_watched_file,
            self.on_watched_error,
            mode=settings.watch,
            poll_interval=settings.poll_interval,
            # inotify reports the directory's own removal, so its safety look can be slow
            # (an idle rank's watcher wakes for nothing else): 30 s at the default heartbeat.
            safety_interval=max(0.5, min(6 * settings.heartbeat_interval, INOTIFY_SAFETY_S)),
            max_bytes=settings.max_control_bytes,
            allowed_uids=tuple(settings.allowed_uids),
            allowed_gids=tuple(settings.allowed_gids),
            settle_time=settings.settle_time,
        )

    def relay_trigger(self, envelope_path: Path, settings: SidecarSettings) -> tuple[FileTrigger, RankRelay]:
        """The file trigger on the node's relay file (sidecar.rank.noderelay), delivering here what
        the node agent relays from the shared control file."""
        relay = RankRelay(self.on_watched_file, self.on_watched_error)
        trigger = FileTrigger(
            envelope_path,
            relay.on_envelope,
            relay.on_envelope_error,
            mode="auto",  # node-local: inotify
            poll_interval=min(settings.poll_interval, RELAY_POLL_S),
            safety_interval=max(0.5, min(6 * settings.heartbeat_interval, INOTIFY_SAFETY_S)),
            max_bytes=envelope_limit(settings.max_control_bytes),
            settle_time=0.0,  # written by rename: always whole
        )
        return trigger, relay

    def on_watched_file(self, control: ControlFile) -> None:
        """The file trigger's callback (its watcher thread): handle the request, then
        publish the answer from this thread, not after a hand-off to the heartbeat's."""
        with self._ctx.heartbeat.publishing_after():
            self._on_control_file(control)

    def on_watched_error(self, exc: RequestError) -> None:
        with self._ctx.heartbeat.publishing_after():
            self.on_control_error(exc)

    def on_signal(self, count: int) -> None:
        """At a step boundary, for the `count`-th signal (the ones before it since the last
        boundary fold into it): a request with the configured defaults, on this rank."""
        request_id = f"signal-{self.identity.rank}-{count}"
        values = dict(self.defaults, rank_filter=RankFilter(frozenset({self.identity.rank})))
        try:
            check_counts(values)
            request = ProfileRequest(id=request_id, source="signal", **values)
        except RequestError as exc:  # a count from the config the sidecar cannot use
            self.on_control_error(exc, request_id)
            return
        self.accept(request)

    def on_control_error(self, exc: RequestError, request_id: str | None = None) -> None:
        """A request that could not be read or cannot apply: refused, and said."""
        message = f"request {request_id} refused: {exc}" if request_id else f"request refused: {exc}"
        log.error("[Profiler] rank %d: %s", self.identity.rank, message)
        self._capture.refuse_invalid(message)
        self._ctx.wake()

    def _on_control_file(self, control: ControlFile) -> None:
        fallback = file_request_id(control.mtime_ns, control.data)
        try:
            request = parse_request(control.data, self.defaults, fallback)
        except RequestError as exc:
            self.on_control_error(exc)
            return
        if control.repeat or request.id in self._seen_ids:
            old = request
            self._seen_ids.append(old.id)
            request = capture.reissue(old, fallback, self._ctx.steps())
            log.info(
                "[Profiler] rank %d: the control file holds %s again: a new request %s%s",
                self.identity.rank,
                "the same content" if control.repeat else f"request id {old.id}",
                fallback,
                f" (its start_step {old.start_step} has passed: starting at the next step)"
                if request.start_step != old.start_step else "",
            )
        self._seen_ids.append(request.id)
        self.accept(request)

    # -- what a request does ----------------------------------------------------

    def accept(self, request: ProfileRequest) -> bool:
        """Arm `request` if this rank is selected and free; else record why not."""
        rank = self.identity.rank
        if request.kind == "watch":
            return self._arm_watch(request)
        ctx = self._ctx
        self._watches.on_request(request, ctx.steps())
        rate = ctx.heartbeat.recent_rate() if request.start_step is not None else None
        cuda = request.kind == "memory" and _cuda_available()
        decision = self._capture.admit(
            request, rank=rank, world_size=self.identity.world_size, replica=self.identity.replica,
            step=ctx.steps(), enabled=self.enabled, recent_rate=rate, cuda_available=cuda,
            cannot_trace=ctx.cannot_trace,
        )
        if decision.action == "invalid":
            self.on_control_error(RequestError(decision.reason), request.id)
            return False
        if decision.action == "not selected":
            log.debug("[Profiler] request %s does not select rank %d", request.id, rank)
            ctx.wake()
            return False
        if decision.action == "cancel":
            self._on_cancel(request)
            return True
        if decision.action in ("stacks", "hang"):
            self._dump_stacks(request)
            return True
        ctx.wake()
        if decision.action == "refused":
            log.warning("[Profiler] rank %d: %s", rank, decision.reason)
            return False
        log.info(
            "[Profiler] rank %d armed request %s (%s)",
            rank,
            request.id,
            f"start at step {request.start_step}" if request.start_step is not None else "start at the next step",
        )
        return True

    def _on_cancel(self, cancel: ProfileRequest) -> None:
        """A cancel, on the watcher thread: disarm at once; a running capture stops
        at the next step boundary and saves what it recorded; a save completes.
        A slowdown watch is disarmed too."""
        self._watches.cancel(cancel.id)
        step = self._ctx.steps()
        outcome, current, state = self._capture.cancel(cancel, step)
        self._ctx.wake()
        if current is not None:
            log.warning("[Profiler] rank %d: request %s cancels request %s (%s at step %d): %s",
                        self.identity.rank, cancel.id, current.id, state, step, outcome)
        else:
            log.info("[Profiler] rank %d: request %s: nothing to cancel (%s)", self.identity.rank, cancel.id, state)

    def _arm_watch(self, request: ProfileRequest) -> bool:
        """A watch request, on the watcher thread: arm it on a selected rank, and take its baseline."""
        rank, world_size = self.identity.rank, self.identity.world_size
        top = request.rank_filter.highest()
        if top is not None and top >= world_size:
            self.on_control_error(RequestError(f"rank_filter {request.rank_filter} names rank {top}, but world size "
                                               f"is {world_size}"), request.id)
            return False
        if rank not in request.rank_filter:
            log.debug("[Profiler] watch %s does not select rank %d", request.id, rank)
            return False
        if not self.enabled:
            self.on_control_error(RequestError("profiler is disabled for this job ([profiler] enable_profiler = "
                                               "false); no slowdown watch was armed"), request.id)
            return False
        self._watches.install(request)
        if request.baseline:
            self.accept(slowdown.baseline_request(request))
        return True

    # -- the answers given at once (sidecar.rank.dumps) ---------------------------

    def _dump_stacks(self, request: ProfileRequest) -> None:
        """Kind "stacks" (and "hang": the flight recorder too), on the watcher thread."""
        rank = self.identity.rank
        header = self._dump_header(request.id)
        stacks = dumps.write_stacks(self._saver, header)
        if stacks.error:
            message = f"request {request.id}: writing stacks to {stacks.path} failed: {stacks.error}"
            log.error("[Profiler] rank %d: %s", rank, message)
            self._capture.stacks_failed(message)
            self._ctx.wake()
            return
        log.info("[Profiler] save stacks for rank: %d to file: %s", rank, stacks.path)
        extra: dict[str, Any] = {}
        if request.kind == "hang":
            fr_path, fr_error = self._dump_flight_recorder(header, stacks)
            extra = {"flight_recorder": fr_path, "flight_recorder_error": fr_error or None}
        self._capture.stacks_saved(str(stacks.path), self._ctx.steps(), request.id, **extra)
        self._ctx.wake()

    def _dump_header(self, request_id: str | None) -> dict[str, Any]:
        """The header of a dump taken now, for `request_id`."""
        return dumps.dump_header(self.identity, self._ctx.steps(), self._capture.state.value, request_id,
                                 last_step_at=self._ctx.heartbeat.last_step_at)

    def _dump_flight_recorder(self, header: dict[str, Any],
                              stacks: dumps.StacksDump | None = None) -> tuple[str | None, str]:
        """`dumps.write_flight_recorder`, said in the log. Never raises.

        Returns:
            (the file's path, or None when none could be written; why there is no
            flight recorder data in it: "" when there is).
        """
        rank = self.identity.rank
        dump = dumps.write_flight_recorder(self._saver, header, stacks)
        if dump.path is None:
            log.warning("[Profiler] rank %d: %s", rank, dump.reason)
            return None, dump.reason
        if dump.ok:
            log.info("[Profiler] save flight recorder for rank: %d to file: %s", rank, dump.path)
        else:
            self._ctx.log.once("flight-recorder", logging.WARNING,
                               f"[Profiler] rank {rank}: no flight recorder data: {dump.reason} (wrote {dump.path})")
        return str(dump.path), dump.reason


def _cuda_available() -> bool:
    from sidecar.rank import driver as driver_module

    return driver_module.cuda_available()
