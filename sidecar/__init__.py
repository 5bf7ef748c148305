"""cosmos-profiler-sidecar: on-demand torch.profiler traces for running training jobs.

    import sidecar
    sc = sidecar.install(output_dir="outputs/run1", replica="r1")
    for batch in loader:
        train_step(batch)
        sc.step()
    sc.close()

Importing this package does not import torch, and the CLI never does; `install()` needs it
(`pip install 'cosmos-profiler-sidecar[rank]'`) and raises `TorchMissing`, an ImportError, without it.
"""

from __future__ import annotations

import os
import threading
from typing import TYPE_CHECKING, Any

from sidecar.common.exceptions import (
    ConfigError,
    ControllerError,
    RegistryError,
    ReplicaNotFound,
    RequestError,
    SidecarError,
    TorchMissing,
    TraceError,
)
from sidecar.common.version import __version__

__all__ = [
    "ConfigError",
    "ControllerError",
    "RegistryError",
    "ReplicaNotFound",
    "RequestError",
    "Sidecar",
    "SidecarError",
    "TorchMissing",
    "TraceError",
    "__version__",
    "current",
    "install",
]

if TYPE_CHECKING:
    from sidecar.rank.core import Sidecar

_lock = threading.Lock()
_current: Sidecar | None = None


def install(
    output_dir: str | os.PathLike[str] | None = None,
    replica: str | None = None,
    rank: int | None = None,
    role: str = "policy",
    config: Any = None,
    registry: str | os.PathLike[str] | None = None,
) -> Sidecar:
    """Install the sidecar in this process and return it.

    Args:
        output_dir: traces go to <output_dir>/profile_trace/<replica>_<rank>/.
            Default: COSMOS_PROFILER_OUTPUT_DIR, else dirname([train] output_dir)
            of the config, else ./outputs.
        replica: default COSMOS_PROFILER_REPLICA, TORCHELASTIC_RUN_ID (unless
            "none"), SLURM_JOB_ID, rdzv-<MASTER_ADDR>-<MASTER_PORT>, else
            <host>-<pid> (see `identity.resolve_replica`); a name from the
            environment is made safe, with a warning naming the variable.
        rank: default RANK, SLURM_PROCID, else 0.
        role: "policy", "rollout" or any label.
        config: a TOML path, a `ProfilerConfig` (ours or cosmos-rl's pydantic
            one), a whole cosmos-rl `Config`, or None (profiling enabled with
            Cosmos-RL's sub-profiler defaults).
        registry: default COSMOS_PROFILER_DIR, else [sidecar] registry, else
            dirname([train] output_dir)/profile_control, else a per-user dir.

    Returns:
        The running Sidecar; also a context manager. Installing twice in one
        process returns the sidecar already running.

    Raises:
        TorchMissing: this Python has no torch; the message names the install line.
        ConfigError: the config or an identity value is invalid.
    """
    global _current
    import logging  # here, not at the top: every `sidecar.*` import runs this module, the CLI's too

    from sidecar.rank import fr_env
    from sidecar.rank.core import build_sidecar

    try:
        fr_env.ensure_default()  # the flight recorder's buffer size, while no process group exists yet
    except Exception:  # noqa: BLE001 - a default, never a reason to fail
        logging.getLogger("sidecar").exception("[Profiler] could not set the flight recorder's default")
    with _lock:
        if _current is not None and not _current._closed:
            logging.getLogger("sidecar").warning(
                "[Profiler] sidecar already installed for replica %s rank %d; reusing it",
                _current.replica, _current.rank,
            )
            return _current
        sc = build_sidecar(output_dir=output_dir, replica=replica, rank=rank, role=role, config=config, registry=registry)
        _current = sc.start()
        return sc


def _adopt(sc: Sidecar) -> None:
    """Make `sc` (started by the CosmosProfiler integration) this process's sidecar."""
    global _current
    with _lock:
        _current = sc


def current() -> Sidecar | None:
    """The sidecar installed in this process, if any."""
    return _current if _current is not None and not _current._closed else None


def __getattr__(name: str) -> Any:
    if name == "Sidecar":
        from sidecar.rank.core import Sidecar

        return Sidecar
    raise AttributeError(f"module 'sidecar' has no attribute {name!r}")
