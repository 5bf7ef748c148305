"""Where the traces are: the captures of a replica in the sidecar's layout.

    <output>/profile_trace/<replica>_<rank>/<n>_trace.json.gz     (sidecar.layout)

`find_captures` groups one replica's traces by capture index n and picks one
capture; `trace_location` reads (replica, rank, n) off a path;
`replicas_with_traces` lists the replicas that have any.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path

from sidecar.errors import TraceError
from sidecar.layout import RANK_DIR_RE, RANK_DIR_TEMPLATE, TRACE_DIR, TRACE_FILE_RE

__all__ = ["Capture", "find_captures", "replicas_with_traces", "trace_location"]


@dataclass
class Capture:
    """One capture of one replica: its trace file per rank."""

    replica: str
    index: int  # n of `<n>_trace.json.gz`
    trace_root: Path  # the profile_trace directory
    paths: dict[int, Path]  # rank -> trace file
    available: list[int]  # every capture index found for the replica
    missing_ranks: list[int] = field(default_factory=list)  # ranks with traces, but none for this index


def find_captures(root: str | os.PathLike[str], replica: str, capture: int | None = None) -> Capture:
    """Find `<root>/profile_trace/<replica>_<rank>/<n>_trace.json.gz`, grouped by capture index n.

    Args:
        root: the job's output directory, its `profile_trace` directory, or one
            `<replica>_<rank>` directory in it.
        replica: the replica name.
        capture: the index n; None for the latest (the highest n on any rank).

    Note that n counts captures per rank: a request that selected only some
    ranks advances only their n. `RankSummary.request_id` tells which request
    each trace answered, and `render_summary` points out a mix.

    Raises:
        TraceError: no trace directory, no traces for the replica, or no such capture.
    """
    root = Path(root)
    if (root / TRACE_DIR).is_dir():
        trace_root = root / TRACE_DIR
    elif root.is_dir() and root.name != TRACE_DIR and RANK_DIR_RE.match(root.name) and any(
        TRACE_FILE_RE.match(p.name) for p in listdir(root)
    ):
        trace_root = root.parent
    elif root.is_dir():
        trace_root = root
    else:
        raise TraceError(f"no traces under {root}: it is not a directory")
    by_rank: dict[int, dict[int, Path]] = {}
    replicas: set[str] = set()
    for rank_dir in listdir(trace_root):
        match = RANK_DIR_RE.match(rank_dir.name)
        if not match or not rank_dir.is_dir():
            continue
        replicas.add(match["replica"])
        if match["replica"] != replica:
            continue
        files = {}
        for f in listdir(rank_dir):
            found = TRACE_FILE_RE.match(f.name)
            if found and f.is_file():
                n = int(found["n"])
                # a plain .json beside a .json.gz of the same n: the sidecar writes .json.gz
                if n not in files or f.name.endswith(".gz"):
                    files[n] = f
        by_rank[int(match["rank"])] = files
    available = sorted({n for files in by_rank.values() for n in files})
    if not available:
        others = sorted(replicas - {replica})
        hint = f" (traces found for: {', '.join(others)})" if others else ""
        where = f"{trace_root}/{RANK_DIR_TEMPLATE.format(replica=replica, rank='<rank>')}"
        raise TraceError(f"no traces found for replica {replica!r} under {where}{hint}")
    index = available[-1] if capture is None else capture
    if index not in available:
        raise TraceError(
            f"replica {replica!r} has no capture {index}; captures: {', '.join(map(str, available))}"
        )
    paths = {rank: files[index] for rank, files in sorted(by_rank.items()) if index in files}
    missing = sorted(rank for rank, files in by_rank.items() if index not in files)
    return Capture(replica, index, trace_root, paths, available, missing)


def trace_location(path: str | os.PathLike[str]) -> tuple[str, int, int] | None:
    """(replica, rank, n) of a trace saved in the sidecar's layout,
    `.../<replica>_<rank>/<n>_trace.json.gz`; None for a file named otherwise."""
    path = Path(path)
    dir_match, file_match = RANK_DIR_RE.match(path.parent.name), TRACE_FILE_RE.match(path.name)
    if not (dir_match and file_match):
        return None
    return dir_match["replica"], int(dir_match["rank"]), int(file_match["n"])


def replicas_with_traces(root: str | os.PathLike[str]) -> list[str]:
    """The replicas with at least one trace under `root` (an output directory,
    or its `profile_trace` directory), sorted; [] when there are none.

    Raises:
        TraceError: `root` cannot be listed.
    """
    root = Path(root)
    trace_root = root / TRACE_DIR if (root / TRACE_DIR).is_dir() else root
    names = set()
    for rank_dir in listdir(trace_root):
        match = RANK_DIR_RE.match(rank_dir.name)
        if match and rank_dir.is_dir() and any(TRACE_FILE_RE.match(f.name) and f.is_file() for f in listdir(rank_dir)):
            names.add(match["replica"])
    return sorted(names)


def listdir(path: Path) -> list[Path]:
    try:
        return sorted(path.iterdir())
    except OSError as exc:
        raise TraceError(f"cannot list {path}: {exc.strerror or exc}") from None
