"""One rank's rooms for a unit test: a real `RankContext` under tmp_path, nothing started.

`rank_context` builds the context a Sidecar would, with a heartbeat that is never started
(its `wake()` only sets an event: `was_woken`) and whose publish only counts (`published`).
Steps move with `advance`. No thread is started and no process, so each test stays fast.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import Any

from sidecar.common.config import JobConfig, SidecarSettings
from sidecar.common.identity import RankIdentity
from sidecar.rank.context import RankContext
from sidecar.rank.heartbeat import Heartbeat
from sidecar.rank.hotpath import HotPath

IDENTITY = RankIdentity(replica="r1", role="policy", rank=1, local_rank=1, world_size=4, host="h", pid=os.getpid(),
                        job="job-1")


class CountedPublishes:
    def __init__(self) -> None:
        self.count = 0

    def __call__(self) -> None:
        self.count += 1


def rank_context(tmp_path: Path, enabled: bool = True, identity: RankIdentity = IDENTITY,
                 **settings: Any) -> RankContext:
    """A context for rank `identity.rank` of replica r1 under `tmp_path` (`settings`: [sidecar] keys)."""
    job = JobConfig(sidecar=dataclasses.replace(SidecarSettings(), **settings))
    ctx = RankContext(identity, job, tmp_path / "out", tmp_path / "reg", enabled, HotPath())
    ctx.heartbeat = Heartbeat(60.0, ctx.steps, CountedPublishes())
    return ctx


def advance(ctx: RankContext, steps: int = 1) -> int:
    """Count `steps` training steps, as `Sidecar.step()` does (no boundary work is run); the step now."""
    ctx.hot._step += steps
    return ctx.hot._step


def was_woken(ctx: RankContext) -> bool:
    """Whether a room woke the heartbeat since the last look (and forget it)."""
    return ctx.heartbeat._worker.wait(0)


def published(ctx: RankContext) -> int:
    """How many times a room published from its own thread (`Heartbeat.publishing_after`)."""
    counter = ctx.heartbeat._publish
    assert isinstance(counter, CountedPublishes)
    return counter.count
