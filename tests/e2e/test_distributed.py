"""Many ranks: real torchrun jobs, aligned captures, late ranks, two "nodes" on one shared registry."""

from __future__ import annotations

import json
import random
import subprocess
import threading
from pathlib import Path

import pytest

from sidecar.common.layout import record_path
from sidecar.common.recordscan import read_records
from sidecar.common.registry import write_request
from support.files import read_json
from support.launch import DDP, PYTHON, base_env, free_port, torchrun_cmd
from support.traces import load_trace, profiler_steps
from support.wait import wait_for


def _torchrun(spawn, name: str, nproc: int, registry, tmp_path, *args: str, env_extra=None):
    cmd = torchrun_cmd(nproc, name)
    env = base_env(registry, COSMOS_PROFILER_OUTPUT_DIR=str(tmp_path / "out"), OMP_NUM_THREADS="1", **(env_extra or {}))
    proc = spawn(name, list(args), env, program=cmd)
    records = wait_for(
        lambda: len(r := read_records(registry, name)) == nproc and r, timeout=120, what=f"{nproc} rank records"
    )
    return proc, records


def _traces(registry, name, ranks, timeout=240, proc=None):
    def done():
        recs = {r.rank: r for r in read_records(registry, name)}
        if all(recs.get(k) and recs[k].trace_path for k in ranks):
            return recs
        return None

    def seen() -> str:
        lines = [f"rank {r.rank}: state={r.state} step={r.step} request={r.request_id} start={r.capture_start_step} "
                 f"phase={getattr(r, 'phase', None)} trace={r.trace_path} error={r.error}"
                 for r in read_records(registry, name)]
        if proc is not None:
            lines += ["job stderr (last 40 lines):", *proc.stderr().splitlines()[-40:]]
        return "\n".join(lines)

    return wait_for(done, timeout, what=f"traces of ranks {ranks}", describe=seen)


def _cli(registry, *args: str, timeout: float = 150) -> subprocess.CompletedProcess:
    return subprocess.run(
        [PYTHON, "-m", "sidecar", *args, "--registry", str(registry)],
        capture_output=True, text=True, timeout=timeout, env=base_env(),
    )


@pytest.mark.parametrize("nproc, rank_filter", [(2, "0,1"), (4, "all")])
def test_torchrun_ranks_capture_the_same_steps(spawn, tmp_path, registry, nproc, rank_filter):
    proc, records = _torchrun(spawn, f"ddp{nproc}", nproc, registry, tmp_path)
    assert sorted(r.rank for r in records) == list(range(nproc))
    assert {r.world_size for r in records} == {nproc}
    assert sorted(r.local_rank for r in records) == list(range(nproc))
    assert len({r.pid for r in records}) == nproc
    done = _cli(registry, "profile", "set", f"ddp{nproc}", "-rf", rank_filter, "-as", "2", "--wait", "--timeout", "120")
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"Requested a profile of replica ddp{nproc} through its control file." in done.stdout
    recs = {r.rank: r for r in read_records(registry, f"ddp{nproc}")}
    start = recs[0].capture_start_step
    for k in range(nproc):
        assert f"rank {k}: {recs[k].trace_path}" in done.stdout
    steps = {k: profiler_steps(load_trace(recs[k].trace_path)) for k in range(nproc)}
    assert all(s == [start + 2, start + 3] for s in steps.values()), steps
    assert not any(r.misaligned for r in recs.values())
    for k in range(nproc):
        trace = load_trace(recs[k].trace_path)
        assert trace["distributedInfo"]["rank"] == k and trace["distributedInfo"]["world_size"] == nproc
        assert recs[k].trace_path.endswith(f"ddp{nproc}_{k}/0_trace.json.gz")
    assert proc.stop(timeout=120) == 0


def test_a_rank_that_sees_the_request_late_starts_at_once_and_says_so(spawn, tmp_path, registry):
    proc, _ = _torchrun(spawn, "late", 2, registry, tmp_path, "--slow-poll-rank", "1")
    wait_for(lambda: read_json(record_path(registry, "late", 1)).get("watch") == "poll", what="rank 1 polling")
    start = max(r.step for r in read_records(registry, "late")) + 2
    write_request(registry, "late", {"id": "late", "rank_filter": "all", "start_step": start})
    recs = _traces(registry, "late", [0, 1], proc=proc)
    assert recs[0].misaligned is False and recs[0].capture_start_step == start
    assert recs[1].misaligned is True and recs[1].capture_start_step > start
    assert profiler_steps(load_trace(recs[1].trace_path)) == [recs[1].capture_start_step + 2]
    status = _cli(registry, "profile", "status", "late")
    assert status.returncode == 0, status.stderr
    rows = {line.split()[0]: line for line in status.stdout.splitlines() if line[:2] in ("0 ", "1 ")}
    assert "saved (misaligned)" in rows["1"] and "misaligned" not in rows["0"], status.stdout
    assert proc.stop(timeout=120) == 0
    assert "saw request late late" in proc.stderr()


def test_torchrun_runs_an_unmodified_script_through_sidecar_run(spawn, tmp_path, registry):
    cmd = torchrun_cmd(2, "zero", "-m", "sidecar.run", str(DDP), "--no-sidecar")
    env = base_env(registry, COSMOS_PROFILER_OUTPUT_DIR=str(tmp_path / "out"), OMP_NUM_THREADS="1")
    proc = spawn("zero", [], env, program=cmd)
    wait_for(lambda: len(read_records(registry, "zero")) == 2 and all(r.step > 5 for r in read_records(registry, "zero")),
             timeout=120, what="both ranks counting steps through the optimizer hook")
    done = _cli(registry, "profile", "set", "zero", "-rf", "all", "--wait", "--timeout", "120")
    assert done.returncode == 0, done.stdout + done.stderr
    recs = {r.rank: r for r in read_records(registry, "zero")}
    steps = {k: profiler_steps(load_trace(recs[k].trace_path)) for k in (0, 1)}
    assert steps[0] == steps[1] == [recs[0].capture_start_step + 2]
    assert proc.stop(timeout=120) == 0


def test_two_nodes_share_one_registry_by_polling(spawn, tmp_path, registry):
    procs = []
    for rank, host in enumerate(("node-a", "node-b")):
        env = base_env(
            registry, COSMOS_PROFILER_HOST=host, COSMOS_PROFILER_WATCH="poll", COSMOS_PROFILER_POLL_INTERVAL="0.2",
            RANK=str(rank), WORLD_SIZE="2", COSMOS_PROFILER_REPLICA="shared",
        )
        proc = spawn(host, ["--output", str(tmp_path / host)], env)
        procs.append(proc)
    for proc in procs:
        proc.wait_ready()
    wait_for(lambda: len(read_records(registry, "shared")) == 2, what="both nodes registered")
    records = read_records(registry, "shared")
    assert [(r.host, r.watch) for r in records] == [("node-a", "poll"), ("node-b", "poll")]
    write_request(registry, "shared", {"id": "both", "rank_filter": "all"})
    recs = _traces(registry, "shared", [0, 1], timeout=60)
    assert recs[0].trace_path.startswith(str(tmp_path / "node-a"))
    assert recs[1].trace_path.startswith(str(tmp_path / "node-b"))
    for proc in procs:
        assert proc.stop() == 0
        assert "by polling every 0.2s (forced by configuration)" in proc.stderr()


# Proves: two "nodes" (two torchrun agents, --nnodes 2) that reach the registry and
# the outputs through two separate mounts of a real network filesystem (sshfs, with
# its default caching) detect it and poll, are profiled together by
# `profile set -rf all --wait` through one mount, capture the same steps, again on a
# second request (a replaced control file, which a cached lstat would miss), and
# each node's trace is readable through the other node's mount.
def test_two_nodes_on_a_network_filesystem_capture_the_same_steps(spawn, tmp_path, netfs):
    mounts = {"node-a": netfs.mount("node-a"), "node-b": netfs.mount("node-b")}
    endpoint = f"127.0.0.1:{free_port()}"
    agents = {}
    for host, mount in mounts.items():
        env = base_env(mount / "registry", COSMOS_PROFILER_HOST=host, COSMOS_PROFILER_OUTPUT_DIR=str(mount / "out"),
                       OMP_NUM_THREADS="1")
        cmd = torchrun_cmd(1, "netfs", nnodes=2, endpoint=endpoint)
        agents[host] = spawn(host, [], env, program=cmd)
    seen_from_b = mounts["node-b"] / "registry"
    records = wait_for(lambda: len(r := read_records(seen_from_b, "netfs")) == 2 and r, 120,
                       what="both nodes' records through node-b's mount")
    assert sorted((r.host, r.watch) for r in records) == [("node-a", "poll"), ("node-b", "poll")]
    assert {r.world_size for r in records} == {2}

    for capture in (0, 1):
        done = _cli(mounts["node-a"] / "registry", "profile", "set", "netfs", "-rf", "all", "-as", "2", "--wait",
                    "--timeout", "120")
        assert done.returncode == 0, done.stdout + done.stderr
        recs = {r.rank: r for r in read_records(seen_from_b, "netfs")}
        start = recs[0].capture_start_step
        assert [(r.capture_start_step, r.misaligned) for r in recs.values()] == [(start, False)] * 2, (capture, recs)
        steps = {}
        for rank, rec in recs.items():
            own = mounts[rec.host]
            other = mounts["node-b" if rec.host == "node-a" else "node-a"]
            assert rec.trace_path == str(own / "out" / "profile_trace" / f"netfs_{rank}" / f"{capture}_trace.json.gz")
            assert f"rank {rank}: {rec.trace_path}" in done.stdout
            trace = load_trace(other / Path(rec.trace_path).relative_to(own))
            assert trace["cosmos_profiler"]["host"] == rec.host and trace["distributedInfo"]["rank"] == rank
            steps[rank] = profiler_steps(trace)
        assert steps[0] == steps[1] == [start + 2, start + 3], (capture, steps)

    for agent in agents.values():  # rank 0 (on either node) stops both, at one step
        agent.stop_file.touch()
    for agent in agents.values():
        assert agent.stop(timeout=120) == 0, agent.stderr()[-3000:]
        assert "by polling every 1s (registry is on a fuse.sshfs filesystem)" in agent.stderr()


NUM_SPEED_CAPTURES = 8


def test_aligned_starts_while_the_step_time_changes(spawn, tmp_path, registry):
    """8 ranks whose steps take about 5x longer for 2.5 s, then 5x shorter for 1.5 s, and
    again; `profile set -rf all --wait` at random moments. Every capture starts on every
    rank at the step the CLI chose, and every rank holds the same ProfilerStep numbers.
    (bin/bench runs the 20-capture version: benchmarks/alignment.py.)"""
    proc, _ = _torchrun(spawn, "speed", 8, registry, tmp_path, "--speed-schedule", "0.1:2.5,0.005:1.5")
    rng = random.Random(12)
    for n in range(NUM_SPEED_CAPTURES):
        threading.Event().wait(rng.uniform(0.0, 1.5))  # the input: a request at any moment of the speed cycle
        done = _cli(registry, "profile", "set", "speed", "-rf", "all", "--wait", "--timeout", "120", "--json")
        assert done.returncode == 0, done.stdout + done.stderr
        answer = json.loads(done.stdout)
        start = answer["start_step"]
        starts = {c["rank"]: (c["capture_start_step"], c["misaligned"]) for c in answer["ranks"]}
        assert starts == {k: (start, False) for k in range(8)}, f"capture {n}: start step {start}, ranks {starts}"
        steps = {c["rank"]: profiler_steps(load_trace(c["trace_path"])) for c in answer["ranks"]}
        assert steps == {k: [start + 2] for k in range(8)}, f"capture {n}: {steps}"
        assert all(c["trace_path"].endswith(f"speed_{c['rank']}/{n}_trace.json.gz") for c in answer["ranks"])
    assert proc.stop(timeout=120) == 0
