"""The one replica name check and the one "Replica R not found.", for every command that names a replica.

    check_name          a valid replica name, else BadOption (a usage error)
    controller_replica  the controller's entry for a name; with a controller, it decides which replicas exist
    check_replica       both: a request or a trace lookup names a real replica
    not_found           the error for a replica that does not exist, in Cosmos-RL's words

`sidecar.fleet` (requests, listings) and `sidecar.traces.catalog` (a replica's traces) both
check names here. Standard library only, no I/O.
"""

from __future__ import annotations

from collections.abc import Sequence

from sidecar.common.exceptions import BadOption, ConfigError, ReplicaNotFound
from sidecar.common.identity import validate_replica_name
from sidecar.common.roster import ControllerReplica

# Cosmos-RL's words, printed as they are.
NOT_FOUND_MESSAGE = "Replica {name} not found."


def not_found(name: str) -> ReplicaNotFound:
    """The error for a replica that does not exist: "Replica {name} not found."."""
    return ReplicaNotFound(NOT_FOUND_MESSAGE.format(name=name))


def check_name(name: str) -> str:
    """`name` when it is a valid replica name.

    Raises:
        BadOption: (option "name") it is not.
    """
    try:
        return validate_replica_name(name)
    except ConfigError as exc:
        raise BadOption("name", str(exc)) from None


def controller_replica(controller: Sequence[ControllerReplica], name: str) -> ControllerReplica:
    """The controller's entry for `name`: with a controller, it decides which replicas exist.

    Raises:
        ReplicaNotFound: the controller does not know `name`.
    """
    for replica in controller:
        if replica.name == name:
            return replica
    raise not_found(name)


def check_replica(name: str, controller: Sequence[ControllerReplica] | None = None) -> str:
    """`check_name`, and with a controller, `controller_replica`: a request names a real replica."""
    check_name(name)
    if controller is not None:
        controller_replica(controller, name)
    return name
