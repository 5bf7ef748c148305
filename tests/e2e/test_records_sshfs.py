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
