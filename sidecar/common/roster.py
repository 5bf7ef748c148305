"""The replicas a Cosmos-RL controller lists (GET /api/status), as plain data.

`sidecar.fleet.controller` asks the controller and builds these; the fleet commands and
`sidecar.traces.catalog` (a replica's traces, where the controller names its atoms'
trace paths) read them. Standard library only, no I/O.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ControllerAtom:
    """One rank of a replica, as the controller knows it."""

    global_rank: int
    host_ip: str = ""
    host_name: str = ""
    trace_path: str | None = None


@dataclass(frozen=True)
class ControllerReplica:
    """One entry of `policy_replicas` / `rollout_replicas`."""

    name: str
    role: str
    arrived: bool
    atoms: tuple[ControllerAtom, ...] = ()
