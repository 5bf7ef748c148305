"""The node agent's rooms, in process: the lease (sidecar.rank.nodelease), the relay envelope and
its unwrapping (sidecar.rank.noderelay), and the node record's rollup (sidecar.rank.nodeagent):
rewritten only on a change of state, ticked otherwise. Real files, no process started."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import time

import pytest

from sidecar.common import layout, noderecord
from sidecar.common.config import SidecarSettings
from sidecar.common.exceptions import RequestError
from sidecar.common.records import RankRecord, pid_alive, read_record, start_since_boot
from sidecar.common.registry import ControlFile, atomic_write
from sidecar.rank import nodeagent, noderelay
from sidecar.rank.nodeagent import NodeLink, private_dir, scaled_poll_interval, wants_agent
from sidecar.rank.nodelease import Lease, holder_alive
from support.wait import wait_for

# --- the lease -----------------------------------------------------------------


def test_of_two_ranks_that_claim_at_once_exactly_one_is_the_agent(tmp_path):
    a, b = Lease(tmp_path / "agent", 0, "h"), Lease(tmp_path / "agent", 1, "h")
    b.me["pid"] = os.getpid() + 1_000_000  # another process, as far as the files say
    assert a.vacant(5.0) and b.vacant(5.0)
    assert a.claim() is True
    # b saw the same empty dir; its O_EXCL create of term 0 fails, and term 1 is not its to take.
    b_epochs_before = sorted(os.listdir(tmp_path / "agent"))
    assert b_epochs_before == ["lease-0"]
    assert not b.vacant(5.0)  # a is alive and beating
    assert a.still_mine() and a.beat()


def test_a_dead_or_silent_agent_leaves_a_vacancy_and_the_next_term_is_taken(tmp_path):
    agent, other = Lease(tmp_path / "agent", 0, "h"), Lease(tmp_path / "agent", 1, "h")
    assert agent.claim()
    other.me["pid"] = agent.me["pid"] = os.getpid()
    # Silent: its beat older than stale_after.
    old = time.time() - 30
    os.utime(tmp_path / "agent" / "lease-0", (old, old))
    other.me = dict(other.me, pid=os.getpid() + 1)  # other is another process
    assert other.vacant(5.0)
    assert other.claim() and other.epoch == 1
    assert not agent.still_mine() and not agent.beat() and agent.epoch is None  # it steps down
    assert sorted(os.listdir(tmp_path / "agent")) == ["lease-1"]


def test_a_dead_holder_is_seen_by_its_pid_and_start(tmp_path):
    directory = tmp_path / "agent"
    directory.mkdir()
    (directory / "lease-4").write_text(json.dumps({"pid": 2**22 + 12345, "rank": 3, "host": "h",
                                                   "start_since_boot": 1.0}))
    assert Lease(directory, 0, "h").vacant(60.0)
    # Alive pid, but another start: a reused pid.
    (directory / "lease-5").write_text(json.dumps({"pid": os.getpid(), "rank": 3, "host": "h",
                                                   "start_since_boot": (start_since_boot(os.getpid()) or 0) + 100}))
    me = Lease(directory, 0, "h")
    me.me["pid"] = os.getpid() + 1
    assert me.vacant(60.0)
    assert me.claim() and me.epoch == 6


def test_a_term_number_taken_again_after_the_files_were_removed_is_not_the_old_holders(tmp_path):
    old, new = Lease(tmp_path / "agent", 0, "h"), Lease(tmp_path / "agent", 1, "h")
    assert old.claim() and old.epoch == 0
    for name in os.listdir(tmp_path / "agent"):
        os.unlink(tmp_path / "agent" / name)  # the node dir emptied under the job
    new.me["pid"] = os.getpid() + 1
    assert new.claim() and new.epoch == 0  # the same number, another holder
    assert not old.still_mine()


# --- the relay envelope ----------------------------------------------------------


def _control(data: bytes, mtime_ns: int = 123, repeat: bool = False) -> ControlFile:
    return ControlFile(data=data, mtime_ns=mtime_ns, size=len(data), inode=7, mode=0o100644, repeat=repeat)


def test_a_relayed_request_reaches_the_rank_as_the_control_file_was_and_only_once(tmp_path):
    got: list[ControlFile] = []
    errors: list[RequestError] = []
    relay = noderelay.RankRelay(got.append, errors.append)
    raw = noderelay.encode(source=(111, 5, 9, 0o100644), data=b'{"id": "a"}', repeat=False, agent={"rank": 0})
    relay.on_envelope(_control(raw))
    relay.on_envelope(_control(raw, mtime_ns=999))  # the same version relayed again (a resumed agent)
    assert [(c.data, c.mtime_ns, c.size, c.inode, c.repeat) for c in got] == [(b'{"id": "a"}', 111, 5, 9, False)]
    assert relay.num_duplicates == 1
    # The envelope of a bare touch: a new signature, the same bytes.
    relay.on_envelope(_control(noderelay.encode(source=(222, 5, 9, 0o100644), data=b'{"id": "a"}', repeat=True)))
    assert got[-1].repeat and got[-1].mtime_ns == 222
    relay.on_envelope(_control(noderelay.encode(source=(333, 0, 9, 0o120777), data=b"symlink",
                                                error="control file x is a symlink; refusing to follow it")))
    assert [str(e) for e in errors] == ["control file x is a symlink; refusing to follow it"]
    assert len(got) == 2


def test_a_baseline_envelope_is_delivered_to_no_one(tmp_path):
    got: list[ControlFile] = []
    relay = noderelay.RankRelay(got.append, lambda exc: None)
    relay.on_envelope(_control(noderelay.encode(source=(1, 2, 3, 4), data=b"{}", baseline=True)))
    assert got == []
    path = tmp_path / "control.json"
    noderelay.write(path, noderelay.encode(source=(5, 2, 3, 4), data=b"{}"))
    relay.baseline(path, 10_000)  # what the envelope holds when the rank starts: seen
    relay.on_envelope(_control(path.read_bytes()))
    assert got == []


def test_an_envelope_whose_data_was_tampered_with_is_not_delivered():
    got: list[ControlFile] = []
    raw = json.loads(noderelay.encode(source=(1, 2, 3, 4), data=b'{"id": "x"}'))
    raw["data"] = "eyJpZCI6ICJ5In0="  # {"id": "y"}, the digest still x's
    relay = noderelay.RankRelay(got.append, lambda exc: None)
    relay.on_envelope(_control(json.dumps(raw).encode()))
    assert got == []


# --- when, and where -----------------------------------------------------------------


def test_auto_uses_an_agent_on_a_network_filesystem_only(tmp_path, monkeypatch):
    assert wants_agent(SidecarSettings(node_agent="on"), tmp_path)[0]
    assert not wants_agent(SidecarSettings(node_agent="off"), tmp_path)[0]
    used, why = wants_agent(SidecarSettings(), tmp_path)
    assert not used and "local" in why
    monkeypatch.setattr(nodeagent, "filesystem_type", lambda path: "nfs4")
    used, why = wants_agent(SidecarSettings(), tmp_path)
    assert used and why == "the registry is on a nfs4 filesystem"


def test_the_node_dir_is_private_and_another_users_is_refused(tmp_path, monkeypatch):
    private_dir(tmp_path / "base")
    assert oct(os.stat(tmp_path / "base").st_mode & 0o777) == "0o700"
    (tmp_path / "open").mkdir()
    os.chmod(tmp_path / "open", 0o777)
    private_dir(tmp_path / "open")  # ours: made private again
    assert oct(os.stat(tmp_path / "open").st_mode & 0o777) == "0o700"
    monkeypatch.setattr(os, "getuid", lambda: 4321)
    with pytest.raises(PermissionError, match="owned by uid 0, not this user"):
        private_dir(tmp_path / "base")


def test_the_node_base_resolution(tmp_path):
    settings = SidecarSettings()
    assert nodeagent.node_base(settings, {"COSMOS_PROFILER_NODE_DIR": "/x/y"}) == nodeagent.Path("/x/y")
    assert nodeagent.node_base(SidecarSettings(node_dir="/cfg"), {}) == nodeagent.Path("/cfg")
    assert nodeagent.node_base(settings, {"XDG_RUNTIME_DIR": str(tmp_path)}) == tmp_path / "cosmos-profiler-node"


def test_the_poll_interval_grows_past_256_nodes_up_to_4_s():
    assert scaled_poll_interval(1.0, 1024, 8) == 1.0  # 128 nodes
    assert scaled_poll_interval(1.0, 4096, 8) == 2.0  # 512 nodes
    assert scaled_poll_interval(1.0, 16384, 8) == 4.0  # 2,048 nodes: capped
    assert scaled_poll_interval(5.0, 16384, 8) == 5.0  # never below the configured one


# --- the rollup ------------------------------------------------------------------------


def _link(tmp_path, **settings) -> NodeLink:
    settings = SidecarSettings(heartbeat_interval=settings.pop("heartbeat_interval", 1.0), node_agent="on", **settings)
    link = NodeLink(tmp_path / "node" / "job-x", tmp_path / "reg", "job", 0, "node-1", 16, settings,
                    lambda key, level, message: None)
    link.prepare()
    return link


STARTED = time.time() - 3600


def _local_record(link: NodeLink, rank: int, step: int, rate: float, at: float | None = None, **fields) -> RankRecord:
    """Rank `rank`'s own record in the node dir, as its heartbeat at `at` (default now) writes it."""
    now = time.time() if at is None else at
    record = RankRecord(replica="job", role="policy", rank=rank, world_size=16, host="node-1", pid=os.getpid(),
                        start_since_boot=start_since_boot(os.getpid()), started_at=STARTED, heartbeat_at=now,
                        heartbeat_interval=1.0, mtime_heartbeat=True, step=step,
                        recent_steps=[[now - 1, step - rate], [now, step]] if rate else [[now, step]],
                        last_step_at=now, **fields)
    path = layout.node_record_local(link.node_dir, rank)
    atomic_write(path, record.to_json())
    if at is not None:
        os.utime(path, (at, at))
    return record


class _Clock:
    """The agent's `time` module, at a time the test sets (the files' mtimes are set to match)."""

    def __init__(self, now: float) -> None:
        self.now = now

    def time(self) -> float:
        return self.now

    def monotonic(self) -> float:
        return self.now


def test_a_steady_node_writes_its_record_once_then_only_ticks_it(tmp_path, monkeypatch):
    link = _link(tmp_path)
    t0 = time.time() - 30
    clock = _Clock(t0)
    monkeypatch.setattr(nodeagent, "time", clock)
    link._offset, link._offset_due = 0.0, float("inf")  # the fake clock is the filesystem's
    for rank in range(2):
        _local_record(link, rank, 100, 10.0, at=t0)
    assert link.lease.claim()
    link._rollup(force=True)
    assert link.num_node_writes == 1
    first = json.loads(link.node_record.read_bytes())
    assert [(e["rank"], e["fresh"], e["pace"]["step"]) for e in noderecord.node_entries(first)] == [(0, True, 100), (1, True, 100)]
    # The ranks step on at their pace and republish at each heartbeat (their step moved): the node
    # record is not rewritten, only ticked when its heartbeat is due.
    for later in (t0 + 10, t0 + 20, t0 + 30):
        clock.now = later
        for rank in range(2):
            _local_record(link, rank, 100 + round(10.0 * (later - t0)), 10.0, at=later)
        link._tick_due = 0.0
        link._rollup()
    assert (link.num_node_writes, link.num_node_ticks) == (1, 3)
    # A change of state is written at once.
    _local_record(link, 1, 400, 10.0, at=t0 + 30, state="armed", request_id="req-1")
    link._rollup()
    assert link.num_node_writes == 2
    states = {e["rank"]: e["state"] for e in noderecord.node_entries(json.loads(link.node_record.read_bytes()))}
    assert states == {0: "idle", 1: "armed"}
    # Read back, each rank stands where its pace puts it at the file's last tick.
    records, problems = noderecord.expand(json.loads(link.node_record.read_bytes()), time.time())
    assert not problems and all(abs(r.step - 400) <= 3 for r in records), [r.step for r in records]


def test_a_rank_that_ran_away_from_its_anchor_gets_a_new_one(tmp_path):
    link = _link(tmp_path)
    _local_record(link, 0, 100, 10.0)
    assert link.lease.claim()
    link._rollup(force=True)
    _local_record(link, 0, 200, 10.0)  # 100 steps ahead of where the anchor says it is
    link._rollup()
    assert link.num_node_writes == 2
    (entry,) = noderecord.node_entries(json.loads(link.node_record.read_bytes()))
    assert entry["pace"]["step"] == 200


def test_a_rank_whose_record_went_quiet_is_marked_and_keeps_its_own_time(tmp_path):
    link = _link(tmp_path)
    record = _local_record(link, 0, 50, 5.0)
    quiet = time.time() - 10 * link.heartbeat
    os.utime(layout.node_record_local(link.node_dir, 0), (quiet, quiet))
    assert link.lease.claim()
    link._rollup(force=True)
    (entry,) = noderecord.node_entries(json.loads(link.node_record.read_bytes()))
    assert entry["fresh"] is False and entry["pace"] is None and entry["heartbeat_at"] == record.heartbeat_at
    (read,), problems = noderecord.expand(json.loads(link.node_record.read_bytes()), time.time())
    assert not problems and read.file_mtime == pytest.approx(record.heartbeat_at, abs=1.0)


def test_an_agent_that_lost_its_term_writes_nothing(tmp_path):
    link = _link(tmp_path)
    _local_record(link, 0, 1, 0.0)
    assert link.lease.claim()
    for name in os.listdir(link.lease.directory):
        os.unlink(link.lease.directory / name)
    link._rollup(force=True)
    assert not link.node_record.exists()


def _wait_relayed(link: NodeLink, data: bytes, relays: int = 1) -> None:
    """Until `data` is in the envelope and the agent has counted `relays` relays: its watcher thread
    writes the envelope, then notes what it relayed and counts (a test that read the count at the
    envelope alone saw 0 under load)."""
    wait_for(lambda: (e := noderelay.read(link.envelope_path, 10_000)) is not None and e["data"] == data
             and link.num_relays >= relays, 10, what=f"the relay of {data!r} into {link.envelope_path}")


def test_the_agent_relays_and_resumes_from_what_the_last_envelope_says(tmp_path):
    link = _link(tmp_path, poll_interval=0.05, watch="poll")
    control = layout.control_path(tmp_path / "reg", "job")
    control.parent.mkdir(parents=True)
    control.write_bytes(b'{"id": "before"}')  # there before any agent: no request
    link.start()
    try:
        assert link.is_agent
        envelope = noderelay.read(link.envelope_path, 10_000)
        assert envelope is not None and envelope["baseline"] and envelope["data"] == b'{"id": "before"}'
        atomic_write(control, b'{"id": "one"}')
        _wait_relayed(link, b'{"id": "one"}')
        assert link.num_relays == 1
    finally:
        link._worker.stop()
        link._step_down(release=True)
    # The next agent resumes from the envelope: request one is not relayed again; two, written
    # while no agent served, is.
    atomic_write(control, b'{"id": "two"}')
    successor = _link(tmp_path, poll_interval=0.05, watch="poll")
    successor.lease.me["pid"] = os.getpid()
    successor.start()
    try:
        _wait_relayed(successor, b'{"id": "two"}')
        assert successor.num_relays == 1
    finally:
        successor.stop()


def test_the_last_rank_of_a_node_to_exit_writes_the_node_record_itself(tmp_path):
    link = _link(tmp_path)
    record = _local_record(link, 0, 9, 0.0)
    atomic_write(layout.node_record_local(link.node_dir, 0),
                 dataclasses.replace(record, exited_at=time.time()).to_json())
    link.stop()  # no agent serves: this rank takes the term for one last write, then gives it up
    (entry,) = noderecord.node_entries(json.loads(link.node_record.read_bytes()))
    assert entry["exited_at"] is not None
    assert not link.node_dir.exists()  # the job's last rank on the node: its node dir goes too


def test_a_rank_that_exits_before_the_others_leaves_the_node_dir_to_them(tmp_path):
    link = _link(tmp_path)
    mine = _local_record(link, 0, 9, 0.0)
    atomic_write(layout.node_record_local(link.node_dir, 0), dataclasses.replace(mine, exited_at=time.time()).to_json())
    _local_record(link, 1, 9, 0.0)  # rank 1, alive (this process's pid), not exited
    assert link.lease.claim()
    link.stop()
    assert read_record(layout.node_record_local(link.node_dir, 0)).exited_at is not None
    assert os.listdir(link.lease.directory) == []  # the term given up, for rank 1 to take


def test_a_rank_whose_pid_another_process_took_does_not_keep_the_node_dir(tmp_path):
    """Rank 1 died and its pid was reused (here: this process, with another start since boot): it
    is no live rank, so the exiting rank is the job's last on the node and removes the node dir."""
    link = _link(tmp_path)
    mine = _local_record(link, 0, 9, 0.0)
    atomic_write(layout.node_record_local(link.node_dir, 0), dataclasses.replace(mine, exited_at=time.time()).to_json())
    gone = _local_record(link, 1, 9, 0.0)
    atomic_write(layout.node_record_local(link.node_dir, 1),
                 dataclasses.replace(gone, start_since_boot=gone.start_since_boot - 5.0).to_json())
    assert link.lease.claim()
    link.stop()
    assert not link.node_dir.exists()


def test_pid_alive_is_the_process_that_was_seen_not_its_pid():
    me, started = os.getpid(), start_since_boot(os.getpid())
    assert pid_alive(me) and pid_alive(me, started)
    assert not pid_alive(me, started - 5.0)  # the pid taken by another process since
    assert not pid_alive(2**22 + 17)  # above pid_max's ceiling: never a process
    assert not pid_alive(None) and not pid_alive(0) and not pid_alive(True) and not pid_alive("1")
    assert holder_alive({"pid": me, "start_since_boot": started}) and not holder_alive({"pid": me, "start_since_boot": 1.0})


def test_an_agent_that_finds_no_relay_file_resumes_from_the_node_record(tmp_path):
    """The node dir removed under the job, relay file and all: the next agent takes what was last
    relayed from the node record a live agent of this job wrote, not the control file as it is now."""
    link = _link(tmp_path, poll_interval=0.05, watch="poll")
    control = layout.control_path(tmp_path / "reg", "job")
    control.parent.mkdir(parents=True)
    _local_record(link, 0, 5, 0.0)
    link.start()
    try:
        atomic_write(control, b'{"id": "one"}')
        _wait_relayed(link, b'{"id": "one"}')
        link._rollup(force=True)  # the node record says what was relayed
        relayed = json.loads(link.node_record.read_bytes())["agent"]["relayed"]
        assert relayed["digest"] == noderelay.digest_of(b'{"id": "one"}')
    finally:
        link._worker.stop()
        link._step_down(release=True)
    shutil.rmtree(link.node_dir)
    atomic_write(control, b'{"id": "two"}')  # while no agent served, and no relay file is left
    successor = _link(tmp_path, poll_interval=0.05, watch="poll")
    _local_record(successor, 0, 5, 0.0)
    successor.start()
    try:
        _wait_relayed(successor, b'{"id": "two"}')
        assert successor.num_relays == 1
    finally:
        successor.stop()


def test_a_rank_that_stops_is_re_anchored_at_rate_0_when_the_tick_is_due_not_before(tmp_path, monkeypatch):
    """Behind its anchor (a rank that stopped, or slowed) is re-anchored at the node record's next
    tick only; ahead of it (a start step planned from it would come too early) at once."""
    link = _link(tmp_path)
    t0 = time.time() - 60
    clock = _Clock(t0)
    monkeypatch.setattr(nodeagent, "time", clock)
    link._offset, link._offset_due = 0.0, float("inf")
    _local_record(link, 0, 100, 10.0, at=t0)
    assert link.lease.claim()
    link._rollup(force=True)
    # It stopped at step 100: its record is only ticked from then on (a tick: nothing moved).
    path = layout.node_record_local(link.node_dir, 0)
    clock.now = t0 + 20
    os.utime(path, (clock.now, clock.now))
    link._tick_due = t0 + 25
    link._rollup()
    assert link.num_node_writes == 1  # behind, but the tick is not due: no rewrite
    clock.now = t0 + 25
    os.utime(path, (clock.now, clock.now))
    link._rollup()
    assert link.num_node_writes == 2
    (entry,) = noderecord.node_entries(json.loads(link.node_record.read_bytes()))
    assert (entry["pace"]["step"], entry["pace"]["rate"]) == (100, 0.0)
    # It steps again, far ahead of a still anchor: rewritten at once, tick due or not.
    clock.now = t0 + 26
    _local_record(link, 0, 110, 10.0, at=clock.now)
    link._tick_due = t0 + 100
    link._rollup()
    assert link.num_node_writes == 3
