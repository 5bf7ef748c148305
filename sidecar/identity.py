"""Who this rank is and where its files live, resolved as DESIGN.md says.

The same functions serve the sidecar and the CLI, so `replica ls` with no
flags finds what runs on this machine.
"""

from __future__ import annotations

import os
import re
import socket
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from sidecar.errors import ConfigError

ENV_REPLICA = "COSMOS_PROFILER_REPLICA"
ENV_REGISTRY = "COSMOS_PROFILER_DIR"
ENV_OUTPUT = "COSMOS_PROFILER_OUTPUT_DIR"
ENV_HOST = "COSMOS_PROFILER_HOST"

# Replica names become file names; keep them to a safe, portable alphabet.
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,199}$")


def validate_replica_name(name: str) -> str:
    """Return `name` if it is usable as a replica name.

    Raises:
        ConfigError: the name is empty, too long, or has characters other than
            letters, digits and ._- (it is used in file names).
    """
    if not isinstance(name, str) or not _NAME_RE.fullmatch(name):  # fullmatch: `$` alone lets a trailing newline in
        raise ConfigError(
            f"replica name {name!r} is not valid: use 1-200 letters, digits and ._- , starting with a letter or digit"
        )
    return name


def host_name(env: Mapping[str, str] | None = None) -> str:
    env = os.environ if env is None else env
    return env.get(ENV_HOST) or socket.gethostname()


def resolve_replica(replica: str | None = None, env: Mapping[str, str] | None = None) -> str:
    """Argument, else COSMOS_PROFILER_REPLICA, TORCHELASTIC_RUN_ID, SLURM_JOB_ID, else <host>-<pid>."""
    env = os.environ if env is None else env
    if replica:
        return validate_replica_name(replica)
    for key in (ENV_REPLICA, "TORCHELASTIC_RUN_ID", "SLURM_JOB_ID"):
        value = env.get(key, "").strip()
        # torchrun sets TORCHELASTIC_RUN_ID=none when no --rdzv-id is given.
        if value and value.lower() != "none":
            return validate_replica_name(value)
    return validate_replica_name(f"{host_name(env)}-{os.getpid()}")


def _env_int(env: Mapping[str, str], key: str) -> int | None:
    raw = env.get(key, "").strip()
    if not raw:
        return None
    try:
        value = int(raw)
    except ValueError:
        raise ConfigError(f"environment variable {key} must be an integer, got {raw!r}") from None
    if value < 0:
        raise ConfigError(f"environment variable {key} must not be negative, got {value}")
    return value


@dataclass(frozen=True)
class RankIdentity:
    replica: str
    role: str
    rank: int
    local_rank: int
    world_size: int
    host: str
    pid: int


def resolve_identity(
    replica: str | None = None,
    rank: int | None = None,
    role: str = "policy",
    env: Mapping[str, str] | None = None,
) -> RankIdentity:
    """Resolve replica, rank (argument, RANK, SLURM_PROCID, else 0) and the rest."""
    env = os.environ if env is None else env
    if rank is None:
        rank = _env_int(env, "RANK")
    if rank is None:
        rank = _env_int(env, "SLURM_PROCID")
    if rank is None:
        rank = 0
    if isinstance(rank, bool) or not isinstance(rank, int) or rank < 0:
        raise ConfigError(f"rank must be a non-negative integer, got {rank!r}")
    local_rank = _env_int(env, "LOCAL_RANK")
    if local_rank is None:
        local_rank = _env_int(env, "SLURM_LOCALID") or 0
    world_size = _env_int(env, "WORLD_SIZE") or _env_int(env, "SLURM_NTASKS") or 1
    world_size = max(world_size, rank + 1)
    if not isinstance(role, str) or not role.strip():
        raise ConfigError(f"role must be a non-empty string, got {role!r}")
    return RankIdentity(
        replica=resolve_replica(replica, env),
        role=role,
        rank=rank,
        local_rank=local_rank,
        world_size=world_size,
        host=host_name(env),
        pid=os.getpid(),
    )


def default_registry_root(env: Mapping[str, str] | None = None) -> Path:
    """The per-user default: $XDG_RUNTIME_DIR/cosmos-profiler, else /tmp/cosmos-profiler-<uid>."""
    env = os.environ if env is None else env
    runtime = env.get("XDG_RUNTIME_DIR", "").strip()
    if runtime and os.path.isdir(runtime):
        return Path(runtime) / "cosmos-profiler"
    return Path("/tmp") / f"cosmos-profiler-{os.getuid()}"


REGISTRY_DIR_NAME = "profile_control"


def registry_for_output_root(output_root: str | os.PathLike[str]) -> Path:
    """Cosmos-RL layout: the registry sits beside `profile_trace/`, in the output root
    (`sidecar.config` explains how the root is found, whatever cosmos-rl's timestamp)."""
    return Path(os.path.abspath(os.fspath(output_root))) / REGISTRY_DIR_NAME


def resolve_registry_root(
    registry: str | os.PathLike[str] | None = None,
    env: Mapping[str, str] | None = None,
    configured: str | None = None,
    output_root: str | None = None,
) -> tuple[Path, bool]:
    """Resolve the registry root.

    Order: argument, COSMOS_PROFILER_DIR, `[sidecar] registry`,
    `<output root>/profile_control` (the job's `[train]` output), the per-user default.

    Returns:
        (root, is_user_default): the second tells the caller to create the
        root with mode 0700.
    """
    env = os.environ if env is None else env
    for candidate in (registry, env.get(ENV_REGISTRY), configured):
        if candidate:
            return Path(os.path.abspath(os.path.expanduser(os.fspath(candidate)))), False
    if output_root:
        return registry_for_output_root(output_root), False
    return default_registry_root(env), True


def resolve_output_dir(
    output_dir: str | os.PathLike[str] | None = None,
    env: Mapping[str, str] | None = None,
    output_root: str | None = None,
) -> Path:
    """Argument, COSMOS_PROFILER_OUTPUT_DIR, the job's output root (see `sidecar.config`), else ./outputs."""
    env = os.environ if env is None else env
    if output_dir:
        return Path(os.path.abspath(os.fspath(output_dir)))
    if env.get(ENV_OUTPUT):
        return Path(os.path.abspath(env[ENV_OUTPUT]))
    if output_root:
        return Path(os.path.abspath(output_root))
    return Path(os.path.abspath("outputs"))
