"""profile cancel and `{"kind": "cancel"}`: real training subprocesses, the CLI as a subprocess."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

from sidecar.common.layout import control_path
from sidecar.common.registry import write_request
from support.launch import PYTHON, ROOT, base_env
from support.records import record, wait_record
from support.traces import load_trace, profiler_steps


def cli(registry: Path, *args: str) -> subprocess.CompletedProcess:
    done = subprocess.run([PYTHON, "-m", "cosmos_rl.cli.cli", *args, "--registry", str(registry)],
                          capture_output=True, text=True, timeout=120, env=base_env(), cwd=ROOT)
    assert "Traceback" not in done.stderr, done.stderr
    return done


def start_ranks(spawn, tmp_path: Path, registry: Path, num: int = 1) -> list:
    procs = []
    for rank in range(num):
        env = base_env(registry, RANK=str(rank), WORLD_SIZE=str(num))
        procs.append(spawn(f"rank{rank}", ["--replica", "r1", "--output", str(tmp_path / "out")], env))
    for rank, proc in enumerate(procs):
        proc.wait_ready()
        wait_record(registry, lambda r: r.get("state") == "idle" and r.get("step", 0) > 0, "r1", rank)
    return procs


def test_cancel_disarms_an_armed_replica_that_the_busy_answer_names(spawn, tmp_path, registry):
    procs = start_ranks(spawn, tmp_path, registry, 2)
    far = record(registry)["step"] + 50_000
    armed = cli(registry, "profile", "set", "r1", "-rf", "all", "--start-step", str(far), "--json")
    assert armed.returncode == 0, armed.stderr
    request_id = json.loads(armed.stdout)["request_id"]
    for rank in (0, 1):
        wait_record(registry, lambda r: r["state"] == "armed", "r1", rank)

    busy = cli(registry, "profile", "set", "r1")
    assert (busy.returncode, busy.stdout) == (1, "")
    assert busy.stderr == (f"Replica r1 is busy with request {request_id} (ranks 0-1, start step {far}, phase armed). "
                           f"`cosmos-profiler profile cancel r1 --registry {registry}` ends it.\n")

    done = cli(registry, "profile", "cancel", "r1")
    assert done.returncode == 0, done.stdout + done.stderr
    lines = done.stdout.splitlines()
    cancel_id = re.match(r"Cancel (\S+) sent to replica r1, ranks 0-1 \(busy: rank 0 with request (\S+), "
                         r"rank 1 with request (\S+)\)\.$", lines[0]).group(1)
    for rank in (0, 1):
        rec = record(registry, "r1", rank)
        assert rec["state"] == "idle" and rec["cancelled"] is True and rec["request_id"] == request_id
        assert rec["cancel"]["id"] == cancel_id and rec["cancel"]["outcome"] == "disarmed"
        assert f"rank {rank}: disarmed request {request_id} at step {rec['cancel']['step']}" in lines
        assert rec["trace_path"] is None and rec["history"][-1]["cancelled"] == cancel_id

    status = json.loads(cli(registry, "profile", "status", "r1", "--json").stdout)
    assert [(c["rank"], c["phase"]) for c in status["ranks"]] == [(0, "cancelled"), (1, "cancelled")]
    again = cli(registry, "profile", "set", "r1", "-rf", "all", "--wait")
    assert again.returncode == 0, again.stdout + again.stderr
    for proc in procs:
        assert proc.stop() == 0


def test_cancel_stops_a_tracing_rank_and_saves_the_steps_it_recorded(spawn, tmp_path, registry):
    (proc,) = start_ranks(spawn, tmp_path, registry)
    # A long capture, followed by a `profile set --wait` that the cancel will end.
    follower = subprocess.Popen(
        [PYTHON, "-m", "cosmos_rl.cli.cli", "profile", "set", "r1", "-as", "900", "--wait-steps", "0",
         "--warmup-steps", "0", "--wait", "--timeout", "120", "--registry", str(registry)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=base_env(), cwd=ROOT)
    try:
        rec = wait_record(registry, lambda r: r["state"] == "tracing" and r["step"] >= r["capture_start_step"] + 5)
        start, request_id = rec["capture_start_step"], rec["request_id"]
        done = cli(registry, "profile", "cancel", "r1", "-rf", "0", "--json")
        assert done.returncode == 0, done.stdout + done.stderr
        answer = json.loads(done.stdout)
        (rank0,) = answer["ranks"]
        assert rank0["rank"] == 0
        assert (rank0["phase"], rank0["outcome"], rank0["cancelled_request"]) == ("done", "stopped", request_id)
        stopped_at = rank0["step"]
        steps = profiler_steps(load_trace(rank0["trace_path"]))
        assert steps[0] == start and steps == list(range(start, steps[-1] + 1)), steps
        assert stopped_at <= steps[-1] <= stopped_at + 2, "it stopped at the boundary after the cancel"
        rec = record(registry)
        assert rec["cancelled"] is True and rec["trace_path"] == rank0["trace_path"] and rec["state"] == "idle"
        assert [h["state"] for h in rec["history"]] == ["armed", "tracing", "saving", "idle"]
        assert rec["history"][-1]["saved"] == rank0["trace_path"]
        assert rec["history"][-2]["cancelled"] == rec["history"][-1]["cancelled"] == answer["request_id"]
        out, err = follower.communicate(timeout=60)
    finally:
        follower.kill()
    assert follower.returncode == 1
    assert f"rank 0: cancelled: cancelled by request {answer['request_id']} (stopped request {request_id} after step " \
           f"{stopped_at}; saved the steps recorded so far to {rank0['trace_path']})" in err
    assert proc.stop() == 0
    assert "[Profiler] save trace for rank: 0 to file: " + rank0["trace_path"] in proc.stderr()


def test_a_cancel_in_the_control_file_and_a_rank_with_nothing_to_cancel(spawn, tmp_path, registry):
    (proc,) = start_ranks(spawn, tmp_path, registry)
    # In the wait phase nothing has been recorded: stopped, and nothing is saved.
    write_request(registry, "r1", {"id": "waiting", "wait_steps": 5000, "active_steps": 1})
    wait_record(registry, lambda r: r["state"] == "tracing")
    control_path(registry, "r1").write_text('{"kind": "cancel"}')  # as `echo '{"kind":"cancel"}' > ...` does
    rec = wait_record(registry, lambda r: (r.get("cancel") or {}).get("outcome") == "stopped" and r["state"] == "idle")
    assert rec["cancel"]["id"].startswith("file-") and rec["cancel"]["request_id"] == "waiting"
    assert rec["cancel"]["detail"] == "no step had been recorded yet; nothing saved"
    assert rec["cancelled"] is True and rec["trace_path"] is None and rec["error"] is None
    assert not (tmp_path / "out" / "profile_trace" / "r1_0").exists() or not list(
        (tmp_path / "out" / "profile_trace" / "r1_0").glob("*_trace.json.gz"))

    done = cli(registry, "profile", "cancel", "r1")
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[1:] == ["rank 0: nothing to cancel (idle)"]
    assert done.stdout.splitlines()[0].endswith("rank 0 (busy: none).")
    rec = record(registry)
    assert rec["request_id"] == "waiting" and rec["cancel"]["outcome"] == "nothing to cancel"
    assert proc.stop() == 0
