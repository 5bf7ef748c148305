"""Node records in the registry (sidecar.common.recordscan): `replica ls` and `lsr` list the ranks of
node records as they list rank files, byte for byte; both layouts in one replica; one rank from two
files; bad node files and entries; the incremental reader, which parses a ticked node record once."""

from __future__ import annotations

import gc
import json
import os
import shutil
import threading
import time
from pathlib import Path

import pytest
from test_cli_listing import COMMANDS, HOST, INIT_CREATE, NOW, build_registry

from sidecar.common import clock, noderecord, recordscan
from sidecar.common.layout import node_record_path, nodes_dir, record_path, replica_dir
from sidecar.common.noderecord import Pace
from sidecar.common.records import RankRecord, write_record
from sidecar.common.recordscan import RecordReader, scan_records
from sidecar.fleet import replicas
from support.cli import invoke as run
from support.records import node_record, remote_record


def _as_node_records(files: Path, nodes: Path) -> None:
    """The registry `files` again, with each host's ranks in one node record: the ranks whose file
    is the host's newest ride its ticks (fresh), the others keep their own heartbeat (quiet)."""
    shutil.copytree(files / "control", nodes / "control")
    for replica in sorted(os.listdir(files / "replicas")):
        scan = scan_records(files, replica, parallel=False)
        assert scan.problems == []
        by_host: dict[str, list[RankRecord]] = {}
        for record in scan.records:
            by_host.setdefault(record.host, []).append(record)
        for host, records in by_host.items():
            mtime = max(clock.written_at(r) for r in records)
            stale = tuple(r.rank for r in records if clock.written_at(r) != mtime or r.exited_at is not None)
            for r in records:
                r.heartbeat_at = clock.written_at(r)  # on one clock: the node's is the filesystem's here
            node_record(nodes, replica, host, records, mtime=mtime, stale=stale)


@pytest.fixture
def frozen(monkeypatch):
    if INIT_CREATE is None:
        pytest.skip("pid 1 cannot be inspected here (hidepid?)")
    monkeypatch.setattr(time, "time", lambda: NOW)
    monkeypatch.setattr(clock, "fs_now", lambda directory: NOW)
    monkeypatch.setattr(replicas, "host_name", lambda: HOST)


@pytest.mark.parametrize("as_json", [False, True], ids=["text", "json"])
@pytest.mark.parametrize("command", ["ls", "lsr_r1"])
def test_node_records_list_as_the_same_rank_files_do(tmp_path, frozen, command, as_json):
    files, nodes = tmp_path / "files", tmp_path / "nodes"
    build_registry(files)
    os.unlink(record_path(files, "r1", 11))  # the bad files: a node record's bad entries read otherwise
    shutil.rmtree(replica_dir(files, "r4"))
    _as_node_records(files, nodes)
    assert not any(replica_dir(nodes, "r1").glob("rank-*.json")) and any(nodes_dir(nodes, "r1").rglob("*.json"))
    flags = ["--json"] if as_json else []
    want = run(*COMMANDS[command], "--registry", str(files), *flags)
    got = run(*COMMANDS[command], "--registry", str(nodes), *flags)
    assert want.exit_code == got.exit_code == 0
    assert got.stdout.replace(str(nodes), "<REG>") == want.stdout.replace(str(files), "<REG>")
    assert "777" in want.stdout or command == "lsr_r1"  # the rank-0 conflict, from the node record


def test_both_layouts_in_one_replica_list_every_rank(tmp_path):
    now = time.time()
    old = [RankRecord(replica="r1", role="policy", rank=k, world_size=12, host="node-a", pid=10 + k, started_at=now - 60,
                      heartbeat_at=now - 1, step=40) for k in range(4)]
    node_record(tmp_path, "r1", "node-a", old, mtime=now - 1)
    node_record(tmp_path, "r1", "node-b", [RankRecord(**{**vars(r), "rank": r.rank + 4, "host": "node-b"}) for r in old],
                mtime=now - 1)
    for k in range(8, 12):
        remote_record(tmp_path, "r1", k, heartbeat_age=1.0, world_size=12)
    scan = scan_records(tmp_path, "r1")
    assert [r.rank for r in scan.records] == list(range(12)) and scan.problems == []
    ranks = replicas.replica_ranks(tmp_path, "r1")
    assert all(r.alive for r in ranks) and {r.host for r in ranks} == {"node-a", "node-b", "node-elsewhere"}


def _file(registry: Path, rank: int, age: float, pid: int = 99, host: str = "node-elsewhere", **fields) -> None:
    """A rank file of `rank`, written `age` seconds ago (its mtime)."""
    at = time.time() - age
    path = write_record(registry, _one(rank, host, pid, at, **fields))
    os.utime(path, (at, at))


def _one(rank: int, host: str, pid: int, at: float, **fields) -> RankRecord:
    return RankRecord(replica="r1", role="policy", rank=rank, world_size=2, host=host, pid=pid, started_at=at - 60,
                      heartbeat_at=at, job=f"job-{pid}", **fields)


def test_one_rank_in_two_files_is_the_newer_with_the_other_live_writer_as_its_conflict(tmp_path):
    now = time.time()
    node_record(tmp_path, "r1", "node-a", [_one(0, "node-a", 11, now - 1), _one(1, "node-a", 12, now - 1)],
                mtime=now - 1)
    _file(tmp_path, 0, age=3.0)  # another job, still alive
    scan = scan_records(tmp_path, "r1")
    kept = {r.rank: r for r in scan.records}
    assert (kept[0].host, kept[0].pid) == ("node-a", 11)
    assert kept[0].conflict == {"pid": 99, "host": "node-elsewhere", "job": "job-99",
                                "seen_at": pytest.approx(os.stat(record_path(tmp_path, "r1", 0)).st_mtime)}
    assert kept[1].conflict is None
    listing = replicas.list_replicas(tmp_path)[0]
    assert listing.conflicts == [{"rank": 0, "pid": 99, "host": "node-elsewhere", "job": "job-99"}]
    # The rank file left by a dead writer (stale), or by the same process: no conflict.
    _file(tmp_path, 0, age=600.0)
    assert scan_records(tmp_path, "r1").records[0].conflict is None
    _file(tmp_path, 0, age=2.0, pid=11, host="node-a")
    assert scan_records(tmp_path, "r1").records[0].conflict is None
    # Newer in the rank file: that one is kept, the node record's entry its conflict.
    _file(tmp_path, 0, age=0.0)
    record = scan_records(tmp_path, "r1").records[0]
    assert (record.pid, record.conflict["pid"], record.conflict["host"]) == (99, 11, "node-a")


def test_one_rank_in_two_node_records_is_the_newer(tmp_path):
    now = time.time()
    node_record(tmp_path, "r1", "node-a", [_one(0, "node-a", 11, now - 500)], mtime=now - 500, world_size=2)
    node_record(tmp_path, "r1", "node-a", [_one(0, "node-a", 21, now - 1)], mtime=now - 1, world_size=2000)  # a restart
    records = scan_records(tmp_path, "r1").records
    assert [(r.rank, r.pid, r.conflict) for r in records] == [(0, 21, None)]


def test_a_bad_node_file_is_a_problem_of_no_rank_that_replica_ls_names(tmp_path):
    now = time.time()
    node_record(tmp_path, "r1", "node-a", [_one(0, "node-a", 11, now), _one(1, "node-a", 12, now)], mtime=now)
    bad = node_record(tmp_path, "r1", "node-b", [_one(0, "node-b", 13, now)], mtime=now)
    bad.write_text("{half a rec")
    entries = node_record(tmp_path, "r1", "node-c", [_one(0, "node-c", 14, now - 3)], mtime=now - 3)
    scan = scan_records(tmp_path, "r1")
    assert [r.rank for r in scan.records] == [0, 1]
    assert [(p.rank, p.path) for p in scan.problems] == [(None, str(bad))]
    assert scan.problems[0].error.startswith(f"node record {bad} is not JSON")
    (row,) = replicas.list_replicas(tmp_path)
    assert row.problems == [scan.problems[0].error] and row.num_ranks == 2
    # A bad entry: a problem for its rank, unless another file holds that rank.
    node = noderecord.parse_node_bytes(entries.read_bytes())
    node["ranks"] = [{"rank": 1, "step": -5}]
    entries.write_text(json.dumps(node))
    scan = scan_records(tmp_path, "r1")
    assert [p.rank for p in scan.problems] == [None, None]
    node["ranks"] = [{"rank": 5, "step": -5, "world_size": 6}]
    entries.write_text(json.dumps(node))
    scan = scan_records(tmp_path, "r1")
    assert [p.rank for p in scan.problems] == [5, None]
    assert "rank 5: field 'step' must be between 0" in scan.problems[0].error
    ranks = {r.rank: r for r in replicas.replica_ranks(tmp_path, "r1")}
    assert ranks[5].liveness == replicas.BAD_RECORD and ranks[1].alive


def test_temp_files_and_stray_names_under_nodes_are_not_read(tmp_path):
    now = time.time()
    path = node_record(tmp_path, "r1", "node-a", [_one(0, "node-a", 11, now)], mtime=now)
    (path.parent / ".node-a.json.tmp-1-ab").write_text("{half")
    (path.parent / "notes.txt").write_text("x")
    (nodes_dir(tmp_path, "r1") / "stray.json").write_text("{}")  # not in a shard directory
    scan = scan_records(tmp_path, "r1")
    assert [r.rank for r in scan.records] == [0] and scan.problems == []


class CountingParse:
    def __init__(self, monkeypatch) -> None:
        self.count = 0
        real = noderecord.parse_nodes

        def parse(nodes):
            self.count += len(nodes)
            return real(nodes)

        monkeypatch.setattr(noderecord, "parse_nodes", parse)


def test_the_reader_parses_a_ticked_node_record_once_and_projects_it_to_each_tick(tmp_path, monkeypatch):
    now = float(int(time.time()) - 100)
    records = [_one(k, "node-a", 10 + k, now) for k in range(3)]
    path = node_record(tmp_path, "r1", "node-a", records, mtime=now, paces={k: Pace(now - 1, 100, 10.0) for k in range(3)},
                       world_size=3)
    parses = CountingParse(monkeypatch)
    reader = RecordReader(tmp_path, "r1", parallel=False)
    assert [r.step for r in reader.scan().records] == [110] * 3 and parses.count == 1
    assert [r.step for r in reader.scan().records] == [110] * 3 and parses.count == 1  # unchanged: not even read
    os.utime(path, (now + 2, now + 2))  # a tick
    scan = reader.scan()
    assert [r.step for r in scan.records] == [130] * 3 and parses.count == 1
    assert [r.file_mtime for r in scan.records] == [now + 2] * 3
    node_record(tmp_path, "r1", "node-a", [*records[:2]], mtime=now + 3, world_size=3)  # a rewrite: rank 2 left
    assert [r.rank for r in reader.scan().records] == [0, 1] and parses.count == 2
    path.unlink()
    assert reader.scan().records == []


def test_parallel_reading_of_node_records_gives_what_the_serial_one_does(tmp_path):
    now = time.time()
    for n in range(40):
        node_record(tmp_path, "r1", f"node-{n}", [_one(2 * n + k, f"node-{n}", 100 + 2 * n + k, now - n) for k in range(2)],
                    mtime=now - n, world_size=800, paces={2 * n: Pace(now - n - 1, 7, 2.0)})
    bad = node_record_path(tmp_path, "r1", "node-bad", 800)
    bad.parent.mkdir(parents=True, exist_ok=True)
    bad.write_text("[]")
    _file(tmp_path, 3, age=0.0)
    assert len(list(nodes_dir(tmp_path, "r1").iterdir())) > 1  # several shard directories
    serial = scan_records(tmp_path, "r1", parallel=False)
    parallel = scan_records(tmp_path, "r1", parallel=True)
    assert [vars(r) for r in parallel.records] == [vars(r) for r in serial.records]
    assert parallel.problems == serial.problems and [p.path for p in serial.problems] == [str(bad)]
    assert [r.rank for r in serial.records] == list(range(80))
    cached = RecordReader(tmp_path, "r1", parallel=True)
    assert [vars(r) for r in cached.scan().records] == [vars(r) for r in cached.scan().records]


def test_merge_keeps_one_record_per_rank_without_touching_the_ones_it_was_given():
    a = _one(0, "node-a", 1, 100.0)
    b = _one(0, "node-b", 2, 200.0)
    scan = recordscan.merge([a, b], alive=lambda r: True)
    assert scan.records[0].pid == 2 and scan.records[0].conflict["pid"] == 1
    assert b.conflict is None  # a cached record stays as read


def test_a_scan_off_the_main_thread_leaves_the_collector_to_the_job(tmp_path):
    """A rank's slowdown watch reads records on a sidecar thread: pausing the collector there
    would race the job's own gc.disable() and could turn it back on after. Only the CLI's main
    thread pauses it."""
    remote_record(tmp_path, "r1", 0, 0.0)
    seen: list[bool] = []

    def scan_in_thread() -> None:
        with recordscan.collector_paused():
            seen.append(gc.isenabled())
        seen.append(len(scan_records(tmp_path, "r1").records) == 1)

    assert gc.isenabled()
    worker = threading.Thread(target=scan_in_thread)
    worker.start()
    worker.join()
    assert seen == [True, True]
    with recordscan.collector_paused():  # the main thread's (the CLI's) still pauses it
        assert not gc.isenabled()
    assert gc.isenabled()


@pytest.mark.parametrize("count", [0, 1, 5, recordscan.NETWORK_READERS, 3 * recordscan.NETWORK_READERS + 7])
def test_read_in_parallel_keeps_the_order_on_one_task_per_thread(count):
    threads: set[str] = set()

    def read(k: int) -> int:
        threads.add(threading.current_thread().name)
        return k * k

    assert recordscan.read_in_parallel(read, list(range(count))) == [k * k for k in range(count)]
    assert len(threads) <= min(recordscan.NETWORK_READERS, max(count, 1))
