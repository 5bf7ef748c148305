"""The stall watch (`[sidecar] stall_after_s`): a rank that stops stepping says where, with no one watching.

One thread (`StallWatch`) wakes every `stall_after_s / 4` and reads the step
counter; `step()` itself is untouched (no cost on the hot path). When the
counter has stood still for `stall_after_s` (`now - moved_at`, where `moved_at`
is the wake that first saw the current step, so never early) the sidecar's
`on_stall` dumps every thread's stacks and the flight recorder, marks the record
`stalled` and logs one line; the first wake that sees the counter move again
calls `on_resume`. One dump per stall.

A Python thread cannot run while a C call holds the GIL, so a C-level backstop
covers that case: `faulthandler.dump_traceback_later(3 * stall_after_s)`,
re-armed by this thread (never by `step()`: a re-arm joins and starts
faulthandler's watchdog thread, ~100 us) when a wake that saw the counter move
finds less than 1.5 stall times left on it. Stepping, it is pushed out every
1.5 stall times and never fires; when the process freezes it fires 1.5 to 3
stall times after the last step and writes all threads, without the
GIL, to the rank's `rank-<k>.faulthandler.txt` beside its record (shared with
the stacks signal's dumps; a timer dump starts with `Timeout (`). When this thread runs again (the GIL
came back) it sees that the file grew: the stall's dump is that one, rewritten
with thread names; a stall that ended before this thread could run is reported
after the fact. The C timer is cancelled while a Python-visible stall is
handled, and re-armed when the steps resume.

faulthandler has a single `dump_traceback_later` slot per process: a job that
uses it itself should leave `stall_after_s` off (documented).
"""

from __future__ import annotations

import faulthandler
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from sidecar.rank.context import RankContext
from sidecar.rank.dumps import dump_header, write_flight_recorder, write_stacks
from sidecar.rank.saver import Saver
from sidecar.rank.threads import Worker

log = logging.getLogger("sidecar")

SOURCE_FAULTHANDLER = "faulthandler"
TIMEOUT_PREFIX = "Timeout ("  # the first line of a dump_traceback_later dump
CHECKS_PER_STALL = 4  # wakes per stall_after_s
# The C timer is set BACKSTOP_FACTOR stall times ahead, and pushed out again only when a wake that
# saw the steps move finds less than REARM_BELOW stall times left: a re-arm every 1.5 stall times
# while stepping, and it fires 1.5 to 3 stall times after the last step, always after the Python
# check (1 stall time) has had its chance.
BACKSTOP_FACTOR = 3.0
REARM_BELOW = 1.5


@dataclass
class Stall:
    """One stall, as the watch saw it."""

    step: int  # the step counter that stood still (for a stall seen after the fact: the last step the watch saw)
    since: float  # wall time of the wake that first saw that step
    at: float  # wall time it was declared
    gil_held: bool = False  # the C backstop fired: no Python thread ran for a while
    fault_text: str = ""  # the backstop's dump, when it fired
    ended_at: float | None = None
    details: dict = field(default_factory=dict)  # stacks_path, flightrec_path, flightrec (what on_stall did)
    reported: bool = False  # on_stall is done: its stacks and details are in; the record may show it


class StallWatch:
    """Watches the step counter from a thread of its own; see the module docstring."""

    def __init__(self, after_s: float, steps: Callable[[], int], on_stall: Callable[[Stall], None],
                 on_resume: Callable[[Stall, int], None], fault_path: Path | None) -> None:
        self.after_s = after_s
        self.interval = after_s / CHECKS_PER_STALL
        self._steps = steps
        self._on_stall = on_stall
        self._on_resume = on_resume
        self.fault_path = fault_path
        self._fd: int | None = None
        self._armed_size = 0
        self._deadline = 0.0  # monotonic time the C timer fires at
        self.current: Stall | None = None  # the stall in progress
        self.last: Stall | None = None  # the last stall (in progress or over)
        self._previous: Stall | None = None  # the one before it, shown until `last` is reported
        self._worker = Worker("cosmos-profiler-stall-watch", self._run)
        self._failed = False

    @property
    def is_stalled(self) -> bool:
        """A stall in progress, once reported: a record never says `stalled` without its stacks."""
        return self.current is not None and self.current.reported

    @property
    def shown(self) -> Stall | None:
        """The stall a record shows (`stall`): the last one, once reported; until then the one before."""
        return self.last if self.last is None or self.last.reported else self._previous

    def start(self) -> None:
        if self.fault_path is not None:
            try:
                from sidecar.rank.faulthandler_stacks import open_append

                self._fd = open_append(self.fault_path)
            except OSError as exc:
                log.warning("[Profiler] the stall watch's GIL-proof dump is off: cannot open %s: %s",
                            self.fault_path, exc.strerror or exc)
        self._arm(time.monotonic())
        self._worker.start()

    def stop(self) -> None:
        self._worker.stop()
        if self._fd is not None:
            faulthandler.cancel_dump_traceback_later()
            os.close(self._fd)
            self._fd = None

    def _arm(self, now: float, force: bool = True) -> None:
        """(Re-)arm the C timer, unless (not `force`) it still has REARM_BELOW stall times to go."""
        if self._fd is not None and (force or self._deadline - now < REARM_BELOW * self.after_s):
            self._armed_size = os.fstat(self._fd).st_size
            self._deadline = now + BACKSTOP_FACTOR * self.after_s
            faulthandler.dump_traceback_later(BACKSTOP_FACTOR * self.after_s, repeat=False, file=self._fd)

    def _fired(self) -> str:
        """The backstop's dump when it fired since it was armed, else "". The file is shared
        with the stacks signal's dumps (sidecar.rank.faulthandler_stacks): the timer's starts with `Timeout (`."""
        if self._fd is None or os.fstat(self._fd).st_size <= self._armed_size:
            return ""
        with open(self.fault_path, "rb") as f:  # type: ignore[arg-type]
            f.seek(self._armed_size)
            text = f.read(16 << 20).decode("utf-8", errors="replace")
        start = text.find(TIMEOUT_PREFIX)
        if start < 0 or (start > 0 and text[start - 1] != "\n"):
            return ""
        return text[start:]

    def _run(self, worker: Worker) -> None:
        last_step, moved_at, moved_wall = self._steps(), time.monotonic(), time.time()
        while not worker.sleep(self.interval):
            try:
                now, step = time.monotonic(), self._steps()
                if step != last_step:
                    fired = self._fired()
                    resumed = self.current is not None or bool(fired)
                    if self.current is None and fired:
                        # Frozen (the GIL held) for the whole stall: it ended before this thread could run.
                        stall = Stall(last_step, moved_wall, time.time(), gil_held=True, fault_text=fired)
                        stall.ended_at = stall.at
                        stall.details["resumed_step"] = step
                        self._previous, self.last = self.last, stall
                        try:
                            self._on_stall(stall)
                        finally:
                            stall.reported = True
                        self._on_resume(stall, step)
                    elif self.current is not None:
                        stall, self.current = self.current, None
                        stall.ended_at = time.time()
                        self._on_resume(stall, step)
                    last_step, moved_at, moved_wall = step, now, time.time()
                    self._arm(now, force=resumed)
                elif self.current is None and now - moved_at >= self.after_s:
                    if self._fd is not None:
                        faulthandler.cancel_dump_traceback_later()  # waits for a dump in progress
                    fired = self._fired()
                    stall = Stall(step, moved_wall, time.time(), gil_held=bool(fired), fault_text=fired)
                    self._previous, self.current, self.last = self.last, stall, stall
                    try:
                        self._on_stall(stall)
                    finally:
                        stall.reported = True  # even when the report failed: the record says stalled
            except Exception:  # noqa: BLE001 - never into training; say it once
                if not self._failed:
                    self._failed = True
                    log.exception("[Profiler] the stall watch failed")


class StallReporter:
    """What a rank does about a stall: stacks, flight recorder, the record, one log line."""

    def __init__(self, ctx: RankContext, saver: Saver) -> None:
        self.identity = ctx.identity
        self.saver = saver
        self.after_s = ctx.settings.stall_after_s
        self._capture = ctx.capture
        self._wake = ctx.wake

    def on_stall(self, stall: Stall) -> None:
        ident = self.identity
        source = SOURCE_FAULTHANDLER if stall.fault_text else "watcher"
        header = dump_header(ident, stall.step, self._capture.state.value, f"stall-{stall.step}", source=source)
        stacks = write_stacks(self.saver, header, stall.fault_text)
        if stacks.error:
            stall.details["error"] = f"writing the stall's stacks failed: {stacks.error}"
            where = stall.details["error"]
        else:
            stall.details["stacks_path"] = str(stacks.path)
            where = f"stacks saved to {stacks.path}"
        seconds = (stall.ended_at or time.time()) - stall.since
        if stall.ended_at is None:  # over already (a GIL-held stall seen after the fact): nothing to record
            dump = write_flight_recorder(self.saver, header, stacks, stall_step=stall.step)
            stall.details["flightrec"] = "saved" if dump.ok else dump.reason
            if dump.ok:
                stall.details["flightrec_path"] = str(dump.path)
            fr = f"; flight recorder {dump.path}" if dump.ok else f"; no flight recorder ({dump.reason})"
        else:
            fr = ""
        if stall.gil_held and stall.ended_at is not None:
            how = (f"no Python thread ran for about {seconds:.1f}s (a C call held the GIL), between step {stall.step} "
                   f"(the last the watch saw) and step {stall.details.get('resumed_step', '?')} (where it is stepping "
                   "again); faulthandler's dump rewritten with thread names")
        elif stall.gil_held:
            how = (f"no Python thread ran for {seconds:.1f}s after step {stall.step} (a C call held the GIL); "
                   f"faulthandler's dump rewritten with thread names")
        else:
            how = f"no training step for {seconds:.1f}s after step {stall.step}"
        log.warning("[Profiler] rank %d stalled (stall_after_s=%g): %s; %s%s", ident.rank, self.after_s, how, where, fr)
        stall.reported = True
        self._wake()

    def on_resume(self, stall: Stall, step: int) -> None:
        log.info("[Profiler] rank %d is stepping again (step %d) after a stall of %.1fs at step %d",
                 self.identity.rank, step, (stall.ended_at or time.time()) - stall.since, stall.step)
        self._wake()


def stall_json(stall: Stall | None) -> dict | None:
    """The record's `stall`."""
    if stall is None:
        return None
    end = stall.ended_at or time.time()
    return {"step": stall.step, "since": round(stall.since, 3), "at": round(stall.at, 3),
            "seconds": round(end - stall.since, 3), "gil_held": stall.gil_held,
            "ended_at": round(stall.ended_at, 3) if stall.ended_at else None, **stall.details}
