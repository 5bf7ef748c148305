"""The Sidecar: one rank's rooms, built around one context, and the hot path between them.

Threads and who does what:
- the training thread calls `step()`; idle, that is one counter increment and
  two attribute tests (`rank.hotpath`). At a step boundary with work to do it takes a
  signal's request and lets `runner` start, advance, stop or finish a capture; it never
  touches the filesystem.
- the watcher thread (`FileTrigger`) reads and validates control files; `intake`
  asks the capture owner to admit the request, arms it, records the refusal, takes
  stacks at once (`dumps`), or applies a cancel.
- the heartbeat thread (`heartbeat.Heartbeat`, owned by `publisher`) samples the pace and
  rewrites the rank record, at once when a state change wakes it; at each beat
  `signalowner` checks that the trigger's signal is still ours.
- a saver thread per capture (`saver.Saver`) writes the file, names it and tells the others.

What each room holds: `capture` the states, their transitions and their one owner
(`CaptureOwner`: the only lock on them), `runner` a capture's run (`driver`,
torch.profiler), `saver` its save (`exporter` writes the file) and what follows,
`intake` the requests, `dumps` the stacks and flight recorder, `watches` the slowdown
watch, `stall` the stall watch, `signalowner` the trigger's signal, `autostep` the
optimizer hook, `publisher` the record, `triggers` the ways in. This class builds one
`RankContext` (`rank.context`) and hands it to each room; it is the `HotPath` whose
attributes `step()` reads. Nothing here raises into the training loop: every failure is
caught, logged once and written to the rank record.
"""

from __future__ import annotations

import atexit
import functools
import logging
import os
import weakref
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sidecar.common import layout
from sidecar.common.config import JobConfig, SidecarSettings
from sidecar.common.identity import RankIdentity
from sidecar.common.log import ensure_log_handler
from sidecar.common.records import RankRecord, State
from sidecar.common.registry import ensure_dir, remove_stale_temps
from sidecar.common.request import ProfileRequest
from sidecar.rank import nodeagent, slowdown
from sidecar.rank.autostep import OptimizerStepHook
from sidecar.rank.context import RankContext
from sidecar.rank.faulthandler_stacks import FaultStacks
from sidecar.rank.hotpath import HotPath
from sidecar.rank.intake import RequestIntake
from sidecar.rank.noderelay import RankRelay
from sidecar.rank.pointer import leave_pointer
from sidecar.rank.publisher import RecordPublisher
from sidecar.rank.runner import CaptureRunner
from sidecar.rank.saver import OnSaved, Saver
from sidecar.rank.signalowner import SignalOwner
from sidecar.rank.stall import StallReporter, StallWatch
from sidecar.rank.torchcheck import require_torch
from sidecar.rank.triggers.signal import SignalTrigger

if TYPE_CHECKING:
    from sidecar.common.redisstore import RedisStore
from sidecar.rank.watches import Watches

log = logging.getLogger("sidecar")


class Sidecar(HotPath):
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
        store: RedisStore | None = None,
    ) -> None:
        # Hot-path state (`HotPath`): `_boundary_work` and `_watch` are all step() reads when idle.
        super().__init__()
        self._closed = False
        self.job = job
        self.settings = job.sidecar
        self.enabled = enabled
        self._private_root = private_root
        self._auto_hook: OptimizerStepHook | None = None
        # True when a Cosmos-RL CosmosProfiler built this sidecar (sidecar.cosmos): the worker's
        # profiler drives it, so the post-import hook leaves it alone.
        self.cosmos_owned = False

        self._ctx = ctx = RankContext(identity, job, output_dir, registry_root, enabled, hot=self)
        self.output_dir, self.registry_root, self.trace_dir = ctx.output_dir, ctx.registry_root, ctx.trace_dir
        # Where the registry is on shared storage, one rank per node watches it for the node
        # (sidecar.rank.nodeagent); this rank then watches its node's relay file and writes its record there.
        self.node = nodeagent.link_for(ctx.registry_root, identity.replica, identity.rank, identity.host,
                                       identity.world_size, self.settings, ctx.log.once, store)
        if self.node is not None:
            ctx.record_path = layout.node_record_local(self.node.node_dir, identity.rank)
        if store is not None:
            # A request this rank writes (its slowdown watch's) goes to the store, where every node's agent takes it.
            from sidecar.common import storeurl

            storeurl.request_senders[os.fspath(ctx.registry_root)] = lambda name, data: store.send_request(name, data)
            storeurl.claimers[os.fspath(ctx.registry_root)] = store.claim  # the watch's claim: one for all nodes
        self._capture = ctx.capture
        self._saver = Saver(ctx)
        self._runner = CaptureRunner(ctx, self._saver)
        self._watches = Watches(ctx)
        self._intake = RequestIntake(ctx, self._watches, self._saver)
        self._relay: RankRelay | None = None
        if self.node is not None:
            self.file_trigger, self._relay = self._intake.relay_trigger(self.node.envelope_path, self.settings)
        else:
            self.file_trigger = self._intake.file_trigger(layout.control_path(ctx.registry_root, identity.replica),
                                                          self.settings)
        # The signal trigger is taken at start(), on a signal nobody else handles; `reserved_signals`:
        # those the job will handle but has not taken yet (a cosmos-rl worker's).
        self._signals = SignalOwner(ctx, reserved_signals or {})
        # Stacks while a C call holds the GIL (sidecar.rank.faulthandler_stacks), and the stall watch (sidecar.rank.stall).
        self._fault_stacks = FaultStacks(self.settings.stacks_signal,
                                         layout.fault_stacks_path(ctx.registry_root, identity.replica, identity.rank,
                                                                  sharded=self.node is not None),
                                         identity.rank)
        self._stall_watch: StallWatch | None = None
        if self.settings.stall_after_s:
            reporter = StallReporter(ctx, self._saver)
            self._stall_watch = StallWatch(self.settings.stall_after_s, ctx.steps, reporter.on_stall,
                                           reporter.on_resume, self._fault_stacks.path)
        self._record = RecordPublisher(ctx, signals=self._signals, watches=self._watches, saver=self._saver,
                                       file_trigger=self.file_trigger, fault_stacks=self._fault_stacks,
                                       stall_watch=self._stall_watch)
        self._heartbeat = self._record.heartbeat

    # -- public API -------------------------------------------------------

    @property
    def identity(self) -> RankIdentity:
        """Who this rank is, as its record shows it."""
        return self._record.identity

    @identity.setter
    def identity(self, identity: RankIdentity) -> None:
        # The Cosmos-RL profiler widens world_size to its parallel dims' once the sidecar is built
        # (sidecar.cosmos.profiler): the record shows it; the rooms keep the identity they were built with.
        self._record.identity = identity

    @property
    def record_path(self) -> Path:
        """Where this rank's record is written: the registry, or its node's dir (`node`)."""
        return self._ctx.record_path

    @property
    def cannot_trace(self) -> str | None:
        """Why this rank cannot count steps (set by `mark_cannot_trace`); None: it can."""
        return self._ctx.cannot_trace

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
        return self._ctx.counts_steps_by

    def mark_cannot_trace(self, reason: str) -> None:
        """This rank has no step boundary (no `step()`, no optimizer step): refuse trace and
        memory requests with `reason`, and say so in the record, instead of arming them forever."""
        self._ctx.cannot_trace = reason
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
        return self._saver.trace_paths

    @property
    def on_saved(self) -> list[OnSaved]:
        """Called on the saver thread after each file is saved: (kind, path, request)."""
        return self._saver.on_saved

    def start(self) -> Sidecar:
        """Create directories, publish the record and start the triggers."""
        ensure_log_handler()
        try:
            ensure_dir(self.registry_root, private=self._private_root)
        except OSError as exc:
            self._ctx.log.once("registry", logging.ERROR, f"[Profiler] cannot create registry {self.registry_root}: {exc}")
        remove_stale_temps(self.trace_dir)
        self._saver.check_upload()
        if self.node is not None and self._relay is not None:
            self.node.start()  # the agent's term, if no one serves: its relay file is then there
            self._relay.baseline(self.node.envelope_path, self.node.envelope_limit)
        self.file_trigger.start()
        self._runner.ondemand.start()  # kineto's on-demand path, where the environment was prepared
        self._signals.start(self._fault_stacks.signums)
        self._fault_stacks.install(self.signal_trigger.signum if self.signal_trigger is not None else None)
        for note in self._ctx.config_notes:
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
        self._record.publish()
        self._heartbeat.start()
        if self._stall_watch is not None:
            self._stall_watch.start()
        if self.settings.slowdown_factor and self.enabled:
            self._watches.install(slowdown.always_on_request(self.settings.slowdown_factor, self.identity.job,
                                                             self._ctx.defaults), always_on=True,
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
        if self._boundary_work:
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
        self._ctx.auto_step = True
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
            self._capture.settle_boundary()  # work left only for a request armed meanwhile
            return True
        except Exception as exc:  # noqa: BLE001
            log.exception("[Profiler] rank %d: stopping the capture failed", self.identity.rank)
            self._runner.fail(f"stopping the capture failed: {type(exc).__name__}: {exc}")
            return False

    def close(self) -> None:
        """Stop watching, abort an unfinished capture, wait for a running save. Idempotent."""
        if self._closed:
            return
        self._closed = True
        self._boundary_work = False
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
            self.file_trigger.stop()
            self._runner.close(self._step)
            self._heartbeat.stop()
            self._record.publish(exited=True)
            if self.node is not None:
                self.node.stop()  # after the last record: the node record says this rank exited
            # Once the record says so: the signal's default action (which ends the process) comes back,
            # and the CLI signals no rank that has exited (nor one that no longer catches it).
            self._fault_stacks.close()
            self._fault_stacks.remove_if_empty()
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
        self._boundary_work = False

    # -- counting steps without code changes -----------------------------------

    def _first_explicit_step(self) -> None:
        counted = self._auto_hook is not None and self._auto_hook.has_counted
        self._disable_auto_step()
        log.info("[Profiler] explicit step() calls take over from the optimizer hook at step %d", self._step)
        if not counted:
            Sidecar.step(self)

    def _disable_auto_step(self) -> None:
        hook, self._auto_hook = self._auto_hook, None
        self._ctx.auto_step = False
        if hook is not None:
            hook.remove()
        # `del`, never through `self.__dict__`: touching it gives the instance a dict of its own, and
        # every attribute read of step() gets slower (2-3x, measured: benchmarks/overhead.py, phase 1).
        try:
            del self.step  # the instance's own, set by enable_auto_step
        except AttributeError:
            pass

    # -- the training thread ------------------------------------------------

    def _on_boundary(self) -> None:
        try:
            if self._closed:
                self._boundary_work = False
                return
            if self._signals.reclaim_due and self._signals.reclaim():
                self._heartbeat.wake()
            count = self._signals.take()
            if count is not None:
                self._intake.on_signal(count)
            self._runner.on_boundary(self._step)
            signals = self._signals
            self._capture.settle_boundary(lambda: signals.reclaim_due or signals.has_unhandled)
        except Exception as exc:  # noqa: BLE001 - never into the training loop
            log.exception("[Profiler] rank %d: capture failed", self.identity.rank)
            self._runner.abort(f"capture failed at step {self._step}: {type(exc).__name__}: {exc}", settle=True)

    # -- the record ---------------------------------------------------------

    def record(self, exited: bool = False) -> RankRecord:
        """A snapshot of this rank's record (`rank.publisher`)."""
        return self._record.record(exited=exited)


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
    from sidecar.common.identity import registry_url, resolve_identity, resolve_output_dir, resolve_registry_root

    job, enabled = job_config(config)
    # Inside a running job a bad variable turns off only what it configures (sidecar.common.envvars);
    # `python -m sidecar.run` has refused it at launch already.
    envvars.warn()
    job.sidecar = envvars.apply(job.sidecar, strict=False)
    ensure_log_handler()  # resolving the identity may warn about a name taken from the environment
    require_torch()
    identity = resolve_identity(replica=replica, rank=rank, role=role)
    store = None
    url = registry_url(registry, configured=job.sidecar.registry)
    if url is not None:  # a redis:// registry: the node's mirror of it is this rank's registry root
        root, private, store = store_root(url, job.sidecar)
    else:
        root, private = resolve_registry_root(registry, configured=job.sidecar.registry, output_root=job.output_root)
    out = resolve_output_dir(output_dir, output_root=job.output_root)
    return Sidecar(identity, job, out, root, private_root=private, enabled=enabled,
                   reserved_signals=reserved_signals, store=store)


def store_root(url: str, settings: SidecarSettings) -> tuple[Path, bool, RedisStore | None]:
    """(registry root, private, store) of a rank whose registry is the store `url`: its node's mirror
    directory (storeurl.mirror_dir), and the store its node agent talks to; None where the redis client
    is missing (said once: the ranks of this node then meet in the mirror alone).

    Raises:
        ConfigError: `url` is not a usable store URL, or its password file cannot be read.
    """
    from sidecar.common import storeurl
    from sidecar.common.redisstore import RedisStore, StoreUnavailable

    parsed = storeurl.parse(url)
    root = storeurl.mirror_dir(nodeagent.node_base(settings), parsed)
    try:
        return root, True, RedisStore(parsed, storeurl.password())
    except StoreUnavailable as exc:
        log.warning("[Profiler] %s; the ranks of this node are not reachable through it", exc)
        return root, True, None
