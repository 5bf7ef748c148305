"""What every room of one rank shares: one `RankContext`, handed to each room the Sidecar builds.

A room gets this one object, not a bundle of callbacks into the Sidecar: who the rank is and
its settings, where its files go, the step counter and hot-path flags (`hot`, `rank.hotpath`),
the capture state's one owner (`capture`, `rank.capture.CaptureOwner`), the heartbeat to wake
after a change (`wake()`; `rank.publisher` builds it) and the log said once (`log`).
"""

from __future__ import annotations

import logging
from pathlib import Path

from sidecar.common import layout
from sidecar.common.config import JobConfig, SidecarSettings
from sidecar.common.identity import RankIdentity
from sidecar.common.request import config_defaults
from sidecar.rank.capture import CaptureOwner
from sidecar.rank.heartbeat import Heartbeat
from sidecar.rank.hotpath import HotPath

log = logging.getLogger("sidecar")


class OnceLog:
    """Messages logged once per key, until the key is forgotten (the condition ended)."""

    def __init__(self) -> None:
        self._logged: set[str] = set()

    def once(self, key: str, level: int, message: str) -> None:
        if key not in self._logged:
            self._logged.add(key)
            log.log(level, message)

    def forget(self, key: str) -> None:
        """Log `key`'s message again the next time it comes."""
        self._logged.discard(key)


class RankContext:
    """The facts and the shared pieces of one rank (see the module docstring).

    Args:
        hot: the step counter and the hot-path flags (the Sidecar itself, seen as a `HotPath`).
        enabled: the profiler is on for this job (`[profiler] enable_profiler`).
    """

    heartbeat: Heartbeat  # set by the record's publisher (`rank.publisher`), which owns it

    def __init__(self, identity: RankIdentity, job: JobConfig, output_dir: Path, registry_root: Path,
                 enabled: bool, hot: HotPath) -> None:
        self.identity = identity
        self.job = job
        self.output_dir = Path(output_dir)
        self.registry_root = Path(registry_root)
        self.trace_dir = layout.rank_trace_dir(self.output_dir, identity.replica, identity.rank)
        # Where this rank's record is written: the registry, or its node's dir (sidecar.rank.nodeagent).
        self.record_path = layout.record_path(self.registry_root, identity.replica, identity.rank)
        self.enabled = enabled
        self.hot = hot
        # Bounded here, where they are used (cosmos-rl accepts them as they are): said once at start.
        self.defaults, self.config_notes = config_defaults(job.profiler.sub_profiler_config)
        self.capture = CaptureOwner(hot)
        self.log = OnceLog()
        # Why this rank cannot count steps (`Sidecar.mark_cannot_trace`); None: it can.
        self.cannot_trace: str | None = None
        self.auto_step = False  # steps are counted at the optimizer's step (`Sidecar.enable_auto_step`)

    @property
    def settings(self) -> SidecarSettings:
        return self.job.sidecar

    @property
    def counts_steps_by(self) -> str:
        """How steps are counted: "step()", "optimizer" (the hook, until step() takes over) or "none"."""
        if self.cannot_trace:
            return "none"
        return "optimizer" if self.auto_step else "step()"

    def steps(self) -> int:
        """The training step now running."""
        return self.hot.steps()

    def wake(self) -> None:
        """Wake the heartbeat: a state change for the record."""
        self.heartbeat.wake()
