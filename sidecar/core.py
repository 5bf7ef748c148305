"""The Sidecar: composes triggers, the profiler driver and the rank record.

Threads and who does what:
- the training thread calls `step()`; idle, that is one counter increment and
  one attribute test. At a step boundary with work to do it starts, advances or
  finishes a capture; it never touches the filesystem.
- the watcher thread (FileTrigger) reads and validates control files and arms
  the request, or records the refusal; it disarms an armed rank on a cancel,
  and asks the training thread to stop a running capture at its next boundary.
- the heartbeat thread samples the step counter every `pace.SAMPLE_INTERVAL_S`
  (in memory), and rewrites the rank record every `heartbeat_interval`, at once
  when woken by a state change, and early when the steps run ahead of the pace
  the record shows (so the CLI's start step stays ahead of every rank).
- a saver thread per capture exports and gzips the trace, then renames it in.

Nothing here raises into the training loop: every failure is caught, logged
once and written to the rank record.
"""

from __future__ import annotations

import atexit
import dataclasses
import logging
import os
import signal as signal_module
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sidecar import __version__, pace
from sidecar.capture import BUSY_STATES
from sidecar.config import JobConfig
from sidecar.errors import RequestError
from sidecar.identity import RankIdentity
from sidecar.log import ensure_log_handler
from sidecar.registry import (
    MIN_STALE_S,
    STALE_HEARTBEATS,
    ControlFile,
    RankRecord,
    RecordError,
    atomic_write,
    control_path,
    ensure_dir,
    is_alive,
    publish_numbered,
    read_record,
    record_path,
    remove_stale_temps,
    write_temp,
)
from sidecar.request import (
    ProfileRequest,
    RankFilter,
    check_start_ahead,
    defaults_from_config,
    file_request_id,
    parse_request,
)
from sidecar.triggers.file import FileTrigger
from sidecar.triggers.signal import SignalTrigger

log = logging.getLogger("sidecar")

TRACE_DIR = "profile_trace"
RANK_DIR_TEMPLATE = "{replica}_{rank}"
TRACE_TEMPLATE = "{n}_trace.json.gz"
MEMORY_TEMPLATE = "{n}_memory.pickle"
STACKS_TEMPLATE = "{n}_stacks.txt"
REPORT_TIMEOUT_S = 3.0
MAX_HISTORY = 16
SAVE_JOIN_TIMEOUT_S = 60.0
MAX_SEEN_IDS = 64
CANCEL_HINT = "`cosmos-profiler profile cancel {replica}` ends it."


class Sidecar:
    """One rank's profiler sidecar. Create with `sidecar.install(...)`."""

    def __init__(
        self,
        identity: RankIdentity,
        job: JobConfig,
        output_dir: Path,
        registry_root: Path,
        private_root: bool = False,
        enabled: bool = True,
    ) -> None:
        self.identity = identity
        self.job = job
        self.settings = job.sidecar
        self.output_dir = Path(output_dir)
        self.registry_root = Path(registry_root)
        self.enabled = enabled
        self.trace_dir = self.output_dir / TRACE_DIR / RANK_DIR_TEMPLATE.format(
            replica=identity.replica, rank=identity.rank
        )
        self.trace_paths: list[str] = []

        # Hot-path state: `_busy` is the only thing step() reads when idle.
        self._step = 0
        self._busy = False
        self._closed = False
        self._signal_count = 0
        self._signals_handled = 0
        self._num_requests = 0  # requests that reached this rank (accepted or not)
        self._num_refused = 0
        self._num_coalesced = 0  # signals folded into one request

        self._lock = threading.RLock()
        self._state = "idle"
        self._pending: ProfileRequest | None = None
        self._active: ProfileRequest | None = None
        self._request: ProfileRequest | None = None
        self._selected: bool | None = None
        self._misaligned = False
        self._capture_start: int | None = None
        self._history: list[dict[str, Any]] = []
        self._trace_path: str | None = None
        self._num_captures = 0
        self._num_finished = 0  # schedules ended (handed to a saver), saved or not yet
        self._error: str | None = None
        self._refused: str | None = None
        self._next_index: dict[str, int] = {}
        self._logged: set[str] = set()
        self._record_inode: int | None = None  # of the record file as we last wrote it
        self._conflict: dict[str, Any] | None = None  # another live writer of our record (RankRecord.conflict)
        self._cancelled = False  # the current request was cancelled
        self._cancel: dict[str, Any] | None = None  # the last cancel handled (the record's `cancel`)
        self._stop_requested: ProfileRequest | None = None  # a cancel for the running capture
        self._seen_ids: deque[str] = deque(maxlen=MAX_SEEN_IDS)  # request ids delivered by the control file
        tick = min(pace.SAMPLE_INTERVAL_S, self.settings.heartbeat_interval)
        self._samples: deque[pace.Sample] = deque(maxlen=int(pace.WINDOW_S / tick) + 2)
        self._published_steps: list[pace.Sample] = []
        self._early_publish_at = 0.0

        self._driver = None  # sidecar.driver.ProfilerDriver, created on first use
        self._saver: threading.Thread | None = None
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._heartbeat: threading.Thread | None = None
        self._defaults = defaults_from_config(job.profiler.sub_profiler_config)
        self._started_at = time.time()
        self._create_time = _process_create_time()
        self._private_root = private_root
        self._stacks_path: str | None = None
        self._memory_path: str | None = None
        self._auto_hook: Any = None
        self._lead_optimizer: Any = None
        self._reporters: list[threading.Thread] = []
        # Called on the saver thread after each file is saved: (kind, path).
        self.on_saved: list[Callable[[str, Path], None]] = []

        self.file_trigger = FileTrigger(
            control_path(self.registry_root, identity.replica),
            self._on_control_file,
            self._on_control_error,
            mode=self.settings.watch,
            poll_interval=self.settings.poll_interval,
            safety_interval=max(0.5, min(self.settings.heartbeat_interval, 5.0)),
            max_bytes=self.settings.max_control_bytes,
            allowed_uids=tuple(self.settings.allowed_uids),
            allowed_gids=tuple(self.settings.allowed_gids),
            settle_time=self.settings.settle_time,
        )
        self.signal_trigger: SignalTrigger | None = None
        if self.settings.signal.lower() != "off":
            self.signal_trigger = SignalTrigger(
                int(getattr(signal_module, self.settings.signal)), self._on_signal
            )

    # -- public API -------------------------------------------------------

    @property
    def step_num(self) -> int:
        """The training step now running (number of `step()` calls so far)."""
        return self._step

    @property
    def state(self) -> str:
        return self._state

    @property
    def replica(self) -> str:
        return self.identity.replica

    @property
    def rank(self) -> int:
        return self.identity.rank

    def start(self) -> Sidecar:
        """Create directories, publish the record and start the triggers."""
        ensure_log_handler()
        try:
            ensure_dir(self.registry_root, private=self._private_root)
        except OSError as exc:
            self._log_once("registry", logging.ERROR, f"[Profiler] cannot create registry {self.registry_root}: {exc}")
        remove_stale_temps(self.trace_dir)
        self.file_trigger.start()
        if self.signal_trigger is not None:
            self.signal_trigger.start()
        log.info(
            "[Profiler] sidecar ready for replica %s rank %d (registry %s, traces under %s%s)",
            self.identity.replica,
            self.identity.rank,
            self.registry_root,
            self.trace_dir,
            "" if self.enabled else "; profiler disabled by config: requests will be refused",
        )
        self._publish()
        self._heartbeat = threading.Thread(target=self._heartbeat_loop, name="cosmos-profiler-heartbeat", daemon=True)
        self._heartbeat.start()
        atexit.register(self.close)
        forget = weakref.WeakMethod(self._forget_in_child)
        os.register_at_fork(after_in_child=lambda: (m := forget()) and m())
        return self

    def _forget_in_child(self) -> None:
        # A forked child (DataLoader worker) has none of our threads and must
        # not write this rank's files; it keeps a do-nothing sidecar.
        self._closed = True
        self._busy = False

    def step(self) -> None:
        """Mark the end of one training step. Call once per step."""
        self._step += 1
        if self._busy:
            self._on_boundary()

    def enable_auto_step(self) -> None:
        """Count steps from torch's global optimizer step hook (zero code change).

        The rule: one training step is one `step()` of the *lead* optimizer,
        the first optimizer that steps after this call. Other optimizers that
        step in the same iteration (a GAN's, say) are not counted. An explicit
        `Sidecar.step()` takes precedence: its first call removes the hook, and
        does not count again the boundary the hook already counted.
        """
        if self._auto_hook is not None or self._closed:
            return
        from torch.optim.optimizer import register_optimizer_step_post_hook

        self._auto_hook = register_optimizer_step_post_hook(self._on_optimizer_step)
        self.step = self._first_explicit_step  # type: ignore[method-assign]

    def _on_optimizer_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        lead = self._lead_optimizer
        if lead is None:
            self._lead_optimizer = weakref.ref(optimizer)
        elif lead() is not optimizer:
            return
        self._step += 1
        if self._busy:
            self._on_boundary()

    def _first_explicit_step(self) -> None:
        counted = self._lead_optimizer is not None
        self._disable_auto_step()
        log.info("[Profiler] explicit step() calls take over from the optimizer hook at step %d", self._step)
        if not counted:
            Sidecar.step(self)

    def _disable_auto_step(self) -> None:
        handle, self._auto_hook = self._auto_hook, None
        if handle is not None:
            handle.remove()
        self.__dict__.pop("step", None)

    def request_capture(self, request: ProfileRequest, begin_now: bool = False) -> bool:
        """Arm a capture from the training thread (the Cosmos-RL adapter uses this).

        With `begin_now`, the schedule starts at the current step without
        waiting for the next boundary, as Cosmos-RL's `profiler.start()` does.
        Returns whether the request was accepted.
        """
        try:
            if not self._accept(request):
                return False
            if begin_now and self._pending is request:
                self._begin(request, self._step, misaligned=False)
            return True
        except Exception:  # noqa: BLE001
            log.exception("[Profiler] rank %d: could not start a capture", self.identity.rank)
            return False

    def finish_now(self) -> bool:
        """Stop the running capture early and save what it recorded.

        Returns True when a save was started.
        """
        try:
            with self._lock:
                if self._active is None or self._driver is None:
                    return False
                if not self._driver.has_recorded():
                    self._driver.abort()
                    self._fail(f"capture {self._active.id} stopped at step {self._step} before any step was recorded")
                    return False
            self._finish()
            self._busy = self._pending is not None
            return True
        except Exception as exc:  # noqa: BLE001
            log.exception("[Profiler] rank %d: stopping the capture failed", self.identity.rank)
            with self._lock:
                self._fail(f"stopping the capture failed: {type(exc).__name__}: {exc}")
            return False

    @property
    def num_captures(self) -> int:
        """Captures this rank has saved."""
        return self._num_captures

    @property
    def num_finished(self) -> int:
        """Captures whose schedule has ended on this rank (the save may still run)."""
        return self._num_finished

    @property
    def active_request(self) -> ProfileRequest | None:
        """The request being traced now, if any."""
        return self._active

    @property
    def profiler(self) -> Any:
        """The running `torch.profiler.profile`, or None."""
        driver = self._driver
        return driver.profiler if driver is not None and self._active is not None else None

    def close(self) -> None:
        """Stop watching, abort an unfinished capture, wait for a running save. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._busy = False
        if os.getpid() != self.identity.pid:
            return  # a forked child (a DataLoader worker): the parent owns the files
        try:
            atexit.unregister(self.close)
        except Exception:  # noqa: BLE001
            pass
        try:
            if self._auto_hook is not None:
                self._disable_auto_step()
            if self.signal_trigger is not None:
                self.signal_trigger.stop()
            self.file_trigger.stop()
            with self._lock:
                if self._active is not None and self._driver is not None:
                    self._driver.abort()
                    self._fail(f"capture {self._active.id} aborted: the sidecar closed at step {self._step} before its schedule finished")
                self._pending = None
            saver = self._saver
            if saver is not None:
                saver.join(timeout=SAVE_JOIN_TIMEOUT_S)
            for reporter in self._reporters:
                reporter.join(timeout=REPORT_TIMEOUT_S + 1.0)
            self._stop.set()
            self._wake.set()
            if self._heartbeat is not None and self._heartbeat is not threading.current_thread():
                self._heartbeat.join(timeout=5.0)
            self._publish(exited=True)
        except Exception:  # noqa: BLE001 - close runs at exit too; never raise
            log.exception("[Profiler] error while closing the sidecar")

    def __enter__(self) -> Sidecar:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- triggers (watcher thread / signal handler) ------------------------

    def _on_signal(self) -> None:
        # Runs inside the signal handler: only record intent.
        self._signal_count += 1
        self._busy = True

    def _on_control_file(self, control: ControlFile) -> None:
        fallback = file_request_id(control.mtime_ns, control.data)
        try:
            request = parse_request(control.data, self._defaults, fallback)
        except RequestError as exc:
            self._on_control_error(exc)
            return
        if control.repeat or request.id in self._seen_ids:
            request = self._reissue(request, fallback, control.repeat)
        self._seen_ids.append(request.id)
        self._accept(request)

    def _reissue(self, request: ProfileRequest, fresh_id: str, repeat: bool) -> ProfileRequest:
        """A touched file, or one naming an id already handled, is a new request:
        it gets the fresh id of a file version, and a start_step that has passed
        becomes "the next step" (never a replay of the old request)."""
        self._seen_ids.append(request.id)
        changes: dict[str, Any] = {"id": fresh_id}
        start = request.start_step
        if start is not None and start <= self._step:
            changes["start_step"] = None
        log.info(
            "[Profiler] rank %d: the control file holds %s again: a new request %s%s",
            self.identity.rank,
            "the same content" if repeat else f"request id {request.id}",
            fresh_id,
            f" (its start_step {start} has passed: starting at the next step)" if "start_step" in changes else "",
        )
        return dataclasses.replace(request, **changes)

    def _on_control_error(self, exc: RequestError, request_id: str | None = None) -> None:
        message = f"request {request_id} refused: {exc}" if request_id else f"request refused: {exc}"
        log.error("[Profiler] rank %d: %s", self.identity.rank, message)
        with self._lock:
            self._refused = message
            self._num_requests += 1
            self._num_refused += 1
            self._error = message
        self._wake.set()

    def _accept(self, request: ProfileRequest) -> bool:
        """Arm `request` if this rank is selected and free; else record why not."""
        rank = self.identity.rank
        if request.source != "signal":
            top = request.rank_filter.highest()
            if top is not None and top >= self.identity.world_size:
                self._on_control_error(
                    RequestError(
                        f"rank_filter {request.rank_filter} names rank {top}, but world size is {self.identity.world_size}"
                    ),
                    request.id,
                )
                return False
            if rank not in request.rank_filter:
                with self._lock:
                    if self._state in ("idle", "error") and request.kind != "cancel":
                        self._request, self._selected = request, False
                log.debug("[Profiler] request %s does not select rank %d", request.id, rank)
                self._wake.set()
                return False
        if request.kind == "cancel":
            self._on_cancel(request)
            return True
        refusal = None
        ahead = None
        if request.start_step is not None and request.source != "signal":
            ahead = check_start_ahead(request.start_step, self._step, self._recent_rate())
        if not self.enabled:
            refusal = (
                f"request {request.id} refused: profiler is disabled for this job "
                "([profiler] enable_profiler = false); the profile request takes no effect"
            )
        elif ahead is not None:
            refusal = f"request {request.id} refused: {ahead}; nothing was armed"
        elif request.kind == "stacks":
            # Stacks are taken at once, here on the watcher thread: the
            # training thread may be the one that is stuck.
            self._dump_stacks(request)
            return True
        elif request.kind == "memory" and not self._cuda_available():
            refusal = (
                f"request {request.id} refused: kind 'memory' needs CUDA, "
                "and torch.cuda.is_available() is False on this rank"
            )
        with self._lock:
            if refusal is None and self._state in BUSY_STATES:
                refusal = f"request {request.id} refused: {self._busy_text()}"
            self._num_requests += 1
            if refusal is not None:
                self._num_refused += 1
                self._refused = refusal
                if self._state not in BUSY_STATES:
                    self._error = refusal
            else:
                self._pending, self._request, self._selected = request, request, True
                self._error = self._refused = None
                self._misaligned = self._cancelled = False
                self._stop_requested = None
                self._capture_start = None
                self._history = []
                self._transition("armed")
                self._busy = True
        if refusal is not None:
            log.warning("[Profiler] rank %d: %s", rank, refusal)
            self._wake.set()
            return False
        log.info(
            "[Profiler] rank %d armed request %s (%s)",
            rank,
            request.id,
            f"start at step {request.start_step}" if request.start_step is not None else "start at the next step",
        )
        return True

    def _busy_text(self) -> str:
        """Which request keeps this rank busy, and how to end it (caller holds the lock)."""
        current = self._pending or self._active or self._request
        start = current.start_step if current is not None else None
        if start is None:
            start = self._capture_start
        return (
            f"rank {self.identity.rank} is busy with request {current.id if current else '?'} "
            f"(start step {'next' if start is None else start}, phase {self._state}). "
            + CANCEL_HINT.format(replica=self.identity.replica)
        )

    def _on_cancel(self, cancel: ProfileRequest) -> None:
        """A cancel, on the watcher thread: disarm at once; a running capture stops
        at the next step boundary and saves what it recorded; a save completes."""
        with self._lock:
            self._num_requests += 1
            state, current = self._state, self._request
            outcome = "nothing to cancel"
            if state == "armed" and self._pending is not None:
                self._pending = None
                self._cancelled = True
                outcome = "disarmed"
            elif state in ("armed", "tracing") and self._active is not None:
                self._stop_requested = cancel  # the training thread stops it at its next boundary
                self._busy = True
                outcome = "stopping"
            elif state == "saving":
                outcome = "saving"  # the schedule had finished; a save is never cut short
            busy = outcome != "nothing to cancel"
            self._cancel = {
                "id": cancel.id, "request_id": current.id if busy and current else None, "outcome": outcome,
                "state": state, "step": self._step, "at": round(time.time(), 6), "trace_path": None,
            }
            if outcome == "disarmed":
                self._transition("idle", cancelled=cancel.id)
            else:
                self._wake.set()
        if busy:
            log.warning("[Profiler] rank %d: request %s cancels request %s (%s at step %d): %s",
                        self.identity.rank, cancel.id, current.id if current else "?", state, self._step, outcome)
        else:
            log.info("[Profiler] rank %d: request %s: nothing to cancel (%s)", self.identity.rank, cancel.id, state)

    def _recent_rate(self) -> float | None:
        with self._lock:
            samples = list(self._samples)
        return pace.recent_rate(pace.thin(samples))

    def _cuda_available(self) -> bool:
        from sidecar import driver as driver_module

        return driver_module.cuda_available()

    def _dump_stacks(self, request: ProfileRequest) -> None:
        from sidecar.stacks import format_stacks

        ident = self.identity
        path = self.trace_dir / STACKS_TEMPLATE.format(n=self._next_index.get(STACKS_TEMPLATE, 0))
        header = {"replica": ident.replica, "rank": ident.rank, "host": ident.host, "pid": ident.pid,
                  "step": self._step, "state": self._state, "request": request.id}
        try:
            ensure_dir(path.parent)
            tmp, _ = write_temp(path, format_stacks(header).encode())
            path = self._publish_numbered(tmp, STACKS_TEMPLATE)
        except Exception as exc:  # noqa: BLE001
            message = f"request {request.id}: writing stacks to {path} failed: {_describe(exc)}"
            log.error("[Profiler] rank %d: %s", ident.rank, message)
            with self._lock:
                self._error = message
            self._wake.set()
            return
        log.info("[Profiler] save stacks for rank: %d to file: %s", ident.rank, path)
        with self._lock:
            self._stacks_path = str(path)
            self._note(self._state, request.id, stacks=str(path))

    # -- the training thread ------------------------------------------------

    def _on_boundary(self) -> None:
        try:
            if self._closed:
                self._busy = False
                return
            if self._signal_count != self._signals_handled:
                count = self._signal_count
                self._num_coalesced += count - self._signals_handled - 1
                self._signals_handled = count
                self._accept(self._signal_request())
            step = self._step
            pending = self._pending  # read once: a cancel may disarm it meanwhile
            if self._active is not None:
                if self._stop_requested is not None:
                    self._stop_for_cancel()
                elif self._driver.step():
                    self._finish()
            elif pending is not None:
                start = pending.start_step
                if start is None or step >= start:
                    self._begin(pending, step, misaligned=start is not None and step > start)
            with self._lock:
                self._busy = self._pending is not None or self._active is not None or (
                    self._signal_count != self._signals_handled
                )
        except Exception as exc:  # noqa: BLE001 - never into the training loop
            log.exception("[Profiler] rank %d: capture failed", self.identity.rank)
            with self._lock:
                if self._driver is not None:
                    self._driver.abort()
                self._fail(f"capture failed at step {self._step}: {type(exc).__name__}: {exc}")
                self._busy = False

    def _signal_request(self) -> ProfileRequest:
        values = dict(self._defaults, rank_filter=RankFilter(frozenset({self.identity.rank})))
        return ProfileRequest(id=f"signal-{self.identity.rank}-{self._signal_count}", source="signal", **values)

    def _begin(self, request: ProfileRequest, step: int, misaligned: bool) -> None:
        from sidecar import driver as driver_module

        with self._lock:
            if self._pending is not request:
                return  # cancelled since the caller looked
            # Claimed: a cancel from now on stops the capture instead of disarming it.
            self._pending, self._active = None, request
        if driver_module.external_profiler_active():
            with self._lock:
                self._active = None
                self._fail(
                    f"request {request.id} refused: another torch.profiler is already running in this process; "
                    "stop it first (the sidecar never interferes with your own profile)"
                )
                # Counted as refused like any other refusal, so num_requests = captures + refused holds.
                self._num_refused += 1
                self._refused = self._error
            return
        if self._driver is None:
            self._driver = driver_module.ProfilerDriver()
        rank = self.identity.rank
        log.info("[Profiler] init profiler for rank %d", rank)
        self._driver.start(
            request,
            step,
            metadata=self._trace_metadata(request),
            distributed_info={"rank": self.identity.rank, "world_size": self.identity.world_size},
        )
        log.info("[Profiler] start to trace for rank: %d", rank)
        with self._lock:
            self._misaligned = misaligned
            self._capture_start = step
            self._transition("tracing")
        if misaligned:
            log.warning(
                "[Profiler] rank %d saw request %s late: start_step %s had passed, tracing from step %d",
                rank, request.id, request.start_step, step,
            )

    def _stop_for_cancel(self) -> None:
        """A cancel reached the running capture: save what it recorded, or drop it when nothing was."""
        with self._lock:
            cancel = self._stop_requested
            self._cancelled = True
        if self._driver.has_recorded():
            self._finish(cancelled_by=cancel)
            return
        self._driver.abort()
        with self._lock:
            self._active, self._stop_requested = None, None
            if self._cancel is not None:
                self._cancel.update(outcome="stopped", detail="no step had been recorded yet; nothing saved")
            self._transition("idle", cancelled=cancel.id if cancel else None)
        log.info("[Profiler] rank %d: capture stopped at step %d before any step was recorded; nothing saved",
                 self.identity.rank, self._step)

    def _finish(self, cancelled_by: ProfileRequest | None = None) -> None:
        """The schedule ended (or a cancel stopped it): hand the results to a saver thread."""
        request = self._active
        result = self._driver.take()
        with self._lock:
            self._active = None
            self._num_finished += 1
            if self._cancel is not None and self._stop_requested is not None and cancelled_by is None:
                self._cancel["outcome"] = "saving"  # the schedule finished before the cancel could stop it
            self._stop_requested = None
            if cancelled_by is not None:
                if self._cancel is not None:
                    self._cancel["outcome"] = "stopped"
                self._transition("saving", cancelled=cancelled_by.id)
            else:
                self._transition("saving")
        template = MEMORY_TEMPLATE if result[0] == "memory" else TRACE_TEMPLATE
        steps = self._step - (self._capture_start if self._capture_start is not None else self._step)
        self._saver = threading.Thread(
            target=self._save, args=(result, request, template, steps), name="cosmos-profiler-save", daemon=True
        )
        self._saver.start()

    # -- the saver thread ----------------------------------------------------

    def _save(self, result: tuple[str, Any], request: ProfileRequest, template: str, steps: int) -> None:
        from sidecar import driver as driver_module

        kind = result[0]
        what = "memory snapshot" if kind == "memory" else "trace"
        # The number is claimed only once the file is complete (see _publish_numbered).
        path = self.trace_dir / template.format(n=self._next_index.get(template, 0))
        try:
            ensure_dir(path.parent)
            path = driver_module.export(result, path, place=lambda tmp, _: self._publish_numbered(tmp, template))
        except Exception as exc:  # noqa: BLE001
            with self._lock:
                self._fail(f"saving {what} {path} failed: {_describe(exc)}")
            log.error("[Profiler] rank %d: saving %s to %s failed: %s", self.identity.rank, what, path, _describe(exc))
            return
        finally:
            del result
        if kind == "memory":
            log.info("[Profiler] save memory snapshot for rank: %d to file: %s after %d steps.", self.identity.rank, path, steps)
        else:
            log.info("[Profiler] save trace for rank: %d to file: %s after %d steps.", self.identity.rank, path, steps)
        with self._lock:
            if kind == "memory":
                self._memory_path = str(path)
            else:
                self._trace_path = str(path)
            self.trace_paths.append(str(path))
            self._num_captures += 1
            cancel = self._cancel
            if cancel is not None and cancel["request_id"] == request.id and cancel["outcome"] in ("stopped", "saving"):
                cancel["trace_path"] = str(path)
                if cancel["outcome"] == "saving":
                    cancel["outcome"] = "finished"
            if self._cancelled:
                self._transition("idle", saved=str(path), cancelled=cancel["id"] if cancel else True)
            else:
                self._transition("idle", saved=str(path))
        if self.settings.controller_url and kind == "trace":
            self._report_trace_dir(path.parent)
        for callback in self.on_saved:
            try:
                callback(kind, path)
            except Exception:  # noqa: BLE001 - a listener's failure is not the save's
                log.exception("[Profiler] rank %d: a listener of saved files failed", self.identity.rank)

    def _report_trace_dir(self, trace_dir: Path) -> None:
        """POST the trace directory to a Cosmos-RL controller: best effort, off the training thread."""
        from sidecar.report import report_trace_path

        def report() -> None:
            try:
                report_trace_path(self.settings.controller_url, self.identity.replica, str(trace_dir.resolve()),
                                  self.identity.rank, timeout=REPORT_TIMEOUT_S)
            except Exception as exc:  # noqa: BLE001 - the controller is optional
                self._log_once("report", logging.WARNING,
                               f"[Profiler] could not report the trace path to {self.settings.controller_url}: {exc}")

        thread = threading.Thread(target=report, name="cosmos-profiler-report", daemon=True)
        self._reporters = [t for t in self._reporters if t.is_alive()] + [thread]
        thread.start()

    # -- state and records ---------------------------------------------------

    def _transition(self, state: str, **extra: Any) -> None:
        """Set the state (caller holds the lock) and wake the heartbeat thread."""
        self._state = state
        self._note(state, self._request.id if self._request else None, **extra)

    def _note(self, state: str, request_id: str | None, **extra: Any) -> None:
        """Append a history entry (caller holds the lock) and wake the heartbeat thread."""
        entry = {"state": state, "step": self._step, "at": round(time.time(), 6), "request_id": request_id}
        entry.update(extra)
        self._history.append(entry)
        del self._history[:-MAX_HISTORY]
        self._wake.set()

    def _fail(self, message: str) -> None:
        self._active = self._stop_requested = None
        self._error = message
        self._transition("error", error=message)

    def _publish_numbered(self, tmp: Path, template: str) -> Path:
        """Give the finished temp file `tmp` the next free `<n>_...` name of its
        kind (traces, stacks and memory snapshots are numbered separately, each
        from 0, continuing after a restart). The name is claimed on disk, never
        replacing a file, so two processes writing one directory (a second job
        under the same replica name and rank) each keep all their files."""
        path = publish_numbered(tmp, self.trace_dir, template, self._next_index.get(template, 0))
        n = int(path.name.split("_", 1)[0])
        with self._lock:
            self._next_index[template] = max(self._next_index.get(template, 0), n + 1)
        return path

    def _trace_metadata(self, request: ProfileRequest) -> dict[str, Any]:
        return {
            "cosmos_profiler": {
                "replica": self.identity.replica,
                "role": self.identity.role,
                "rank": self.identity.rank,
                "world_size": self.identity.world_size,
                "host": self.identity.host,
                "pid": self.identity.pid,
                "job": self.identity.job,
                "request_id": request.id,
                "start_step": self._step,
                "version": __version__,
            }
        }

    def record(self, exited: bool = False) -> RankRecord:
        """A snapshot of this rank's record."""
        ident = self.identity
        with self._lock:
            request = self._request
            return RankRecord(
                replica=ident.replica,
                role=ident.role,
                rank=ident.rank,
                local_rank=ident.local_rank,
                world_size=ident.world_size,
                host=ident.host,
                pid=ident.pid,
                create_time=self._create_time,
                started_at=self._started_at,
                heartbeat_at=time.time(),
                heartbeat_interval=self.settings.heartbeat_interval,
                step=self._step,
                state=self._state,
                enabled=self.enabled,
                watch=self.file_trigger.mode,
                poll_interval=self.settings.poll_interval,
                defaults={k: (v.to_json() if k == "rank_filter" else v) for k, v in self._defaults.items()},
                output_dir=str(self.output_dir),
                request_id=request.id if request else None,
                request=request.to_json() if request else None,
                selected=self._selected,
                misaligned=self._misaligned,
                capture_start_step=self._capture_start,
                history=list(self._history),
                cancelled=self._cancelled,
                cancel=dict(self._cancel) if self._cancel is not None else None,
                recent_steps=[[round(t, 4), n] for t, n in pace.thin(list(self._samples))],
                trace_path=self._trace_path,
                stacks_path=self._stacks_path,
                memory_path=self._memory_path,
                num_captures=self._num_captures,
                num_requests=self._num_requests,
                num_refused=self._num_refused,
                num_signals=self._signal_count,
                num_coalesced=self._num_coalesced,
                error=self._error,
                refused=self._refused,
                version=__version__,
                exited_at=time.time() if exited else None,
                job=ident.job,
                conflict=dict(self._conflict) if self._conflict else None,
            )

    def _publish(self, exited: bool = False) -> None:
        path = record_path(self.registry_root, self.identity.replica, self.identity.rank)
        self._check_record_holder(path)
        record = self.record(exited=exited)
        self._published_steps = [(t, int(n)) for t, n in record.recent_steps]
        try:
            ensure_dir(path.parent)
            self._record_inode = atomic_write(path, record.to_json())
            self._logged.discard("publish")
        except OSError as exc:
            self._log_once("publish", logging.ERROR, f"[Profiler] cannot write rank record under {self.registry_root}: {exc}")

    def _check_record_holder(self, path: Path) -> None:
        """Notice another live process writing our rank record: a second job
        running under this replica name with an overlapping rank.

        Before each write, one lstat: a record file that is not the one we last
        wrote (a rename gives a new inode) was written by someone else; it is
        read (safely) and, when its writer is alive and not this process, the
        conflict is logged once per writer and published in our record, where
        `replica ls` shows it. The conflict ends when the other writer exits,
        or writes nothing for as long as a dead rank's heartbeat takes to go stale.
        """
        ident = self.identity
        now = time.time()
        try:
            inode = os.lstat(path).st_ino
        except OSError:
            inode = None
        other = None
        if inode is not None and inode != self._record_inode:
            try:
                other = read_record(path)
            except (OSError, RecordError):
                other = None
        if other is not None and (other.host, other.pid) != (ident.host, ident.pid):
            if other.exited_at is None and is_alive(other, ident.host, now):
                self._on_conflict(other, now)
                return
            if self._conflict and (other.host, other.pid) == (self._conflict["host"], self._conflict["pid"]):
                self._end_conflict("it exited")
                return
        conflict = self._conflict
        if conflict:
            limit = max(MIN_STALE_S, STALE_HEARTBEATS * float(conflict.get("heartbeat_interval") or 2.0))
            if now - conflict["seen_at"] > limit:
                self._end_conflict(f"it has not written the record for {now - conflict['seen_at']:.0f}s")

    def _on_conflict(self, other: RankRecord, now: float) -> None:
        ident = self.identity
        with self._lock:
            self._conflict = {"pid": other.pid, "host": other.host, "job": other.job, "seen_at": round(now, 3),
                              "heartbeat_interval": other.heartbeat_interval}
        key = f"conflict-{other.host}-{other.pid}"
        if key in self._logged:
            return
        same_job = bool(other.job) and other.job == ident.job
        who = f"another live process of this job ({ident.job})" if same_job else (
            f"a live process of another job ({other.job or 'unknown job'}; this one is {ident.job})")
        self._log_once(key, logging.WARNING,
                       f"[Profiler] replica {ident.replica} rank {ident.rank} is also held by {who}: "
                       f"pid {other.pid} on {other.host or 'an unknown host'}. Both write "
                       f"{record_path(self.registry_root, ident.replica, ident.rank)} and save traces to "
                       f"{self.trace_dir}; `replica ls` shows the conflict. Give one of them another replica "
                       f"name (COSMOS_PROFILER_REPLICA or --replica).")

    def _end_conflict(self, why: str) -> None:
        conflict = self._conflict
        with self._lock:
            self._conflict = None
        if conflict:
            self._logged.discard(f"conflict-{conflict['host']}-{conflict['pid']}")
            log.info("[Profiler] rank %d: the conflict with pid %s on %s is over (%s)",
                     self.identity.rank, conflict["pid"], conflict["host"], why)

    def _heartbeat_loop(self) -> None:
        interval = self.settings.heartbeat_interval
        # Sample often while the rank steps; one whose step counter stood still
        # for pace.STILL_AFTER_S (idle, blocked) costs nothing between heartbeats.
        tick = min(pace.SAMPLE_INTERVAL_S, interval)
        last_step, moved_at = self._step, time.monotonic()
        due = moved_at + interval
        while not self._stop.is_set():
            now = time.monotonic()
            still = now - moved_at >= pace.STILL_AFTER_S
            woken = self._wake.wait(max(0.0, due - now) if still else min(tick, max(0.0, due - now)))
            if woken:
                self._wake.clear()
            if self._stop.is_set():
                return
            try:
                now = time.monotonic()
                early = self._sample_steps(now)
                if self._step != last_step:
                    last_step, moved_at = self._step, now
                if woken or early or now >= due:
                    due = now + interval
                    self._publish()
            except Exception:  # noqa: BLE001
                self._log_once("heartbeat", logging.ERROR, "[Profiler] heartbeat failed")

    def _sample_steps(self, now: float) -> bool:
        """Sample the step counter; True when the record should be rewritten before its
        heartbeat is due: the first measurable pace, or steps running ahead of the published pace."""
        sample = (time.time(), self._step)
        with self._lock:
            self._samples.append(sample)
        if now - self._early_publish_at < pace.PUBLISHED_SPACING_S:
            return False
        published = self._published_steps
        if len(published) >= 2:
            early = pace.ran_ahead(published, sample)
        else:
            early = sample[0] - self._samples[0][0] >= pace.PUBLISHED_SPACING_S
        if early:
            self._early_publish_at = now
        return early

    def _log_once(self, key: str, level: int, message: str) -> None:
        if key not in self._logged:
            self._logged.add(key)
            log.log(level, message)


def _describe(exc: BaseException) -> str:
    if isinstance(exc, OSError) and exc.strerror:
        return f"{exc.strerror} ({exc.filename or ''})".replace(" ()", "")
    return f"{type(exc).__name__}: {exc}"


def _process_create_time() -> float:
    try:
        import psutil

        return psutil.Process().create_time()
    except Exception:  # noqa: BLE001
        return time.time()


def build_sidecar(
    output_dir: str | os.PathLike[str] | None = None,
    replica: str | None = None,
    rank: int | None = None,
    role: str = "policy",
    config: Any = None,
    registry: str | os.PathLike[str] | None = None,
) -> Sidecar:
    """Resolve everything `install()` takes into a Sidecar (not yet started)."""
    from sidecar.config import job_config
    from sidecar.identity import resolve_identity, resolve_output_dir, resolve_registry_root

    job, enabled = job_config(config)
    job.sidecar = job.sidecar.with_env()  # a replace(): the overrides are validated like the file
    ensure_log_handler()  # resolving the identity may warn about a name taken from the environment
    identity = resolve_identity(replica=replica, rank=rank, role=role)
    root, private = resolve_registry_root(registry, configured=job.sidecar.registry, output_root=job.output_root)
    out = resolve_output_dir(output_dir, output_root=job.output_root)
    return Sidecar(identity, job, out, root, private_root=private, enabled=enabled)
