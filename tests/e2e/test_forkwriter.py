"""The forked trace writer: kineto's JSON written by a fork of the process, off its GIL.

- The JSON of a real capture is written by another process (its pid is not ours), the trace is
  complete (its ProfilerSteps are the capture's steps), and the events are freed after.
- Whatever happens to the child (killed, stopped until it stalls, raising, no fork at all, SIGCHLD
  ignored), the parent writes the trace itself: nothing is lost, and it says so once.
- In a real training process, a stopped child never stalls training, and the capture still saves.

When `auto` forks: tests/unit/test_forkwriter_choice.py."""

from __future__ import annotations

import gzip
import json
import logging
import os
import re
import signal
from pathlib import Path

import psutil
import pytest

from sidecar.common.registry import write_request
from sidecar.rank import compress, forkwriter
from sidecar.rank.exporter import export
from support.records import record, wait_record
from support.traces import profiler_steps
from support.training import driver_capture
from support.wait import wait_for


@pytest.fixture(autouse=True)
def _fresh_warnings(monkeypatch):
    monkeypatch.setattr(forkwriter, "_warned", set())


def _in_child(prof, tmp_path: Path, act) -> Path:
    """Wrap `prof`'s JSON writer: record the writing pid, and run `act()` first when that is not us."""
    parent, pids = os.getpid(), tmp_path / "writers"
    original = prof.export_chrome_trace

    def export_chrome_trace(path: str, *args, **kwargs):
        with open(pids, "a") as f:
            f.write(f"{os.getpid()}\n")
        if os.getpid() != parent:
            act()
        return original(path, *args, **kwargs)

    prof.export_chrome_trace = export_chrome_trace
    return pids


def _steps(path: Path) -> list[int]:
    return profiler_steps(json.loads(gzip.decompress(path.read_bytes())))


# Proves: with writer "fork" the JSON of a real capture is written by another process, the saved trace holds the capture's steps, and the events are freed once it is done.
def test_a_forked_child_writes_the_json_and_the_parent_frees_the_events_after(tmp_path):
    kind, prof = driver_capture(record_shape=True)
    pids = _in_child(prof, tmp_path, lambda: None)
    path = export((kind, prof), tmp_path / "0_trace.json.gz", writer="fork")
    (writer,) = pids.read_text().split()
    assert int(writer) != os.getpid()
    assert _steps(path) == [5, 6]
    assert prof.profiler.kineto_results is None
    assert forkwriter.running() == [] and compress.running() == []
    assert sorted(os.listdir(tmp_path)) == ["0_trace.json.gz", "writers"]


def _falls_back(tmp_path: Path, caplog, act, expect: str, **env: str) -> None:
    kind, prof = driver_capture(record_shape=True)
    pids = _in_child(prof, tmp_path, act)
    with caplog.at_level(logging.WARNING, logger="sidecar"):
        path = export((kind, prof), tmp_path / "0_trace.json.gz", writer="fork")
    child, parent = (int(p) for p in pids.read_text().split())
    assert parent == os.getpid() != child
    assert _steps(path) == [5, 6] and prof.profiler.kineto_results is None
    message = (f"[Profiler] the forked trace writer (pid {child}) {expect}; "
               "writing the trace on the saver thread")
    assert [r.getMessage() for r in caplog.records] == [message]
    assert forkwriter.running() == []
    assert not psutil.pid_exists(child) or psutil.Process(child).status() == psutil.STATUS_ZOMBIE
    assert sorted(os.listdir(tmp_path)) == ["0_trace.json.gz", "writers"]


def _kill_self(sig: int = signal.SIGKILL):
    return lambda: os.kill(os.getpid(), sig)


def test_a_killed_child_leaves_the_trace_to_the_saver_thread(tmp_path, caplog):
    _falls_back(tmp_path, caplog, _kill_self(), "was killed by SIGKILL")


def test_a_child_that_raises_leaves_the_trace_to_the_saver_thread(tmp_path, caplog):
    def boom():
        raise RuntimeError("boom")

    _falls_back(tmp_path, caplog, boom, "failed: RuntimeError: boom")


def test_a_stalled_child_is_killed_and_the_trace_written_here(tmp_path, caplog, monkeypatch):
    # The stall clock runs from the fork: the child must reach its SIGSTOP (and note its pid) first. With
    # 0.5 s, a child not scheduled for half a second on a loaded machine was killed before it got there.
    monkeypatch.setenv(forkwriter.STALL_ENV, "5")
    _falls_back(tmp_path, caplog, _kill_self(signal.SIGSTOP), "wrote nothing for 5 s; it was killed")


# Proves: with SIGCHLD ignored (the kernel reaps the child, waitpid has nothing to give) a killed child still counts as failed.
def test_a_killed_child_is_a_failure_even_with_sigchld_ignored(tmp_path, caplog):
    previous = signal.signal(signal.SIGCHLD, signal.SIG_IGN)
    try:
        _falls_back(tmp_path, caplog, _kill_self(), "ended before it had finished")
    finally:
        signal.signal(signal.SIGCHLD, previous)


def test_the_child_s_pipe_may_sit_past_fd_setsize(tmp_path):
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1200:
        pytest.skip(f"RLIMIT_NOFILE hard limit {hard} < 1200")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1200), hard))
    held = [os.open(os.devnull, os.O_RDONLY) for _ in range(1100)]  # the pipe's fds land above 1024
    try:
        kind, prof = driver_capture(record_shape=True)
        pids = _in_child(prof, tmp_path, lambda: None)
        path = export((kind, prof), tmp_path / "0_trace.json.gz", writer="fork")
        assert int(pids.read_text().split()[0]) != os.getpid() and _steps(path) == [5, 6]
    finally:
        for fd in held:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_trouble_following_the_child_kills_it_and_writes_the_trace_here(tmp_path, caplog, monkeypatch):
    def broken(*args):
        raise RuntimeError("no poll today")

    monkeypatch.setattr(forkwriter, "_wait", broken)
    kind, prof = driver_capture(record_shape=True)
    pids = _in_child(prof, tmp_path, lambda: None)  # the child may be killed before it writes its pid
    with caplog.at_level(logging.WARNING, logger="sidecar"):
        path = export((kind, prof), tmp_path / "0_trace.json.gz", writer="fork")
    assert int(pids.read_text().split()[-1]) == os.getpid()
    assert _steps(path) == [5, 6] and forkwriter.running() == []
    (message,) = [r.getMessage() for r in caplog.records]
    assert re.fullmatch(r"\[Profiler\] the forked trace writer \(pid \d+\) could not be followed \(RuntimeError: "
                        r"no poll today\); it was killed; writing the trace on the saver thread", message), message


def test_no_fork_left_writes_the_trace_here_and_says_so_once(tmp_path, caplog, monkeypatch):
    def no_fork():
        raise BlockingIOError(11, "Resource temporarily unavailable")

    monkeypatch.setattr(os, "fork", no_fork)
    with caplog.at_level(logging.WARNING, logger="sidecar"):
        for n in range(2):
            kind, prof = driver_capture(record_shape=True)
            path = export((kind, prof), tmp_path / f"{n}_trace.json.gz", writer="fork")
            assert _steps(path) == [5, 6]
    assert [r.getMessage() for r in caplog.records] == [
        "[Profiler] could not fork a trace writer (Resource temporarily unavailable); "
        "writing traces on the saver thread"]


def _forked_writer(pid: int) -> psutil.Process | None:
    """The rank's forked trace writer: a child running the rank's own command line."""
    try:
        rank = psutil.Process(pid)
        for child in rank.children():
            if child.cmdline() == rank.cmdline():
                return child
    except psutil.Error:
        pass
    return None


# Proves: in a real training process a stopped forked writer never stalls training; it is killed once it has written nothing for the stall time, and the capture saves anyway, complete.
def test_a_stopped_forked_writer_never_stalls_training_and_the_capture_saves(spawn, registry):
    proc = spawn.rank(registry, "--width", "512", "--layers", "20", "--step-sleep", "0.001",
                      env_extra={"COSMOS_PROFILER_SAVE_WRITER": "fork", forkwriter.STALL_ENV: "3"})
    big = {"wait_steps": 0, "warmup_steps": 0, "active_steps": 30, "with_stack": True, "record_shape": True}
    child = None
    for attempt in range(3):  # the child may be done before we see it: ask again
        write_request(registry, "r1", {"id": f"big{attempt}", **big})
        child = wait_for(lambda n=attempt: _forked_writer(proc.pid) or record(registry).get("num_captures", 0) > n
                         or None, 120, interval=0.001, what="the forked writer")
        if isinstance(child, psutil.Process):
            break
        wait_record(registry, lambda r: r["state"] == "idle", what="the quick save to end")
    assert isinstance(child, psutil.Process), "every save finished before its forked writer could be seen"
    child.send_signal(signal.SIGSTOP)
    stopped_at = record(registry)
    wait_record(registry, lambda r: r["step"] >= stopped_at["step"] + 20, what="training to step on")
    rec = wait_record(registry, lambda r: r["state"] == "idle" and r["request_id"] == f"big{attempt}"
                      and r["num_captures"] == attempt + 1, what="the capture to save after all")
    assert rec["error"] is None
    start = rec["capture_start_step"]
    assert _steps(Path(rec["trace_path"])) == list(range(start, start + 30))
    assert not psutil.pid_exists(child.pid) or child.status() == psutil.STATUS_ZOMBIE
    assert proc.stop() == 0
    err = proc.stderr()
    assert f"[Profiler] the forked trace writer (pid {child.pid}) wrote nothing for 3 s; it was killed" in err
    assert "Traceback" not in err
