"""End to end: captures on kineto's on-demand path (sidecar.rank.ondemand), answered in the training process.

Each test starts tests/programs/train.py as the startup hook makes it (COSMOS_PROFILER_SIDECAR=1: kineto's
environment set before torch is imported), asks for a window at a start step well ahead, and reads the
record and the trace. The failure cases (pre-emption, steps stopping mid-window, exit during the window)
are driven by step numbers, never by time.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

from sidecar.common.registry import write_request
from sidecar.rank.ondemand import steps_verdict
from support.launch import PYTHON, base_env
from support.records import record, wait_record
from support.traces import load_trace, profiler_steps
from support.wait import wait_for

AHEAD = 400  # steps between the request and its start step: several of kineto's 1 s polls at ~100 steps/s


def _start(spawn, tmp_path: Path, registry: Path, *extra: str, env_extra: dict | None = None, name: str = "r1"):
    env = base_env(registry, COSMOS_PROFILER_SIDECAR="1", **(env_extra or {}))
    proc = spawn(name, ["--replica", "r1", "--output", str(tmp_path / "out"), *extra], env)
    proc.wait_ready()
    wait_record(registry, lambda r: r.get("state") == "idle", "r1", 0, what="first record")
    return proc


def _log_lines(text: str) -> list[str]:
    return [line.split(" INFO ", 1)[-1] for line in text.splitlines() if "[Profiler]" in line]


def _paths(rec: dict) -> list[str]:
    return [h["path"] for h in rec["history"] if "path" in h]


def test_a_window_at_its_start_step_is_captured_by_kineto_with_our_name_marks_and_metadata(spawn, tmp_path, registry):
    proc = _start(spawn, tmp_path, registry, "--step-sleep", "0.005")
    start = record(registry, "r1")["step"] + AHEAD
    write_request(registry, "r1", {"id": "od-1", "start_step": start, "wait_steps": 1, "warmup_steps": 1,
                                   "active_steps": 3, "record_shape": True})
    rec = wait_record(registry, lambda r: r.get("trace_path") and r["state"] == "idle", "r1", 0, timeout=120,
                      what="the on-demand trace")
    assert _paths(rec) == ["ondemand"]
    assert [h["state"] for h in rec["history"]] == ["armed", "tracing", "saving", "idle"]
    assert rec["capture_start_step"] == start and rec["misaligned"] is False and rec["error"] is None
    path = Path(rec["trace_path"])
    assert path == tmp_path / "out" / "profile_trace" / "r1_0" / "0_trace.json.gz"
    trace = load_trace(path)
    assert profiler_steps(trace) == [start + 2, start + 3, start + 4]
    assert trace["trace_id"] == "od-1"
    assert trace["distributedInfo"] == {"rank": 0, "world_size": 1}
    assert trace["cosmos_profiler"]["request_id"] == "od-1" and trace["cosmos_profiler"]["replica"] == "r1"
    ops = [e for e in trace["traceEvents"] if e.get("name", "").startswith("aten::")]
    assert ops and any(e.get("args", {}).get("Input Dims") for e in ops), "no shapes recorded"
    assert proc.stop() == 0
    lines = _log_lines(proc.stderr())
    assert "[Profiler] rank 0: captures on kineto's on-demand path (COSMOS_PROFILER_ONDEMAND=off turns it off)" in lines
    assert "[Profiler] init profiler for rank 0" in lines and "[Profiler] start to trace for rank: 0" in lines
    assert f"[Profiler] save trace for rank: 0 to file: {path} after 5 steps." in lines
    assert not list(path.parent.glob(".*")), "temp files left behind"


@pytest.mark.parametrize(("extra", "why"), [
    ({"COSMOS_PROFILER_ONDEMAND": "off"}, "COSMOS_PROFILER_ONDEMAND=off turns the on-demand path off"),
    ({"KINETO_USE_DAEMON": "1"}, "KINETO_USE_DAEMON is set by the job (a dynolog of its own): the sidecar leaves it alone"),
], ids=["opt-out", "dynolog"])
def test_the_opt_out_and_a_jobs_own_dynolog_keep_the_python_path(spawn, tmp_path, registry, extra, why):
    proc = _start(spawn, tmp_path, registry, env_extra=extra)
    write_request(registry, "r1", {"id": "py", "active_steps": 2})
    rec = wait_record(registry, lambda r: r.get("trace_path") and r["state"] == "idle", "r1", 0, what="a trace")
    assert _paths(rec) == []
    assert len(profiler_steps(load_trace(rec["trace_path"]))) == 2
    assert proc.stop() == 0
    assert f"[Profiler] rank 0: captures on the Python path: {why}" in _log_lines(proc.stderr())


def test_profile_memory_takes_the_python_path(spawn, tmp_path, registry):
    proc = _start(spawn, tmp_path, registry)
    start = record(registry, "r1")["step"] + AHEAD
    write_request(registry, "r1", {"id": "mem", "start_step": start, "active_steps": 1, "profile_memory": True})
    rec = wait_record(registry, lambda r: r.get("trace_path") and r["state"] == "idle", "r1", 0, timeout=120)
    assert _paths(rec) == [] and rec["capture_start_step"] == start
    assert any(e.get("name") == "[memory]" for e in load_trace(rec["trace_path"])["traceEvents"])
    assert proc.stop() == 0


def _start_step(spawn, tmp_path: Path, registry: Path) -> int:
    """A start step AHEAD of where a first process of this program stands once ready: the step numbers
    the failure cases are set at (a process's step count at its first idle record is nearly the same)."""
    probe = _start(spawn, tmp_path / "probe", registry / "probe", name="probe")
    start = record(registry / "probe", "r1")["step"] + AHEAD
    assert probe.stop() == 0
    return start


def test_a_users_profiler_that_preempts_the_window_is_said_once_and_shown_by_lsr(spawn, tmp_path, registry):
    start = _start_step(spawn, tmp_path, registry)
    # the user's own torch.profiler starts inside the window: kineto drops ours silently
    user_done = tmp_path / "user-profiler.stop"
    proc = _start(spawn, tmp_path, registry, "--user-profiler-at", str(start + 20), "--steps", "100000",
                  "--user-profiler-stop-file", str(user_done))
    write_request(registry, "r1", {"id": "pre", "start_step": start, "wait_steps": 0, "warmup_steps": 1,
                                   "active_steps": 200})
    rec = wait_record(registry, lambda r: r["state"] == "error", "r1", 0, timeout=120, what="pre-emption")
    assert "another torch.profiler session in this process pre-empted the on-demand capture" in rec["error"]
    assert _paths(rec) == ["ondemand"]
    lsr = subprocess.run([PYTHON, "-m", "sidecar", "replica", "lsr", "r1", "--registry", str(registry)],
                         capture_output=True, text=True, timeout=60, env=base_env())
    assert "pre-empted the on-demand capture" in lsr.stdout, lsr.stdout + lsr.stderr
    # the user's profiler ends: kineto dropped the pre-empted window, and the next capture takes this path again
    user_done.touch()
    wait_for(lambda: "USER_PROFILE_OK" in proc.stdout(), 60, what="the user's profiler to stop")
    again = record(registry, "r1")["step"] + AHEAD
    write_request(registry, "r1", {"id": "after", "start_step": again, "wait_steps": 0, "warmup_steps": 0,
                                   "active_steps": 2})
    rec = wait_record(registry, lambda r: r.get("request_id") == "after" and r.get("trace_path") and
                      r["state"] == "idle", "r1", 0, timeout=120, what="the capture after the pre-emption")
    assert _paths(rec) == ["ondemand"] and profiler_steps(load_trace(rec["trace_path"])) == [again, again + 1]
    assert proc.stop() == 0
    assert len(re.findall(r"pre-empted the on-demand capture", proc.stderr())) == 1


def test_steps_that_stop_inside_the_window_are_said_and_the_window_saved_when_they_resume(spawn, tmp_path, registry):
    release = tmp_path / "release"
    start = _start_step(spawn, tmp_path, registry)
    proc = _start(spawn, tmp_path, registry, "--pause-at", str(start + 2), "--pause-until-file", str(release))
    write_request(registry, "r1", {"id": "paused", "start_step": start, "wait_steps": 0, "warmup_steps": 1,
                                   "active_steps": 4})
    rec = wait_record(registry, lambda r: r.get("error") and "waits at step" in r["error"], "r1", 0, timeout=120,
                      what="the window said to wait")
    assert rec["state"] == "tracing" and f"waits at step {start + 2}" in rec["error"]
    lsr = subprocess.run([PYTHON, "-m", "sidecar", "replica", "lsr", "r1", "--registry", str(registry)],
                         capture_output=True, text=True, timeout=60, env=base_env())
    assert "waits at step" in lsr.stdout, lsr.stdout + lsr.stderr
    release.touch()
    rec = wait_record(registry, lambda r: r.get("trace_path") and r["state"] == "idle", "r1", 0, timeout=120)
    assert rec["error"] is None
    assert profiler_steps(load_trace(rec["trace_path"])) == [start + 1, start + 2, start + 3, start + 4]
    assert proc.stop() == 0
    assert len(re.findall(r"waits at step", proc.stderr())) == 1


def test_an_exit_inside_the_window_ends_it_saves_what_it_recorded_and_says_so(spawn, tmp_path, registry):
    start = _start_step(spawn, tmp_path, registry)
    proc = _start(spawn, tmp_path, registry, "--steps", str(start + 3))
    write_request(registry, "r1", {"id": "exit", "start_step": start, "wait_steps": 0, "warmup_steps": 0,
                                   "active_steps": 50})
    assert proc.proc.wait(timeout=120) == 0  # a window left open at exit crashed the process in kineto's teardown
    rec = record(registry, "r1")
    assert rec["state"] == "idle" and _paths(rec) == ["ondemand"] and rec["trace_path"]
    steps = profiler_steps(load_trace(rec["trace_path"]))
    assert steps[0] == start and steps[-1] <= start + 3
    assert rec["error"] == (f"capture exit (on-demand path): the process exited at step {start + 3} inside the window, "
                            f"which was ended there: {steps_verdict(steps, start, 50)}")
    assert len(re.findall(r"inside capture exit's on-demand window", proc.stderr())) == 1
