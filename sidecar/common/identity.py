"""Who this rank is and where its files live, resolved as docs/contract.md says ("Who a rank is").

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

from sidecar.common import layout
from sidecar.common.exceptions import ConfigError

# Rows of the one table of variables (`sidecar.common.envvars`); their text is taken as it is.
ENV_REPLICA = "COSMOS_PROFILER_REPLICA"
ENV_REGISTRY = "COSMOS_PROFILER_DIR"
ENV_OUTPUT = "COSMOS_PROFILER_OUTPUT_DIR"
ENV_HOST = "COSMOS_PROFILER_HOST"

# Replica names become file names; keep them to a safe, portable alphabet.
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,199}$")
NAME_RULE = "1-200 letters, digits and ._- , starting with a letter or digit"
MAX_NAME_LENGTH = 200
_UNSAFE_RUN = re.compile(r"[^A-Za-z0-9._-]+")
_LOOPBACK_RE = re.compile(r"^(localhost(\.localdomain)?|127(\.\d{1,3}){3}|::1|\[::1\])$", re.IGNORECASE)


def is_valid_replica_name(name: object) -> bool:
    return isinstance(name, str) and _NAME_RE.fullmatch(name) is not None  # fullmatch: `$` lets a newline in


def validate_replica_name(name: str) -> str:
    """Return `name` if it is usable as a replica name.

    Raises:
        ConfigError: the name is empty, too long, or has characters other than
            letters, digits and ._- (it is used in file names).
    """
    if not is_valid_replica_name(name):
        raise ConfigError(f"replica name {name!r} is not valid: use {NAME_RULE}")
    return name


def safe_replica_name(raw: str) -> str:
    """`raw` made into a valid replica name: every run of other characters
    becomes one '-', leading characters other than letters and digits are
    dropped, and the name is cut to 200 characters. "" when nothing is left.

    exp/42 -> exp-42;  "my run #3" -> my-run-3;  ../x -> x
    """
    name = _UNSAFE_RUN.sub("-", raw.strip())
    name = name.lstrip("._-")[:MAX_NAME_LENGTH].rstrip("-")
    return name if is_valid_replica_name(name) else ""


def host_name(env: Mapping[str, str] | None = None) -> str:
    env = os.environ if env is None else env
    return env.get(ENV_HOST) or socket.gethostname()


# Where a replica name comes from, in order (docs/contract.md, "Who a rank is").
REPLICA_ENV_SOURCES = (ENV_REPLICA, "TORCHELASTIC_RUN_ID", "SLURM_JOB_ID")


def resolve_replica(replica: str | None = None, env: Mapping[str, str] | None = None) -> str:
    """The replica name, first found of:

    1. the argument (refused with ConfigError when not a valid name: it is the caller's code);
    2. COSMOS_PROFILER_REPLICA;
    3. TORCHELASTIC_RUN_ID, unless "none" (torchrun without --rdzv-id);
    4. SLURM_JOB_ID;
    5. `rdzv-<MASTER_ADDR>-<MASTER_PORT>` (see `shared_job_name`): the store
       endpoint every rank of one torchrun (or env:// launched) job is given;
    6. `<host>-<pid>`.

    A value from the environment that is not a valid name is made safe
    (`safe_replica_name`: exp/42 -> exp-42) with one warning naming the
    variable; one with nothing usable left is skipped with a warning. Training
    never stops over the name.
    """
    env = os.environ if env is None else env
    if replica:
        return validate_replica_name(replica)
    for key in REPLICA_ENV_SOURCES:
        value = env.get(key, "").strip()
        # torchrun sets TORCHELASTIC_RUN_ID=none when no --rdzv-id is given.
        if value and value.lower() != "none":
            name = _name_from_env(key, value)
            if name:
                return name
    shared = shared_job_name(env)
    if shared:
        return shared
    return safe_replica_name(f"{host_name(env)}-{os.getpid()}") or f"pid-{os.getpid()}"


def _name_from_env(key: str, value: str) -> str:
    if is_valid_replica_name(value):
        return value
    from sidecar.common.log import log  # logging only where there is something to say: the CLI starts without it

    name = safe_replica_name(value)
    if name:
        log.warning("[Profiler] %s=%r is not a valid replica name (%s); using replica name %r", key, value, NAME_RULE, name)
    else:
        log.warning("[Profiler] %s=%r is not a valid replica name (%s) and has nothing usable; ignoring it",
                    key, value, NAME_RULE)
    return name


def shared_job_name(env: Mapping[str, str]) -> str:
    """`rdzv-<MASTER_ADDR>-<MASTER_PORT>` (made safe), or "" without both variables.

    torchrun gives every worker of one job, on every node, the same
    MASTER_ADDR/MASTER_PORT: the TCP store its rank-0 agent serves for the
    job's lifetime (torch shares the rendezvous store by default, so the port
    stays the same across elastic restarts; with
    TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1 a restart picks a new port, and a new
    name). TORCHELASTIC_RESTART_COUNT is not part of the name. Launchers that
    use torch.distributed's env:// init set the same two variables.
    """
    addr, port = env.get("MASTER_ADDR", "").strip(), env.get("MASTER_PORT", "").strip()
    if not addr or not port:
        return ""
    return safe_replica_name("rdzv-{}-{}".format(*(_UNSAFE_RUN.sub("-", part).strip("-") for part in (addr, port))))


def job_identity(env: Mapping[str, str], host: str, pid: int) -> str:
    """What the processes of one job share, and two jobs running at once do not.

    - `rdzv:<MASTER_ADDR>:<MASTER_PORT>`: torchrun and env:// launchers (the
      store endpoint is one live socket, so two running jobs cannot share it;
      a loopback address is qualified with the host);
    - `slurm:<SLURM_JOB_ID>.<SLURM_STEP_ID>`: srun without those variables;
    - `pid:<host>:<pid>`: a process started on its own is a job of its own.

    Two live processes that write the same rank record are a conflict (see
    `Sidecar`); the job identity says whether they belong to two jobs.
    """
    addr, port = env.get("MASTER_ADDR", "").strip(), env.get("MASTER_PORT", "").strip()
    if addr and port:
        if _LOOPBACK_RE.match(addr):
            addr = f"{addr}@{host}"
        return f"rdzv:{addr}:{port}"
    slurm = env.get("SLURM_JOB_ID", "").strip()
    if slurm:
        step = env.get("SLURM_STEP_ID", "").strip()
        return f"slurm:{slurm}" + (f".{step}" if step else "")
    return f"pid:{host}:{pid}"


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
    job: str = ""


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
    host = host_name(env)
    return RankIdentity(
        replica=resolve_replica(replica, env),
        role=role,
        rank=rank,
        local_rank=local_rank,
        world_size=world_size,
        host=host,
        pid=os.getpid(),
        job=job_identity(env, host, os.getpid()),
    )


def default_registry_root(env: Mapping[str, str] | None = None) -> Path:
    """The per-user default: $XDG_RUNTIME_DIR/cosmos-profiler, else /tmp/cosmos-profiler-<uid>."""
    env = os.environ if env is None else env
    runtime = env.get("XDG_RUNTIME_DIR", "").strip()
    if runtime and os.path.isdir(runtime):
        return Path(runtime) / "cosmos-profiler"
    return Path("/tmp") / f"cosmos-profiler-{os.getuid()}"


def registry_url(
    registry: str | os.PathLike[str] | None = None,
    env: Mapping[str, str] | None = None,
    configured: str | None = None,
) -> str | None:
    """The registry as a store URL (`redis://...`, `sidecar.common.storeurl`) where the first of
    the argument, COSMOS_PROFILER_DIR and `[sidecar] registry` that is set is one; else None."""
    env = os.environ if env is None else env
    for candidate in (registry, env.get(ENV_REGISTRY), configured):
        if candidate:
            text = os.fspath(candidate)
            return text if "://" in text else None
    return None


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
        # Beside profile_trace/ in the output root (sidecar.common.config: whatever cosmos-rl's timestamp).
        return layout.registry_for_output_root(os.path.abspath(output_root)), False
    return default_registry_root(env), True


def resolve_output_dir(
    output_dir: str | os.PathLike[str] | None = None,
    env: Mapping[str, str] | None = None,
    output_root: str | None = None,
) -> Path:
    """Argument, COSMOS_PROFILER_OUTPUT_DIR, the job's output root (see `sidecar.common.config`), else ./outputs."""
    env = os.environ if env is None else env
    if output_dir:
        return Path(os.path.abspath(os.fspath(output_dir)))
    if env.get(ENV_OUTPUT):
        return Path(os.path.abspath(env[ENV_OUTPUT]))
    if output_root:
        return Path(os.path.abspath(output_root))
    return Path(os.path.abspath("outputs"))
