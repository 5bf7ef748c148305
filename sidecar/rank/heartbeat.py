"""The heartbeat thread that keeps a rank's record fresh, and the rank's recent pace.

`Heartbeat` samples the step counter every `startstep.SAMPLE_INTERVAL_S` while the rank
steps (in memory; only at heartbeats once the counter stood still), and calls
`publish()` every `interval`, at once when woken by a state change, and early when
the steps run ahead of the pace the record shows, so the CLI's start step stays
ahead of every rank. What it publishes is the record's publisher's (`rank.publisher`,
which builds the record and owns this heartbeat).
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from contextlib import contextmanager

from sidecar.common import startstep
from sidecar.rank.threads import Worker

log = logging.getLogger("sidecar")

FULL_EVERY = 6  # an idle rank's record is built and compared at every 6th heartbeat, ticked in between


class Heartbeat:
    """The thread that keeps a rank's record fresh, and the rank's recent pace."""

    def __init__(self, interval: float, steps: Callable[[], int], publish: Callable[[], None],
                 idle_tick: Callable[[], None] | None = None) -> None:
        self.interval = interval
        self._steps = steps
        self._publish = publish
        # A heartbeat with nothing new to say (`_run` decides): `idle_tick()` may only set the
        # record's mtime, sparing the build of a record that would say the same again.
        self._idle_tick = idle_tick
        self._tick = min(startstep.SAMPLE_INTERVAL_S, interval)
        self._samples: deque[startstep.Sample] = deque(maxlen=int(startstep.WINDOW_S / self._tick) + 2)
        self._lock = threading.Lock()
        self._publish_lock = threading.Lock()  # one publisher at a time: this thread, or `publish_now`'s caller
        self.published_steps: list[startstep.Sample] = []  # the samples in the record last written
        self._early_publish_at = 0.0
        self._worker = Worker("cosmos-profiler-heartbeat", self._run)
        self._publishing_after = threading.local()  # .active: this thread publishes once it is done
        self._failed = False
        # Wall-clock time at which the step counter was last seen to move (or this started):
        # within one sample interval of the last step while the rank steps.
        self.last_step_at = time.time()

    def start(self) -> None:
        self._worker.start()

    def wake(self) -> None:
        """Publish at once (a state change); inside `publishing_after`, by that thread's publish."""
        if getattr(self._publishing_after, "active", False):
            return
        self._worker.wake()

    @contextmanager
    def publishing_after(self) -> Iterator[None]:
        """Handle a change on the calling thread (the watcher's, a request), then publish from
        it (`publish_now`). A `wake()` on this thread meanwhile is that one publish, not also a
        hand-off to the heartbeat thread: that would write the same record a second time, its
        thread competing for the GIL while this one publishes."""
        self._publishing_after.active = True
        try:
            yield
        finally:
            self._publishing_after.active = False
            self.publish_now()

    def stop(self) -> None:
        self._worker.stop()

    def publish_now(self) -> None:
        """Publish on the calling thread (the watcher's, after a request), sparing the
        hand-off to this thread: under a busy training thread each thread that must
        take the GIL waits up to `sys.getswitchinterval()` for it. Never raises."""
        try:
            with self._publish_lock:
                self._publish()
        except Exception:  # noqa: BLE001
            self._failed_once()

    def _failed_once(self) -> None:
        """Log the first failure with its traceback; the heartbeat goes on either way."""
        if not self._failed:
            self._failed = True
            log.exception("[Profiler] heartbeat failed")

    def recent(self) -> list[startstep.Sample]:
        """The recent samples a record publishes (`recent_steps`)."""
        with self._lock:
            return startstep.thin(list(self._samples))

    def recent_rate(self) -> float | None:
        return startstep.recent_rate(self.recent())

    def _run(self, worker: Worker) -> None:
        last_step, moved_at = self._steps(), time.monotonic()
        due = moved_at + self.interval
        full_step, ticks = None, 0  # the step of the last full publish here; ticks since
        while not worker.stopping:
            now = time.monotonic()
            still = now - moved_at >= startstep.STILL_AFTER_S
            woken = worker.wait(due - now if still else min(self._tick, due - now))
            if worker.stopping:
                return
            try:
                now = time.monotonic()
                early = self._sample(now)
                step = self._steps()
                if step != last_step:
                    last_step, moved_at = step, now
                    self.last_step_at = time.time()
                if woken or early or now >= due:
                    due = now + self.interval
                    # Only time moved: no wake (every state change wakes us), no step since the
                    # last full publish, and the pace window has passed since the last step, so
                    # the record would say the same. Every FULL_EVERY-th heartbeat is full anyway.
                    quiet = (not woken and not early and step == full_step and ticks < FULL_EVERY - 1
                             and now - moved_at > startstep.WINDOW_S + self.interval)
                    with self._publish_lock:
                        if quiet and self._idle_tick is not None:
                            self._idle_tick()
                            ticks += 1
                        else:
                            self._publish()
                            full_step, ticks = step, 0
            except Exception:  # noqa: BLE001
                self._failed_once()

    def _sample(self, now: float) -> bool:
        """Sample the step counter; True when the record should be rewritten before its
        heartbeat is due: the first measurable pace, or steps running ahead of the published pace."""
        sample = (time.time(), self._steps())
        with self._lock:
            self._samples.append(sample)
            first = self._samples[0]
        if now - self._early_publish_at < startstep.PUBLISHED_SPACING_S:
            return False
        published = self.published_steps
        if len(published) >= 2:
            early = startstep.ran_ahead(published, sample)
        else:  # the first pace: samples far enough apart that show steps (a rank standing still has none)
            early = sample[0] - first[0] >= startstep.PUBLISHED_SPACING_S and sample[1] != first[1]
        if early:
            self._early_publish_at = now
        return early
