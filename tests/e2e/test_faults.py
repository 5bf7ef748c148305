"""Faults: nothing the sidecar meets can hurt the training job.

Each test runs a real training subprocess (tests/programs/train.py), breaks
something under it, and checks that training keeps stepping, the failure is
recorded where the user looks (the rank record, the log), and the process
exits 0. Numbers quoted in the README's fault table come from these tests.
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

import pytest

from sidecar.common.identity import host_name
from sidecar.common.layout import control_path, record_path
from sidecar.common.records import RankRecord, write_record
from sidecar.common.registry import write_request
from support.cli import run_cli
from support.files import remove_tree
from support.launch import PYTHON, base_env
from support.procs import settled_counts, stable_counts
from support.records import record, wait_record
from support.traces import load_trace, profiler_steps
from support.wait import wait_for

ONE_STEP = {"wait_steps": 0, "warmup_steps": 0, "active_steps": 1}
TRACE_NAME = re.compile(r"^(\d+)_trace\.json\.gz$")


def _trace_dir(tmp_path: Path, replica: str = "r1", rank: int = 0) -> Path:
    return tmp_path / "out" / "profile_trace" / f"{replica}_{rank}"


def _listing(directory: Path) -> list[str]:
    try:
        return sorted(os.listdir(directory))
    except OSError:
        return []


def _keeps_stepping(registry: Path, since: dict, steps: int = 20) -> dict:
    return wait_record(registry, lambda r: r["step"] >= since["step"] + steps, what=f"{steps} more training steps")


def _step_rate(registry: Path, window_s: float) -> tuple[float, dict, dict]:
    """Training steps per second over `window_s` of heartbeats: (rate, first record, last record)."""
    first = record(registry)
    last = wait_record(registry, lambda r: r["heartbeat_at"] >= first["heartbeat_at"] + window_s, timeout=30)
    return (last["step"] - first["step"]) / (last["heartbeat_at"] - first["heartbeat_at"]), first, last


# --- output directory unwritable or full -------------------------------------------


def _run(*cmd: str) -> subprocess.CompletedProcess:
    return subprocess.run(list(cmd), capture_output=True, text=True, timeout=30)


def _fill(directory: Path) -> Path:
    """Write a file until the filesystem says ENOSPC."""
    filler = directory / "filler"
    fd = os.open(filler, os.O_WRONLY | os.O_CREAT, 0o600)
    try:
        while True:
            os.write(fd, b"\0" * 4096)
    except OSError as exc:
        assert exc.errno == errno.ENOSPC, exc
    finally:
        os.close(fd)
    return filler


def _block(kind: str, trace_dir: Path, request: pytest.FixtureRequest):
    """Make `trace_dir` unwritable in the way `kind` names; return the callable that fixes it.

    Skips (with the reason) only when this machine cannot set up that kind;
    "file-in-the-way" needs no privileges, so every machine exercises a fault.
    """
    trace_dir.parent.mkdir(parents=True)
    if kind == "file-in-the-way":
        trace_dir.write_text("a regular file where the trace directory should be\n")
        return trace_dir.unlink
    trace_dir.mkdir()
    if kind == "immutable-dir":
        # chmod does not stop root; the immutable attribute does.
        if shutil.which("chattr") is None:
            pytest.skip("chattr is not installed")
        done = _run("chattr", "+i", str(trace_dir))
        if done.returncode != 0:
            pytest.skip(f"chattr +i is not possible here: {done.stderr.strip()}")
        request.addfinalizer(lambda: _run("chattr", "-i", str(trace_dir)))
        return lambda: _run("chattr", "-i", str(trace_dir)).check_returncode()
    assert kind == "full-tmpfs"
    done = _run("mount", "-t", "tmpfs", "-o", "size=1m,mode=0755", "tmpfs", str(trace_dir))
    if done.returncode != 0:
        pytest.skip(f"mounting a tmpfs needs CAP_SYS_ADMIN, and failed here: {done.stderr.strip()}")

    def unmount() -> None:
        if _run("umount", str(trace_dir)).returncode != 0:
            _run("umount", "-l", str(trace_dir))

    request.addfinalizer(unmount)
    filler = _fill(trace_dir)
    return filler.unlink


# The errno each blocker must surface as, in the rank record's error.
BLOCKERS = {
    "file-in-the-way": "Not a directory",
    "immutable-dir": "Operation not permitted",
    "full-tmpfs": "No space left on device",
}


# Proves: an unwritable/full trace dir fails the save with the real errno on the record, leaves no file, training goes on, and a fixed dir saves again.
@pytest.mark.parametrize("kind", list(BLOCKERS))
def test_unwritable_or_full_output_dir_fails_cleanly_and_recovers(spawn, tmp_path, registry, request, kind):
    trace_dir = _trace_dir(tmp_path)
    unblock = _block(kind, trace_dir, request)
    before = _listing(trace_dir)
    proc = spawn.rank(registry)
    write_request(registry, "r1", {"id": "blocked", **ONE_STEP})
    rec = wait_record(registry, lambda r: r["state"] == "error", what="the save to fail")
    assert rec["error"].startswith("saving trace ") and BLOCKERS[kind] in rec["error"], rec["error"]
    assert rec["trace_path"] is None and rec["num_captures"] == 0
    assert _listing(trace_dir) == before, "a partial or temp file was left in the trace dir"
    _keeps_stepping(registry, rec)

    unblock()
    write_request(registry, "r1", {"id": "fixed", **ONE_STEP})
    rec = wait_record(registry, lambda r: r.get("trace_path") and r["state"] == "idle", what="the save to work")
    assert rec["error"] is None and rec["request_id"] == "fixed"
    path = Path(rec["trace_path"])
    assert path.parent == trace_dir and TRACE_NAME.match(path.name)
    assert profiler_steps(load_trace(path)) == [rec["capture_start_step"]]
    assert proc.stop() == 0
    assert "DONE" in proc.stdout() and "Traceback" not in proc.stderr()


# --- the user's own torch.profiler --------------------------------------------------


# Proves: a request during the user's own torch.profiler is refused with a clear message, the user's trace keeps every step, and the sidecar works after.
def test_users_own_profiler_is_refused_and_left_intact(spawn, tmp_path, registry):
    user_stop, user_trace = tmp_path / "user.stop", tmp_path / "user_trace.json"
    proc = spawn.rank(registry, "--user-profiler-at", "0",
                      "--user-profiler-stop-file", str(user_stop), "--user-profiler-trace", str(user_trace))
    write_request(registry, "r1", {"id": "clash", **ONE_STEP})
    rec = wait_record(registry, lambda r: r["state"] == "error", what="the refusal")
    assert rec["error"] == (
        "request clash refused: another torch.profiler is already running in this process; "
        "stop it first (the sidecar never interferes with your own profile)"
    )
    assert rec["num_captures"] == 0 and rec["trace_path"] is None
    assert rec["num_refused"] == rec["num_requests"] == 1 and rec["refused"] == rec["error"]
    _keeps_stepping(registry, rec)

    user_stop.touch()
    match = wait_for(lambda: re.search(r"USER_PROFILE_OK (\d+) (\d+)", proc.stdout()), 30, what="the user's profile")
    user_steps = int(match.group(2))
    events = json.loads(user_trace.read_text())["traceEvents"]
    linear = sum(1 for e in events if e.get("name") == "aten::linear" and e.get("ph") == "X")
    # the model has two Linear layers: every profiled step is in the user's trace
    assert user_steps > 0 and linear == 2 * user_steps, (linear, user_steps)

    write_request(registry, "r1", {"id": "after", **ONE_STEP})
    rec = wait_record(registry, lambda r: r.get("trace_path") and r["request_id"] == "after")
    assert profiler_steps(load_trace(rec["trace_path"])) == [rec["capture_start_step"]]
    assert proc.stop() == 0


# --- SIGKILL while saving --------------------------------------------------------------


# Proves: SIGKILL with the gzip half written leaves only dot-temp names, `lsr` shows the rank dead, and the next start cleans up and saves.
def test_sigkill_while_saving_leaves_no_partial_trace(spawn, tmp_path, registry):
    big = ["--width", "512", "--layers", "20", "--step-sleep", "0.001"]
    proc = spawn.rank(registry, *big)
    trace_dir = _trace_dir(tmp_path)
    write_request(registry, "r1", {"id": "big", "wait_steps": 0, "warmup_steps": 0, "active_steps": 30,
                                   "with_stack": True, "record_shape": True})

    def temps_being_written() -> list[str]:
        try:
            entries = list(os.scandir(trace_dir))
        except FileNotFoundError:
            return []
        names = []
        for entry in entries:
            try:
                # the gzip temp, part written: the last stage before the rename
                if entry.name.startswith(".0_trace.json.gz.tmp-") and entry.stat().st_size > 0:
                    names.append(entry.name)
            except FileNotFoundError:
                continue
        assert not any(TRACE_NAME.match(e.name) for e in entries), "the save finished before it could be killed"
        return names

    temps = wait_for(temps_being_written, 120, interval=0.001, what="the save to be under way")
    proc.kill()
    assert proc.proc.returncode == -signal.SIGKILL

    final = trace_dir / "0_trace.json.gz"
    left = _listing(trace_dir)
    assert not final.exists(), f"a file under the final name after SIGKILL: {left}"
    assert left and all(n.startswith(".") and ".tmp-" in n for n in left), left
    assert record(registry)["state"] in ("tracing", "saving"), "the rank died mid-capture"

    code, out, err, _ = run_cli("replica", "lsr", "r1", "--registry", str(registry), "--json")
    assert code == 0, err
    (rank0,) = json.loads(out)["ranks"]
    assert rank0["alive"] is False and rank0["liveness"] == "process gone", rank0

    again = spawn.rank(registry)
    assert _listing(trace_dir) == [], "the restart did not remove the killed save's temp files"
    write_request(registry, "r1", {"id": "after-kill", **ONE_STEP})
    rec = wait_record(registry, lambda r: r.get("trace_path") and r["pid"] == again.pid)
    assert Path(rec["trace_path"]) == final and profiler_steps(load_trace(final)) == [rec["capture_start_step"]]
    assert again.stop() == 0
    print(f"killed while writing {temps}; left {left}")


# --- the registry deleted or replaced --------------------------------------------------


FAST_CONFIG = """\
[profiler]
enable_profiler = true
[sidecar]
heartbeat_interval = 0.2
"""


# Proves: a registry deleted under a running rank is recreated; replaced by a file it is logged once while training steps on at full rate.
def test_registry_deleted_or_replaced_while_running(spawn, tmp_path, registry):
    config = tmp_path / "fast.toml"
    config.write_text(FAST_CONFIG)
    proc = spawn.rank(registry, "--config", str(config))
    ctl_dir = control_path(registry, "r1").parent

    remove_tree(registry)
    rec = wait_record(registry, lambda r: r["pid"] == proc.pid, what="the record to be recreated")
    wait_for(ctl_dir.is_dir, 10, what="the control directory to be recreated")
    write_request(registry, "r1", {"id": "after-delete", **ONE_STEP})
    rec = wait_record(registry, lambda r: r.get("trace_path") and r["request_id"] == "after-delete")

    normal_rate, _, rec = _step_rate(registry, 1.0)

    def replace_with_file() -> bool:
        try:
            remove_tree(registry)
            registry.write_text("a file where the registry directory was\n")
            return True
        except OSError:  # the heartbeat recreated it in between: again
            return False

    wait_for(replace_with_file, 10, what="the registry to be replaced by a file")
    wait_for(lambda: "cannot write rank record under" in proc.stderr(), 10, what="the outage to be logged")
    outage_started = time.monotonic()
    # Keep the registry broken for a second of training, then fix it.
    wait_for(lambda: time.monotonic() - outage_started > 1.0, 5, interval=0.1, what="a second of outage")
    assert proc.proc.poll() is None, "training died with its registry"

    registry.unlink()
    back = wait_record(registry, lambda r: r["heartbeat_at"] > rec["heartbeat_at"] + 1.0, what="the record back")
    outage_rate = (back["step"] - rec["step"]) / (back["heartbeat_at"] - rec["heartbeat_at"])
    assert outage_rate >= 0.5 * normal_rate, f"{outage_rate:.1f} steps/s through the outage vs {normal_rate:.1f}"
    wait_for(ctl_dir.is_dir, 10, what="the control directory to be recreated")
    write_request(registry, "r1", {"id": "after-replace", **ONE_STEP})
    rec = wait_record(registry, lambda r: r["num_captures"] == 2 and r["state"] == "idle")
    assert rec["request_id"] == "after-replace" and rec["error"] is None
    assert proc.stop() == 0
    err = proc.stderr()
    assert err.count("cannot write rank record under") == 1, "the outage should be logged once"
    assert "Traceback" not in err
    print(f"step rate {normal_rate:.1f}/s before, {outage_rate:.1f}/s through the outage")


# --- request and signal storms ---------------------------------------------------------


def _captures(trace_dir: Path) -> list[list[int]]:
    """The ProfilerStep numbers of every saved trace, in capture order."""
    names = sorted((n for n in _listing(trace_dir) if TRACE_NAME.match(n)), key=lambda n: int(n.split("_")[0]))
    return [profiler_steps(load_trace(trace_dir / n)) for n in names]


def _assert_one_at_a_time(captures: list[list[int]]) -> None:
    for steps in captures:
        assert steps, "an empty trace"
    for earlier, later in zip(captures, captures[1:], strict=False):
        assert max(earlier) < min(later), f"captures overlap: {earlier} and {later}"


def _assert_storm_left_no_trace(proc, registry: Path, tmp_path: Path, rec: dict, before: tuple[int, int]):
    """After a storm: as many traces as the record counts, one capture at a time; the thread and fd
    counts back to `before`; training goes on and exits 0. Returns the counts after."""
    after = settled_counts(proc.pid, before)
    captures = _captures(_trace_dir(tmp_path))
    assert len(captures) == rec["num_captures"]
    _assert_one_at_a_time(captures)
    assert after == before, f"threads/fds before {before}, after {after}"
    _keeps_stepping(registry, rec)
    assert proc.stop() == 0
    return after


# Proves: 1,000 back-to-back requests: one capture at a time, each request read is captured or refused on the record, threads/fds unchanged.
def test_request_storm_one_capture_at_a_time_and_no_leaks(spawn, tmp_path, registry):
    proc = spawn.rank(registry)
    write_request(registry, "r1", {"id": "warm-up", **ONE_STEP})  # torch's one-time profiler setup
    warm = wait_record(registry, lambda r: r["num_captures"] == 1 and r["state"] == "idle")
    before = stable_counts(proc.pid)

    started = time.monotonic()
    for i in range(1000):
        write_request(registry, "r1", {"id": f"storm-{i}", **ONE_STEP})
    written_s = time.monotonic() - started

    def settled(r: dict) -> bool:
        last_seen = r["request_id"] == "storm-999" or "request storm-999 refused" in (r.get("refused") or "")
        return last_seen and r["state"] == "idle"

    rec = wait_record(registry, settled, timeout=120, what="the storm to settle")
    read = rec["num_requests"] - warm["num_requests"]
    captured = rec["num_captures"] - warm["num_captures"]
    refused = rec["num_refused"] - warm["num_refused"]
    assert read == captured + refused, (read, captured, refused)
    assert 1 <= captured and read <= 1000
    after = _assert_storm_left_no_trace(proc, registry, tmp_path, rec, before)
    print(f"1000 requests written in {written_s:.2f}s: read {read}, captured {captured}, refused {refused}, "
          f"superseded before read {1000 - read}; threads/fds before {before} after {after}")


# Proves: 1,000 SIGUSR1 (burst and paced): one capture at a time, every delivered signal captured, refused or coalesced, threads/fds unchanged.
def test_signal_storm_one_capture_at_a_time_and_no_leaks(spawn, tmp_path, registry):
    proc = spawn.rank(registry)
    proc.signal(signal.SIGUSR1)  # warm-up capture: torch's one-time profiler setup
    rec = wait_record(registry, lambda r: r["num_captures"] == 1 and r["state"] == "idle")
    before = stable_counts(proc.pid)
    stats = {}
    # A burst lands while the rank is not running, so the kernel merges it (a pending standard signal
    # is one bit); paced signals each reach the handler, and the sidecar folds those per step.
    for storm, gap_s in (("burst", 0.0), ("paced", 0.0005)):
        base = rec
        started = time.monotonic()
        for _ in range(1000):
            os.kill(proc.pid, signal.SIGUSR1)
            if gap_s:
                time.sleep(gap_s)  # pacing the storm, not waiting for anything
        sent_s = time.monotonic() - started
        # A signal still pending when a record is built is handled a moment later (at the main thread's
        # next bytecode): settled only in a record built two steps past one built after the last kill.
        sent_at = time.time()
        after = wait_record(registry, lambda r, sent_at=sent_at: r["heartbeat_at"] > sent_at,
                            what=f"a record built after the {storm} storm")

        def delta(r: dict, key: str, base=base) -> int:
            return r[key] - base[key]

        def settled(r: dict, delta=delta, past=after["step"] + 2) -> bool:
            signals = delta(r, "num_signals")
            return (signals > 0 and signals == delta(r, "num_requests") + delta(r, "num_coalesced")
                    and r["state"] == "idle" and r["step"] >= past)

        rec = wait_record(registry, settled, timeout=120, what=f"the {storm} storm to settle")
        got = {k: delta(rec, f"num_{k}") for k in ("signals", "requests", "coalesced", "captures", "refused")}
        assert got["requests"] == got["captures"] + got["refused"], got
        assert 1 <= got["captures"] and got["signals"] <= 1000, got
        stats[storm] = {**got, "sent_s": round(sent_s, 3)}
    assert stats["paced"]["signals"] > 1 and stats["paced"]["coalesced"] > 0, stats
    after = _assert_storm_left_no_trace(proc, registry, tmp_path, rec, before)
    print(f"SIGUSR1 storms {stats}; threads/fds before {before} after {after}")


# --- a controller that is down, slow or answers garbage --------------------------------


CONTROLLER_ERRORS = {
    "closed": "connection refused",
    "slow": "did not answer within 1s",
    "garbage-json": "did not answer JSON",
    "not-http": "did not speak HTTP",
}
CLI_TIMEOUT_S = 1.0
CLI_START_SLACK_S = 5.0  # interpreter start on a loaded machine; the controller wait itself is measured server-side


# Proves: a controller that is down, slow or answers garbage makes each CLI command exit 1 with one `Error:` line at its timeout.
@pytest.mark.parametrize("mode", list(CONTROLLER_ERRORS))
def test_cli_fails_clearly_within_its_timeout_when_the_controller_misbehaves(controller, tmp_path, mode):
    if mode == "closed":
        controller.close()  # its port now refuses connections
    else:
        controller.mode = mode
    port = controller.port
    source = ["-ch", "127.0.0.1", "-cp", str(port), "--timeout", str(CLI_TIMEOUT_S), "--registry", str(tmp_path / "reg")]
    for command in (["replica", "ls"], ["replica", "lsr", "r1"], ["profile", "set", "r1"]):
        code, out, err, elapsed = run_cli(*command, *source, timeout=30)
        assert code == 1, (command, code, out, err)
        lines = err.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("Error: ") and CONTROLLER_ERRORS[mode] in lines[0], err
        assert "Traceback" not in err and out == ""
        assert elapsed < CLI_TIMEOUT_S + CLI_START_SLACK_S, (command, elapsed)
    if mode == "slow":
        held = [c.closed_at - c.at for c in controller.calls if c.closed_at is not None]
        assert len(held) == 3 and all(0.8 * CLI_TIMEOUT_S <= s <= CLI_TIMEOUT_S + 1.0 for s in held), held
    assert not (tmp_path / "reg").exists(), "a failed controller lookup wrote to the registry"


REPORT_CONFIG = """\
[profiler]
enable_profiler = true
[profiler.sub_profiler_config]
active_steps = 1
warmup_steps = 0
wait_steps = 0
[sidecar]
heartbeat_interval = 0.1
controller_url = "http://127.0.0.1:{port}"
"""


# Proves: a trace-path report to a slow (past 3 s), garbage or down controller never slows training; traces save; the failure is logged once.
def test_trace_path_report_never_blocks_training(spawn, tmp_path, registry, controller):
    controller.mode = "slow"
    config = tmp_path / "report.toml"
    config.write_text(REPORT_CONFIG.format(port=controller.port))
    proc = spawn.rank(registry, "--config", str(config))

    rate_before, _, _ = _step_rate(registry, 1.5)
    control_path(registry, "r1").touch()
    rec = wait_record(registry, lambda r: r["num_captures"] == 1 and r["state"] == "idle")
    wait_for(lambda: controller.calls, 10, what="the report to reach the controller")
    hit_at = controller.calls[0].at
    rate_during, _, _ = _step_rate(registry, 1.0)
    assert controller.calls[0].closed_at is None, "the window should fall while the report was still pending"
    assert rate_during >= 0.5 * rate_before, f"step rate {rate_during:.1f}/s while reporting vs {rate_before:.1f}/s"
    wait_for(lambda: controller.calls[0].closed_at, 15, what="the report to give up")
    held = controller.calls[0].closed_at - hit_at
    assert 2.5 <= held <= 6.0, f"the report held the connection for {held:.1f}s; its timeout is 3s"

    for n, mode in enumerate(("not-http", "garbage-json"), start=2):
        controller.mode = mode
        control_path(registry, "r1").touch()
        wait_record(registry, lambda r, n=n: r["num_captures"] == n and r["state"] == "idle")
        wait_for(lambda n=n: len(controller.calls) == n and controller.calls[-1].closed_at, 10, what=f"the {mode} answer")
    controller.close()  # now the port is closed: connection refused
    control_path(registry, "r1").touch()
    rec = wait_record(registry, lambda r: r["num_captures"] == 4 and r["state"] == "idle")
    assert rec["error"] is None
    _keeps_stepping(registry, rec)
    assert proc.stop() == 0
    err = proc.stderr()
    assert err.count(f"could not report the trace path to http://127.0.0.1:{controller.port}") == 1, err[-2000:]
    assert "Traceback" not in err
    print(f"step rate before {rate_before:.1f}/s, while the report hung {rate_during:.1f}/s; report gave up "
          f"after {held:.2f}s")


# --- dead ranks and clock jumps ---------------------------------------------------------


def _dead_process() -> tuple[int, float]:
    """(pid, create time) of a process that has exited: a reused pid would not match the create time."""
    import psutil

    child = subprocess.Popen([PYTHON, "-c", "import sys; sys.stdin.read()"], stdin=subprocess.PIPE)
    created = psutil.Process(child.pid).create_time()
    child.communicate(timeout=30)
    return child.pid, created


# Proves: `replica ls`/`lsr` show ranks whose record files are old or stamped in the future, a dead pid or a
# reused pid as dead, not live; and judge a remote rank by its file, not by its own clock (sidecar.common.clock).
def test_dead_ranks_and_clock_jumps_show_as_dead(tmp_path):
    import psutil

    reg = tmp_path / "reg"
    now, here = time.time(), host_name()
    me = psutil.Process()
    dead_pid, dead_created = _dead_process()
    ranks = {
        0: dict(host="node-elsewhere", heartbeat_at=now),  # a live rank
        1: dict(host="node-elsewhere", heartbeat_at=now - 3600),  # stopped heartbeating an hour ago
        2: dict(host="node-elsewhere", heartbeat_at=now + 3600),  # its file stamped an hour ahead: not trusted
        3: dict(host=here, pid=dead_pid, create_time=dead_created, heartbeat_at=now),  # fresh heartbeat, process gone
        4: dict(host=here, pid=me.pid, create_time=me.create_time() - 1000, heartbeat_at=now),  # pid reused
        5: dict(host="node-elsewhere", heartbeat_at=now + 3600),  # written just now by a rank an hour ahead: alive
    }
    for rank, fields in ranks.items():
        write_record(reg, RankRecord(replica="ghosts", role="policy", rank=rank, world_size=6, **fields))
    for rank in (1, 2):  # the filesystem's clock is what counts: the file's mtime
        os.utime(record_path(reg, "ghosts", rank), (ranks[rank]["heartbeat_at"],) * 2)

    env = base_env()
    code, out, err, _ = run_cli("replica", "lsr", "ghosts", "--registry", str(reg), "--json", env=env)
    assert code == 0, err
    rows = {r["rank"]: r for r in json.loads(out)["ranks"]}
    assert {k: rows[k]["alive"] for k in rows} == {0: True, 1: False, 2: False, 3: False, 4: False, 5: True}, rows
    assert rows[3]["liveness"] == rows[4]["liveness"] == "process gone"
    assert rows[1]["liveness"].startswith("no heartbeat for") and rows[2]["liveness"].startswith("no heartbeat for")

    code, out, err, _ = run_cli("replica", "ls", "--registry", str(reg), "--json", env=env)
    assert code == 0, err
    (summary,) = json.loads(out)["replicas"]
    assert summary["replica"] == "ghosts" and summary["num_alive"] == 2 and summary["num_ranks"] == 6
