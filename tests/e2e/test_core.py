"""End to end: real training subprocesses profile themselves on a touch, a JSON request or SIGUSR1."""

from __future__ import annotations

import hashlib
import json
import os
import re
import signal
import subprocess
import threading
from pathlib import Path

import pytest

from sidecar.common.layout import control_path
from sidecar.common.registry import write_request
from support.launch import PYTHON, base_env
from support.records import record, wait_record
from support.traces import load_trace, profiler_steps


def _start(spawn, tmp_path: Path, registry: Path, name: str = "r1", *extra: str, env_extra: dict | None = None):
    env = base_env(registry, **(env_extra or {}))
    proc = spawn(name, ["--replica", name, "--output", str(tmp_path / "out"), *extra], env)
    proc.wait_ready()
    wait_record(registry, lambda r: r.get("state") == "idle", name, int(env.get("RANK", 0)), what="first record")
    return proc


def _cli(registry: Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([PYTHON, "-m", "cosmos_rl.cli.cli", *args, "--registry", str(registry)],
                          capture_output=True, text=True, timeout=120, env=base_env())


def _log_lines(text: str) -> list[str]:
    return [line.split(" INFO ", 1)[-1] for line in text.splitlines() if "[Profiler]" in line]


def test_json_request_traces_exactly_the_active_steps(spawn, tmp_path, registry):
    proc = _start(spawn, tmp_path, registry)
    write_request(registry, "r1", {"id": "req-1", "wait_steps": 1, "warmup_steps": 1, "active_steps": 2})
    rec = wait_record(registry, lambda r: r.get("trace_path") and r["state"] == "idle", "r1", 0, what="trace saved")

    trace_path = Path(rec["trace_path"])
    assert trace_path == tmp_path / "out" / "profile_trace" / "r1_0" / "0_trace.json.gz"
    start = rec["capture_start_step"]
    trace = load_trace(trace_path)
    assert trace["traceEvents"], "trace has no events"
    # wait = start, warmup = start+1, active = start+2 and start+3
    assert profiler_steps(trace) == [start + 2, start + 3]
    assert any(e.get("name", "").startswith("aten::") for e in trace["traceEvents"]), "no aten ops recorded"
    assert trace["cosmos_profiler"]["request_id"] == "req-1"

    assert rec["request_id"] == "req-1"
    assert [h["state"] for h in rec["history"]] == ["armed", "tracing", "saving", "idle"]
    assert rec["history"][1]["step"] == start
    assert rec["history"][2]["step"] == start + 4

    assert proc.stop() == 0
    lines = _log_lines(proc.stderr())
    assert "[Profiler] init profiler for rank 0" in lines
    assert "[Profiler] start to trace for rank: 0" in lines
    assert f"[Profiler] save trace for rank: 0 to file: {trace_path} after 4 steps." in lines
    assert not list(trace_path.parent.glob(".*")), "temp files left behind"


def test_touch_uses_config_defaults_and_numbers_captures(spawn, tmp_path, registry):
    config = tmp_path / "train.toml"
    config.write_text(
        "[train]\noutput_dir = 'ignored-because-output-given'\n"
        "[profiler]\nenable_profiler = true\n"
        "[profiler.sub_profiler_config]\nactive_steps = 3\nwait_steps = 0\nwarmup_steps = 2\n"
    )
    proc = _start(spawn, tmp_path, registry, "r1", "--config", str(config))
    paths = []
    for n in range(2):
        control_path(registry, "r1").touch()
        rec = wait_record(registry, lambda r, n=n: r.get("num_captures") == n + 1 and r["state"] == "idle", "r1", 0)
        paths.append(Path(rec["trace_path"]))
        start = rec["capture_start_step"]
        assert profiler_steps(load_trace(paths[-1])) == [start + 2, start + 3, start + 4]
    assert [p.name for p in paths] == ["0_trace.json.gz", "1_trace.json.gz"]
    assert proc.stop() == 0


def test_sigusr1_profiles_that_rank_with_its_defaults(spawn, tmp_path, registry):
    proc = _start(spawn, tmp_path, registry, "r1", env_extra={"RANK": "3", "WORLD_SIZE": "4"})
    proc.signal(signal.SIGUSR1)
    rec = wait_record(registry, lambda r: r.get("trace_path"), "r1", 3, what="signal capture")
    assert rec["request"]["source"] == "signal"
    assert Path(rec["trace_path"]).parent.name == "r1_3"
    start = rec["capture_start_step"]
    assert profiler_steps(load_trace(rec["trace_path"])) == [start + 2]
    assert proc.stop() == 0
    assert "[Profiler] start to trace for rank: 3" in _log_lines(proc.stderr())


def test_rank_filter_selects_only_the_named_ranks(spawn, tmp_path, registry):
    procs = [
        _start(spawn, tmp_path, registry, "r1", env_extra={"RANK": str(k), "WORLD_SIZE": "2"})
        for k in (0, 1)
    ]
    write_request(registry, "r1", {"id": "only-1", "rank_filter": [1]})
    rec1 = wait_record(registry, lambda r: r.get("trace_path"), "r1", 1, what="rank 1 trace")
    rec0 = wait_record(registry, lambda r: r.get("request_id") == "only-1", "r1", 0)
    assert rec0["selected"] is False and rec0["trace_path"] is None and rec0["state"] == "idle"
    assert rec1["selected"] is True
    assert not (tmp_path / "out" / "profile_trace" / "r1_0").exists()
    for p in procs:
        assert p.stop() == 0


def test_start_step_in_the_future_waits_for_it(spawn, tmp_path, registry):
    proc = _start(spawn, tmp_path, registry)
    step = record(registry, "r1")["step"]
    target = step + 60
    write_request(registry, "r1", {"id": "later", "start_step": target, "wait_steps": 0, "warmup_steps": 1, "active_steps": 1})
    armed = wait_record(registry, lambda r: r["state"] == "armed", "r1", 0)
    assert armed["step"] < target
    rec = wait_record(registry, lambda r: r.get("trace_path"), "r1", 0)
    assert rec["capture_start_step"] == target and rec["misaligned"] is False
    assert profiler_steps(load_trace(rec["trace_path"])) == [target + 1]
    assert proc.stop() == 0


def test_second_request_while_busy_is_refused(spawn, tmp_path, registry):
    proc = _start(spawn, tmp_path, registry)
    write_request(registry, "r1", {"id": "long", "wait_steps": 150, "active_steps": 1})
    wait_record(registry, lambda r: r["state"] == "tracing", "r1", 0)
    write_request(registry, "r1", {"id": "second"})
    rec = wait_record(registry, lambda r: r.get("refused"), "r1", 0)
    assert re.fullmatch(
        r"request second refused: rank 0 is busy with request long \(start step \d+, phase tracing\)\. "
        r"`cosmos-profiler profile cancel r1` ends it\.", rec["refused"]), rec["refused"]
    assert rec["request_id"] == "long" and rec["state"] == "tracing"
    rec = wait_record(registry, lambda r: r.get("trace_path"), "r1", 0, timeout=90)
    assert rec["num_captures"] == 1
    assert proc.stop() == 0
    assert "request second refused" in proc.stderr()


def test_disabled_profiler_refuses_with_cosmos_message(spawn, tmp_path, registry):
    config = tmp_path / "train.toml"
    config.write_text("[profiler]\nenable_profiler = false\n")
    proc = _start(spawn, tmp_path, registry, "r1", "--config", str(config))
    assert record(registry, "r1")["enabled"] is False
    write_request(registry, "r1", {"id": "nope"})
    rec = wait_record(registry, lambda r: r.get("refused"), "r1", 0)
    assert "enable_profiler = false" in rec["refused"] and "takes no effect" in rec["refused"]
    assert rec["state"] == "idle" and rec["trace_path"] is None
    assert proc.stop() == 0


BAD_REQUESTS = [
    (b"{not json", "not valid JSON"),
    (b"[1, 2]", "must be a JSON object, got a JSON array"),
    (b'{"active_step": 2}', "unknown field 'active_step'"),
    (b'{"active_steps": -1}', "active_steps must be between 1 and 1000, got -1"),
    (b'{"wait_steps": 10000000}', "wait_steps must be between 0 and 100000"),
    (b'{"active_steps": 2.5}', "active_steps must be an integer"),
    (b'{"rank_filter": "0-x"}', "rank_filter: cannot parse '0-x'"),
    (b'{"rank_filter": [0, 7]}', "names rank 7, but world size is 1"),
    (b'{"output_dir": "/etc"}', "unknown field 'output_dir'"),
    (b"\xff\xfe", "not UTF-8"),
]


def test_bad_requests_are_refused_and_the_next_valid_one_works(spawn, tmp_path, registry):
    proc = _start(spawn, tmp_path, registry)
    ctl = control_path(registry, "r1")
    for i, (data, expected) in enumerate(BAD_REQUESTS):
        tmp = ctl.with_name(f".bad{i}")
        tmp.write_bytes(data)
        os.replace(tmp, ctl)
        rec = wait_record(registry, lambda r, e=expected: r.get("error") and e in r["error"], "r1", 0, what=expected)
        assert rec["state"] == "idle"

    # oversized control file
    ctl.write_bytes(b" " * (64 * 1024 + 1))
    wait_record(registry, lambda r: "bytes; the limit is 65536" in (r.get("error") or ""), "r1", 0)
    # a symlink in place of the control file
    target = tmp_path / "elsewhere.json"
    target.write_text('{"active_steps": 1}')
    ctl.unlink()
    ctl.symlink_to(target)
    wait_record(registry, lambda r: "is a symlink" in (r.get("error") or ""), "r1", 0)
    assert record(registry, "r1")["num_captures"] == 0

    ctl.unlink()
    write_request(registry, "r1", {"id": "good"})
    rec = wait_record(registry, lambda r: r.get("trace_path"), "r1", 0)
    assert rec["error"] is None and rec["request_id"] == "good"
    assert proc.stop() == 0
    assert "unknown field 'active_step'" in proc.stderr()


def test_unwritable_output_dir_records_the_error_and_training_goes_on(spawn, tmp_path, registry):
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("a file where the output dir should be")
    env = base_env(registry)
    proc = spawn("r1", ["--replica", "r1", "--output", str(blocker / "out")], env)
    proc.wait_ready()
    wait_record(registry, lambda r: r.get("state") == "idle", "r1", 0)
    write_request(registry, "r1", {"id": "fails"})
    rec = wait_record(registry, lambda r: r["state"] == "error", "r1", 0)
    assert "saving trace" in rec["error"] and "Not a directory" in rec["error"]
    step = rec["step"]
    wait_record(registry, lambda r: r["step"] > step + 20, "r1", 0, what="training to go on")
    assert proc.stop() == 0
    assert "DONE" in proc.stdout()


def test_users_own_profiler_is_left_alone(spawn, tmp_path, registry):
    proc = _start(spawn, tmp_path, registry, "r1", "--user-profiler-at", "0", "--steps", "100000")
    write_request(registry, "r1", {"id": "clash"})
    rec = wait_record(registry, lambda r: r["state"] == "error", "r1", 0)
    assert "another torch.profiler is already running" in rec["error"]
    assert proc.stop() == 0
    assert re.search(r"USER_PROFILE_OK [1-9]", proc.stdout())


# --- trigger semantics: what a new version of the control file means ---------------------


def test_a_touch_of_a_handled_request_is_a_new_request_never_a_replay(spawn, tmp_path, registry):
    proc = _start(spawn, tmp_path, registry)
    step = record(registry, "r1")["step"]
    write_request(registry, "r1", {"id": "old", "start_step": step + 20, "active_steps": 1})
    first = wait_record(registry, lambda r: r.get("num_captures") == 1 and r["state"] == "idle", "r1", 0)
    assert (first["request_id"], first["capture_start_step"]) == ("old", step + 20)
    ctl = control_path(registry, "r1")
    data = ctl.read_bytes()
    os.utime(ctl)  # touch: same bytes, new mtime; start step step+20 has passed
    mtime_ns = os.stat(ctl).st_mtime_ns
    second = wait_record(registry, lambda r: r.get("num_captures") == 2 and r["state"] == "idle", "r1", 0)
    # the documented id of a file version: the same on every rank that reads it
    assert second["request_id"] == f"file-{mtime_ns}-{hashlib.sha256(data).hexdigest()[:8]}"
    assert second["request"]["start_step"] is None and second["misaligned"] is False, "the next step, not a late start"
    assert second["capture_start_step"] > step + 20
    assert profiler_steps(load_trace(second["trace_path"])) == [second["capture_start_step"] + 2]
    assert second["num_refused"] == 0
    status = json.loads(_cli(registry, "profile", "status", "r1", "--json").stdout)
    assert (status["request_id"], status["ranks"][0]["phase"]) == (second["request_id"], "saved")
    assert proc.stop() == 0
    assert "the control file holds the same content again: a new request file-" in proc.stderr()


def test_a_writer_that_truncates_then_writes_gets_exactly_its_request(spawn, tmp_path, registry):
    """Before: the empty file ran as a defaults capture, and the written request was refused as busy."""
    proc = _start(spawn, tmp_path, registry)
    ctl = control_path(registry, "r1")
    with open(ctl, "w") as f:  # what `echo ... > file` does: truncate (creating it), then write
        f.flush()
        threading.Event().wait(0.05)  # the writer's pace: the input of this test
        f.write('{"id": "mine", "active_steps": 2}')
    rec = wait_record(registry, lambda r: r.get("num_captures") == 1 and r["state"] == "idle", "r1", 0)
    assert (rec["request_id"], rec["num_requests"], rec["num_refused"], rec["refused"]) == ("mine", 1, 0, None)
    start = rec["capture_start_step"]
    assert profiler_steps(load_trace(rec["trace_path"])) == [start + 2, start + 3]
    assert proc.stop() == 0
    assert not list((tmp_path / "out" / "profile_trace" / "r1_0").glob("1_*")), "one capture only"


@pytest.mark.parametrize(
    "start_step, refusal",
    [
        (99999999, r"request far refused: start_step 99999999 is \d+ steps past step \d+; "
                   r"the limit is 100000 steps ahead; nothing was armed"),
        (9007199254740992, r"request refused: start_step must be between 0 and 9007199254740991 \(2\*\*53-1, "
                           r"the largest integer JSON carries exactly\), got 9007199254740992"),
    ],
)
def test_a_start_step_no_rank_can_reach_is_refused_by_the_rank(spawn, tmp_path, registry, start_step, refusal):
    """Both used to leave the rank armed for ever, refusing every later request."""
    proc = _start(spawn, tmp_path, registry)
    ctl = control_path(registry, "r1")
    ctl.write_text(f'{{"id": "far", "start_step": {start_step}}}')
    rec = wait_record(registry, lambda r: r.get("refused"), "r1", 0)
    assert re.fullmatch(refusal, rec["refused"]), rec["refused"]
    assert (rec["state"], rec["num_requests"], rec["request_id"], rec["trace_path"]) == ("idle", 1, None, None)
    write_request(registry, "r1", {"id": "near"})
    rec = wait_record(registry, lambda r: r.get("num_captures") == 1 and r["state"] == "idle", "r1", 0)
    assert rec["request_id"] == "near" and rec["refused"] is None
    assert proc.stop() == 0
