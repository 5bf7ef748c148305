"""Lay one capture out flat for HolisticTraceAnalysis or Perfetto: a file per rank in one folder.

    export_flat(capture.paths, "hta/r1-0")   # rank<k>.<n>_trace.json.gz, hard links where possible

`export_traces` is what `profile export` calls: `find_traces`, then `export_flat`.
"""

from __future__ import annotations

import filecmp
import json
import os
import re
import shutil
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from sidecar.common.exceptions import BadOption, TraceError
from sidecar.common.registry import atomic_write, unlink_quietly
from sidecar.common.roster import ControllerReplica
from sidecar.traces.catalog import find_traces, listdir, traces_only
from sidecar.traces.merge import EventWriter, write_output
from sidecar.traces.reader import RANKED_SOURCES, TraceReader, identity_of

__all__ = ["ExportResult", "export_flat", "export_traces"]


@dataclass
class ExportResult:
    """What `export_traces` laid out."""

    replica: str | None
    capture: int | None
    out_dir: str
    files: dict[int, str]  # rank -> file in out_dir
    warnings: list[str] = field(default_factory=list)


def _is_hta_input(name: str) -> bool:
    # HolisticTraceAnalysis reads every file of a folder whose name ends so
    return name.endswith(".gz") or name.endswith(".json")


def export_flat(trace_paths_by_rank: Mapping[int, str | os.PathLike[str]], out_dir: str | os.PathLike[str]) -> list[Path]:
    """Lay one capture out flat in `out_dir` for HolisticTraceAnalysis or Perfetto.

    One file per rank, `rank<k>.<n>_trace.json.gz` (the source name after the
    rank), as a hard link where the filesystem allows, else a symlink, else a
    copy. HTA (`TraceAnalysis(trace_dir=out_dir)`) reads every *.json / *.gz
    file in a folder and takes each one's rank from the first `"rank": N` in
    it, which kineto's `distributedInfo` or the sidecar's `cosmos_profiler`
    metadata provides. A trace that names no rank of its own is written as a
    streamed copy with `distributedInfo.rank` added, since a link cannot say it.
    Running it again with the same capture is a no-op.

    Args:
        trace_paths_by_rank: rank -> trace file (`Capture.paths`).
        out_dir: the folder; created if missing. One folder per capture.

    Returns:
        The files in `out_dir`, in rank order.

    Raises:
        TraceError: no traces; a source missing or not a trace; a trace that
            names another rank than its key; `out_dir` holding a different file
            under one of the names, or other trace files (HTA would read them
            as more ranks).
    """
    if not trace_paths_by_rank:
        raise TraceError("no traces to export")
    out_dir = Path(out_dir)
    plan: list[tuple[int, Path, Path, bool]] = []  # rank, source, target, needs a copy with distributedInfo
    for rank, src in sorted(trace_paths_by_rank.items()):
        if isinstance(rank, bool) or not isinstance(rank, int) or rank < 0:
            raise TraceError(f"rank {rank!r} is not a rank number")
        src = Path(src)
        with TraceReader(src) as reader:
            ident = identity_of(reader.header(), src)
            is_gzip = reader.is_gzip
        if ident.rank_source in RANKED_SOURCES and ident.rank != rank:
            raise TraceError(f"{src} is the trace of rank {ident.rank} ({ident.rank_source}), not rank {rank}")
        stem = re.sub(r"(\.json)?(\.gz)?$", "", src.name) or "trace"
        target = out_dir / f"rank{rank}.{stem}.json{'.gz' if is_gzip else ''}"
        plan.append((rank, src, target, ident.rank_source not in RANKED_SOURCES))
    targets = {target.name for _, _, target, _ in plan}
    if out_dir.exists():
        strays = sorted(p.name for p in listdir(out_dir) if _is_hta_input(p.name) and p.name not in targets)
        if strays:
            raise TraceError(
                f"{out_dir} already holds other traces ({', '.join(strays)}); HTA reads every trace "
                "in a folder as one more rank, so export each capture to a folder of its own"
            )
    try:
        out_dir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise TraceError(f"cannot create {out_dir}: {exc.strerror or exc}") from None
    for rank, src, target, needs_rank in plan:
        if needs_rank:
            _place_ranked_copy(src, target, rank)
        else:
            _place(src, target)
    return [target for _, _, target, _ in plan]


def _place(src: Path, target: Path) -> None:
    """Hard link, else symlink, else copy `src` at `target`; an identical file already there is fine."""
    if os.path.lexists(target):
        _check_same(src, target)
        return
    for make in (os.link, _symlink):
        try:
            make(src, target)
            return
        except FileExistsError:
            _check_same(src, target)
            return
        except OSError:
            continue  # another filesystem, or links not allowed: try the next way
    try:
        with open(src, "rb") as source:
            atomic_write(target, lambda out: shutil.copyfileobj(source, out, 1 << 20), mode=None)
    except OSError as exc:
        raise TraceError(f"cannot copy {src} to {target}: {exc.strerror or exc}") from None


def _symlink(src: Path, target: Path) -> None:
    os.symlink(os.path.abspath(src), target)


def _check_same(src: Path, target: Path) -> None:
    try:
        if os.path.samefile(src, target) or filecmp.cmp(src, target, shallow=False):
            return
    except OSError:
        pass
    raise TraceError(f"{target} already exists and is not {src}; not overwriting it")


def _place_ranked_copy(src: Path, target: Path, rank: int) -> None:
    """Stream `src` into `target` with `distributedInfo.rank` first in its header."""

    def write(out: IO[str]) -> None:
        with TraceReader(src) as reader:
            header = {"distributedInfo": {"rank": rank}}
            header.update((k, v) for k, v in reader.header().items() if k != "distributedInfo")
            out.write(json.dumps(header)[:-1] + ', "traceEvents": [\n')
            writer = EventWriter(out)
            for event in reader.events():
                writer.write(event)
            writer.flush()
            out.write("\n]")
            leading = set(header)
            for key, value in reader.metadata.items():
                if key not in leading:
                    out.write(f", {json.dumps(key)}: {json.dumps(value)}")
            out.write("}\n")

    if not os.path.lexists(target):
        write_output(target, write)
        return
    fresh = target.with_name(f".new-{os.getpid()}-{target.name}")  # same suffix: same compression
    try:
        write_output(fresh, write)
        _check_same(fresh, target)
    finally:
        unlink_quietly(fresh)


def export_traces(
    target: str,
    out_dir: str | os.PathLike[str],
    root: Path | None = None,
    capture: int | None = None,
    controller: list[ControllerReplica] | None = None,
) -> ExportResult:
    """`find_traces`, then `export_flat` into `out_dir` (one folder per capture).

    Raises:
        as `find_traces`; BadOption: loose files whose ranks the layout does not tell;
        TraceError: as `export_flat`.
    """
    found = traces_only(find_traces(target, root, capture, controller))
    if not found.ranks_known:
        raise BadOption("target", f"{target} is not in the sidecar's layout (<output>/profile_trace/<replica>_<rank>/"
                                  "<n>_trace.json.gz), so the rank of each file is not known; give a replica name "
                                  "or such a directory")
    out_dir = os.path.abspath(out_dir)
    files = export_flat(found.paths, out_dir)
    ranks = sorted(found.paths)
    return ExportResult(found.replica, found.capture, out_dir, {k: str(f) for k, f in zip(ranks, files, strict=True)},
                        found.warnings)
