"""Stacks that work while a C call holds the GIL, in real training processes: `profile stacks` reaches
a rank holding the GIL through faulthandler on `[sidecar] stacks_signal`, and a job's own handler on
that signal is left alone."""

from __future__ import annotations

import json
import os
import re
import signal
import time
from pathlib import Path

import pytest

from sidecar.common import layout
from support.cli import run_cli
from support.launch import base_env
from support.records import wait_record
from support.wait import wait_for

TRAIN_PY = 'programs/train.py", line'


def test_profile_stacks_reaches_a_rank_holding_the_gil(spawn, registry):
    """Rank 0 sits in a C call that holds the GIL (its watcher thread cannot run); rank 1 trains.
    `profile stacks` answers within seconds: rank 0 through faulthandler, rank 1 through its watcher."""
    stuck = spawn.rank(registry, "--gil-at", "5", name="stuck", env_extra={"RANK": "0", "WORLD_SIZE": "2"})
    healthy = spawn.rank(registry, name="healthy", env_extra={"RANK": "1", "WORLD_SIZE": "2"})
    wait_for(lambda: "HOLDING" in stuck.stdout(), what="rank 0 to hold the GIL")
    record = wait_record(registry, lambda r: r.get("fault_stacks"), "r1", 0)
    assert record["fault_stacks"]["signal"] == int(signal.SIGUSR2)
    fault_file = Path(record["fault_stacks"]["path"])
    assert fault_file == registry / "replicas" / "r1" / "rank-0.faulthandler.txt"

    code, out, err, _ = run_cli("profile", "stacks", "r1", "--registry", str(registry), env=base_env())
    assert code == 0, err
    assert "Stacks of replica r1 " in out and "2 of 2 ranks answered." in out
    assert ("rank 0 (1 rank): from the faulthandler fallback (the watcher thread did not answer in time: "
            "a C call holding the GIL?)") in out
    group0 = out.split("\nrank 0 (1 rank): MainThread", 1)[1].split("\n\n", 1)[0]
    frames = [line.strip() for line in group0.splitlines() if line.strip().startswith("File ")]
    assert TRAIN_PY in frames[-1] and frames[-1].endswith(", in held_the_gil"), group0
    assert "cosmos-profiler-heartbeat" in group0 and "Thread 0x" not in group0  # names published ahead of time
    assert "\nrank 1 (1 rank): MainThread" in out
    # Signalled once its heartbeat (every 5 s) had stopped for two intervals: no Python ran in it.
    said = re.search(rf"  rank 0: {re.escape(str(fault_file))} \(the watcher thread did not answer within (\d+)s, and its "
                     rf"heartbeat had stopped (\d+)s before: sent SIGUSR2 to pid {stuck.pid}; faulthandler's dump starts "
                     rf"at byte 0\)", out)
    assert said and int(said[1]) >= 2 and int(said[2]) >= 10, out

    code, out, err, _ = run_cli("profile", "stacks", "r1", "--registry", str(registry), "--json", env=base_env())
    assert code == 0, err
    data = json.loads(out)
    ranks = {r["rank"]: r for r in data["ranks"]}
    assert (ranks[0]["source"], ranks[0]["phase"], ranks[0]["stacks_path"]) == ("faulthandler", "saved", str(fault_file))
    assert ranks[1]["source"] == "watcher" and ranks[1]["stacks_path"].endswith("r1_1/1_stacks.txt")
    main0 = next(g for g in data["groups"] if g["ranks"] == [{"rank": 0}])
    assert main0["thread"] == "MainThread" and main0["frames"][-1].endswith("in held_the_gil")
    assert "cosmos-profiler-heartbeat" in main0["other_threads"]  # names the rank published ahead of time
    assert stuck.proc.poll() is None and healthy.proc.poll() is None  # the signal kills no one

    # `profile hang` collects through the same path: the frozen rank's stack, through faulthandler.
    code, out, err, _ = run_cli("profile", "hang", "r1", "--registry", str(registry), "--json", env=base_env())
    assert code == 0, err
    hang = {r["rank"]: r for r in json.loads(out)["ranks"]}
    assert hang[0]["phase"] == "saved" and hang[0]["main_stack"][-1].endswith("in held_the_gil"), hang[0]
    assert hang[0]["stacks_path"] == str(fault_file) and hang[1]["phase"] == "saved"
    code, out, err, _ = run_cli("profile", "hang", "r1", "--registry", str(registry), env=base_env())
    assert code == 0 and "held_the_gil" in out, out + err
    assert "HOLDING" in stuck.stdout() and "RELEASED" not in stuck.stdout()


@pytest.mark.parametrize("kind", ["python", "faulthandler"])
def test_the_users_own_handler_on_the_signal_is_left_alone(spawn, registry, kind):
    proc = spawn.rank(registry, "--user-usr2", kind)
    record = wait_record(registry, lambda r: r.get("pid") == proc.pid, "r1", 0)
    assert record["fault_stacks"] is None
    if kind == "python":
        assert ("SIGUSR2 already has a Python handler (main.<locals>.<lambda>); the faulthandler stacks dump stays "
                "off and that handler is left alone") in proc.stderr()
        proc.signal(signal.SIGUSR2)
        wait_for(lambda: "USER_USR2" in proc.stdout(), what="the user's handler to run")
    else:
        assert ("SIGUSR2 has a handler installed outside Python's signal module" in proc.stderr()
                or "SIGUSR2 already has a handler installed outside Python" in proc.stderr()), proc.stderr()
        proc.signal(signal.SIGUSR2)
        wait_for(lambda: "Current thread" in proc.stdout() or "Stack (most recent" in proc.stdout(),
                 what="the user's faulthandler dump on stdout")
    assert proc.stop() == 0


def test_a_rank_whose_python_runs_is_not_signalled_while_its_watcher_is_late(spawn, registry):
    """A rank that trains (its heartbeat fresh) but whose watcher sees the request late (it polls the control
    file every 6 s) is waited for, never sent the faulthandler signal after the 2 s fallback: faulthandler
    walks the other threads' frames without the GIL, and a thread that runs Python meanwhile can crash the
    rank (a rank died so, its watcher importing while it was signalled)."""
    proc = spawn.rank(registry, env_extra={"COSMOS_PROFILER_WATCH": "poll", "COSMOS_PROFILER_POLL_INTERVAL": "6"})
    record = wait_record(registry, lambda r: r.get("fault_stacks") and r.get("watch") == "poll", "r1", 0)
    fault_file = Path(record["fault_stacks"]["path"])

    code, out, err, _ = run_cli("profile", "stacks", "r1", "--registry", str(registry), "--json", env=base_env())
    assert code == 0, err
    (rank0,) = json.loads(out)["ranks"]
    assert (rank0["phase"], rank0["source"], rank0["fallback"]) == ("saved", "watcher", None), rank0
    assert rank0["stacks_path"].endswith("r1_0/0_stacks.txt")
    assert not fault_file.exists() or fault_file.stat().st_size == 0  # no signal was sent
    assert proc.proc.poll() is None


def test_a_process_whose_sidecar_closed_is_never_sent_the_signal(spawn, registry, tmp_path):
    """The sidecar closed (faulthandler unregistered: the signal's default action, which ends the process, is
    back) and the job goes on with its own work, a checkpoint; its last record, as if its exit was never
    published (a full disk, a network filesystem's hiccup), still advertises the dump. `profile stacks` must
    not signal it: the process, and the checkpoint it writes, would die. The CLI checks that the signal is
    caught (/proc/<pid>/status) just before it sends it."""
    linger = tmp_path / "linger"
    proc = spawn.rank(registry, "--linger-file", str(linger))
    record = wait_record(registry, lambda r: r.get("fault_stacks"), "r1", 0)
    fault_file = Path(record["fault_stacks"]["path"])
    earlier = 'Thread 0x00007f0000000001 (most recent call first):\n  File "train.py", line 35 in held_the_gil\n'
    with fault_file.open("a") as f:
        f.write(earlier)  # an earlier fallback's dump: the file stays at close
    path = layout.record_path(registry, "r1", 0)
    advertised = path.read_bytes()
    proc.stop_file.touch()
    wait_for(lambda: "DONE" in proc.stdout(), what="the sidecar to close")
    assert fault_file.read_text() == earlier
    path.write_bytes(advertised)  # its exit, lost: a live pid, an old heartbeat, the dump advertised
    os.utime(path, (time.time() - 60, time.time() - 60))

    code, out, err, _ = run_cli("profile", "stacks", "r1", "--registry", str(registry), "--timeout", "3", "--json",
                                env=base_env(COSMOS_PROFILER_STACKS_FALLBACK_S="0.2"))
    assert proc.proc.poll() is None, f"the signal ended the process: {proc.proc.returncode}"
    (rank0,) = json.loads(out)["ranks"]
    assert rank0["phase"] == "timeout" and rank0["source"] == "watcher", rank0
    assert ("does not catch SIGUSR2 now (the sidecar closed?): not sent, since its default action would end "
            "the process") in rank0["fallback"], rank0
    linger.touch()
    wait_for(lambda: "LINGERED" in proc.stdout(), what="the job's own work to finish")
    assert proc.proc.wait(timeout=60) == 0
