"""The Sidecar: one rank's rooms, wired together, and the hot path between them.

Threads and who does what:
- the training thread calls `step()`; idle, that is one counter increment and
  two attribute tests. At a step boundary with work to do it takes a signal's
  request and lets `runner` start, advance, stop or finish a capture; it never
  touches the filesystem.
- the watcher thread (`FileTrigger`) reads and validates control files; `intake`
  admits the request (`capture.admit`), arms it, records the refusal, takes
  stacks at once (`dumps`), or applies a cancel.
- the heartbeat thread (`heartbeat.Heartbeat`) samples the pace and rewrites the
  rank record (`heartbeat.RecordWriter`), at once when a state change wakes it;
  at each beat `signalowner` checks that the trigger's signal is still ours.
- a saver thread per capture (`saver.Saver`) writes the file and names it.

What each room holds: `capture` the states and their transitions (pure),
`runner` a capture's run (`driver`, torch.profiler) and save (`saver`),
`intake` the requests, `dumps` the stacks and flight recorder, `watches` the
slowdown watch, `stall` the stall watch, `signalowner` the trigger's signal,
`autostep` the optimizer hook, `heartbeat` the record, `triggers` the ways in.
This class builds them, shares one lock and one `CaptureState` between them,
and keeps the hot-path flags (`_step`, `_busy`, `_watch`) that `step()` and the
signal handler touch. Nothing here raises into the training loop: every failure
is caught, logged once and written to the rank record.
"""

from __future__ import annotations

import atexit
import functools
import logging
import os
import threading
import time
import weakref
from pathlib import Path
from typing import Any

from sidecar.common import layout
from sidecar.common.config import JobConfig
from sidecar.common.identity import RankIdentity
from sidecar.common.log import ensure_log_handler
from sidecar.common.records import RankRecord, State
from sidecar.common.registry import ensure_dir, remove_stale_temps
from sidecar.common.request import ProfileRequest, config_defaults
from sidecar.common.version import __version__
from sidecar.rank import capture, slowdown
from sidecar.rank.autostep import OptimizerStepHook
from sidecar.rank.faulthandler_stacks import FaultStacks
from sidecar.rank.heartbeat import Heartbeat, RecordWriter
from sidecar.rank.intake import RequestIntake
from sidecar.rank.pointer import leave_pointer
from sidecar.rank.recordfields import capture_fields, identity_fields
from sidecar.rank.runner import CaptureRunner, OnSaved
from sidecar.rank.signalowner import SignalOwner
from sidecar.rank.stall import StallReporter, StallWatch, stall_json
from sidecar.rank.torchcheck import require_torch
from sidecar.rank.triggers.signal import SignalTrigger
from sidecar.rank.watches import Watches

log = logging.getLogger("sidecar")


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

        # Hot-path state: `_busy` is the only thing step() reads when idle, with `_watch`.
        self._step = 0
        self._busy = False
        self._closed = False
        self._watch: slowdown.SlowdownWatch | None = None  # the slowdown watch step() feeds (rank.watches)
        self._published_signals = 0  # the count of signals in the record last written
        self._published_trigger = False  # whether that record named a trigger signal

        self._lock = threading.RLock()
        self._capture = capture.CaptureState()
        # Bounded here, where they are used (cosmos-rl accepts them as they are): said once at start.
        self._defaults, self._config_notes = config_defaults(job.profiler.sub_profiler_config)
        self._logged: set[str] = set()
        self._started_at = time.time()
        self._create_time = _process_create_time()
        self._private_root = private_root
        self._auto_hook: OptimizerStepHook | None = None
        # Why this rank cannot count steps (set by `mark_cannot_trace`); None: it can.
        self.cannot_trace: str | None = None
        # True when a Cosmos-RL CosmosProfiler built this sidecar (sidecar.cosmos): the worker's
        # profiler drives it, so the post-import hook leaves it alone.
        self.cosmos_owned = False

        steps = self._steps
        self._writer = RecordWriter(layout.record_path(self.registry_root, identity.replica, identity.rank),
                                    identity, self.trace_dir, self._log_once, self._logged.discard)
        self._heartbeat = Heartbeat(self.settings.heartbeat_interval, steps, self._publish, self._idle_tick)
        wake = self._heartbeat.wake
        self._runner = CaptureRunner(identity, job, self.trace_dir, self._capture, self._lock, steps, wake,
                                     self._log_once)
        self._watches = Watches(identity, self.settings, self.registry_root, self.trace_dir, self._lock, steps,
                                self._is_capturing, wake, self._set_watch)
        self._intake = RequestIntake(identity, self._defaults, enabled, self._capture, self._lock, self._heartbeat,
                                     self._watches, self._runner.saver, steps, lambda: self.cannot_trace,
                                     self._mark_busy, self._log_once)
        self.file_trigger = self._intake.file_trigger(layout.control_path(self.registry_root, identity.replica),
                                                      self.settings)
        # The signal trigger is taken at start(), on a signal nobody else handles; `reserved_signals`:
        # those the job will handle but has not taken yet (a cosmos-rl worker's).
        self._signals = SignalOwner(identity, self.settings.signal, reserved_signals or {}, self._on_signal,
                                    self._mark_busy_locked, self._log_once)
        # Stacks while a C call holds the GIL (sidecar.rank.faulthandler_stacks), and the stall watch (sidecar.rank.stall).
        self._fault_stacks = FaultStacks(self.settings.stacks_signal,
                                         layout.fault_stacks_path(self.registry_root, identity.replica, identity.rank),
                                         identity.rank)
        self._stall_watch: StallWatch | None = None
        if self.settings.stall_after_s:
            reporter = StallReporter(identity, self._runner.saver, self.settings.stall_after_s,
                                     lambda: self._capture.state.value, wake)
            self._stall_watch = StallWatch(self.settings.stall_after_s, steps, reporter.on_stall,
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
        return self._runner.profiler

    @property
    def signal_trigger(self) -> SignalTrigger | None:
        """The signal trigger, once start() took a signal; None when it is off."""
        return self._signals.trigger

    @property
    def trace_paths(self) -> list[str]:
        """Every file this rank saved, in order."""
        return self._runner.trace_paths

    @property
    def on_saved(self) -> list[OnSaved]:
        """Called on the saver thread after each file is saved: (kind, path, request)."""
        return self._runner.on_saved

    def start(self) -> Sidecar:
        """Create directories, publish the record and start the triggers."""
        ensure_log_handler()
        try:
            ensure_dir(self.registry_root, private=self._private_root)
        except OSError as exc:
            self._log_once("registry", logging.ERROR, f"[Profiler] cannot create registry {self.registry_root}: {exc}")
        remove_stale_temps(self.trace_dir)
        self._runner.check_upload()
        self.file_trigger.start()
        self._signals.start(self._fault_stacks.signums)
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
        # Before the first record: whoever sees the record finds the pointer.
        leave_pointer(self.job, self.registry_root, self._private_root, self.identity.replica, self.output_dir)
        # Read before the first publish replaces it: a restart keeps the always-on watch's budget.
        last_slowdown = self._watches.last_capture_at() if self.settings.slowdown_factor else None
        self._publish()
        self._heartbeat.start()
        if self._stall_watch is not None:
            self._stall_watch.start()
        if self.settings.slowdown_factor and self.enabled:
            self._watches.install(slowdown.always_on_request(self.settings.slowdown_factor, self.identity.job,
                                                             self._defaults), always_on=True,
                                  last_capture_at=last_slowdown)
        if self._fault_stacks.installed:
            self._heartbeat.wake()  # republish: the record names the threads just started (faulthandler does not)
        atexit.register(self.close)
        forget = weakref.WeakMethod(self._forget_in_child)
        os.register_at_fork(after_in_child=lambda: (m := forget()) and m())
        return self

    def step(self) -> None:
        """Mark the end of one training step. Call once per step."""
        self._step += 1
        if self._watch is not None:
            self._watches.on_step(self._step)
        if self._busy:
            self._on_boundary()

    def enable_auto_step(self) -> None:
        """Count steps from torch's global optimizer step hook (zero code change): one step
        of the lead optimizer is one training step (`rank.autostep`). An explicit
        `Sidecar.step()` takes precedence: its first call removes the hook, and
        does not count again the boundary the hook already counted.
        """
        if self._auto_hook is not None or self._closed:
            return
        self._auto_hook = OptimizerStepHook(functools.partial(Sidecar.step, self))
        self._auto_hook.install()
        self.step = self._first_explicit_step  # type: ignore[method-assign]

    def request_capture(self, request: ProfileRequest, begin_now: bool = False) -> bool:
        """Arm a capture from the training thread (the Cosmos-RL adapter uses this).

        With `begin_now`, the schedule starts at the current step without
        waiting for the next boundary, as Cosmos-RL's `profiler.start()` does.
        Returns whether the request was accepted.
        """
        try:
            if not self._intake.accept(request):
                return False
            if begin_now and self._capture.pending is request:
                self._runner.begin(request, self._step, misaligned=False)
            return True
        except Exception:  # noqa: BLE001
            log.exception("[Profiler] rank %d: could not start a capture", self.identity.rank)
            return False

    def finish_now(self) -> bool:
        """Stop the running capture early and save what it recorded.

        Returns True when a save was started.
        """
        try:
            if not self._runner.finish_now():
                return False
            self._busy = self._capture.pending is not None
            return True
        except Exception as exc:  # noqa: BLE001
            log.exception("[Profiler] rank %d: stopping the capture failed", self.identity.rank)
            with self._lock:
                self._runner.fail(f"stopping the capture failed: {type(exc).__name__}: {exc}")
            return False

    def dump_flight_recorder(self, request_id: str | None = None) -> tuple[str | None, str]:
        """Write torch.distributed's flight recorder to this rank's next `<n>_flight_recorder.json`
        (`sidecar.rank.dumps`), from the calling thread (never the training thread's business). Never raises.

        Returns:
            (the file's path, or None when none could be written; why there is no
            flight recorder data in it: "" when there is).
        """
        return self._intake.dump_flight_recorder(self._intake.dump_header(request_id))

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
            self._signals.stop()
            if self._stall_watch is not None:
                self._stall_watch.stop()
            self._watches.stop()
            self._fault_stacks.close()
            self._fault_stacks.remove_if_empty()
            self.file_trigger.stop()
            self._runner.close(self._step)
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

    def _first_explicit_step(self) -> None:
        counted = self._auto_hook is not None and self._auto_hook.has_counted
        self._disable_auto_step()
        log.info("[Profiler] explicit step() calls take over from the optimizer hook at step %d", self._step)
        if not counted:
            Sidecar.step(self)

    def _disable_auto_step(self) -> None:
        hook, self._auto_hook = self._auto_hook, None
        if hook is not None:
            hook.remove()
        self.__dict__.pop("step", None)

    # -- the hot-path flags, as the rooms set them ----------------------------------

    def _on_signal(self) -> None:
        # Runs inside the signal handler (the signal owner counted it): only record intent.
        self._busy = True

    def _steps(self) -> int:
        return self._step

    def _mark_busy(self) -> None:
        """(caller holds the lock)"""
        self._busy = True

    def _mark_busy_locked(self) -> None:
        with self._lock:
            self._busy = True

    def _set_watch(self, watch: slowdown.SlowdownWatch | None) -> None:
        self._watch = watch

    def _is_capturing(self) -> bool:
        cs = self._capture
        return cs.active is not None or cs.state is State.SAVING

    # -- the training thread ------------------------------------------------

    def _on_boundary(self) -> None:
        try:
            if self._closed:
                self._busy = False
                return
            if self._signals.reclaim_due and self._signals.reclaim():
                self._heartbeat.wake()
            count = self._signals.take()
            if count is not None:
                self._intake.on_signal(count)
            self._runner.on_boundary(self._step)
            with self._lock:
                cs = self._capture
                self._busy = (cs.pending is not None or cs.active is not None or self._signals.reclaim_due
                              or self._signals.has_unhandled)
        except Exception as exc:  # noqa: BLE001 - never into the training loop
            log.exception("[Profiler] rank %d: capture failed", self.identity.rank)
            with self._lock:
                self._runner.abort(f"capture failed at step {self._step}: {type(exc).__name__}: {exc}")
                self._busy = False

    # -- the record ---------------------------------------------------------

    def record(self, exited: bool = False) -> RankRecord:
        """A snapshot of this rank's record."""
        recent = self._heartbeat.recent()
        stall = self._stall_watch
        fault_stacks = self._fault_stacks.info() if self._fault_stacks.check() else None
        trigger = self._signals.check()
        runner = self._runner
        with self._lock:
            cs = self._capture
            return RankRecord(
                **identity_fields(self.identity),
                **capture_fields(cs),
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
                recent_steps=[[round(t, 4), n] for t, n in recent],
                last_step_at=round(self._heartbeat.last_step_at, 3),
                num_signals=self._signals.count,
                signal=trigger.name if trigger is not None else None,
                num_coalesced=self._signals.num_coalesced,
                version=__version__,
                exited_at=time.time() if exited else None,
                conflict=dict(self._writer.conflict) if self._writer.conflict else None,
                fault_stacks=fault_stacks,
                stall_after_s=self.settings.stall_after_s,
                stall=stall_json(stall.shown) if stall is not None else None,
                upload_to=runner.uploader.target.location if runner.uploader is not None else None,
                trace_url=runner.trace_url,
                upload_error=runner.upload_error,
                counts_steps_by=self.counts_steps_by,
                cannot_trace=self.cannot_trace,
                slowdown=self._watches.to_json(),
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
        trigger_on = self._signals.check() is not None
        if (self._fault_stacks.check() != stacks_on or trigger_on != self._published_trigger
                or self._signals.count != self._published_signals or not self._writer.tick()):
            self._publish()

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

    `reserved_signals`: signals the job will handle (by number, with who owns them), never the trigger's.

    Raises:
        TorchMissing: this Python has no torch (`sidecar.rank.torchcheck`).
        ConfigError: the config or an identity value is invalid.
    """
    from sidecar.common import envvars
    from sidecar.common.config import job_config
    from sidecar.common.identity import resolve_identity, resolve_output_dir, resolve_registry_root

    job, enabled = job_config(config)
    # Inside a running job a bad variable turns off only what it configures (sidecar.common.envvars);
    # `python -m sidecar.run` has refused it at launch already.
    envvars.warn()
    job.sidecar = envvars.apply(job.sidecar, strict=False)
    ensure_log_handler()  # resolving the identity may warn about a name taken from the environment
    require_torch()
    identity = resolve_identity(replica=replica, rank=rank, role=role)
    root, private = resolve_registry_root(registry, configured=job.sidecar.registry, output_root=job.output_root)
    out = resolve_output_dir(output_dir, output_root=job.output_root)
    return Sidecar(identity, job, out, root, private_root=private, enabled=enabled,
                   reserved_signals=reserved_signals)
