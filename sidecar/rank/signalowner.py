"""Which signal triggers this rank, and whether it is still ours.

A guest takes nothing the host owns: at start the sidecar takes the configured signal only where
nobody handles it, else (unless the user named it) the first free real-time one
(`triggers.signal.choose_signal`), and says once which and how to trigger the rank. At each
heartbeat it checks that the signal is still ours (`check`): a job that installs its own handler
later takes it, and a job that gives it back gets it taken again, at the next step boundary
(`reclaim`: a handler is installed only on the main thread). A signal, and a signal to take
back, give the next step boundary work: the handler sets the hot-path flag itself (`HotPath.on_signal`,
no lock in a handler); the heartbeat's check asks the capture owner (`CaptureOwner.mark_boundary_work`).
"""

from __future__ import annotations

import logging
import os
from collections.abc import Mapping

from sidecar.common.config import SidecarSettings
from sidecar.common.signames import parse_signal, signal_name
from sidecar.rank.context import RankContext
from sidecar.rank.triggers.signal import FREE, SignalTrigger, choose_signal, slurm_signals

DEFAULT_SIGNAL = parse_signal(SidecarSettings.signal)  # a setting that names another is the user's choice


class SignalOwner:
    """The signal trigger of one rank (`trigger`: None when it is off or could not be taken).

    Args:
        reserved: signals the job will handle but has not taken yet (a cosmos-rl worker's), by number.
    """

    def __init__(self, ctx: RankContext, reserved: Mapping[int, str]) -> None:
        self.identity = ctx.identity
        self.setting = ctx.settings.signal
        self.reserved = dict(reserved)
        self._hot = ctx.hot
        self._capture = ctx.capture
        self._log_once = ctx.log.once
        self.trigger: SignalTrigger | None = None
        self.reclaim_due = False  # the job gave the trigger's signal back: take it at the next boundary
        self.count = 0  # signals received
        self.num_coalesced = 0  # signals folded into the request of a later one
        self._handled = 0  # the count taken by the last step boundary

    @property
    def has_unhandled(self) -> bool:
        """A signal came since the last step boundary took them (`take`)."""
        return self.count != self._handled

    def take(self) -> int | None:
        """At a step boundary: the count of the newest signal not yet handled, or None. The
        signals before it since the last boundary fold into its one request (`num_coalesced`)."""
        count = self.count
        if count == self._handled:
            return None
        self.num_coalesced += count - self._handled - 1
        self._handled = count
        return count

    def start(self, taken: frozenset[int]) -> None:
        """Take the configured signal where nobody handles it; else (unless the user named it) the
        first free real-time one but those in `taken` (the stacks signal's); log once which, and how
        to trigger this rank."""
        if self.setting.lower() == "off":
            return
        try:
            configured = parse_signal(self.setting)
        except ValueError as exc:
            self._log_once("signal", logging.WARNING, f"[Profiler] the signal trigger is off: sidecar.signal: {exc}")
            return
        explicit = configured != DEFAULT_SIGNAL
        reserved = {**slurm_signals(os.environ), **self.reserved}
        signum, why = choose_signal(configured, explicit, reserved, taken)
        rank, name = self.identity.rank, signal_name(configured)
        if signum is None:  # then `why` says whose it is
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
        trigger = SignalTrigger(signum, self._on_received, rank)
        if trigger.start():
            self.trigger = trigger

    def check(self) -> SignalTrigger | None:
        """At each heartbeat: the trigger when its signal is still ours (None when the job took it,
        or it is off). A signal the job gave back is due to be taken again (`reclaim_due`)."""
        trigger = self.trigger
        if trigger is None:
            return None
        if trigger.check() == FREE and not self.reclaim_due:
            self.reclaim_due = True
            self._capture.mark_boundary_work()  # the next step boundary calls `reclaim`
        return trigger if trigger.is_installed else None

    def reclaim(self) -> bool:
        """At a step boundary (the main thread), when `reclaim_due`: take the signal again if it
        is still free. True when it was taken."""
        self.reclaim_due = False
        return self.trigger is not None and self.trigger.reclaim()

    def _on_received(self) -> None:
        # Runs inside the signal handler: only record intent.
        self.count += 1
        self._hot.on_signal()

    def stop(self) -> None:
        if self.trigger is not None:
            self.trigger.stop()
