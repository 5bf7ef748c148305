"""The rank record's settled parts, as plain fields: who the rank is (`identity_fields`)
and where it stands with its requests (`capture_fields`). `Sidecar.record`, their one
caller, adds the live ones (step, pace, triggers, stall, uploads) and builds the `RankRecord`."""

from __future__ import annotations

from typing import Any

from sidecar.common.identity import RankIdentity
from sidecar.rank.capture import CaptureState


def identity_fields(identity: RankIdentity) -> dict[str, Any]:
    """replica, role, rank, local_rank, world_size, host, pid, job."""
    return {"replica": identity.replica, "role": identity.role, "rank": identity.rank,
            "local_rank": identity.local_rank, "world_size": identity.world_size, "host": identity.host,
            "pid": identity.pid, "job": identity.job}


def capture_fields(cs: CaptureState) -> dict[str, Any]:
    """The current (or last) request, its capture, the history, the counts and the last error
    (the caller holds the lock that guards `cs`; the record's `state` is the caller's, which
    may say `stalled`)."""
    request = cs.request
    return {
        "request_id": request.id if request else None,
        "request": request.to_json() if request else None,
        "selected": cs.selected,
        "misaligned": cs.misaligned,
        "capture_start_step": cs.capture_start,
        "history": list(cs.history),
        "cancelled": cs.cancelled,
        "cancel": dict(cs.cancel) if cs.cancel is not None else None,
        "trace_path": cs.trace_path,
        "stacks_path": cs.stacks_path,
        "memory_path": cs.memory_path,
        "num_captures": cs.num_captures,
        "num_requests": cs.num_requests,
        "num_refused": cs.num_refused,
        "error": cs.error,
        "refused": cs.refused,
    }
