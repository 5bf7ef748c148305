"""The exceptions the sidecar raises; every one derives from SidecarError."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


class SidecarError(Exception):
    """Base class for every error this project raises on purpose."""


class ConfigError(SidecarError, ValueError):
    """A configuration value is invalid; the message names the key."""


class RequestError(SidecarError):
    """A profile request (control file, CLI flags) is malformed or refused."""


class RegistryError(SidecarError):
    """The registry directory cannot be read or written."""


class ReplicaNotFound(RegistryError):
    """No replica of that name is registered."""


class ControllerError(SidecarError):
    """A Cosmos-RL controller could not be reached or answered nonsense."""


class TraceError(SidecarError):
    """A saved trace cannot be found or read, or is not a Chrome trace."""


class BadOption(RequestError):
    """A value is wrong for this replica (a usage error); `option` names the parameter."""

    def __init__(self, option: str, message: str) -> None:
        super().__init__(message)
        self.option = option


@dataclass(frozen=True)
class BusyRequest:
    """A request that holds ranks of a replica: armed, tracing or saving."""

    request_id: str  # "?" when a rank's record names none
    ranks: tuple[int, ...]  # the live ranks it holds, in order
    start_step: int | None  # the step its schedule begins at; None: the next step a rank sees it
    phase: str  # the furthest state of those ranks: armed < tracing < saving


class ReplicaBusy(RequestError):
    """A selected rank is armed, tracing or saving; nothing was written.

    `replica` and `requests` (a `BusyRequest` each) say which requests hold it; the CLI's
    sentence, with the cancel command to type, is `sidecar.cli.render_refusal.busy_text`'s.
    """

    def __init__(self, replica: str, requests: Sequence[BusyRequest]) -> None:
        self.replica = replica
        self.requests = tuple(requests)
        super().__init__(f"replica {replica} is busy with request "
                         + ", ".join(request.request_id for request in self.requests))


class NoLiveRank(RequestError):
    """No rank the request selects is alive; the message says when each was last heard from."""


class TorchMissing(SidecarError, ImportError):
    """The rank side was started in a Python without torch (the CLI needs none; the message says what to install)."""
