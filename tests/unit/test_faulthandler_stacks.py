"""Stacks that work while a C call holds the GIL: faulthandler on `[sidecar] stacks_signal`, and the
`profile stacks` fallback that sends it when the watcher thread does not answer, over hand-written
ranks. Real processes holding the GIL: tests/e2e/test_faulthandler_stacks_jobs.py."""

from __future__ import annotations

import faulthandler
import os
import signal
import tempfile
import threading
import time

import pytest

from sidecar.common import envvars
from sidecar.common.config import SidecarSettings
from sidecar.common.exceptions import ConfigError
from sidecar.common.stackdump import ThreadStack, format_stacks, parse_fault_dump, parse_stacks
from sidecar.fleet.answers import RankStacks
from sidecar.fleet.signal_stacks import fallback_after_s
from sidecar.fleet.stackgroups import group_stacks
from sidecar.rank.faulthandler_stacks import FaultStacks
from support.cli import invoke
from support.records import alive_record
from support.threads import parked_thread

# A record's advertised faulthandler dump (its file is never read: `ask_rank` is replaced).
FAULT_STACKS = {"signal": int(signal.SIGUSR2), "path": "/nonexistent/rank-0.faulthandler.txt"}


def test_a_fault_dump_reads_as_the_watchers_frames_and_groups_with_them():
    """The same parked thread, dumped by faulthandler and by format_stacks, has the same frames."""
    with parked_thread() as t:
        with tempfile.TemporaryFile("w+") as f:
            faulthandler.dump_traceback(f, all_threads=True)
            f.seek(0)
            fault_text = f.read()
        watcher_text = format_stacks({"rank": 0}, skip_current=False)
    fault = {th.ident: th for th in parse_fault_dump(fault_text)}
    watcher = {s.name: s for s in parse_stacks(watcher_text)}
    assert fault[t.ident].frames == watcher["parked"].frames
    assert fault[t.ident].frames[-1].endswith(", in wait") and not fault[t.ident].is_current
    assert fault[threading.main_thread().ident].is_current
    answers = [
        RankStacks(0, "saved", threads=[watcher["parked"]], main_thread=0),
        RankStacks(1, "saved", threads=[ThreadStack("parked", fault[t.ident].frames)], main_thread=0,
                   source="faulthandler"),
    ]
    groups = group_stacks(answers)
    assert [g.ranks for g in groups] == [[0, 1]]


def test_a_handler_installed_later_turns_the_dump_off(tmp_path):
    before = signal.getsignal(signal.SIGUSR2)
    dump = FaultStacks("SIGUSR2", tmp_path / "rank-0.faulthandler.txt", 0)
    try:
        assert dump.install() and dump.check() and dump.info()["signal"] == int(signal.SIGUSR2)
        signal.signal(signal.SIGUSR2, lambda *_: None)
        assert not dump.check() and dump.info() is None
        dump.close()
        assert signal.getsignal(signal.SIGUSR2) not in (signal.SIG_DFL, None)  # theirs stays
    finally:
        dump.close()
        signal.signal(signal.SIGUSR2, before if before is not None else signal.SIG_DFL)


def test_a_rank_on_another_host_is_not_signalled_and_the_error_says_where_to_run(tmp_path):
    reg = tmp_path / "reg"
    fault = {"signal": int(signal.SIGUSR2), "path": str(tmp_path / "f.txt"), "main": 1, "threads": {"1": "MainThread"}}
    alive_record(reg, "r1", 0, world_size=1, host="gpu-node-7", fault_stacks=fault)
    result = invoke("profile", "stacks", "r1", "--registry", str(reg), "--timeout", "1.5",
                    env={"COSMOS_PROFILER_STACKS_FALLBACK_S": "0.3"})
    assert result.exit_code == 1
    assert ("Error: no stacks from rank 0 (rank 0: timeout: the watcher thread did not answer within 1.5s; its "
            "heartbeat is fresh (step 1000), so its watcher thread did not see the request; no faulthandler dump: "
            "rank 0 runs on host gpu-node-7, and its faulthandler dump can only be asked there: run the same "
            "command on gpu-node-7 (e.g. cosmos-profiler profile stacks r1 -rf 0))") in result.output
    assert not (tmp_path / "f.txt").exists()


def test_settings_and_env_for_the_stacks_signal():
    assert SidecarSettings().stacks_signal == "SIGUSR2"
    assert SidecarSettings(stacks_signal="usr2").stacks_signal == "SIGUSR2"
    assert envvars.apply(SidecarSettings(), {"COSMOS_PROFILER_STACKS_SIGNAL": "off"}).stacks_signal == "off"
    with pytest.raises(ConfigError, match=r"sidecar.stacks_signal: 'SIGNOPE' names no signal"):
        SidecarSettings(stacks_signal="SIGNOPE")
    with pytest.raises(ConfigError, match="sidecar.stacks_signal cannot be SIGSEGV"):
        SidecarSettings(stacks_signal="SIGSEGV")
    assert fallback_after_s({}) == 2.0 and fallback_after_s({"COSMOS_PROFILER_STACKS_FALLBACK_S": "0.5"}) == 0.5
    with pytest.raises(ConfigError, match=r"COSMOS_PROFILER_STACKS_FALLBACK_S must be a number of seconds between 0 "
                                          r"and 3600, got 'soon'"):
        fallback_after_s({"COSMOS_PROFILER_STACKS_FALLBACK_S": "soon"})


def test_a_local_rank_without_the_dump_says_so_and_is_not_signalled(tmp_path):
    """A rank of this host whose record advertises no dump (stacks_signal off, or a sidecar from before)."""
    reg = tmp_path / "reg"
    alive_record(reg, "r1", 0, world_size=1)  # this process: it must not be signalled
    result = invoke("profile", "stacks", "r1", "--registry", str(reg), "--timeout", "1",
                    env={"COSMOS_PROFILER_STACKS_FALLBACK_S": "0.2"})
    assert result.exit_code == 1
    assert ("rank 0: timeout: the watcher thread did not answer within 1s; its heartbeat is fresh (step 1000), so "
            "its watcher thread did not see the request; no faulthandler dump: its faulthandler stacks dump is off "
            "(sidecar.stacks_signal, or the signal was taken))") in result.output


def test_a_rank_whose_watcher_is_answering_is_not_signalled(tmp_path, monkeypatch):
    """A loaded machine: the watcher wrote this request's stacks and is dumping the flight recorder when
    the fallback's 2 s pass. Its Python runs, so no signal (one then segfaulted a rank of fr_job:
    faulthandler walked its watcher's frames mid-import); a stacks dump of another request does not count."""
    from sidecar.common import layout
    from sidecar.fleet import signal_stacks

    asked: list[int] = []
    monkeypatch.setattr(signal_stacks, "ask_rank", lambda record, host: asked.append(record.rank) or 1 / 0)
    out = tmp_path / "out"
    silent_since = time.time() - 60  # its heartbeat stopped a minute ago
    record = alive_record(tmp_path / "reg", "r1", 0, world_size=1, output_dir=str(out), heartbeat_at=silent_since,
                          fault_stacks=FAULT_STACKS)
    record.file_mtime = silent_since
    rank_dir = layout.rank_trace_dir(out, "r1", 0)
    rank_dir.mkdir(parents=True)
    (rank_dir / "0_stacks.txt").write_text(format_stacks({"replica": "r1", "rank": 0, "request": "cli-old"}))
    answer = RankStacks(rank=0, phase="timeout")
    with pytest.raises(ZeroDivisionError):  # another request's dump: the rank is signalled, as before
        signal_stacks.fall_back(record, answer, 2.0, record.host, "r1", "cli-new", time.time())
    assert asked == [0]
    (rank_dir / "1_stacks.txt").write_text(format_stacks({"replica": "r1", "rank": 0, "request": "cli-new"}))
    answer = RankStacks(rank=0, phase="timeout")
    assert signal_stacks.fall_back(record, answer, 2.0, record.host, "r1", "cli-new", time.time()) is answer
    assert asked == [0] and answer.phase == "pending" and answer.source == "watcher" and answer.fallback is None


def test_a_rank_whose_heartbeat_ticks_is_not_signalled_until_it_stops(tmp_path, monkeypatch):
    """A rank whose record was ticked within two heartbeat intervals runs Python, so its watcher will answer:
    no signal (faulthandler would walk its running threads' frames without the GIL). Once its heartbeat has
    stopped for two intervals, no Python runs in it, and it is signalled."""
    from sidecar.fleet import signal_stacks

    asked: list[int] = []
    monkeypatch.setattr(signal_stacks, "ask_rank", lambda record, host: asked.append(record.rank) or 1 / 0)
    now = time.time()
    record = alive_record(tmp_path / "reg", "r1", 0, world_size=1, heartbeat_interval=5.0, fault_stacks=FAULT_STACKS)
    for age in (0.0, 5.0, 9.9):
        record.file_mtime = now - age
        answer = RankStacks(rank=0, phase="timeout")
        assert signal_stacks.fall_back(record, answer, 2.0, record.host, "r1", "cli-x", now) is answer
        assert (answer.phase, answer.fallback, asked) == ("pending", None, []), age
    assert signal_stacks.heartbeat_stopped(record, now) is None
    record.file_mtime = now - 10.0
    assert signal_stacks.heartbeat_stopped(record, now) == 10.0
    with pytest.raises(ZeroDivisionError):
        signal_stacks.fall_back(record, RankStacks(rank=0, phase="timeout"), 2.0, record.host, "r1", "cli-x", now)
    assert asked == [0]


def test_catches_reads_whether_a_handler_is_installed_now():
    """The check the CLI makes just before it signals: /proc/<pid>/status's SigCgt."""
    from sidecar.fleet.signal_stacks import catches

    signum = signal.SIGRTMIN + 9  # one no other test takes
    assert signal.getsignal(signum) is signal.SIG_DFL
    assert not catches(os.getpid(), signum)
    with tempfile.TemporaryFile("w+") as f:
        faulthandler.register(signum, file=f, all_threads=True, chain=False)
        try:
            assert catches(os.getpid(), signum)
        finally:
            faulthandler.unregister(signum)
    assert not catches(os.getpid(), signum)
    assert not catches(2**22 + 12345, signum)  # no such process (above the kernel's pid_max): unknown, not caught
