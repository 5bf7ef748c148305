"""Reading rank records at scale: the incremental reader of `--wait`, the parallel reader of
network filesystems, and the liveness tick (a record's mtime as its heartbeat). Through a real
sshfs mount: tests/e2e/test_records_sshfs.py."""

from __future__ import annotations

import dataclasses
import json
import os
import signal
import stat
import time
from pathlib import Path

import pytest

from sidecar.common.identity import RankIdentity
from sidecar.common.layout import record_path
from sidecar.common.recordcheck import loads
from sidecar.common.records import RECORD_FIELDS, RankRecord, read_record, start_since_boot, write_record
from sidecar.common.recordscan import RecordReader, scan_records
from sidecar.fleet.replicas import liveness
from sidecar.rank.publisher import RecordWriter
from support.records import alive_record, remote_record
from support.wait import wait_for


class CountingRead:
    """`read_record`, counting the files it reads."""

    def __init__(self) -> None:
        self.paths: list[str] = []

    def __call__(self, path: str) -> RankRecord:
        self.paths.append(os.path.basename(path))
        return read_record(path)


def _age(path: Path, seconds: float = 60.0) -> None:
    """Set the file's mtime into the past, as a record nobody rewrote for a while."""
    then = time.time() - seconds
    os.utime(path, (then, then))


def test_reader_rereads_only_records_that_changed(tmp_path):
    records = [remote_record(tmp_path, "r1", k, heartbeat_age=0.0, world_size=4) for k in range(4)]
    for k in range(4):
        _age(record_path(tmp_path, "r1", k))
    read = CountingRead()
    reader = RecordReader(tmp_path, "r1", parallel=False, read=read)

    assert [r.step for r in reader.scan().records] == [1000] * 4
    assert sorted(read.paths) == [f"rank-{k}.json" for k in range(4)]

    read.paths.clear()
    assert [r.rank for r in reader.scan().records] == [0, 1, 2, 3]
    assert read.paths == [], "unchanged records were read again"

    write_record(tmp_path, dataclasses.replace(records[2], step=1234, state="armed"))  # a rank's rewrite
    scan = reader.scan()
    assert read.paths == ["rank-2.json"]
    assert {r.rank: (r.step, r.state) for r in scan.records}[2] == (1234, "armed")
    assert [r.step for r in scan.records if r.rank != 2] == [1000] * 3

    record_path(tmp_path, "r1", 3).unlink()  # a rank that left
    read.paths.clear()
    _age(record_path(tmp_path, "r1", 2))
    assert [r.rank for r in reader.scan().records] == [0, 1, 2]
    assert read.paths == ["rank-2.json"]  # its stat changed (the mtime we set): read once more
    read.paths.clear()
    reader.scan()
    assert read.paths == []


def test_reader_rereads_a_record_written_within_one_timestamp_tick(tmp_path):
    """Two rewrites of one size within the same mtime tick look alike by their stat:
    a record this fresh is read by the next scan again, whatever its stat says."""
    rec = alive_record(tmp_path, "r1", 0)
    read = CountingRead()
    reader = RecordReader(tmp_path, "r1", parallel=False, read=read)
    reader.scan()
    path = record_path(tmp_path, "r1", 0)
    st = os.stat(path)
    write_record(tmp_path, dataclasses.replace(rec, step=2000))  # same size as step 1000
    os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))  # and the same mtime, as within one tick
    assert [r.step for r in reader.scan().records] == [2000]
    assert len(read.paths) == 2


def test_bad_records_are_problems_in_the_incremental_reader_too(tmp_path):
    alive_record(tmp_path, "r1", 0)
    reader = RecordReader(tmp_path, "r1", parallel=False)
    assert [r.rank for r in reader.scan().records] == [0]
    path = record_path(tmp_path, "r1", 0)
    path.write_text("{not json")
    _age(path)
    scan = reader.scan()
    assert scan.records == [] and "rank-0.json: is not JSON" in scan.problems[0].error
    path.unlink()
    (tmp_path / "elsewhere.json").write_text("{}")
    path.symlink_to(tmp_path / "elsewhere.json")
    scan = reader.scan()
    assert scan.records == [] and "is a symlink" in scan.problems[0].error


def test_parallel_reader_returns_what_the_serial_one_does(tmp_path):
    for k in range(40):
        remote_record(tmp_path, "r1", k, heartbeat_age=k, world_size=48, step=k * 10)
    directory = record_path(tmp_path, "r1", 0).parent
    (directory / "rank-41.json").write_text("[]")
    (directory / "rank-42.json").write_bytes(record_path(tmp_path, "r1", 5).read_bytes())  # holds rank 5
    (directory / "rank-43.json").symlink_to(record_path(tmp_path, "r1", 6))
    os.mkfifo(directory / "rank-44.json")
    (directory / "notes.txt").write_text("not a record")

    serial = scan_records(tmp_path, "r1", parallel=False)
    parallel = scan_records(tmp_path, "r1", parallel=True)
    assert parallel == serial
    assert [r.rank for r in parallel.records] == list(range(40))
    assert [r.step for r in parallel.records] == [k * 10 for k in range(40)]
    assert [p.rank for p in parallel.problems] == [41, 42, 43, 44]
    assert scan_records(tmp_path, "missing", parallel=True).records == []


def test_an_unchanged_record_is_refreshed_by_its_mtime_and_stays_alive(tmp_path):
    """The liveness tick: a record that says nothing new gets a new mtime (now, by the
    filesystem's clock), not a new file; readers judge its age by that mtime (sidecar.common.clock)."""
    identity = RankIdentity(replica="r1", rank=0, local_rank=0, world_size=1, role="policy", host="node-elsewhere",
                            pid=4242, job="j")
    path = record_path(tmp_path, "r1", 0)
    writer = RecordWriter(path, identity, tmp_path / "traces", lambda *a: None, lambda key: None)
    started = time.time() - 300
    rec = RankRecord(replica="r1", role="policy", rank=0, host="node-elsewhere", pid=4242, started_at=started,
                     heartbeat_at=started, heartbeat_interval=1.0, mtime_heartbeat=True, step=7,
                     recent_steps=[[started, 7]])
    writer.check()
    assert writer.publish(rec) is False  # the first write
    inode = os.stat(path).st_ino
    _age(path, 300)
    assert liveness(read_record(path), "here")[0] is False  # five minutes without a heartbeat

    now = time.time()
    writer.check()
    ticked = dataclasses.replace(rec, heartbeat_at=now, recent_steps=[[now, 7]])  # only the heartbeat moved
    assert writer.publish(ticked) is True
    assert os.stat(path).st_ino == inode, "the tick rewrote the file"
    back = read_record(path)
    assert back.heartbeat_at == started and back.step == 7, "a tick leaves the rank's own clock out of it"
    assert abs(back.file_mtime - time.time()) < 5
    assert liveness(back, "here") == (True, "alive")

    writer.check()
    moved = dataclasses.replace(rec, heartbeat_at=time.time(), step=8, recent_steps=[[now, 7], [time.time(), 8]])
    assert writer.publish(moved) is False  # something new: a whole new record
    assert os.stat(path).st_ino != inode and read_record(path).step == 8


def test_a_record_is_as_old_as_its_file_whatever_its_rank_clock_says(tmp_path):
    """Liveness on one clock: the file's mtime, not `heartbeat_at` (the rank's own clock)."""
    rec = remote_record(tmp_path, "r1", 0, heartbeat_age=3600)
    back = read_record(record_path(tmp_path, "r1", 0))
    assert back.heartbeat_at == rec.heartbeat_at
    assert liveness(back, "here")[1].startswith("no heartbeat for 1h")
    for skew in (-3600.0, 3600.0):  # written just now by a rank whose clock is an hour off
        write_record(tmp_path, dataclasses.replace(rec, heartbeat_at=time.time() + skew))
        assert liveness(read_record(record_path(tmp_path, "r1", 0)), "here") == (True, "alive"), skew


def test_an_idle_sidecar_ticks_and_stays_alive(tmp_path):
    """A real sidecar that does not step: its record is refreshed by utime (same file), and a
    reader on another host keeps seeing it alive by its heartbeat."""
    import sidecar

    config = tmp_path / "job.toml"
    config.write_text("[sidecar]\nheartbeat_interval = 0.1\nwatch = \"poll\"\npoll_interval = 0.5\n")
    sc = sidecar.install(output_dir=tmp_path / "out", replica="idle", rank=0, config=str(config),
                         registry=tmp_path / "reg")
    try:
        path = record_path(tmp_path / "reg", "idle", 0)
        # After its first still heartbeats the record stops changing; from then on only its mtime moves.
        first = wait_for(lambda: (st := os.stat(path)) and time.time() - sc._record.started_at > 1.0 and st, 30,
                         what="a second of heartbeats")
        later = wait_for(lambda: (st := os.stat(path)).st_mtime_ns > first.st_mtime_ns + 200_000_000 and st, 30,
                         what="heartbeats 0.2 s later")
        assert later.st_ino == first.st_ino, "an unchanged record was rewritten instead of ticked"
        back = read_record(path)
        assert back.mtime_heartbeat and back.file_mtime == later.st_mtime and back.heartbeat_at < later.st_mtime
        assert liveness(back, "another-host") == (True, "alive")
    finally:
        sc.close()
    assert read_record(path).exited_at is not None


def test_an_idle_sidecar_builds_its_record_only_every_few_heartbeats(tmp_path):
    """A rank that stands still builds and compares its record at every FULL_EVERY-th heartbeat
    only, and in between just sets the file's mtime (it used to build it at every heartbeat: a
    rank that never stepped published "early" each time). A record file replaced under it is
    written again in full at the next heartbeat."""
    import shutil

    import sidecar
    from sidecar.rank.heartbeat import FULL_EVERY

    config = tmp_path / "job.toml"
    config.write_text("[sidecar]\nheartbeat_interval = 0.3\n")
    sc = sidecar.install(output_dir=tmp_path / "out", replica="idle", rank=0, config=str(config),
                         registry=tmp_path / "reg")
    hb = sc._heartbeat
    counts = {"full": 0, "tick": 0}
    publish, tick = hb._publish, hb._idle_tick

    def counted(kind, fn):
        def call():
            counts[kind] += 1
            fn()
        return call

    try:
        path = record_path(tmp_path / "reg", "idle", 0)
        # Ticks start once the pace window has passed since the (absent) last step.
        wait_for(lambda: time.time() - sc._record.started_at > 4.0, 30, what="the pace window to pass")  # 3 s + 0.3 s
        hb._publish, hb._idle_tick = counted("full", publish), counted("tick", tick)
        inode = os.stat(path).st_ino
        wait_for(lambda: counts["full"] >= 2 and counts["tick"] >= 2 * (FULL_EVERY - 1), 60,
                 what="two full heartbeats and the ticks between them")
        assert counts["tick"] >= (FULL_EVERY - 1) * (counts["full"] - 1), counts
        assert counts["full"] <= counts["tick"] // (FULL_EVERY - 1) + 1, counts
        assert os.stat(path).st_ino == inode, "an unchanged record was rewritten"
        assert liveness(read_record(path), "another-host") == (True, "alive")

        # A SIGUSR1 (its handler only counts it, waking nobody) shows at the next heartbeat,
        # not at the next full one: sent just after a full heartbeat, at most one tick later.
        fulls = counts["full"]
        wait_for(lambda: counts["full"] > fulls, 30, interval=0.005, what="a full heartbeat")
        ticks = counts["tick"]
        os.kill(os.getpid(), signal.SIGUSR1)
        wait_for(lambda: read_record(path).num_signals == 1, 30, interval=0.005, what="the signal in the record")
        assert counts["tick"] - ticks <= 1, counts

        # Someone renames a copy over it: the next heartbeat writes ours again, in full.
        shutil.copyfile(path, tmp_path / "copy.json")
        os.replace(tmp_path / "copy.json", path)
        foreign = os.stat(path).st_ino
        wait_for(lambda: os.stat(path).st_ino != foreign, 30, what="the record to be written again")
        assert read_record(path).pid == os.getpid()
    finally:
        sc.close()


def test_a_rank_standing_still_never_publishes_early(monkeypatch):
    """The heartbeat publishes early for the first measurable pace; a rank that never stepped
    has none, and used to publish "early" at every heartbeat (a full record build each time)."""
    from sidecar.rank import heartbeat as hb_module

    clock = [1000.0]
    monkeypatch.setattr(hb_module.time, "time", lambda: clock[0])
    step = [7]
    hb = hb_module.Heartbeat(5.0, steps=lambda: step[0], publish=lambda: None)
    answers = []
    for _ in range(4):  # heartbeats 5 s apart: one sample in each 3 s pace window
        answers.append(hb._sample(clock[0]))
        clock[0] += 5.0
    assert answers == [False] * 4
    step[0] += 3  # it steps: that pace is worth publishing at once
    assert hb._sample(clock[0]) is True


def test_wait_follows_the_records_that_change_without_rereading_the_rest(tmp_path, monkeypatch):
    """`profile set --wait`'s loop: the first poll reads every record, a poll with nothing
    new reads none, and every rank's answer written meanwhile is picked up."""
    from concurrent.futures import ThreadPoolExecutor

    from sidecar.fleet import follow

    num = 20
    records = [remote_record(tmp_path, "r1", k, heartbeat_age=0.0, world_size=num, heartbeat_interval=600.0)
               for k in range(num)]
    for k in range(num):
        _age(record_path(tmp_path, "r1", k))
    read = CountingRead()
    scans: list[int] = []  # reads so far, at each poll

    class Reader(RecordReader):
        def __init__(self, root: Path, replica: str) -> None:
            super().__init__(root, replica, parallel=False, read=read)

        def scan(self):  # noqa: ANN202
            scans.append(len(read.paths))
            return super().scan()

    monkeypatch.setattr(follow, "RecordReader", Reader)

    def answer() -> list[str]:
        wait_for(lambda: len(scans) >= 5, 30, interval=0.005, what="five polls")
        quiet = list(read.paths)
        for k in range(num):
            write_record(tmp_path, dataclasses.replace(records[k], request_id="req-1", selected=True,
                                                       history=[{"state": "saving", "saved": f"/traces/{k}.json.gz"}]))
        return quiet

    with ThreadPoolExecutor(1) as pool:
        answered = pool.submit(answer)
        result = follow.wait_for_capture(tmp_path, "r1", "req-1", range(num), timeout=60, poll_interval=0.01)
        quiet = answered.result()
    assert [(c.rank, c.phase, c.trace_path) for c in result] == [(k, "saved", f"/traces/{k}.json.gz") for k in range(num)]
    assert sorted(quiet) == sorted(f"rank-{k}.json" for k in range(num)), "polls with nothing new read records again"


FULL = RankRecord(
    replica="r1", role="policy", rank=3, local_rank=3, world_size=8, host="node-0", pid=4242, create_time=5.5,
    started_at=100.0, heartbeat_at=200.25, step=17, state="armed", request_id="cli-1",
    request={"start_step": 20, "rank_filter": "all"}, selected=True, capture_start_step=20,
    history=[{"state": "idle", "request_id": "cli-0", "saved": "/t/0_trace.json.gz"}], recent_steps=[[1.5, 16]],
    conflict={"pid": 7, "host": "h", "job": "j", "seen_at": 3.0}, stall={"step": 9, "since": 1.0}, version="v",
)


@pytest.mark.parametrize("field, value, message", [
    ("step", [], "field 'step' must be an integer, got array"),
    ("rank", "zero", "field 'rank' must be an integer, got string"),
    ("heartbeat_at", float("nan"), "field 'heartbeat_at' must be a finite number, got nan"),
    ("heartbeat_at", 1e301, "field 'heartbeat_at' must be a finite number, got 1e+301"),
    ("create_time", -1e301, "field 'create_time' must be a finite number, got -1e+301"),
    ("pid", True, "field 'pid' must be an integer, got boolean"),
    ("world_size", 10**12, "field 'world_size' must be at most 1048576, got 1000000000000"),
    ("num_captures", -1, "field 'num_captures' must be between 0 and 9007199254740991, got -1"),
    ("history", [{"state": "idle"}, "x"], "field 'history' item 1 must be an object, got string"),
    ("recent_steps", [[1.0, "x"]], "field 'recent_steps' item 0 item 1 must be a number, got string"),
    ("conflict", {"pid": 1, "host": "h", "job": "j"}, "field 'conflict' has no 'seen_at'"),
    ("request", [], "field 'request' must be an object, got array"),
    ("selected", "yes", "field 'selected' must be true or false, got string"),
])
def test_a_whole_record_is_checked_field_by_field_like_a_partial_one(field, value, message):
    obj = json.loads(FULL.to_json())
    assert set(obj) == RECORD_FIELDS  # every field: the path a sidecar's own record takes
    obj[field] = value
    with pytest.raises(ValueError) as raised:
        RankRecord.from_json(json.dumps(obj).encode())
    assert str(raised.value) == message


def test_a_whole_record_reads_back_as_written_whatever_its_key_order():
    assert RankRecord.from_json(FULL.to_json()) == FULL
    backwards = json.dumps(dict(reversed(json.loads(FULL.to_json()).items()))).encode()
    read = RankRecord.from_json(backwards)
    assert read == FULL
    assert read.history is not RankRecord.from_json(backwards).history  # its own lists
    # a newer sidecar's field in place of one of ours: ours takes its default, theirs is dropped
    swapped = json.loads(FULL.to_json())
    del swapped["version"]
    swapped["future"] = 1
    assert RankRecord.from_json(json.dumps(swapped).encode()) == dataclasses.replace(FULL, version="")


@pytest.mark.parametrize("data", [
    b' {"replica": "r1"}', b'{"replica": "r1"} x', b'{"replica": "r1"}\n\n', b"\xef\xbb\xbf{}", b"{\x00}",
    '{"replica": "r1"}'.encode("utf-16-le"), b'{"a": "\xff"}', b"{", b"{}}", b'{"a": 1}\t\r\n ',
])
def test_record_bytes_parse_or_fail_exactly_as_json_loads_says(data):
    try:
        expected: object = json.loads(data)
    except ValueError as exc:
        expected = exc
    try:
        got: object = loads(data)
    except ValueError as exc:
        got = exc
    assert type(got) is type(expected) and str(got) == str(expected)


# Proves: a local rank stays alive when the wall clock is stepped. create_time is the kernel's boot
# time read now plus the start since boot, and the boot time (btime) moves with every clock step or
# slew; the suite failed under load with "process gone" for live ranks before the pid check moved
# to the start since boot.
def test_a_clock_step_does_not_make_a_live_local_rank_look_gone(tmp_path):
    me = alive_record(tmp_path, "r1", 0)
    assert me.start_since_boot is not None and me.start_since_boot == start_since_boot(os.getpid())
    stepped = dataclasses.replace(me, create_time=me.create_time - 7.0)  # written before a 7 s clock step
    assert liveness(stepped, me.host) == (True, "alive")
    reused = dataclasses.replace(me, start_since_boot=me.start_since_boot - 3.0)  # another process, same pid
    assert liveness(reused, me.host) == (False, "process gone")
    other_boot = dataclasses.replace(me, create_time=me.create_time - 3600.0)  # same start, an earlier boot
    assert liveness(other_boot, me.host) == (False, "process gone")
    older_sidecar = dataclasses.replace(me, start_since_boot=None)  # no start since boot: create time, 1 s
    assert liveness(older_sidecar, me.host) == (True, "alive")
    assert liveness(dataclasses.replace(older_sidecar, create_time=me.create_time - 7.0), me.host)[0] is False


def test_start_since_boot_reads_proc_and_says_none_for_no_process():
    mine = start_since_boot(os.getpid())
    assert mine is not None and 0 < mine <= time.clock_gettime(time.CLOCK_BOOTTIME)
    assert start_since_boot(2**22 + 17) is None  # above pid_max's ceiling: never a process


def test_a_read_cut_short_by_a_stale_cached_size_is_read_again(tmp_path, monkeypatch):
    """A network filesystem's client (sshfs, seen) answers the open's fstat from its attribute cache and
    ends the read at that size, while the file is a newer, longer one another node renamed into place;
    the read refreshes the attributes. Simulated here: the first fstat and the reads before the next
    fstat see the old size. The record comes back whole, with the fresh stat."""
    from sidecar.common import records

    path = tmp_path / "rank-0.json"
    path.write_bytes(b'{"old": 1, "new": "' + b"x" * 100 + b'"}')
    whole = path.read_bytes()
    stale = 12  # the cached size of the file it replaced
    real_fstat, real_read, real_pread = os.fstat, os.read, os.pread
    state = {"fstats": 0}

    def fstat(fd):
        st = real_fstat(fd)
        state["fstats"] += 1
        if state["fstats"] > 1:
            return st
        fields = list(st)
        fields[stat.ST_SIZE] = stale
        return os.stat_result(fields)

    def capped(n: int, at: int) -> int:
        return n if state["fstats"] > 1 else max(0, min(n, stale - at))

    monkeypatch.setattr(os, "fstat", fstat)
    monkeypatch.setattr(os, "read", lambda fd, n: real_read(fd, capped(n, os.lseek(fd, 0, os.SEEK_CUR))))
    monkeypatch.setattr(os, "pread", lambda fd, n, at: real_pread(fd, capped(n, at), at))
    data, st = records.read_capped(path, "rank record", 1 << 20)
    assert data == whole and st.st_size == len(whole)
