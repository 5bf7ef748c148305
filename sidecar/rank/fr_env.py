"""The flight recorder's environment: the names the running torch reads, and the sidecar's default.

torch.distributed's flight recorder keeps the last N collectives of each process
group in a ring buffer; N is read from the environment when the process group is
created, so a default must be in place before `init_process_group`:

    torch >= 2.8   TORCH_FR_BUFFER_SIZE (TORCH_NCCL_TRACE_BUFFER_SIZE still read as an alias)
    torch <  2.8   TORCH_NCCL_TRACE_BUFFER_SIZE (NCCL only; off by default before 2.6)

`python -m sidecar.run` calls `ensure_default()` before the user's script runs;
`sidecar.install()` calls it too, and where a process group already exists it
logs once that it is too late (the process group keeps what torch read). A value
the user set, under either name, is never changed. No torch import here: the
version comes from the package metadata (or from torch itself when it is loaded).
"""

from __future__ import annotations

import logging
import os
import re
import sys
from collections.abc import MutableMapping

log = logging.getLogger("sidecar")

FR_BUFFER_SIZE = "TORCH_FR_BUFFER_SIZE"
NCCL_TRACE_BUFFER_SIZE = "TORCH_NCCL_TRACE_BUFFER_SIZE"
BUFFER_NAMES = (FR_BUFFER_SIZE, NCCL_TRACE_BUFFER_SIZE)
# The first torch whose flight recorder reads TORCH_FR_BUFFER_SIZE (pytorch#152563, "Make FR vendor neutral").
FR_NAME_SINCE = (2, 8)
# Entries per process group: torch's own default where it records by default (2.6+).
DEFAULT_BUFFER_SIZE = 2000

_logged_too_late = False


def torch_version() -> tuple[int, int] | None:
    """(major, minor) of the torch this process runs or would import; None when unknown."""
    torch = sys.modules.get("torch")
    text = getattr(torch, "__version__", None) if torch is not None else None
    if not isinstance(text, str):
        try:
            from importlib.metadata import PackageNotFoundError, version

            text = version("torch")
        except (PackageNotFoundError, ValueError):
            return None
    return parse_version(text)


def parse_version(text: str) -> tuple[int, int] | None:
    """`"2.13.0+cu128"` -> (2, 13)."""
    match = re.match(r"\s*(\d+)\.(\d+)", str(text))
    return (int(match.group(1)), int(match.group(2))) if match else None


def buffer_env_name(version: tuple[int, int] | None = None) -> str:
    """The buffer-size variable the running torch reads (the new name when the version is unknown)."""
    version = torch_version() if version is None else version
    if version is not None and version < FR_NAME_SINCE:
        return NCCL_TRACE_BUFFER_SIZE
    return FR_BUFFER_SIZE


def user_setting(environ: MutableMapping[str, str] | None = None) -> tuple[str, str] | None:
    """(name, value) of a buffer size set in the environment under either name, else None."""
    environ = os.environ if environ is None else environ
    for name in BUFFER_NAMES:
        if name in environ:
            return name, environ[name]
    return None


def process_group_exists() -> bool:
    """Whether torch.distributed has a default process group (never imports torch)."""
    dist = sys.modules.get("torch.distributed")
    if dist is None:
        return False
    try:
        return bool(dist.is_available() and dist.is_initialized())
    except Exception:  # noqa: BLE001
        return False


def ensure_default(environ: MutableMapping[str, str] | None = None,
                   version: tuple[int, int] | None = None) -> str:
    """Set the flight recorder's buffer size to DEFAULT_BUFFER_SIZE where the user has set none.

    Returns:
        "set" (under `buffer_env_name()`), "user" (a value was already set: kept),
        or "too late" (a process group exists: it keeps what torch read; logged once).
    """
    global _logged_too_late
    environ = os.environ if environ is None else environ
    if user_setting(environ) is not None:
        return "user"
    name = buffer_env_name(version)
    if process_group_exists():
        if not _logged_too_late:
            _logged_too_late = True
            log.info("[Profiler] the process group exists already, so the sidecar cannot set the flight recorder's "
                     "%s default; it keeps torch's own (set %s before init_process_group, or run under "
                     "python -m sidecar.run)", name, name)
        return "too late"
    environ[name] = str(DEFAULT_BUFFER_SIZE)
    return "set"
