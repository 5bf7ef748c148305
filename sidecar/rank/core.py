"""The Sidecar: one rank's triggers, capture state machine, profiler driver, saver and heartbeat.

Threads and who does what:
- the training thread calls `step()`; idle, that is one counter increment and
  one attribute test. At a step boundary with work to do it starts, advances,
  stops or finishes a capture through the driver; it never touches the filesystem.
- the watcher thread (`FileTrigger`) reads and validates control files; the
  sidecar admits the request (`capture.admit`), arms it, records the refusal, takes
  stacks at once, or applies a cancel.
- the heartbeat thread (`heartbeat.Heartbeat`) samples the pace and rewrites the
  rank record (`heartbeat.RecordWriter`), at once when a state change wakes it.
- a saver thread per capture (`saver.Saver`) writes the file and names it.

What each room holds: `capture` the states and their transitions (pure),
`driver` torch.profiler (the only torch import), `saver` the files,
`heartbeat` the record, `triggers` the ways in. This class composes them, and
keeps the hot path and the locking. Nothing here raises into the training loop:
every failure is caught, logged once and written to the rank record.

Why ~650 lines: what is left is the glue that must see the lock, the hot-path
flags and every part at once (the request handlers of the watcher thread and
the step-boundary handlers of the training thread); each has a docstring, and
the decisions they make live in `capture`.
"""

from __future__ import annotations

import atexit
import json
import logging
import os
import threading
import time
import weakref
from collections import deque
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sidecar import layout
from sidecar.config import JobConfig, SidecarSettings
from sidecar.errors import RequestError
from sidecar.identity import RankIdentity
from sidecar.log import ensure_log_handler
from sidecar.rank import capture, dumps, slowdown
from sidecar.rank.faultstacks import FaultStacks
from sidecar.rank.heartbeat import Heartbeat, RecordWriter
from sidecar.rank.report import TraceDirReporter
from sidecar.rank.saver import Saver
from sidecar.rank.stall import StallReporter, StallWatch, stall_json
from sidecar.rank.threads import Worker
from sidecar.rank.triggers.file import FileTrigger
from sidecar.rank.triggers.signal import FREE, SignalTrigger, choose_signal, slurm_signals
from sidecar.rank.upload import TraceUploader
from sidecar.records import RankRecord, State
from sidecar.registry import ControlFile, ensure_dir, remove_stale_temps
from sidecar.request import (
    ProfileRequest,
    RankFilter,
    check_counts,
    config_defaults,
    file_request_id,
    parse_request,
)
from sidecar.signames import parse_signal, signal_name
from sidecar.version import __version__

log = logging.getLogger("sidecar")
INOTIFY_SAFETY_S = 30.0
DEFAULT_SIGNAL = parse_signal(SidecarSettings.signal)  # a setting that names another is the user's choice

MAX_SEEN_IDS = 64


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
        reserved_signals: dict[int, str] | None = None,
    ) -> None:
        self.identity = identity
        self.job = job
        self.settings = job.sidecar
        self.output_dir = Path(output_dir)
        self.registry_root = Path(registry_root)
        self.enabled = enabled
        self.trace_dir = layout.rank_trace_dir(self.output_dir, identity.replica, identity.rank)
        self.trace_paths: list[str] = []
        # Called on the saver thread after each file is saved: (kind, path, request).
        self.on_saved: list[Callable[[str, Path], None]] = []

        # Hot-path state: `_busy` is the only thing step() reads when idle.
        self._step = 0
        self._busy = False
        self._closed = False
        self._signal_count = 0
        self._published_signals = 0  # the count in the record last written
        self._published_trigger = False  # whether that record named a trigger signal
        self._signals_handled = 0
        self._num_coalesced = 0  # signals folded into one request

        self._lock = threading.RLock()
        self._capture = capture.CaptureState()
        # Bounded here, where they are used (cosmos-rl accepts them as they are): said once at start.
        self._defaults, self._config_notes = config_defaults(job.profiler.sub_profiler_config)
        self._seen_ids: deque[str] = deque(maxlen=MAX_SEEN_IDS)  # request ids delivered by the control file
        self._logged: set[str] = set()
        self._started_at = time.time()
        self._create_time = _process_create_time()
        self._private_root = private_root
        self._driver = None  # sidecar.rank.driver.ProfilerDriver, created on first use
        self._auto_hook: Any = None
        self._lead_optimizer: Any = None
        # Why this rank cannot count steps (set by `mark_cannot_trace`); None: it can.
        self.cannot_trace: str | None = None

        self._saver = Saver(self.trace_dir, identity.rank, self._on_file_saved, self._on_save_failed)
        self._reporter = TraceDirReporter(self.settings.controller_url, identity.replica, identity.rank)
        # [train.ckpt] upload_s3: each saved trace, copied to S3 on a thread of its own (sidecar.rank.upload).
        self._uploader = TraceUploader(job.s3, identity.rank, self._on_uploaded, self._log_once) if job.s3 else None
        self._trace_url: str | None = None
        self._upload_error: str | None = None
        self._writer = RecordWriter(layout.record_path(self.registry_root, identity.replica, identity.rank),
                                    identity, self.trace_dir, self._log_once, self._logged.discard)
        self._heartbeat = Heartbeat(self.settings.heartbeat_interval, lambda: self._step, self._publish, self._idle_tick)
        self.file_trigger = FileTrigger(
            layout.control_path(self.registry_root, identity.replica),
            self._on_watched_file,
            self._on_watched_error,
            mode=self.settings.watch,
            poll_interval=self.settings.poll_interval,
            # inotify reports the directory's own removal, so its safety look can be slow
            # (an idle rank's watcher wakes for nothing else): 30 s at the default heartbeat.
            safety_interval=max(0.5, min(6 * self.settings.heartbeat_interval, INOTIFY_SAFETY_S)),
            max_bytes=self.settings.max_control_bytes,
            allowed_uids=tuple(self.settings.allowed_uids),
            allowed_gids=tuple(self.settings.allowed_gids),
            settle_time=self.settings.settle_time,
        )
        # The signal trigger is made at start(), on a signal nobody else handles (choose_signal);
        # `reserved_signals`: those the job will handle but has not taken yet (a cosmos-rl worker's).
        self.signal_trigger: SignalTrigger | None = None
        self._reserved_signals = dict(reserved_signals or {})
        self._reclaim_signal = False  # the job gave the trigger's signal back: take it at the next boundary
        # Stacks while a C call holds the GIL (sidecar.faultstacks), and the stall watch (sidecar.rank.stall).
        self._fault_stacks = FaultStacks(self.settings.stacks_signal,
                                         layout.fault_stacks_path(self.registry_root, identity.replica, identity.rank),
                                         identity.rank)
        # The slowdown watch (sidecar.rank.slowdown): `_watch` while it watches (step() reads it),
        # `_shown_watch` the current or last one, for the record.
        self._watch: slowdown.SlowdownWatch | None = None
        self._shown_watch: slowdown.SlowdownWatch | None = None
        self._watch_worker: Worker | None = None
        self._stall_watch: StallWatch | None = None
        if self.settings.stall_after_s:
            reporter = StallReporter(identity, self._saver, self.settings.stall_after_s,
                                     lambda: self._capture.state.value, self._heartbeat.wake)
            self._stall_watch = StallWatch(self.settings.stall_after_s, lambda: self._step, reporter.on_stall,
                                           reporter.on_resume, self._fault_stacks.path)

    # -- public API -------------------------------------------------------

    @property
    def step_num(self) -> int:
        """The training step now running (number of `step()` calls so far)."""
        return self._step

    @property
    def state(self) -> State:
        return self._capture.state

    @property
    def replica(self) -> str:
        return self.identity.replica

    @property
    def rank(self) -> int:
        return self.identity.rank

    @property
    def num_captures(self) -> int:
        """Captures this rank has saved."""
        return self._capture.num_captures

    @property
    def num_finished(self) -> int:
        """Captures whose schedule has ended on this rank (the save may still run)."""
        return self._capture.num_finished

    @property
    def busy_with(self) -> ProfileRequest | None:
        """The request armed or being traced now, if any."""
        return self._capture.pending or self._capture.active

    @property
    def last_finished_id(self) -> str | None:
        """The id of the request whose schedule ended last on this rank."""
        return self._capture.finished_id

    @property
    def counts_steps_by(self) -> str:
        """How steps are counted: "step()", "optimizer" (the hook, until step() takes over) or "none"."""
        if self.cannot_trace:
            return "none"
        return "optimizer" if self._auto_hook is not None else "step()"

    def mark_cannot_trace(self, reason: str) -> None:
        """This rank has no step boundary (no `step()`, no optimizer step): refuse trace and
        memory requests with `reason`, and say so in the record, instead of arming them forever."""
        self.cannot_trace = reason
        if self._auto_hook is not None:
            self._disable_auto_step()
        self._heartbeat.wake()

    @property
    def active_request(self) -> ProfileRequest | None:
        """The request being traced now, if any."""
        return self._capture.active

    @property
    def profiler(self) -> Any:
        """The running `torch.profiler.profile`, or None."""
        driver = self._driver
        return driver.profiler if driver is not None and self._capture.active is not None else None

    def start(self) -> Sidecar:
        """Create directories, publish the record and start the triggers."""
        ensure_log_handler()
        try:
            ensure_dir(self.registry_root, private=self._private_root)
        except OSError as exc:
            self._log_once("registry", logging.ERROR, f"[Profiler] cannot create registry {self.registry_root}: {exc}")
        remove_stale_temps(self.trace_dir)
        if self._uploader is not None:
            self._upload_error = self._uploader.check()  # boto3 missing: said once, now
        self.file_trigger.start()
        self._start_signal_trigger()
        self._fault_stacks.install(self.signal_trigger.signum if self.signal_trigger is not None else None)
        for note in self._config_notes:
            log.warning("[Profiler] rank %d: %s", self.identity.rank, note)
        log.info(
            "[Profiler] sidecar ready for replica %s rank %d (registry %s, traces under %s%s)",
            self.identity.replica,
            self.identity.rank,
            self.registry_root,
            self.trace_dir,
            "" if self.enabled else "; profiler disabled by config: requests will be refused",
        )
        self._point_from_default()  # before the first record: whoever sees the record finds the pointer
        # Read before the first publish replaces it: a restart keeps the always-on watch's budget.
        last_slowdown = self._last_slowdown_capture() if self.settings.slowdown_factor else None
        self._publish()
        self._heartbeat.start()
        if self._stall_watch is not None:
            self._stall_watch.start()
        if self.settings.slowdown_factor and self.enabled:
            self._install_watch(slowdown.always_on_request(self.settings.slowdown_factor, self.identity.job,
                                                           self._defaults), always_on=True,
                                last_capture_at=last_slowdown)
        if self._fault_stacks.installed:
            self._heartbeat.wake()  # republish: the record names the threads just started (faulthandler does not)
        atexit.register(self.close)
        forget = weakref.WeakMethod(self._forget_in_child)
        os.register_at_fork(after_in_child=lambda: (m := forget()) and m())
        return self

    def _start_signal_trigger(self) -> None:
        """Take the configured signal where nobody handles it; else (unless the user named it) the
        first free real-time one (`choose_signal`); log once which, and how to trigger this rank."""
        if self.settings.signal.lower() == "off":
            return
        try:
            configured = parse_signal(self.settings.signal)
        except ValueError as exc:
            self._log_once("signal", logging.WARNING, f"[Profiler] the signal trigger is off: sidecar.signal: {exc}")
            return
        explicit = configured != DEFAULT_SIGNAL
        reserved = {**slurm_signals(os.environ), **self._reserved_signals}
        signum, why = choose_signal(configured, explicit, reserved, self._fault_stacks.signums)
        rank, name = self.identity.rank, signal_name(configured)
        if why and signum is None:
            self._log_once("signal", logging.WARNING, (
                f"[Profiler] rank {rank}: {name} is the job's ({why}); the sidecar neither takes nor chains it, "
                + ("and takes no other signal in place of one you named: " if explicit else
                   "and no real-time signal is free: ")
                + "the signal trigger is off. Trigger this rank with `cosmos-profiler profile set` or its control "
                "file, or set [sidecar] signal (COSMOS_PROFILER_SIGNAL) to a free signal"))
            return
        if why:
            self._log_once("signal", logging.WARNING, (
                f"[Profiler] rank {rank}: {name} is the job's ({why}); the sidecar neither takes nor chains it. "
                f"`kill -s {signal_name(signum)} {self.identity.pid}` triggers this rank instead "
                "(`cosmos-profiler replica lsr` shows each rank's signal)"))
        trigger = SignalTrigger(signum, self._on_signal, rank)
        if trigger.start():
            self.signal_trigger = trigger

    def _point_from_default(self) -> None:
        """A registry taken from a relative `[train] output_dir` (cosmos-rl's default `./outputs`):
        leave a pointer to it in the per-user default registry, so the CLI, run from another
        directory, can find this replica (`sidecar.fleet.resolve_source`)."""
        relative = self.job.train_output_dir and not os.path.isabs(self.job.train_output_dir)
        if self._private_root or not relative or not self.job.output_root or (
                self.registry_root != layout.registry_for_output_root(os.path.abspath(self.job.output_root))):
            return
        from sidecar.identity import default_registry_root
        from sidecar.registry import atomic_write

        default = default_registry_root()
        if default == self.registry_root:
            return
        pointer = {"replica": self.identity.replica, "registry": str(self.registry_root),
                   "output_dir": str(self.output_dir)}
        try:
            ensure_dir(default, private=True)
            ensure_dir(default / layout.ROOTS_DIR)
            atomic_write(layout.root_pointer_path(default, self.identity.replica),
                         (json.dumps(pointer, sort_keys=True) + "\n").encode())
        except OSError as exc:
            log.debug("[Profiler] no pointer to %s in %s: %s", self.registry_root, default, exc)

    def step(self) -> None:
        """Mark the end of one training step. Call once per step."""
        self._step += 1
        if self._watch is not None:
            self._on_watched_step()
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

    def request_capture(self, request: ProfileRequest, begin_now: bool = False) -> bool:
        """Arm a capture from the training thread (the Cosmos-RL adapter uses this).

        With `begin_now`, the schedule starts at the current step without
        waiting for the next boundary, as Cosmos-RL's `profiler.start()` does.
        Returns whether the request was accepted.
        """
        try:
            if not self._accept(request):
                return False
            if begin_now and self._capture.pending is request:
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
                active = self._capture.active
                if active is None or self._driver is None:
                    return False
                if not self._driver.has_recorded():
                    self._driver.abort()
                    self._fail(f"capture {active.id} stopped at step {self._step} before any step was recorded")
                    return False
            self._finish()
            self._busy = self._capture.pending is not None
            return True
        except Exception as exc:  # noqa: BLE001
            log.exception("[Profiler] rank %d: stopping the capture failed", self.identity.rank)
            with self._lock:
                self._fail(f"stopping the capture failed: {type(exc).__name__}: {exc}")
            return False

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
            if self._stall_watch is not None:
                self._stall_watch.stop()
            self._watch = None
            if self._watch_worker is not None:
                self._watch_worker.stop()
            self._fault_stacks.close()
            self._fault_stacks.remove_if_empty()
            self.file_trigger.stop()
            with self._lock:
                active = self._capture.active
                if active is not None and self._driver is not None:
                    self._driver.abort()
                    self._fail(f"capture {active.id} aborted: the sidecar closed at step {self._step} "
                               "before its schedule finished")
                self._capture.pending = None
            self._saver.join()
            self._reporter.join()
            if self._uploader is not None:
                self._uploader.close()
            self._heartbeat.stop()
            self._publish(exited=True)
        except Exception:  # noqa: BLE001 - close runs at exit too; never raise
            log.exception("[Profiler] error while closing the sidecar")

    def __enter__(self) -> Sidecar:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _forget_in_child(self) -> None:
        # A forked child (DataLoader worker) has none of our threads and must
        # not write this rank's files; it keeps a do-nothing sidecar.
        self._closed = True
        self._busy = False

    # -- counting steps without code changes -----------------------------------

    def _on_optimizer_step(self, optimizer: Any, args: Any, kwargs: Any) -> None:
        lead = self._lead_optimizer
        if lead is None:
            self._lead_optimizer = weakref.ref(optimizer)
        elif lead() is not optimizer:
            return
        self._step += 1
        if self._watch is not None:
            self._on_watched_step()
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

    # -- requests (watcher thread / signal handler) --------------------------

    def _on_signal(self) -> None:
        # Runs inside the signal handler: only record intent.
        self._signal_count += 1
        self._busy = True

    def _on_watched_file(self, control: ControlFile) -> None:
        """The file trigger's callback (its watcher thread): handle the request, then
        publish the answer from this thread, not after a hand-off to the heartbeat's."""
        with self._heartbeat.publishing_after():
            self._on_control_file(control)

    def _on_watched_error(self, exc: RequestError) -> None:
        with self._heartbeat.publishing_after():
            self._on_control_error(exc)

    def _on_control_file(self, control: ControlFile) -> None:
        fallback = file_request_id(control.mtime_ns, control.data)
        try:
            request = parse_request(control.data, self._defaults, fallback)
        except RequestError as exc:
            self._on_control_error(exc)
            return
        if control.repeat or request.id in self._seen_ids:
            old = request
            self._seen_ids.append(old.id)
            request = capture.reissue(old, fallback, self._step)
            log.info(
                "[Profiler] rank %d: the control file holds %s again: a new request %s%s",
                self.identity.rank,
                "the same content" if control.repeat else f"request id {old.id}",
                fallback,
                f" (its start_step {old.start_step} has passed: starting at the next step)"
                if request.start_step != old.start_step else "",
            )
        self._seen_ids.append(request.id)
        self._accept(request)

    def _on_control_error(self, exc: RequestError, request_id: str | None = None) -> None:
        message = f"request {request_id} refused: {exc}" if request_id else f"request refused: {exc}"
        log.error("[Profiler] rank %d: %s", self.identity.rank, message)
        with self._lock:
            capture.refuse_invalid(self._capture, message)
        self._heartbeat.wake()

    def _accept(self, request: ProfileRequest) -> bool:
        """Arm `request` if this rank is selected and free; else record why not."""
        rank = self.identity.rank
        if request.kind == "watch":
            return self._arm_watch(request)
        watch = self._shown_watch
        if watch is not None and not watch.is_done and watch.is_ours(request) and rank in request.rank_filter:
            with self._lock:
                watch.on_request(request, self._step)
            log.warning("[Profiler] rank %d: slowdown watch %s fired: %s", rank, watch.id, request.reason)
        rate = self._heartbeat.recent_rate() if request.start_step is not None else None
        cuda = request.kind == "memory" and self._cuda_available()
        with self._lock:
            decision = capture.admit(
                self._capture, request, rank=rank, world_size=self.identity.world_size,
                replica=self.identity.replica, step=self._step, enabled=self.enabled,
                recent_rate=rate, cuda_available=cuda, cannot_trace=self.cannot_trace,
            )
            if decision.action == "armed":
                self._busy = True
        if decision.action == "invalid":
            self._on_control_error(RequestError(decision.reason), request.id)
            return False
        if decision.action == "not selected":
            log.debug("[Profiler] request %s does not select rank %d", request.id, rank)
            self._heartbeat.wake()
            return False
        if decision.action == "cancel":
            self._on_cancel(request)
            return True
        if decision.action in ("stacks", "hang"):
            self._dump_stacks(request)
            return True
        self._heartbeat.wake()
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
        watch = self._shown_watch
        if watch is not None and not watch.is_done:
            with self._lock:
                self._watch = None
                watch.cancel(cancel.id)
            log.info("[Profiler] rank %d: request %s disarms slowdown watch %s", self.identity.rank, cancel.id,
                     watch.id)
        with self._lock:
            state = self._capture.state
            outcome, current = capture.cancel(self._capture, cancel, self._step)
            if outcome == "stopping":
                self._busy = True
        self._heartbeat.wake()
        if current is not None:
            log.warning("[Profiler] rank %d: request %s cancels request %s (%s at step %d): %s",
                        self.identity.rank, cancel.id, current.id, state, self._step, outcome)
        else:
            log.info("[Profiler] rank %d: request %s: nothing to cancel (%s)", self.identity.rank, cancel.id, state)

    # -- the slowdown watch (sidecar.rank.slowdown) ------------------------------------

    def _arm_watch(self, request: ProfileRequest) -> bool:
        """A watch request, on the watcher thread: arm it on a selected rank, and take its baseline."""
        rank = self.identity.rank
        top = request.rank_filter.highest()
        if top is not None and top >= self.identity.world_size:
            self._on_control_error(RequestError(f"rank_filter {request.rank_filter} names rank {top}, but world size "
                                                f"is {self.identity.world_size}"), request.id)
            return False
        if rank not in request.rank_filter:
            log.debug("[Profiler] watch %s does not select rank %d", request.id, rank)
            return False
        if not self.enabled:
            self._on_control_error(RequestError("profiler is disabled for this job ([profiler] enable_profiler = "
                                                "false); no slowdown watch was armed"), request.id)
            return False
        self._install_watch(request)
        if request.baseline:
            self._accept(slowdown.baseline_request(request))
        return True

    def _last_slowdown_capture(self) -> float | None:
        """When this rank's always-on watch last captured, from the record a previous run of it left
        (so that a restart does not reset the budget); None when there is none."""
        from sidecar.records import read_record

        try:
            watch = read_record(layout.record_path(self.registry_root, self.identity.replica, self.identity.rank)).slowdown
        except Exception:  # noqa: BLE001 - no record, or one we cannot read: no capture known
            return None
        if isinstance(watch, dict) and watch.get("always_on") and isinstance(watch.get("last_capture_at"), (int, float)):
            return float(watch["last_capture_at"])
        return None

    def _install_watch(self, request: ProfileRequest, always_on: bool = False,
                       last_capture_at: float | None = None) -> None:
        old = self._shown_watch
        last = old.last_capture_at if old is not None else last_capture_at
        watch = slowdown.SlowdownWatch(request, always_on=always_on,
                                       min_interval_s=self.settings.slowdown_min_interval_s,
                                       last_capture_at=last, times=old.times if old is not None else None)
        with self._lock:
            self._shown_watch = watch
            self._watch = watch
        if self._watch_worker is None:
            self._watch_worker = Worker("profiler-slowdown", self._watch_loop)
            self._watch_worker.start()
        log.info("[Profiler] rank %d armed slowdown watch %s (%gx the median, %d steps in a row%s)",
                 self.identity.rank, request.id, request.factor, request.consecutive,
                 ", always on" if always_on else f", {request.repeat} repeats")
        self._heartbeat.wake()

    def _on_watched_step(self) -> None:
        """The training thread: one step for the watch (O(1) amortized; see slowdown.StepTimes)."""
        watch = self._watch
        if watch is None:  # a cancel (watcher thread) or close() took it since step() looked
            return
        try:
            cs = self._capture
            if watch.on_step(self._step, time.perf_counter(), cs.active is not None or cs.state is State.SAVING):
                self._watch_worker.wake()
            elif watch.is_done and self._watch is watch:  # not one armed since
                self._watch = None
        except Exception:  # noqa: BLE001 - never into the training loop
            self._watch = None
            log.exception("[Profiler] rank %d: the slowdown watch failed and is off", self.identity.rank)

    def _watch_loop(self, worker: Worker) -> None:
        place = slowdown.WatchPlace(self.registry_root, self.identity.replica, self.identity.rank, self.trace_dir,
                                    self.settings.slowdown_min_free_pct, lambda: self._step)
        while not worker.stopping:
            worker.wait(1.0)
            watch = self._watch
            if watch is None or watch.state != "firing" or worker.stopping:
                continue
            try:
                slowdown.ask_for_capture(watch, place)
            except Exception as exc:  # noqa: BLE001
                log.exception("[Profiler] rank %d: the slowdown watch could not ask for a capture", self.identity.rank)
                watch.not_captured(f"asking for a capture failed: {type(exc).__name__}: {exc}")
            self._heartbeat.wake()

    def _cuda_available(self) -> bool:
        from sidecar.rank import driver as driver_module

        return driver_module.cuda_available()

    def _dump_stacks(self, request: ProfileRequest) -> None:
        """Kind "stacks" (and "hang": the flight recorder too), on the watcher thread."""
        rank = self.identity.rank
        header = self._dump_header(request.id)
        stacks = dumps.write_stacks(self._saver, header)
        if stacks.error:
            message = f"request {request.id}: writing stacks to {stacks.path} failed: {stacks.error}"
            log.error("[Profiler] rank %d: %s", rank, message)
            with self._lock:
                self._capture.error = message
            self._heartbeat.wake()
            return
        log.info("[Profiler] save stacks for rank: %d to file: %s", rank, stacks.path)
        extra: dict[str, Any] = {}
        if request.kind == "hang":
            fr_path, fr_error = self._dump_flight_recorder(header, stacks)
            extra = {"flight_recorder": fr_path, "flight_recorder_error": fr_error or None}
        with self._lock:
            self._capture.stacks_path = str(stacks.path)
            capture.note(self._capture, self._step, request_id=request.id, stacks=str(stacks.path), **extra)
        self._heartbeat.wake()

    def dump_flight_recorder(self, request_id: str | None = None) -> tuple[str | None, str]:
        """Write torch.distributed's flight recorder to this rank's next `<n>_flight_recorder.json`
        (`sidecar.rank.dumps`), from the calling thread (never the training thread's business). Never raises.

        Returns:
            (the file's path, or None when none could be written; why there is no
            flight recorder data in it: "" when there is).
        """
        return self._dump_flight_recorder(self._dump_header(request_id))

    def _dump_header(self, request_id: str | None) -> dict[str, Any]:
        return dumps.dump_header(self.identity, self._step, self._capture.state.value, request_id,
                                 last_step_at=self._heartbeat.last_step_at)

    def _dump_flight_recorder(self, header: dict[str, Any],
                              stacks: dumps.StacksDump | None = None) -> tuple[str | None, str]:
        rank = self.identity.rank
        dump = dumps.write_flight_recorder(self._saver, header, stacks)
        if dump.path is None:
            log.warning("[Profiler] rank %d: %s", rank, dump.reason)
            return None, dump.reason
        if dump.ok:
            log.info("[Profiler] save flight recorder for rank: %d to file: %s", rank, dump.path)
        else:
            self._log_once("flight-recorder", logging.WARNING,
                           f"[Profiler] rank {rank}: no flight recorder data: {dump.reason} (wrote {dump.path})")
        return str(dump.path), dump.reason

    # -- the training thread ------------------------------------------------

    def _on_boundary(self) -> None:
        try:
            if self._closed:
                self._busy = False
                return
            if self._reclaim_signal:
                self._reclaim_signal = False
                if self.signal_trigger is not None and self.signal_trigger.reclaim():
                    self._heartbeat.wake()
            if self._signal_count != self._signals_handled:
                count = self._signal_count
                self._num_coalesced += count - self._signals_handled - 1
                self._signals_handled = count
                try:
                    request = self._signal_request()
                except RequestError as exc:  # a count from the config the sidecar cannot use
                    self._on_control_error(exc, f"signal-{self.identity.rank}-{count}")
                else:
                    self._accept(request)
            step = self._step
            cs = self._capture
            pending = cs.pending  # read once: a cancel may disarm it meanwhile
            if cs.active is not None:
                if cs.stop_requested is not None:
                    self._stop_for_cancel()
                elif self._driver.step():
                    self._finish()
            elif pending is not None:
                start = pending.start_step
                if start is None or step >= start:
                    self._begin(pending, step, misaligned=start is not None and step > start)
            with self._lock:
                self._busy = cs.pending is not None or cs.active is not None or self._reclaim_signal or (
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
        check_counts(values)
        return ProfileRequest(id=f"signal-{self.identity.rank}-{self._signal_count}", source="signal", **values)

    def _begin(self, request: ProfileRequest, step: int, misaligned: bool) -> None:
        from sidecar.rank import driver as driver_module

        with self._lock:
            if not capture.claim(self._capture, request):
                return  # cancelled since the caller looked
        if driver_module.external_profiler_active():
            with self._lock:
                self._fail(
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
            distributed_info={"rank": self.identity.rank, "world_size": self.identity.world_size},
        )
        log.info("[Profiler] start to trace for rank: %d", rank)
        with self._lock:
            capture.begin(self._capture, step, misaligned)
        self._heartbeat.wake()
        if misaligned:
            log.warning(
                "[Profiler] rank %d saw request %s late: start_step %s had passed, tracing from step %d",
                rank, request.id, request.start_step, step,
            )

    def _stop_for_cancel(self) -> None:
        """A cancel reached the running capture: save what it recorded, or drop it when nothing was."""
        if self._driver.has_recorded():
            self._finish(cancelled_by=self._capture.stop_requested)
            return
        self._driver.abort()
        with self._lock:
            capture.stopped_empty(self._capture, self._step)
        self._heartbeat.wake()
        log.info("[Profiler] rank %d: capture stopped at step %d before any step was recorded; nothing saved",
                 self.identity.rank, self._step)

    def _finish(self, cancelled_by: ProfileRequest | None = None) -> None:
        """The schedule ended (or a cancel stopped it): hand the results to the saver."""
        result = self._driver.take()
        with self._lock:
            start = self._capture.capture_start
            request = capture.finish(self._capture, self._step, cancelled_by)
        self._heartbeat.wake()
        self._saver.save(result, request, self._step - (start if start is not None else self._step))

    # -- the saver thread ----------------------------------------------------

    def _on_file_saved(self, kind: str, path: Path, request: ProfileRequest, steps: int) -> None:
        with self._lock:
            self.trace_paths.append(str(path))
            capture.saved(self._capture, kind, str(path), request, self._step)
        self._heartbeat.wake()
        if kind == "trace":
            self._reporter.report(path.parent)
            if self._uploader is not None:
                self._uploader.upload(path)
        for callback in self.on_saved:
            try:
                callback(kind, path, request)
            except Exception:  # noqa: BLE001 - a listener's failure is not the save's
                log.exception("[Profiler] rank %d: a listener of saved files failed", self.identity.rank)

    def _on_uploaded(self, path: Path, url: str | None, error: str | None) -> None:
        """The upload thread: `path` is at `url`, or not (`error`)."""
        with self._lock:
            if url is not None:
                self._trace_url = url
            self._upload_error = error
            # The history ties the outcome to its trace, for `profile status` (answers.capture_of).
            if url is not None:
                capture.note(self._capture, self._step, upload=str(path), url=url)
            else:
                capture.note(self._capture, self._step, upload=str(path), upload_error=error)
        self._heartbeat.wake()

    def _on_save_failed(self, message: str) -> None:
        with self._lock:
            self._fail(message)

    # -- state and records ---------------------------------------------------

    def _fail(self, message: str) -> None:
        """(caller holds the lock)"""
        capture.fail(self._capture, message, self._step)
        self._heartbeat.wake()

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
        recent = self._heartbeat.recent()
        stall = self._stall_watch
        fault_stacks = self._fault_stacks.info() if self._fault_stacks.check() else None
        trigger = self._check_signal()
        with self._lock:
            cs = self._capture
            request = cs.request
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
                mtime_heartbeat=True,
                step=self._step,
                state=State.STALLED.value if stall is not None and stall.is_stalled else cs.state.value,
                enabled=self.enabled,
                watch=self.file_trigger.mode,
                poll_interval=self.settings.poll_interval,
                defaults={k: (v.to_json() if k == "rank_filter" else v) for k, v in self._defaults.items()},
                output_dir=str(self.output_dir),
                request_id=request.id if request else None,
                request=request.to_json() if request else None,
                selected=cs.selected,
                misaligned=cs.misaligned,
                capture_start_step=cs.capture_start,
                history=list(cs.history),
                cancelled=cs.cancelled,
                cancel=dict(cs.cancel) if cs.cancel is not None else None,
                recent_steps=[[round(t, 4), n] for t, n in recent],
                last_step_at=round(self._heartbeat.last_step_at, 3),
                trace_path=cs.trace_path,
                stacks_path=cs.stacks_path,
                memory_path=cs.memory_path,
                num_captures=cs.num_captures,
                num_requests=cs.num_requests,
                num_refused=cs.num_refused,
                num_signals=self._signal_count,
                signal=trigger.name if trigger is not None else None,
                num_coalesced=self._num_coalesced,
                error=cs.error,
                refused=cs.refused,
                version=__version__,
                exited_at=time.time() if exited else None,
                job=ident.job,
                conflict=dict(self._writer.conflict) if self._writer.conflict else None,
                fault_stacks=fault_stacks,
                stall_after_s=self.settings.stall_after_s,
                stall=stall_json(stall.shown) if stall is not None else None,
                upload_to=self._uploader.target.location if self._uploader is not None else None,
                trace_url=self._trace_url,
                upload_error=self._upload_error,
                counts_steps_by=self.counts_steps_by,
                cannot_trace=self.cannot_trace,
                slowdown=self._shown_watch.to_json() if self._shown_watch is not None else None,
            )

    def _publish(self, exited: bool = False) -> None:
        self._writer.check()
        record = self.record(exited=exited)
        self._heartbeat.published_steps = [(t, int(n)) for t, n in record.recent_steps]
        self._published_signals = record.num_signals
        self._published_trigger = record.signal is not None
        try:
            self._writer.publish(record)
            self._logged.discard("publish")
        except OSError as exc:
            self._log_once("publish", logging.ERROR, f"[Profiler] cannot write rank record under {self.registry_root}: {exc}")

    def _idle_tick(self) -> None:
        """An idle heartbeat (see Heartbeat._run): the record file's mtime only, unless the
        file is not ours any more, faulthandler's handler was replaced, the trigger's signal
        changed hands or a signal came (its handler only counts it, without a wake); then in full."""
        stacks_on = self._fault_stacks.installed
        trigger_on = self._check_signal() is not None
        if (self._fault_stacks.check() != stacks_on or trigger_on != self._published_trigger
                or self._signal_count != self._published_signals or not self._writer.tick()):
            self._publish()

    def _check_signal(self) -> SignalTrigger | None:
        """At each heartbeat: the trigger when its signal is still ours (None when the job took it, or it
        is off). A signal the job gave back is taken again at the next step boundary (the main thread)."""
        trigger = self.signal_trigger
        if trigger is None:
            return None
        found = trigger.check()
        if found == FREE and not self._reclaim_signal:
            with self._lock:
                self._reclaim_signal = True
                self._busy = True
        return trigger if trigger.is_installed else None

    def _log_once(self, key: str, level: int, message: str) -> None:
        if key not in self._logged:
            self._logged.add(key)
            log.log(level, message)


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
    reserved_signals: dict[int, str] | None = None,
) -> Sidecar:
    """Resolve everything `install()` takes into a Sidecar (not yet started).

    `reserved_signals`: signals the job will handle (by number, with who owns them), never the trigger's."""
    from sidecar import envvars
    from sidecar.config import job_config
    from sidecar.identity import resolve_identity, resolve_output_dir, resolve_registry_root

    job, enabled = job_config(config)
    # Inside a running job a bad variable turns off only what it configures (sidecar.envvars);
    # `python -m sidecar.run` has refused it at launch already.
    envvars.warn()
    job.sidecar = envvars.apply(job.sidecar, strict=False)
    ensure_log_handler()  # resolving the identity may warn about a name taken from the environment
    identity = resolve_identity(replica=replica, rank=rank, role=role)
    root, private = resolve_registry_root(registry, configured=job.sidecar.registry, output_root=job.output_root)
    out = resolve_output_dir(output_dir, output_root=job.output_root)
    return Sidecar(identity, job, out, root, private_root=private, enabled=enabled,
                   reserved_signals=reserved_signals)
