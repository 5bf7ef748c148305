"""Where the traces are: one capture of a replica, rank by rank.

    <output>/profile_trace/<replica>_<rank>/<n>_trace.json.gz     (sidecar.common.layout)

`find_captures` groups one replica's traces under one directory by capture
index n and picks one capture; `trace_location` reads (replica, rank, n) off a
path; `replicas_with_traces` lists the replicas that have any.

`split_capture` reads the `REPLICA:CAPTURE` spelling (`profile diff r1:3 r1:7`).

`find_traces` is the one resolver that `profile summary|merge|export|report|diff`
start from: a trace file, a directory of traces, or a replica name (each rank's
`output_dir` from its record under the registry; ranks on different nodes may
have different ones) to one capture, a `FoundCapture` (gathered, unlike a
`Capture`, across every directory its ranks wrote to). `find_pair` is its two
sides for `profile diff` (`default_pair` chooses what a bare replica means).
The replica checks are the floor's (`sidecar.common.replicaname`), as the fleet's are.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sidecar.common import layout, registry
from sidecar.common.capturesummary import MAX_CARRIED_BYTES, read_carried
from sidecar.common.capturesummary import check as check_summary
from sidecar.common.exceptions import BadOption, ConfigError, TraceError
from sidecar.common.identity import host_name, is_valid_replica_name, validate_replica_name
from sidecar.common.layout import (
    RANK_DIR_RE,
    RANK_DIR_TEMPLATE,
    SUMMARY_FILE_RE,
    TRACE_DIR,
    TRACE_FILE_RE,
    TRACE_TEMPLATE,
)
from sidecar.common.records import RankRecord, RecordError, read_capped
from sidecar.common.recordscan import read_records
from sidecar.common.replicaname import check_replica, controller_replica, not_found
from sidecar.common.request import RankFilter
from sidecar.common.roster import ControllerReplica

__all__ = ["Capture", "FoundCapture", "default_pair", "find_captures", "find_pair", "find_traces",
           "replicas_with_traces", "split_capture", "trace_location", "traces_only", "watch_pair"]


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
    each trace answered, and `summary_notes` points out a mix.

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
    """The entries of a directory, sorted; TraceError when it cannot be listed."""
    try:
        return sorted(path.iterdir())
    except OSError as exc:
        raise TraceError(f"cannot list {path}: {exc.strerror or exc}") from None


# -- a capture from a path or a replica name -------------------------------------


@dataclass
class FoundCapture:
    """The capture `find_traces` found for a target: its traces rank by rank, and where they were found.

    Loose files (not in the sidecar's layout) are taken as one capture with no number n."""

    target: str  # what was asked for: a path or a replica name
    replica: str | None
    capture: int | None  # n of `<n>_trace.json.gz`, when the files are in the sidecar's layout
    paths: dict[int, Path]  # rank -> trace; loose files (ranks_known False): position -> trace
    ranks_known: bool = True
    available: list[int] = field(default_factory=list)  # every capture index found
    missing_ranks: list[int] = field(default_factory=list)  # ranks with traces, but none for this capture
    warnings: list[str] = field(default_factory=list)
    # rank -> the summary of this capture it published, for the ranks whose trace is out of reach
    # (on another machine's disk); `sidecar.common.capturesummary`'s shape, checked.
    summaries: dict[int, dict[str, Any]] = field(default_factory=dict)
    # rank -> what its record says of this capture's upload (upload_url, trace_url, upload_error), for
    # the ranks read from their traces.
    uploads: dict[int, dict[str, Any]] = field(default_factory=dict)

    def holds(self, path: str | os.PathLike[str]) -> bool:
        """Whether `path` is one of this capture's traces (by real path): an output must not be."""
        real = os.path.realpath(path)
        return any(os.path.realpath(p) == real for p in self.paths.values())


def split_capture(target: str) -> tuple[str, int | None]:
    """`REPLICA:CAPTURE` -> (REPLICA, CAPTURE); anything else, an existing path first, -> (target, None).

    Raises:
        BadOption: `REPLICA:` followed by something other than a capture number.
    """
    name, colon, capture = target.rpartition(":")
    if not colon or os.path.lexists(target) or not is_valid_replica_name(name):
        return target, None
    if not (capture.isascii() and capture.isdigit()):
        raise BadOption("target", f"{target!r}: after {name}: comes a capture number, as in {name}:0")
    return name, int(capture)


def _is_trace_name(name: str) -> bool:
    """A loose trace file's name: *.json or *.json.gz, not hidden, and no trace's summary."""
    return not name.startswith(".") and (name.endswith(".json") or name.endswith(".json.gz")) \
        and not SUMMARY_FILE_RE.match(name)


def find_traces(
    target: str,
    root: Path | None = None,
    capture: int | None = None,
    controller: list[ControllerReplica] | None = None,
) -> FoundCapture:
    """Resolve `target` to the traces of one capture.

    `target` is, in this order: an existing trace file (that file alone); a
    directory in the sidecar's layout (an output directory, its `profile_trace`
    directory, or one `<replica>_<rank>` directory: every rank of that
    replica); a directory of loose trace files (`*.json`, `*.json.gz`, such as
    an `export` folder); else a replica name, whose ranks' records under the
    registry `root` name their `output_dir` (with a controller, also its
    atoms' trace paths). `capture` picks the capture index n; default the
    latest.

    Raises:
        BadOption: `capture` given for a file or loose files; `target` is neither a path nor a replica name.
        ReplicaNotFound: no such replica in the registry (or at the controller).
        TraceError: no traces, no such capture, a directory holding several replicas' traces.
    """
    path = Path(target)
    if os.path.lexists(path):
        return _traces_at(target, path, capture)
    if os.sep in target or (os.altsep and os.altsep in target):
        raise TraceError(f"{target}: no such file or directory")
    try:
        validate_replica_name(target)
    except ConfigError:
        raise BadOption("target", f"{target!r} is neither a trace file, a directory nor a replica name") from None
    if root is None:
        raise not_found(target)
    return _traces_of_replica(root, target, capture, controller)


def _traces_at(target: str, path: Path, capture: int | None) -> FoundCapture:
    if not path.is_dir():
        if capture is not None:
            raise BadOption("capture", f"{target} is one trace file; --capture picks a capture of a replica or a directory")
        location = trace_location(path)
        if location is None:
            return FoundCapture(target, None, None, {0: path}, ranks_known=False)
        replica, rank, n = location
        return FoundCapture(target, replica, n, {rank: path})
    dir_replica = _rank_dir_replica(path)
    if dir_replica is not None:
        return _found_capture(target, find_captures(path, dir_replica, capture))
    replicas = replicas_with_traces(path)
    if len(replicas) == 1:
        return _found_capture(target, find_captures(path, replicas[0], capture))
    trace_root = path / TRACE_DIR if (path / TRACE_DIR).is_dir() else path
    if replicas:
        raise TraceError(
            f"{target} holds the traces of {len(replicas)} replicas ({', '.join(replicas)}); give one of them "
            f"by name, or one replica's rank directory such as {trace_root / f'{replicas[0]}_0'}"
        )
    files = [p for p in listdir(path) if _is_trace_name(p.name) and p.is_file()]
    if not files:
        raise TraceError(f"no traces in {target}: no <replica>_<rank> directories and no *.json or *.json.gz files")
    if capture is not None:
        raise BadOption("capture", f"{target} holds loose trace files, not captures; --capture picks a capture of a "
                                   "replica or of a directory in the sidecar's layout")
    return FoundCapture(target, None, None, dict(enumerate(files)), ranks_known=False)


def _rank_dir_replica(path: Path) -> str | None:
    """The replica of a `<replica>_<rank>` directory holding traces, else None."""
    named = trace_location(path / TRACE_TEMPLATE.format(n=0))  # does the directory's name fit the layout?
    if named is None or not any(trace_location(p) for p in listdir(path) if p.is_file()):
        return None
    return named[0]


def _found_capture(target: str, found: Capture) -> FoundCapture:
    warnings = []
    if found.missing_ranks:
        warnings.append(_missing_warning(found.missing_ranks, found.index))
    return FoundCapture(target, found.replica, found.index, dict(found.paths), True, list(found.available),
                    list(found.missing_ranks), warnings)


def _missing_warning(ranks: Sequence[int], index: int) -> str:
    many = len(ranks) > 1
    return (f"rank{'s' if many else ''} {RankFilter(frozenset(ranks))} {'have' if many else 'has'} traces, "
            f"but none for capture {index} (n counts each rank's own captures)")


def _traces_of_replica(
    root: Path, name: str, capture: int | None, controller: list[ControllerReplica] | None
) -> FoundCapture:
    check_replica(name, controller)
    records = read_records(root, name)
    where: dict[str, tuple[Path, list[int], str]] = {}  # real path -> (dir, ranks, host)
    claimed: dict[int, str] = {}  # rank -> the directory its own record names

    def add(directory: Path, rank: int, host: str) -> None:
        key = os.path.realpath(directory)
        entry = where.setdefault(key, (directory, [], host))
        entry[1].append(rank)
        claimed.setdefault(rank, key)

    for record in records:
        if record.output_dir:
            add(Path(record.output_dir), record.rank, record.host)
        elif record.trace_path:
            add(Path(record.trace_path).parent, record.rank, record.host)
    if controller is not None:
        atoms = controller_replica(controller, name).atoms
        for atom in atoms:
            if atom.global_rank not in claimed and atom.trace_path:
                trace = Path(atom.trace_path)
                add(trace if not trace.name.endswith((".json", ".gz")) else trace.parent, atom.global_rank,
                    atom.host_name or "")
    carried, warnings = _carried_summaries(root, name)
    if not where:
        if records:
            raise TraceError(f"replica {name}'s rank records under {root} name no output directory or trace")
        if name in registry.list_replicas(root):
            raise TraceError(f"replica {name} has no rank records under {root}, so its traces cannot be found")
        raise not_found(name)

    found: list[tuple[str, Path, Capture]] = []
    problems: list[tuple[list[int], str]] = []
    for key, (directory, ranks, host) in where.items():
        who = f"rank{'s' if len(ranks) > 1 else ''} {RankFilter(frozenset(ranks))}"
        if not directory.is_dir():
            on = f" on {host}" if host and host != host_name() else ""
            problems.append((ranks, f"{who}: {directory}{on} is not a directory on this machine"))
            continue
        try:
            found.append((key, directory, find_captures(directory, name)))
        except TraceError as exc:
            problems.append((ranks, f"{who}: {exc}"))
    if not found and not carried:
        raise TraceError(f"no traces found for replica {name}: " + "; ".join(text for _, text in problems))
    available = sorted({n for _, _, c in found for n in c.available} | {n for by_n in carried.values() for n in by_n})
    index = available[-1] if capture is None else capture
    if index not in available:
        raise TraceError(f"replica {name!r} has no capture {index}; captures: {', '.join(map(str, available))}")
    paths: dict[int, Path] = {}
    missing: set[int] = set()
    for key, directory, latest in found:
        if latest.index == index:
            chosen = latest
        elif index in latest.available:
            chosen = find_captures(directory, name, index)
        else:
            missing.update(latest.paths)
            continue
        missing.update(chosen.missing_ranks)
        for rank, trace in chosen.paths.items():
            if claimed.get(rank, key) == key:  # a rank's own record says where its traces are
                paths.setdefault(rank, trace)
    # A rank whose trace of this capture is not here (another machine's disk): the summary it published.
    summaries = {rank: by_n[index] for rank, by_n in carried.items() if rank not in paths and index in by_n}
    uploads = {rank: carried[rank][index] for rank in paths if index in carried.get(rank, {})}
    missing -= set(paths) | set(summaries)
    if missing:
        warnings.append(_missing_warning(sorted(missing), index))
    # Ranks whose directory cannot be seen here, and that published no summary, are missing from the
    # capture: say so.
    warnings.extend(f"not included: {text}" for ranks, text in problems if not set(ranks) <= set(summaries))
    return FoundCapture(name, name, index, dict(sorted(paths.items())), True, available, sorted(missing), warnings,
                        dict(sorted(summaries.items())), uploads)


def traces_only(found: FoundCapture) -> FoundCapture:
    """`found` for a command that needs the trace files themselves (merge, export): the ranks known
    only by the summaries they published are left out, and its warnings say so.

    Raises:
        TraceError: no trace of the capture is on this machine.
    """
    if not found.summaries:
        return found
    ranks = sorted(found.summaries)
    why = (f"{_ranks_word(ranks)}: {'their traces are' if len(ranks) > 1 else 'its trace is'} not on this machine "
           f"(only {'their summaries travel' if len(ranks) > 1 else 'its summary travels'}, in "
           f"{'their records' if len(ranks) > 1 else 'its record'})")
    if not found.paths:
        raise TraceError(f"no trace of capture {found.capture} of replica {found.replica} is on this machine: {why}")
    return dataclasses.replace(found, summaries={}, warnings=[*found.warnings, f"not included: {why}"])


def _carried_summaries(root: Path, name: str) -> tuple[dict[int, dict[int, dict[str, Any]]], list[str]]:
    """rank -> capture n -> the summary it published (`layout.carried_summaries_path`, checked); and a
    warning for each file or summary that is no good."""
    carried: dict[int, dict[int, dict[str, Any]]] = {}
    warnings: list[str] = []
    top = layout.replica_dir(root, name) / layout.CARRIED_SUMMARIES_DIR
    try:
        shards = sorted(entry.path for entry in os.scandir(top) if entry.is_dir(follow_symlinks=False))
    except OSError:
        return carried, warnings  # none published (or none that can be listed: the traces decide)
    for shard in shards:
        try:
            names = sorted(os.listdir(shard))
        except OSError as exc:
            warnings.append(f"cannot list {shard}: {exc.strerror or exc}")
            continue
        for file_name in names:
            match = layout.CARRIED_SUMMARIES_RE.fullmatch(file_name)
            if match is None:
                continue
            rank, path = int(match["rank"]), os.path.join(shard, file_name)
            try:
                data, _ = read_capped(path, "summaries file", MAX_CARRIED_BYTES)
                summaries = read_carried(data, rank)
            except FileNotFoundError:
                continue
            except (RecordError, ValueError) as exc:
                warnings.append(f"rank {rank}'s published summaries cannot be read: {path}: {exc}")
                continue
            for summary in summaries:
                try:
                    check_summary(summary)
                    if summary["capture"] is None:
                        raise ValueError("it names no capture")
                except ValueError as exc:
                    warnings.append(f"rank {rank} published a summary that cannot be read: {exc}")
                    continue
                carried.setdefault(rank, {})[summary["capture"]] = summary
    return carried, warnings


def _ranks_word(ranks: Sequence[int] | dict[int, Any]) -> str:
    return f"rank{'s' if len(ranks) > 1 else ''} {RankFilter(frozenset(ranks))}"


# -- which two captures a diff compares -------------------------------------------


def default_pair(found: FoundCapture, records: Sequence[RankRecord] = ()) -> tuple[int, int]:
    """The (base, new) capture indexes a diff takes when it is given one side.

    `found` is a replica's or a directory's capture (the latest unless one was named). Where
    `records` (that replica's rank records) show a slowdown watch that fired and whose slow
    capture is `found`'s, the pair is the baseline that watch took when it was armed and that
    slow capture; otherwise `found` is new and the capture before it is base.

    Raises:
        TraceError: `found` is loose files (no numbered captures), or has no capture before it.
    """
    if found.capture is None:
        raise TraceError(f"{found.target} is one capture of loose trace files; name a second capture to compare "
                         "it with: profile diff BASE NEW")
    watched = watch_pair(records, found.replica)
    if watched is not None and watched[1] == found.capture and watched[0] in found.available:
        return watched
    earlier = [n for n in found.available if n < found.capture]
    if not earlier:
        what = f"replica {found.replica}" if found.replica else found.target
        have = ", ".join(map(str, found.available))
        raise TraceError(
            f"{what} has no capture before capture {found.capture} (captures: {have}); a diff needs two: take "
            f"another with `profile set {found.replica or 'REPLICA'}`, or name both sides (profile diff BASE NEW)")
    return earlier[-1], found.capture


def watch_pair(records: Sequence[RankRecord], replica: str | None) -> tuple[int, int] | None:
    """(baseline, slow capture) of the last slowdown watch that fired on `replica`, read off its rank
    records (the watch's `fired_request_id`, and the saved traces their history ties to request
    ids); None where no rank shows both saved."""
    for record in records:
        watch = record.slowdown or {}
        fired, watch_id = watch.get("fired_request_id"), watch.get("id")
        if not fired or not watch_id:
            continue
        saved = {h.get("request_id"): h["saved"] for h in record.history if isinstance(h.get("saved"), str)}
        slow, baseline = saved.get(fired), saved.get(f"{watch_id}.baseline")
        where_slow = trace_location(slow) if slow else None
        where_base = trace_location(baseline) if baseline else None
        if where_slow and where_base and where_slow[0] == where_base[0] == replica:
            return where_base[2], where_slow[2]
    return None


def find_pair(
    base: str,
    new: str | None = None,
    root: Path | None = None,
    controller: list[ControllerReplica] | None = None,
) -> tuple[FoundCapture, FoundCapture]:
    """The (base, new) captures of `profile diff BASE [NEW]`.

    Each side is anything `find_traces` takes, or `REPLICA:CAPTURE` (`split_capture`). Without
    `new`, `base` names one capture (a replica: its latest), and base is the capture before it
    (`default_pair`, with the replica's rank records under `root` where no capture was named).

    Raises:
        as `find_traces` and `split_capture`; TraceError: as `default_pair`.
    """
    if new is None:
        found_new = _find_spelled(base, root, controller)
        named = split_capture(base)[1] is not None
        records = read_records(root, found_new.replica) if found_new.replica and root is not None and not named else []
        base_index, _ = default_pair(found_new, records)
        return _find_spelled(base, root, controller, capture=base_index), found_new
    return _find_spelled(base, root, controller), _find_spelled(new, root, controller)


def _find_spelled(target: str, root: Path | None, controller: list[ControllerReplica] | None,
                  capture: int | None = None) -> FoundCapture:
    name, named = split_capture(target)
    return find_traces(name, root, named if capture is None else capture, controller)
