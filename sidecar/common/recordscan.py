"""Scans of a replica's rank records, in both layouts, read the safe way.

    <registry>/replicas/<replica>/rank-<k>.json                  one rank (sidecar.common.records reads one)
    <registry>/replicas/<replica>/nodes/<shard>/<host>.json      all the ranks of one node, rolled up by its
                                                                 node agent (sidecar.common.noderecord)

`scan_records` reads them once (the good records, and what is no good as `RecordProblem`s);
`RecordReader` reads them again and again (`profile set --wait`), re-reading only the files
whose stat changed, and on a network filesystem on a pool of threads. A node record's entries
read as rank records ticked at its file's mtime (`noderecord.project`); the same rank from two
files (a node record and a rank file, two node records) is the one written last, with a
`conflict` when the other still lives as another process (`merge`).
"""

from __future__ import annotations

import gc
import os
import re
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TypeVar

from sidecar.common import clock, noderecord
from sidecar.common.exceptions import RegistryError
from sidecar.common.identity import host_name
from sidecar.common.layout import NODES_DIR, replica_dir
from sidecar.common.noderecord import ParsedNode
from sidecar.common.records import RankRecord, RecordError, is_alive, read_record
from sidecar.common.registry import check_root, filesystem_type, is_network_fs


@dataclass(frozen=True)
class RecordProblem:
    """A file under a replica's directory that is not a usable rank record, or a node record's
    entry that is not a usable one."""

    path: str
    rank: int | None  # from the file name rank-<k>.json or the entry, when it has one; None: a node file
    error: str

    def __str__(self) -> str:
        return self.error


@dataclass
class RecordScan:
    """What a replica's directory holds: the good records, and the bad files."""

    records: list[RankRecord] = field(default_factory=list)
    problems: list[RecordProblem] = field(default_factory=list)


_RECORD_NAME = re.compile(r"rank-(\d{1,9})\.json")
_NODE_SUFFIX = ".json"


def scan_records(root: Path, replica: str, parallel: bool | None = None) -> RecordScan:
    """Every rank record of `replica`, ordered by rank, and every file under its
    directory named like a record that is not a good one (with why).

    A record whose `rank` differs from its file name's is a problem too: it
    would stand for the wrong rank.

    A missing directory is no records (a replica not registered yet).

    Args:
        parallel: read the files on a pool of threads (`NETWORK_READERS`); None
            decides by the filesystem: in parallel on a network filesystem, where
            every open is a round trip to the server, serially on a local one.

    Raises:
        RegistryError: the replica's directory cannot be listed.
    """
    return RecordReader(root, replica, parallel=parallel, cache=False).scan()


# On a network filesystem every open is a round trip to the server: the reads of
# one scan run on this many threads (os.open and os.read release the GIL).
NETWORK_READERS = 32
# A record file whose mtime is this close to the scan that read it is read again
# by the next scan even when its stat looks unchanged: two rewrites within one
# timestamp tick, of the same size, into a reused inode, would look alike.
RACY_S = 1.0


def on_network_fs(directory: Path) -> bool:
    """Whether `directory` sits on a network or FUSE filesystem (cached per directory)."""
    key = os.fspath(directory)
    known = _NETWORK_FS.get(key)
    if known is None:
        known = _NETWORK_FS[key] = is_network_fs(filesystem_type(Path(key)))
    return known


_NETWORK_FS: dict[str, bool] = {}

T = TypeVar("T")
R = TypeVar("R")


def read_in_parallel(read: Callable[[T], R], items: Sequence[T]) -> list[R]:
    """`[read(item) for item in items]` on up to NETWORK_READERS threads, each taking every n-th
    item: one task per thread, not per file (a task per file cost 1,250 futures, and about as much
    CPU again as the reads themselves, at a `replica ls` of 10,000 ranks over sshfs)."""
    from concurrent.futures import ThreadPoolExecutor

    n = min(NETWORK_READERS, len(items))
    if n <= 1:
        return [read(item) for item in items]
    results: list[R] = [None] * len(items)  # type: ignore[list-item]  # each filled below
    with ThreadPoolExecutor(max_workers=n) as pool:
        for k, part in enumerate(pool.map(lambda k: [read(item) for item in items[k::n]], range(n))):
            results[k::n] = part
    return results


@contextmanager
def collector_paused() -> Iterator[None]:
    """The cyclic garbage collector off for a while: reading 10,000 records, and making a status
    of each, makes some 100,000 objects that it would walk, again and again as they age, to find
    no garbage (a third of `replica ls`'s time on 10,000 ranks).

    Only on the process's main thread (the CLI's). On any other thread (a rank's slowdown watch, the
    debug server) the collector is the job's: its training thread may turn it off meanwhile, and
    turning it back on after would undo the job's setting."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    collecting = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if collecting:
            gc.enable()
ReadRecordFile = Callable[[str], RankRecord]
StatKey = tuple[int, ...]


@dataclass
class _Node:
    """One node record file as last read: its bytes and their parse (or why they are no good)."""

    data: bytes
    parsed: ParsedNode | RecordProblem


@dataclass
class _NodeBytes:
    """A node record file's bytes and mtime, or why it cannot be read."""

    data: bytes = b""
    mtime: float = 0.0
    problem: RecordProblem | None = None


def _read_node_bytes(path: str) -> _NodeBytes | None:
    try:
        data, st = noderecord.read_node_bytes(path)
    except FileNotFoundError:
        return None  # replaced or removed while listing
    except RecordError as exc:
        return _NodeBytes(problem=RecordProblem(path, None, str(exc)))
    return _NodeBytes(data, st.st_mtime)


@dataclass
class _NodeRead:
    """A node record file read at one mtime: the records it stands for, and its problems."""

    node: _Node
    records: list[RankRecord]
    problems: list[RecordProblem]


class RecordReader:
    """Reads one replica's records again and again (`profile set --wait`), re-reading
    only the files whose stat changed since the last scan.

    On a local filesystem a scan is one `os.scandir` per directory (the replica's, and
    its node shards') and one lstat per file; a file with the same inode, size, mtime,
    ctime and mode as when it was last read (and not written within `RACY_S` of that
    read) gives the records read then. On a network filesystem lstat is answered from the
    client's attribute cache, which can be seconds stale, so every file is opened again,
    on `NETWORK_READERS` threads. A node record whose bytes are the ones read before (a
    liveness tick moved only its mtime) is not parsed again, only projected to its new mtime.

    Args:
        parallel: as `scan_records`.
        cache: keep what was read for the next scan (off for a one-off scan).
        read: reads one rank file (`read_record`; tests count calls through it).
        alive: whether a record is of a live process (the other writer of a rank seen
            twice; default `records.is_alive` on the registry filesystem's clock).
    """

    def __init__(self, root: Path, replica: str, *, parallel: bool | None = None, cache: bool = True,
                 read: ReadRecordFile = read_record, alive: Callable[[RankRecord], bool] | None = None) -> None:
        self.root = Path(root)
        self.replica = replica
        self.directory = replica_dir(root, replica)
        self._parallel = parallel
        self._cache_on = cache
        self._read = read
        self._alive = alive
        self._cache: dict[str, tuple[StatKey, RankRecord | RecordProblem | _NodeRead]] = {}
        self._nodes: dict[str, _Node] = {}  # node file -> its last bytes and parse (whatever its stat)

    def scan(self) -> RecordScan:
        """Raises:
            RegistryError: the replica's directory cannot be listed."""
        with collector_paused():
            return self._scan()

    def _scan(self) -> RecordScan:
        try:
            with os.scandir(self.directory) as it:
                entries = [(entry, int(m.group(1)) if (m := _RECORD_NAME.fullmatch(entry.name)) else -1)
                           for entry in it if entry.name == NODES_DIR or _RECORD_NAME.fullmatch(entry.name)]
        except FileNotFoundError:
            self._cache.clear()
            self._nodes.clear()
            return RecordScan()  # no such replica (callers that report "not found" check the root)
        except OSError as exc:
            check_root(self.root)  # the registry itself is the problem: name it
            raise RegistryError(f"cannot list {self.directory}: {exc.strerror or exc}") from None
        parallel = self._parallel if self._parallel is not None else on_network_fs(self.directory)
        files = [(entry, rank) for entry, rank in entries if rank >= 0]
        nodes_dir = next((entry for entry, rank in entries if rank < 0 and entry.is_dir(follow_symlinks=False)), None)
        node_files = self._list_nodes(nodes_dir.path, parallel) if nodes_dir is not None else []
        use_stat = self._cache_on and not parallel
        now = time.time()
        results: dict[str, RankRecord | RecordProblem | _NodeRead | None] = {}
        todo: list[tuple[str, int, StatKey | None]] = []  # path, rank (-1: a node file), stat key
        for entry, rank in [*files, *((e, -1) for e in node_files)]:
            key: StatKey | None = None
            if use_stat:
                try:
                    st = entry.stat(follow_symlinks=False)
                except FileNotFoundError:
                    continue  # replaced or removed while listing
                except OSError:
                    st = None
                if st is not None:
                    key = (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_mode)
                    cached = self._cache.get(entry.path)
                    if cached is not None and cached[0] == key:
                        results[entry.path] = cached[1]
                        continue
                    if now - st.st_mtime < RACY_S:
                        key = None  # too fresh to be known by its stat: read it next time too
            todo.append((entry.path, rank, key))

        def read(item: tuple[str, int, StatKey | None]) -> RankRecord | RecordProblem | _NodeBytes | None:
            return self._read_one(item[0], item[1]) if item[1] >= 0 else _read_node_bytes(item[0])

        # The threads wait on the server; a node record is parsed here, after: 32 threads
        # taking turns at the GIL to parse would cost more than they save.
        read_all = read_in_parallel(read, todo) if parallel else [read(item) for item in todo]
        nodes = self._parse_nodes([(item[0], got) for item, got in zip(todo, read_all, strict=True)
                                   if isinstance(got, _NodeBytes)])
        got_all = [self._node_read(item[0], got, nodes[item[0]]) if isinstance(got, _NodeBytes) else got
                   for item, got in zip(todo, read_all, strict=True)]
        for (path, _, key), got in zip(todo, got_all, strict=True):
            results[path] = got
            if key is not None and got is not None:
                self._cache[path] = (key, got)
            else:
                self._cache.pop(path, None)
        if self._cache_on:
            for path in self._cache.keys() - results.keys():
                del self._cache[path]  # a rank or a node that left
            for path in self._nodes.keys() - results.keys():
                del self._nodes[path]
        else:
            self._nodes.clear()
        return merge(results.values(), self._is_alive)

    def _list_nodes(self, nodes_path: str, parallel: bool) -> list[os.DirEntry[str]]:
        """The node record files under `nodes/`: one listing per shard directory (on a pool of
        threads on a network filesystem, where each is a round trip)."""
        try:
            with os.scandir(nodes_path) as it:
                shards = [entry.path for entry in it if not entry.name.startswith(".")
                          and entry.is_dir(follow_symlinks=False)]
        except FileNotFoundError:
            return []
        except OSError as exc:
            raise RegistryError(f"cannot list {nodes_path}: {exc.strerror or exc}") from None

        def listing(path: str) -> list[os.DirEntry[str]]:
            try:
                with os.scandir(path) as it:  # temp files are hidden (registry.temp_name)
                    return [entry for entry in it if entry.name.endswith(_NODE_SUFFIX) and not entry.name.startswith(".")]
            except FileNotFoundError:
                return []
            except OSError as exc:
                raise RegistryError(f"cannot list {path}: {exc.strerror or exc}") from None

        found = read_in_parallel(listing, shards) if parallel else [listing(path) for path in shards]
        return [entry for entries in found for entry in entries]

    def _read_one(self, path: str, rank: int) -> RankRecord | RecordProblem | None:
        try:
            record = self._read(path)
        except FileNotFoundError:
            return None  # replaced or removed while listing
        except RecordError as exc:
            return RecordProblem(path, rank, str(exc))
        if record.rank != rank:
            return RecordProblem(path, rank, f"rank record {path} holds rank {record.rank}")
        return record

    def _parse_nodes(self, reads: list[tuple[str, _NodeBytes]]) -> dict[str, _Node]:
        """Each node record file's bytes and their parse, by path: parsed again only where they are
        not the bytes read before (a tick moves only the mtime), and all of them together
        (`noderecord.parse_nodes`: the entries of 1,250 nodes a column at a time)."""
        nodes: dict[str, _Node] = {}
        todo: list[tuple[str, bytes, dict[str, object]]] = []
        for path, read in reads:
            if read.problem is not None:
                nodes[path] = _Node(b"", read.problem)
                continue
            known = self._nodes.get(path) if self._cache_on else None
            if known is not None and known.data == read.data:
                nodes[path] = known
                continue
            try:
                todo.append((path, read.data, noderecord.parse_node_bytes(read.data, path)))
            except RecordError as exc:
                nodes[path] = _Node(read.data, RecordProblem(path, None, str(exc)))
        parsed = noderecord.parse_nodes([(node, path) for path, _, node in todo])
        for (path, data, _), one in zip(todo, parsed, strict=True):
            nodes[path] = _Node(data, one)
        if self._cache_on:
            for path, read in reads:
                if read.problem is None:
                    self._nodes[path] = nodes[path]
        return nodes

    def _node_read(self, path: str, read: _NodeBytes, node: _Node) -> _NodeRead:
        """A node record file's records at its mtime, from its parse `node`."""
        if isinstance(node.parsed, RecordProblem):
            return _NodeRead(node, [], [node.parsed])
        return _NodeRead(node, noderecord.project(node.parsed, read.mtime, copy=self._cache_on),
                         [RecordProblem(path, rank, why) for rank, why in node.parsed.problems])

    def _is_alive(self, record: RankRecord) -> bool:
        if self._alive is not None:
            return self._alive(record)
        return is_alive(record, host_name(), clock.fs_now(self.root))


def merge(results: Iterable[RankRecord | RecordProblem | _NodeRead | None],
          alive: Callable[[RankRecord], bool]) -> RecordScan:
    """One record per rank from what the files held, ordered by rank; and the problems.

    A rank found in two files (a node record and a rank file left from before the node
    agent, two node records of one host under two shard counts, two jobs under one
    replica name) is the record written last (`clock.written_at`); when another of them
    is of a live process other than its own, that one is its `conflict`, as a rank's own
    writer reports a second writer of its file (sidecar.rank.publisher). A bad file or
    entry for a rank that has a good record elsewhere is a problem without a rank: it is
    listed, but does not stand for the rank.
    """
    scan = RecordScan()
    found: list[RankRecord] = []
    problems: list[RecordProblem] = []
    for got in results:
        if got is None:
            continue
        if isinstance(got, RecordProblem):
            problems.append(got)
        elif isinstance(got, RankRecord):
            found.append(got)
        else:
            found.extend(got.records)
            problems.extend(got.problems)
    by_rank = {record.rank: record for record in found}
    seen_twice: dict[int, list[RankRecord]] = {}
    if len(by_rank) != len(found):  # a rank in two files (else each is in one: the common case)
        by_rank = {}
        for record in found:
            other = by_rank.setdefault(record.rank, record)
            if other is not record:
                seen_twice.setdefault(record.rank, [other]).append(record)
    for rank, candidates in seen_twice.items():
        by_rank[rank] = _newest(candidates, alive)
    scan.records = [by_rank[rank] for rank in sorted(by_rank)]
    scan.problems = [RecordProblem(p.path, None, p.error) if p.rank is not None and p.rank in by_rank else p
                     for p in problems]
    scan.problems.sort(key=lambda p: (p.rank is None, p.rank or 0, p.path))
    return scan


def _newest(candidates: list[RankRecord], alive: Callable[[RankRecord], bool]) -> RankRecord:
    """The record of one rank written last; its `conflict`, another live writer, when there is one."""
    kept = max(candidates, key=clock.written_at)
    if kept.conflict is not None:
        return kept
    for other in sorted(candidates, key=clock.written_at, reverse=True):
        if other is kept or (other.host, other.pid) == (kept.host, kept.pid) or other.exited_at is not None:
            continue
        if alive(other):
            copy = kept.__class__.__new__(kept.__class__)  # the kept record may be a cached one: left as read
            copy.__dict__.update(kept.__dict__)
            copy.conflict = {"pid": other.pid, "host": other.host, "job": other.job,
                             "seen_at": float(clock.written_at(other))}
            return copy
    return kept


def read_records(root: Path, replica: str) -> list[RankRecord]:
    """The good rank records of a replica, ordered by rank (`scan_records` also says what was skipped)."""
    return scan_records(root, replica).records
