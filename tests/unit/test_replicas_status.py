"""A rank's status (sidecar.fleet.replicas): the liveness of a rank of another host is judged once for
the ranks that share what decides it (their file's time and heartbeat interval, as the ranks of one
node record do), and gives what judging each alone gives, whatever the ranks are: fresh, stale,
exited, of this host (by their pid, each alone), without a file time."""

from __future__ import annotations

import dataclasses
import gc
import os

import psutil
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sidecar.cli import render
from sidecar.common.identity import host_name
from sidecar.common.records import RankRecord
from sidecar.common.recordscan import RecordProblem, RecordScan
from sidecar.common.roster import ControllerAtom, ControllerReplica
from sidecar.fleet import replicas
from support.cli import invoke
from support.records import remote_record

NOW = 1_800_000_000.0
SETTINGS = settings(derandomize=True, database=None, deadline=None, max_examples=200,
                    suppress_health_check=[HealthCheck.too_slow])
THIS_HOST = host_name()
GONE_PID = 4_000_000  # above pid_max: no process has it


@st.composite
def records(draw: st.DrawFn) -> RankRecord:
    here = draw(st.sampled_from(["remote", "remote", "this host, running", "this host, gone"]))
    record = RankRecord(
        replica="r1", role="policy", rank=draw(st.integers(0, 63)),
        host=draw(st.sampled_from(["node-a", "node-b"])) if here == "remote" else THIS_HOST,
        pid=os.getpid() if here == "this host, running" else draw(st.sampled_from([0, GONE_PID, 4242])),
        create_time=psutil.Process().create_time() if here == "this host, running" else 0.0,
        heartbeat_at=NOW - draw(st.sampled_from([0.0, 1.0, 9.0, 300.0])),
        heartbeat_interval=draw(st.sampled_from([0.0, 2.0, 2.0, 60.0])),
        exited_at=draw(st.sampled_from([None, None, None, NOW - 5.0])),
        stall_after_s=draw(st.sampled_from([0.0, 0.0, 5.0])), state=draw(st.sampled_from(["idle", "tracing", "stalled"])),
        conflict=draw(st.sampled_from([None, {"pid": 9, "host": "node-c", "job": "j2", "seen_at": NOW}])),
    )
    # The file times the ranks of a few node records share (ticked now, a minute ago, from the future), or none.
    record.file_mtime = draw(st.sampled_from([None, NOW, NOW - 0.5, NOW - 60.0, NOW - 3600.0, NOW + 120.0]))
    return record


@SETTINGS
@given(st.lists(records(), max_size=30))
def test_liveness_judged_once_per_file_time_and_interval_is_each_ranks_own(ranks):
    judged: replicas.Judged = {}
    together = [replicas._status("r1", r.rank, r, None, THIS_HOST, NOW, judged) for r in ranks]
    alone = [replicas._status("r1", r.rank, r, None, THIS_HOST, NOW) for r in ranks]
    assert together == alone
    assert [(s.alive, s.liveness) for s in alone] == [replicas.liveness(r, THIS_HOST, NOW) for r in ranks]


def test_a_status_is_made_with_its_fields_in_their_order():
    """`_status` gives RankStatus its fields by position (STATUS_FIELDS): they are its fields, in order."""
    assert replicas.STATUS_FIELDS == tuple(f.name for f in dataclasses.fields(replicas.RankStatus))
    record = RankRecord(replica="r1", role="rollout", rank=5, host="node-z", pid=77, world_size=8, step=12,
                        request_id="q", selected=True, misaligned=True, trace_path="/t/0_trace.json.gz",
                        num_captures=2, error="e", refused="busy", heartbeat_at=NOW - 3.0, state="tracing",
                        conflict={"pid": 1, "host": "h", "job": "j", "seen_at": NOW}, upload_to="s3://b/p/",
                        trace_url="s3://b/p/0", upload_error="denied", signal="SIGUSR1")
    record.file_mtime = NOW - 1.0
    status = replicas._status("r1", 5, record, None, THIS_HOST, NOW)
    assert status == replicas.RankStatus(
        replica="r1", rank=5, role="rollout", host="node-z", pid=77, alive=True, liveness="alive", step=12,
        state="tracing", world_size=8, request_id="q", selected=True, misaligned=True, trace_path="/t/0_trace.json.gz",
        num_captures=2, error="e", refused="busy", heartbeat_age=1.0, host_ip=None,
        conflict={"pid": 1, "host": "h", "job": "j", "seen_at": NOW}, upload_to="s3://b/p/", trace_url="s3://b/p/0",
        upload_error="denied", signal="SIGUSR1")


@st.composite
def scans(draw: st.DrawFn) -> tuple[RecordScan, list[ControllerReplica] | None]:
    """A replica's records (some ranks missing, bad or past the world size), and maybe the
    controller's view of it (atoms with hosts and traces of their own)."""
    ranks = draw(st.lists(records(), max_size=20, unique_by=lambda r: r.rank))
    world = draw(st.sampled_from([0, 4, 16, 64]))
    for record in ranks:
        record.world_size = world
        record.role = draw(st.sampled_from(["policy", "", "rollout"]))
        record.state = draw(st.sampled_from(["idle", "armed", "tracing", "saving", "error", "stalled", "unknown"]))
        record.step = draw(st.integers(0, 900))
        if draw(st.integers(0, 5)) == 0:
            record.heartbeat_at = 0.0  # a record that never beat: no age
    problems = [RecordProblem(f"rank-{k}.json", k, draw(st.sampled_from(["bad: x", ""])))
                for k in draw(st.sets(st.integers(0, 70), max_size=4)) if k not in {r.rank for r in ranks}]
    problems += [RecordProblem("nodes/0/n.json", None, "node record n.json is not JSON")] * draw(st.integers(0, 2))
    scan = RecordScan(records=sorted(ranks, key=lambda r: r.rank), problems=problems)
    controller = None
    if draw(st.booleans()):
        atoms = tuple(ControllerAtom(k, host_ip=f"10.0.0.{k}", host_name=draw(st.sampled_from(["", "gpu-1", "node-a"])),
                                     trace_path=draw(st.sampled_from([None, f"/c/{k}.json.gz"])))
                      for k in draw(st.sets(st.integers(0, 70), max_size=6)))
        controller = [ControllerReplica("r1", draw(st.sampled_from(["policy", ""])), draw(st.booleans()), atoms)]
    return scan, controller


@SETTINGS
@given(scans())
def test_a_replicas_row_without_a_status_per_rank_is_the_row_of_its_statuses(tmp_path_factory, case):
    """`replica ls` makes the row of each replica from its records (`replica_row`); `replica ls
    --json` from the statuses of its ranks (`replica_status`): one row, whatever the ranks."""
    scan, controller = case
    root = tmp_path_factory.getbasetemp() / "registry"
    (root / "replicas" / "r1").mkdir(parents=True, exist_ok=True)
    role, arrived = (controller[0].role, controller[0].arrived) if controller else ("", None)
    statuses, unranked = replicas._replica_ranks(root, "r1", controller, NOW, scan)
    want = replicas.replica_status("r1", statuses, role=role, arrived=arrived, unranked=unranked)
    got = replicas.replica_row(replicas._rank_set(root, "r1", controller, NOW, scan), role=role, arrived=arrived)
    assert got == want


@pytest.mark.parametrize(("args", "renders"), [(["replica", "ls", "--json"], "ls_json"),
                                              (["replica", "lsr", "r1"], "ranks_table"),
                                              (["replica", "lsr", "r1", "--json"], "lsr_json")])
def test_ls_and_lsr_render_the_ranks_with_the_collector_paused_and_leave_it_on(tmp_path, monkeypatch, args, renders):
    """The ranks' statuses are rendered before the collector is back on: on again with 10,000 of them
    alive, its first collection would walk them all, as young objects, for no garbage."""
    for k in range(3):
        remote_record(tmp_path, "r1", k, heartbeat_age=1.0, world_size=3)
    seen = []
    real = getattr(render, renders)

    def spy(*a, **k):
        seen.append(gc.isenabled())
        return real(*a, **k)

    monkeypatch.setattr(render, renders, spy)
    assert gc.isenabled()
    result = invoke(*args, "--registry", str(tmp_path))
    assert result.exit_code == 0, result.output
    assert "node-elsewhere" in result.output and seen == [False] and gc.isenabled()
