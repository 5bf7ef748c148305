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

`write_fr_trace` writes the same moment's recorders once more, as torch's own analysis
(`python -m torch.distributed.flight_recorder.fr_trace DIR`) reads them: each recorder's pickle
(`_dump_fr_trace`, `_dump_nccl_trace`, with the collectives' Python stacks) as
`<output>/profile_trace/<replica>_fr_trace/<request>/<recorder>/rank_<k>` (`sidecar.common.layout`).
The gloo path leaves the dump's `pg_config` empty (torch 2.13 records process group ranks for NCCL
only), and fr_trace cannot match a collective without it (KeyError); there the groups this rank
used are filled in from torch.distributed's own registry (name, description, global ranks), and
the dump says so under "cosmos_profiler_pg_config". Nothing else is changed.

Nothing here raises: `collect` and `dump` return why not instead.
"""

from __future__ import annotations

import json
import os
import pickle
import sys
import time
from pathlib import Path
from typing import Any

import torch

from sidecar.common import layout
from sidecar.common.registry import atomic_write, unlink_quietly, write_temp
from sidecar.rank import fr_env

FORMAT_VERSION = 1
RECORDERS = (("cpu", "_dump_fr_trace_json"), ("nccl", "_dump_nccl_trace_json"))
PICKLED_RECORDERS = (("cpu", "_dump_fr_trace"), ("nccl", "_dump_nccl_trace"))
PG_CONFIG_NOTE = "completed from torch.distributed's process groups: the recorder left them out"


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


def write_fr_trace(trace_dir: str | os.PathLike[str], replica: str, rank: int, request: str,
                   only_active: bool = False) -> tuple[dict[str, str], dict[str, str]]:
    """Each recorder that holds data, as torch's fr_trace reads it (see the module docstring), to
    `<replica>_fr_trace/<request>/<recorder>/rank_<rank>` beside `trace_dir`. A file already there is
    kept (nothing is ever replaced). Never raises; any thread.

    Returns:
        ({recorder: the file written}, {recorder: why not}).
    """
    written: dict[str, str] = {}
    errors: dict[str, str] = {}
    if _unavailable() is not None:
        return written, errors
    c10d = torch._C._distributed_c10d
    for key, symbol in PICKLED_RECORDERS:
        fn = getattr(c10d, symbol, None)
        if fn is None:
            continue
        path = layout.fr_trace_dir(Path(trace_dir), replica, request, key) / layout.FR_TRACE_FILE_TEMPLATE.format(
            rank=rank)
        try:
            raw = fn(includeCollectives=True, includeStackTraces=True, onlyActive=only_active)
            dump = pickle.loads(raw)  # torch's own bytes, from this process
            if not isinstance(dump, dict) or not dump.get("entries"):
                continue
            if _complete_pg_config(dump):
                raw = pickle.dumps(dump)
            _write_new(path, raw)
            written[key] = str(path)
        except Exception as exc:  # noqa: BLE001 - said in the answer, never raised
            errors[key] = f"{symbol} to {path} failed: {type(exc).__name__}: {exc}"
    return written, errors


def _complete_pg_config(dump: dict[str, Any]) -> bool:
    """Fill in the process groups the entries name and `pg_config` lacks, from torch.distributed."""
    raw = dump.get("pg_config")
    config: dict[str, Any] = raw if isinstance(raw, dict) else {}
    known = {name for name, c in config.items() if name and isinstance(c, dict) and c.get("ranks") not in (None, "[]")}
    used = {str(e["process_group"][0]) for e in dump["entries"] if e.get("process_group")}
    if used <= known:
        return False
    world = getattr(sys.modules.get("torch.distributed.distributed_c10d"), "_world", None)
    if world is None:
        return False
    completed = {name: c for name, c in config.items() if name in known}
    for pg, name in list(world.pg_names.items()):
        if name in used and name not in known:
            ranks = sorted(world.pg_group_ranks.get(pg, {}))
            completed[name] = {"name": name, "desc": str(getattr(pg, "group_desc", "") or "undefined"),
                               "ranks": str(ranks)}
    dump["pg_config"] = completed
    dump["cosmos_profiler_pg_config"] = PG_CONFIG_NOTE
    return True


def _write_new(path: Path, data: bytes) -> None:
    """`path` with `data` (temp + link), unless a file is there already.

    Raises:
        FileExistsError: one is; OSError: it cannot be written.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp, _ = write_temp(path, data, 0o644, False)
    try:
        try:
            os.link(tmp, path)
        except FileExistsError:
            raise
        except OSError:  # no link(2) on some FUSE and SMB mounts: one rank writes this name, so look, then rename
            if path.exists():
                raise FileExistsError(f"{path} exists") from None
            os.replace(tmp, path)
    finally:
        unlink_quietly(tmp)
