"""Rank records through a real network filesystem (sshfs over a throwaway sshd): read in parallel,
the same as the local read."""

from __future__ import annotations

from sidecar.common.layout import record_path
from sidecar.common.recordscan import scan_records
from support.records import remote_record


def test_records_through_sshfs_are_read_in_parallel_and_match_the_local_read(netfs):
    """A registry on a network filesystem is read on a pool of threads (`on_network_fs`), with
    the same records and problems as a serial read of the same files on the server's disk."""
    from sidecar.common.recordscan import on_network_fs

    local = netfs.export / "reg"
    for k in range(24):
        remote_record(local, "r1", k, heartbeat_age=k, world_size=25, step=k)
    (record_path(local, "r1", 0).parent / "rank-24.json").write_text("{oops")
    mount = netfs.mount("node-b") / "reg"
    assert on_network_fs(record_path(mount, "r1", 0).parent) and not on_network_fs(record_path(local, "r1", 0).parent)

    here, there = scan_records(local, "r1", parallel=False), scan_records(mount, "r1")  # `there`: parallel, by the mount
    assert there.records == here.records and [r.step for r in there.records] == list(range(24))
    assert [(p.rank, p.error.split(": ", 1)[1]) for p in there.problems] == [
        (p.rank, p.error.split(": ", 1)[1]) for p in here.problems] == [(24, "is not JSON (Expecting property name "
                                                                          "enclosed in double quotes: line 1 column 2 (char 1))")]


def test_node_records_through_sshfs_match_the_local_read(netfs):
    """Node records (nodes/<shard>/<host>.json) through the mount: the shard directories listed and
    the files read on the pool of threads, each rank the same record as the local read gives, a
    bad node file the same problem."""
    import time

    from sidecar.common.noderecord import Pace
    from sidecar.common.records import RankRecord
    from support.records import node_record

    local = netfs.export / "reg"
    now = float(int(time.time()))
    for n in range(40):
        ranks = [RankRecord(replica="r1", role="policy", rank=4 * n + k, world_size=800, host=f"node-{n}", pid=100 + k,
                            started_at=now - 60, heartbeat_at=now - n, step=50) for k in range(4)]
        node_record(local, "r1", f"node-{n}", ranks, mtime=now - n % 3, paces={4 * n: Pace(now - n - 1, 50, 2.0)},
                    world_size=800)
    node_record(local, "r1", "node-bad", ranks[:1], mtime=now, world_size=800).write_text("[]")
    mount = netfs.mount("node-b") / "reg"
    here, there = scan_records(local, "r1", parallel=False), scan_records(mount, "r1")
    assert [vars(r) for r in there.records] == [vars(r) for r in here.records]
    assert [r.rank for r in there.records] == list(range(160)) and there.records[0].step == 52  # 1 s at 2 steps/s
    assert [p.error.replace(str(mount), "<REG>") for p in there.problems] == [
        p.error.replace(str(local), "<REG>") for p in here.problems]
    assert len(there.problems) == 1 and there.problems[0].rank is None


def test_a_record_rewritten_through_another_mount_is_read_whole(netfs, tmp_path):
    """Node B replaces its node record (a capture ended: the new file is longer) while node A's client
    still caches the old file's size: a read through A stopped at that size, so the CLI on node A saw a
    truncated node record, "not JSON", and its ranks as having no record (`profile set` then followed
    none of them). The reader checks the descriptor's size after the read and reads again."""
    import os
    import time

    from sidecar.common.records import RankRecord
    from support.records import node_record

    now = float(int(time.time()))
    writer, reader = netfs.mount("node-b") / "reg", netfs.mount("node-a") / "reg"

    def replace(trace_path: str | None) -> None:
        """As the node agent writes it: a new file renamed over the old one, through node B's mount."""
        ranks = [RankRecord(replica="r1", role="policy", rank=k, world_size=2, host="node-b", pid=100 + k,
                            started_at=now - 60, heartbeat_at=now, step=50, trace_path=trace_path) for k in range(2)]
        made = node_record(tmp_path / "scratch", "r1", "node-b", ranks, mtime=now, world_size=2)
        final = writer / made.relative_to(tmp_path / "scratch")
        final.parent.mkdir(parents=True, exist_ok=True)
        temp = final.with_name(".node-b.json.tmp")
        temp.write_bytes(made.read_bytes())
        os.utime(temp, (now, now))
        os.rename(temp, final)

    replace(None)
    first = scan_records(reader, "r1")  # node A's client now caches the file's attributes, its size too
    assert [r.rank for r in first.records] == [0, 1] and not first.problems
    for n in range(3):  # each new file longer than the last
        path = f"/out/profile_trace/r1_0/{n}_trace.json.gz" + "/x" * 40 * n
        replace(path)
        scan = scan_records(reader, "r1")
        assert not scan.problems, scan.problems
        assert [(r.rank, r.trace_path) for r in scan.records] == [(0, path), (1, path)]
