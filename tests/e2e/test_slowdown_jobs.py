"""The slowdown watch (sidecar.rank.slowdown) in real 2-rank torchrun jobs (gloo) slowed while they
run. The detector itself is tests/unit/test_slowdown.py's."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

from sidecar.common.recordscan import read_records
from support.launch import PYTHON, base_env, torchrun_cmd
from support.schema import check_command
from support.traces import load_trace, profiler_steps
from support.wait import wait_for

FIRED_RE = re.compile(r"step time (\d+\.\d)x the median \((\d+) ms vs (\d+) ms\) at step (\d+); capturing (\d+)-(\d+)")


def _cli(registry: Path, *args: str, timeout: float = 150) -> subprocess.CompletedProcess:
    return subprocess.run([PYTHON, "-m", "sidecar", *args, "--registry", str(registry)],
                          capture_output=True, text=True, timeout=timeout, env=base_env())


def _job(spawn, tmp_path: Path, registry: Path, name: str, slow_file: Path, *args: str, **env: str):
    cmd = torchrun_cmd(2, name)
    # No disk floor unless the test sets one: a capture does not depend on how full the test machine's disk is.
    env = {"COSMOS_PROFILER_SLOWDOWN_MIN_FREE_PCT": "0", **env}
    proc = spawn(name, ["--step-sleep", "0.02", "--slow-file", str(slow_file), *args],
                 base_env(registry, COSMOS_PROFILER_OUTPUT_DIR=str(tmp_path / "out"), OMP_NUM_THREADS="1", **env),
                 program=cmd)
    wait_for(lambda: len(read_records(registry, name)) == 2, timeout=120, what="2 rank records")
    return proc


def _slow(path: Path, gen: int, seconds: float, how: str = "") -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(f"{gen} 0 {seconds} {how}")
    tmp.replace(path)  # a new inode: the job reads it at its next step


def _recs(registry: Path, name: str) -> dict:
    return {r.rank: r for r in read_records(registry, name)}


def _traces(tmp_path: Path, name: str, rank: int) -> list[Path]:
    return sorted((tmp_path / "out" / "profile_trace" / f"{name}_{rank}").glob("*_trace.json.gz"))


def test_a_job_that_slows_down_leaves_one_aligned_capture_and_a_baseline(spawn, tmp_path, registry):
    name, slow_file = "slowjob", tmp_path / "slow"
    proc = _job(spawn, tmp_path, registry, name, slow_file)
    cli = subprocess.Popen([PYTHON, "-m", "sidecar", "profile", "set", name, "-rf", "all", "--on-slowdown", "2.5",
                            "-as", "2", "--wait", "--timeout", "150", "--registry", str(registry)],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=base_env())
    try:
        def baselined():
            recs = _recs(registry, name)
            return len(recs) == 2 and all(
                r.request_id and r.request_id.endswith(".baseline") and r.num_captures == 1 and r.state == "idle"
                and (r.slowdown or {}).get("median_s") for r in recs.values()) and recs
        recs = wait_for(baselined, timeout=120, what="a baseline capture and a median on both ranks")
        watch_id = recs[0].slowdown["id"]
        assert recs[1].slowdown["id"] == watch_id and recs[0].slowdown["state"] == "watching"
        slowed_at = max(r.step for r in _recs(registry, name).values())
        # rank 0 multiplies matrices for 80 ms more: both ranks slow down (the all-reduce waits)
        _slow(slow_file, 1, 0.08, "busy")
        out, err = cli.communicate(timeout=170)
    finally:
        cli.kill()
    assert cli.returncode == 0, out + err
    assert "Armed a slowdown watch on replica slowjob" in out and "Baseline:" in out and "Slowdown: capture" in out
    recs = _recs(registry, name)
    messages = {r.slowdown["message"] for r in recs.values()}
    assert len(messages) == 1, messages  # the first rank's request won; the other added none
    match = FIRED_RE.fullmatch(messages.pop())
    assert match and float(match[1]) >= 2.5 and int(match[4]) > slowed_at, recs[0].slowdown
    first, last = int(match[5]), int(match[6])
    assert last == first + 1 and first > int(match[4])
    for rank, rec in recs.items():
        assert rec.slowdown["num_fired"] == 1 and rec.request_id == f"{watch_id}.slow-1"
        assert rec.request["reason"] == match[0] and not rec.misaligned
        assert profiler_steps(load_trace(rec.trace_path)) == [first, last], rank
        assert f"rank {rank}: {rec.trace_path}" in out
    assert f"slowdown watch {watch_id} fired: {match[0]}" in proc.stderr()

    # Still slow, well past the capture: the watch is spent; no second capture.
    # (the slow capture's save may still run when the steps are there: wait for it too, then count)
    recs = wait_for(lambda: (recs := _recs(registry, name)) and all(
        r.step > last + 20 and r.state == "idle" and r.num_captures >= 2 for r in recs.values()) and recs,
        timeout=60, what="more slow steps, both ranks idle after the slow capture")
    assert all(r.slowdown["state"] == "spent" and r.num_captures == 2 for r in recs.values()), recs
    assert [len(_traces(tmp_path, name, k)) for k in (0, 1)] == [2, 2]

    # profile diff on the replica: the watch's baseline against its slow capture; the op that grew first.
    diff = _cli(registry, "profile", "diff", name, "--json")
    assert diff.returncode == 0, diff.stderr
    changed = json.loads(diff.stdout)
    assert (changed["base"]["name"], changed["new"]["name"]) == (f"{name}:0", f"{name}:1"), changed["base"]
    assert changed["ops"][0]["name"] == "aten::mm" and changed["ops"][0]["delta_s"] > 0.02, changed["ops"][:3]
    assert changed["mean_step_s"]["new"] > 2 * changed["mean_step_s"]["base"], changed["mean_step_s"]

    # Armed again, without a baseline: status shows it; cancel disarms it; slow steps then capture nothing.
    _slow(slow_file, 2, 0.0)
    wait_for(lambda: "SLOW 2 rank 1" in proc.stdout(), timeout=30, what="the job at full speed")
    # Followed with --wait: the cancel below ends it (before, it waited out its timeout).
    armed = subprocess.Popen([PYTHON, "-m", "sidecar", "profile", "set", name, "-rf", "all", "--on-slowdown", "3",
                              "--no-baseline", "--consecutive", "4", "--wait", "--timeout", "900", "--registry",
                              str(registry)], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=base_env())
    # The record shows the median and the steps seen as of its last heartbeat (every 5 s, or on a change).
    wait_for(lambda: all((r.slowdown or {}).get("factor") == 3.0 and r.slowdown["steps_seen"] > 0
                         for r in _recs(registry, name).values()), timeout=30, what="the new watch on both ranks")
    status = _cli(registry, "profile", "status", name)
    assert status.returncode == 0, status.stderr
    assert "Slowdown watch:" in status.stdout and "3x, 4 in a row" in status.stdout, status.stdout
    assert "watching" in status.stdout and " ms" in status.stdout
    as_json = _cli(registry, "profile", "status", name, "--json")
    data = json.loads(as_json.stdout)
    check_command(data, "profile status")
    assert [(w["rank"], w["factor"], w["consecutive"], w["state"]) for w in data["slowdown"]] == [
        (0, 3.0, 4, "watching"), (1, 3.0, 4, "watching")]
    assert all(w["median_s"] > 0 and w["steps_seen"] > 0 for w in data["slowdown"]), [(w["median_s"], w["steps_seen"]) for w in data["slowdown"]]
    cancel = _cli(registry, "profile", "cancel", name)
    assert cancel.returncode == 0, cancel.stdout + cancel.stderr
    wait_for(lambda: all(r.slowdown["state"] == "cancelled" for r in _recs(registry, name).values()), timeout=30,
             what="the watch cancelled on both ranks")
    try:
        out, err = armed.communicate(timeout=120)
    finally:
        armed.kill()
    assert armed.returncode == 1 and "Armed a slowdown watch" in out, out + err
    watch_id = re.search(r"Request (\S+) for ranks 0-1", out)[1]  # type: ignore[index]
    assert re.search(rf"Error: the slowdown watch {watch_id} ended before it fired; rank 0: cancelled by request "
                     rf"\S+; rank 1: cancelled by request \S+$", err.strip()), err
    at = max(r.step for r in _recs(registry, name).values())
    _slow(slow_file, 3, 0.08)
    wait_for(lambda: min(r.step for r in _recs(registry, name).values()) > at + 25, timeout=60, what="slow steps")
    assert all(r.num_captures == 2 and r.slowdown["num_fired"] == 0 for r in _recs(registry, name).values())
    assert proc.stop(timeout=120) == 0


def test_the_always_on_watch_captures_at_most_once_per_interval(spawn, tmp_path, registry):
    name = "alwayson"
    # Slow phases of 1.5 s (100 ms steps) between fast ones of 2 s (20 ms): a slowdown every 3.5 s.
    proc = _job(spawn, tmp_path, registry, name, tmp_path / "none", "--speed-schedule", "0.1:1.5,0.02:2",
                COSMOS_PROFILER_SLOWDOWN_FACTOR="2.5", COSMOS_PROFILER_SLOWDOWN_MIN_INTERVAL_S="3600")
    def captured():
        recs = _recs(registry, name)
        return len(recs) == 2 and all(r.num_captures == 1 for r in recs.values()) and recs

    recs = wait_for(captured, timeout=120, what="the always-on watch's first capture")
    assert {r.slowdown["always_on"] for r in recs.values()} == {True}
    assert len({r.request_id for r in recs.values()}) == 1 and all(r.request["reason"] for r in recs.values())
    # The next slow phases are seen but not captured: the budget allows one capture an hour. (The rank that
    # asked for the capture was left "waiting" for a minute when its own watcher took the request before
    # the write returned: no slow phase was seen meanwhile.)
    wait_for(lambda: all("not captured, the last capture was" in (r.slowdown.get("note") or "")
                         for r in _recs(registry, name).values()), timeout=30, what="a slowdown the budget refused")
    assert all(r.num_captures == 1 and r.slowdown["num_fired"] == 1 for r in _recs(registry, name).values())
    assert proc.stop(timeout=120) == 0


def test_a_slowdown_the_disk_floor_refuses_is_said_by_the_waiting_cli(spawn, tmp_path, registry):
    """The trace directory's filesystem has less free than slowdown_min_free_pct: the watch captures
    nothing, and `profile set --wait` says so for each rank as it happens (before, it only timed out
    with "has not fired", on a machine whose disk was 95% full)."""
    name, slow_file = "fulldisk", tmp_path / "slow"
    proc = _job(spawn, tmp_path, registry, name, slow_file, COSMOS_PROFILER_SLOWDOWN_MIN_FREE_PCT="100")
    out_path = tmp_path / "cli.out"
    with open(out_path, "w") as out:
        cli = subprocess.Popen([PYTHON, "-m", "sidecar", "profile", "set", name, "-rf", "all", "--on-slowdown", "2.5",
                                "--no-baseline", "--wait", "--timeout", "600", "--registry", str(registry)],
                               stdout=out, stderr=subprocess.PIPE, text=True, env=base_env())
    try:
        wait_for(lambda: (recs := _recs(registry, name)) and all((r.slowdown or {}).get("median_s")
                                                                 for r in recs.values()),
                 timeout=120, what="a median on both ranks")
        _slow(slow_file, 1, 0.3)  # rank 0 sleeps 300 ms more; rank 1 waits for it in the all-reduce

        def noted():
            lines = [line for line in out_path.read_text().splitlines() if "slowdown_min_free_pct = 100" in line]
            return len(lines) == 2 and lines
        lines = wait_for(noted, timeout=120, what="each rank's note in the waiting CLI's output")
    finally:
        cli.kill()
        cli.communicate()
    note_re = re.compile(r"rank (\d): step time (\d+\.\d)x the median at step (\d+): not captured, (\d+\.\d)% free "
                         r"under (\S+) \(slowdown_min_free_pct = 100\)")
    matches = sorted((m := note_re.fullmatch(line)) and m.groups() for line in lines)
    assert [m[0] for m in matches] == ["0", "1"], lines
    for rank, factor, _step, free, trace_dir in matches:
        assert float(factor) >= 2.5 and float(free) < 100 and trace_dir == str(tmp_path / "out" / "profile_trace"
                                                                               / f"{name}_{rank}"), lines
    recs = _recs(registry, name)
    # (still slow, each rank fires every few steps: a record may be written between a fire and its refusal)
    assert all(r.slowdown["num_fired"] == 0 and r.slowdown["state"] in ("watching", "firing") and r.num_captures == 0
               and "slowdown_min_free_pct = 100" in r.slowdown["note"] for r in recs.values()), recs
    assert not _traces(tmp_path, name, 0) and not _traces(tmp_path, name, 1)
    status = _cli(registry, "profile", "status", name)  # its LAST column: the note
    assert status.returncode == 0 and status.stdout.count("(slowdown_min_free_pct = 100)") == 2, status.stdout
    assert proc.stop(timeout=120) == 0
