"""torch.distributed's flight recorder, dumped in-process from any thread (this module imports torch).

The flight recorder keeps the last collectives of each process group with their
sequence numbers; `pg_status` says, per process group, the last collective this
rank enqueued (entered) and completed. Lined up across ranks (`sidecar.fleet.hang`),
that names the rank the others wait for. torch has two recorders:

    "cpu"   torch._C._distributed_c10d._dump_fr_trace_json    gloo and other CPU backends (torch >= 2.8)
    "nccl"  torch._C._distributed_c10d._dump_nccl_trace_json  ProcessGroupNCCL's own (CUDA builds only)

Both are read when present (a job may use both: `cpu:gloo,cuda:nccl`). On gloo the
entries' `state` stays "scheduled" and the discovered times are 0; only `pg_status`,
`retired` and `time_created_ns` carry information.

The file `dump` writes (`<n>_flight_recorder.json` in the rank's trace dir, see
`sidecar.common.layout`), JSON:

    {"cosmos_profiler": {...the caller's meta, "dumped_at": epoch s, "torch": "2.13.0"},
     "available": true | false,   # whether any recorder holds data
     "reason": null | "why not",  # when not available
     "recorders": {"cpu": <torch's dump, verbatim>, "nccl": ...},
     "errors": {"nccl": "why that recorder failed"}}

Nothing here raises: `collect` and `dump` return why not instead.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

import torch

from sidecar.common.registry import atomic_write
from sidecar.rank import fr_env

FORMAT_VERSION = 1
RECORDERS = (("cpu", "_dump_fr_trace_json"), ("nccl", "_dump_nccl_trace_json"))


def collect(meta: dict[str, Any] | None = None, only_active: bool = False) -> tuple[dict[str, Any], bool, str]:
    """Read every flight recorder of this process. Never raises; callable from any thread.

    Args:
        meta: identity fields to write under "cosmos_profiler" (rank, step, ...).
        only_active: ask torch for the collectives not yet completed only (NCCL honours it; gloo does not).

    Returns:
        (the document `dump` writes, whether any recorder holds data, why not: "" when it does).
    """
    doc: dict[str, Any] = {
        "cosmos_profiler": {**(meta or {}), "dumped_at": round(time.time(), 6), "torch": _torch_version(),
                            "format": FORMAT_VERSION},
        "available": False, "reason": None, "recorders": {}, "errors": {},
    }
    reason = _unavailable()
    if reason is None:
        reason = _read_recorders(doc, only_active)
    doc["available"] = reason is None
    doc["reason"] = reason
    return doc, reason is None, reason or ""


def dump(path: str | os.PathLike[str], meta: dict[str, Any] | None = None,
         only_active: bool = False) -> tuple[bool, str]:
    """Write this process's flight recorders to `path` (temp + rename). Never raises; any thread.

    The file is written when the recorder is unavailable too, holding the reason.

    Returns:
        (ok, reason): ok when the file holds flight recorder data; else why not
        (the recorder is unavailable, or the file could not be written).
    """
    try:
        doc, ok, reason = collect(meta, only_active)
        atomic_write(Path(path), json.dumps(doc).encode())
        return ok, reason
    except Exception as exc:  # noqa: BLE001 - never into the caller
        return False, f"writing the flight recorder dump {path} failed: {type(exc).__name__}: {exc}"


def render(meta: dict[str, Any] | None = None, only_active: bool = False) -> tuple[bytes, bool, str]:
    """`collect`, as the bytes `dump` writes (for a caller that names the file itself). Never raises."""
    try:
        doc, ok, reason = collect(meta, only_active)
        return json.dumps(doc).encode(), ok, reason
    except Exception as exc:  # noqa: BLE001
        reason = f"reading the flight recorder failed: {type(exc).__name__}: {exc}"
        return json.dumps({"cosmos_profiler": meta or {}, "available": False, "reason": reason,
                           "recorders": {}, "errors": {}}).encode(), False, reason


def _torch_version() -> str:
    return str(getattr(torch, "__version__", "?"))


def _unavailable() -> str | None:
    """Why no process group can have recorded anything, or None."""
    dist = sys.modules.get("torch.distributed")  # never imported here: no import from a side thread
    if dist is None:
        return "no process group: torch.distributed is not imported in this process"
    try:
        if not dist.is_available():
            return "this torch has no torch.distributed"
        if not dist.is_initialized():
            return "no process group: torch.distributed is not initialized in this process"
    except Exception as exc:  # noqa: BLE001
        return f"torch.distributed cannot be queried: {type(exc).__name__}: {exc}"
    c10d = getattr(torch._C, "_distributed_c10d", None)
    if c10d is None or not any(hasattr(c10d, symbol) for _, symbol in RECORDERS):
        return (f"torch {_torch_version()} has no flight recorder dump "
                f"(torch._C._distributed_c10d.{' or .'.join(s for _, s in RECORDERS)})")
    return None


def _read_recorders(doc: dict[str, Any], only_active: bool) -> str | None:
    """Fill doc["recorders"] and doc["errors"]; why none holds data, or None."""
    c10d = torch._C._distributed_c10d
    for key, symbol in RECORDERS:
        fn = getattr(c10d, symbol, None)
        if fn is None:
            continue
        try:
            raw = fn(includeCollectives=True, onlyActive=only_active)
            doc["recorders"][key] = json.loads(raw)
        except Exception as exc:  # noqa: BLE001
            doc["errors"][key] = f"{symbol} failed: {type(exc).__name__}: {exc}"
    if any(_holds_data(d) for d in doc["recorders"].values()):
        return None
    if doc["errors"] and not doc["recorders"]:
        return "; ".join(doc["errors"].values())
    setting = fr_env.user_setting()
    if setting is not None and setting[1].strip() == "0":
        return f"the flight recorder is off ({setting[0]}=0 when the process group was created)"
    name = fr_env.buffer_env_name()
    return (f"the flight recorder holds nothing: its buffer size was 0 when the process group was created, "
            f"or this backend does not record (set {name}, e.g. {name}={fr_env.DEFAULT_BUFFER_SIZE}, "
            "before init_process_group)")


def _holds_data(dump: Any) -> bool:
    # A recorder with buffer size 0 returns no "entries" and an empty pg_status.
    return isinstance(dump, dict) and ("entries" in dump or bool(dump.get("pg_status")))
