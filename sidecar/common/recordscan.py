"""Scans of a replica's rank records: every record file under its directory, read the safe way.

    <registry>/replicas/<replica>/rank-<k>.json      (sidecar.common.records reads and checks one)

`scan_records` reads them once (the good records, and the bad files as `RecordProblem`s);
`RecordReader` reads them again and again (`profile set --wait`), re-reading only the files
whose stat changed, and on a network filesystem on a pool of threads.
"""

from __future__ import annotations

import gc
import os
import re
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from sidecar.common.exceptions import RegistryError
from sidecar.common.layout import replica_dir
from sidecar.common.records import RankRecord, RecordError, read_record
from sidecar.common.registry import check_root, filesystem_type, is_network_fs


@dataclass(frozen=True)
class RecordProblem:
    """A file under a replica's directory that is not a usable rank record."""

    path: str
    rank: int | None  # from the file name rank-<k>.json, when it has one
    error: str

    def __str__(self) -> str:
        return self.error


@dataclass
class RecordScan:
    """What a replica's directory holds: the good records, and the bad files."""

    records: list[RankRecord] = field(default_factory=list)
    problems: list[RecordProblem] = field(default_factory=list)


_RECORD_NAME = re.compile(r"rank-(\d{1,9})\.json")


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
ReadRecordFile = Callable[[str], RankRecord]


class RecordReader:
    """Reads one replica's records again and again (`profile set --wait`), re-reading
    only the files whose stat changed since the last scan.

    On a local filesystem a scan is one `os.scandir` and one lstat per file; a
    file with the same inode, size, mtime, ctime and mode as when it was last
    read (and not written within `RACY_S` of that read) gives the record read
    then. On a network filesystem lstat is answered from the client's attribute
    cache, which can be seconds stale, so every file is opened again, on
    `NETWORK_READERS` threads.

    Args:
        parallel: as `scan_records`.
        cache: keep what was read for the next scan (off for a one-off scan).
        read: reads one file (`read_record`; tests count calls through it).
    """

    def __init__(self, root: Path, replica: str, *, parallel: bool | None = None, cache: bool = True,
                 read: ReadRecordFile = read_record) -> None:
        self.root = Path(root)
        self.replica = replica
        self.directory = replica_dir(root, replica)
        self._parallel = parallel
        self._cache_on = cache
        self._read = read
        self._cache: dict[str, tuple[tuple[int, ...], RankRecord | RecordProblem]] = {}

    def scan(self) -> RecordScan:
        """Raises:
            RegistryError: the replica's directory cannot be listed."""
        # Reading 10,000 records makes some 40,000 objects that the collector would
        # walk, again and again as they age, to find no garbage: it waits for the scan.
        collecting = gc.isenabled()
        gc.disable()
        try:
            return self._scan()
        finally:
            if collecting:
                gc.enable()

    def _scan(self) -> RecordScan:
        scan = RecordScan()
        try:
            with os.scandir(self.directory) as it:
                entries = [(entry, int(m.group(1))) for entry in it if (m := _RECORD_NAME.fullmatch(entry.name))]
        except FileNotFoundError:
            self._cache.clear()
            return scan  # no such replica (callers that report "not found" check the root)
        except OSError as exc:
            check_root(self.root)  # the registry itself is the problem: name it
            raise RegistryError(f"cannot list {self.directory}: {exc.strerror or exc}") from None
        parallel = self._parallel if self._parallel is not None else on_network_fs(self.directory)
        use_stat = self._cache_on and not parallel
        now = time.time()
        results: dict[str, RankRecord | RecordProblem | None] = {}
        todo: list[tuple[str, str, int, tuple[int, ...] | None]] = []  # name, path, rank, stat key
        for entry, rank in entries:
            key: tuple[int, ...] | None = None
            if use_stat:
                try:
                    st = entry.stat(follow_symlinks=False)
                except FileNotFoundError:
                    continue  # replaced or removed while listing
                except OSError:
                    st = None
                if st is not None:
                    key = (st.st_ino, st.st_size, st.st_mtime_ns, st.st_ctime_ns, st.st_mode)
                    cached = self._cache.get(entry.name)
                    if cached is not None and cached[0] == key:
                        results[entry.name] = cached[1]
                        continue
                    if now - st.st_mtime < RACY_S:
                        key = None  # too fresh to be known by its stat: read it next time too
            todo.append((entry.name, entry.path, rank, key))
        if parallel and len(todo) > 1:
            from concurrent.futures import ThreadPoolExecutor

            with ThreadPoolExecutor(max_workers=min(NETWORK_READERS, len(todo))) as pool:
                read = list(pool.map(lambda item: self._read_one(item[1], item[2]), todo))
        else:
            read = [self._read_one(path, rank) for _, path, rank, _ in todo]
        for (name, _, _, key), got in zip(todo, read, strict=True):
            results[name] = got
            if key is not None and got is not None:
                self._cache[name] = (key, got)
            else:
                self._cache.pop(name, None)
        if self._cache_on:
            for name in self._cache.keys() - results.keys():
                del self._cache[name]  # a rank that left
        for got in results.values():
            if isinstance(got, RankRecord):
                scan.records.append(got)
            elif got is not None:
                scan.problems.append(got)
        scan.records.sort(key=lambda r: r.rank)
        scan.problems.sort(key=lambda p: (p.rank is None, p.rank or 0, p.path))
        return scan

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


def read_records(root: Path, replica: str) -> list[RankRecord]:
    """The good rank records of a replica, ordered by rank (`scan_records` also says what was skipped)."""
    return scan_records(root, replica).records
