"""The pointer a rank leaves in the per-user default registry when its registry is elsewhere.

A registry taken from a relative `[train] output_dir` (cosmos-rl's default `./outputs`) is
found by the CLI only from the directory the job ran in. So the rank writes
`<default registry>/roots/<replica>.json` ({"replica", "registry", "output_dir"}), and the CLI,
run from anywhere, follows it (`sidecar.fleet.replicas.resolve_source`).
"""

from __future__ import annotations

import json
import logging
import os
from pathlib import Path

from sidecar.common import layout
from sidecar.common.config import JobConfig
from sidecar.common.identity import default_registry_root
from sidecar.common.registry import atomic_write, ensure_dir

log = logging.getLogger("sidecar")


def leave_pointer(job: JobConfig, registry_root: Path, private_root: bool, replica: str, output_dir: Path) -> None:
    """Write the pointer to `registry_root` when it was taken from a relative `[train] output_dir`
    (and is not the default registry itself); otherwise do nothing. Never raises an OSError."""
    relative = job.train_output_dir and not os.path.isabs(job.train_output_dir)
    if private_root or not relative or not job.output_root or (
            registry_root != layout.registry_for_output_root(os.path.abspath(job.output_root))):
        return
    default = default_registry_root()
    if default == registry_root:
        return
    pointer = {"replica": replica, "registry": str(registry_root), "output_dir": str(output_dir)}
    try:
        ensure_dir(default, private=True)
        ensure_dir(default / layout.ROOTS_DIR)
        atomic_write(layout.root_pointer_path(default, replica), (json.dumps(pointer, sort_keys=True) + "\n").encode())
    except OSError as exc:
        log.debug("[Profiler] no pointer to %s in %s: %s", registry_root, default, exc)
