"""The Sidecar in this process, capturing: a real capture saved (its gzip writer is a child process),
a forked child that leaves the parent's files alone, and SIGUSR1 that never kills the process."""

from __future__ import annotations

import os
import signal

import pytest

import sidecar
from sidecar.common.recordscan import read_records
from sidecar.common.registry import write_request
from sidecar.rank.core import build_sidecar
from support.traces import load_trace, profiler_steps
from support.training import train_until
from support.wait import wait_for


def test_capture_in_process_and_clean_close(env):
    with sidecar.install(output_dir=env / "out", replica="inproc") as sc:
        assert sidecar.current() is sc
        assert sidecar.install(replica="other") is sc, "a second install reuses the running sidecar"
        train_until(sc, lambda: sc.step_num >= 3)
        write_request(env / "reg", "inproc", {"id": "x", "active_steps": 2})
        train_until(sc, lambda: sc.trace_paths)
        trace = load_trace(sc.trace_paths[0])
        start = wait_for(lambda: read_records(env / "reg", "inproc")[0].capture_start_step)
        assert profiler_steps(trace) == [start + 2, start + 3]
        assert signal.getsignal(signal.SIGUSR1) == sc.signal_trigger._handle
    assert sidecar.current() is None
    # close() puts the previous handler back, but SIG_DFL would let SIGUSR1 kill the job: ignored instead
    assert signal.getsignal(signal.SIGUSR1) == signal.SIG_IGN
    record = read_records(env / "reg", "inproc")[0]
    assert record.exited_at is not None and record.num_captures == 1


@pytest.mark.filterwarnings("ignore:This process .* is multi-threaded:DeprecationWarning")
def test_a_forked_child_does_not_touch_the_parents_files(env):
    with build_sidecar(output_dir=env / "out", replica="fork").start() as sc:
        before = read_records(env / "reg", "fork")[0]
        pid = os.fork()
        if pid == 0:  # child: step and close must do nothing
            try:
                sc.step()
                sc.close()
            finally:
                os._exit(0 if sc._closed and sc.step_num == 1 else 3)
        _, status = os.waitpid(pid, 0)
        assert os.waitstatus_to_exitcode(status) == 0
        after = read_records(env / "reg", "fork")[0]
        assert after.pid == before.pid and after.exited_at is None


SIGNAL_PROGRAM = r"""
import signal, sys, threading
import sidecar

how = sys.argv[1]
if how == "after-close":
    sidecar.install(output_dir=sys.argv[2], replica="sig").close()
elif how == "thread":
    for _ in range(2):  # the warning comes once
        t = threading.Thread(target=lambda: sidecar.install(output_dir=sys.argv[2], replica="sig").close())
        t.start()
        t.join()
signal.raise_signal(signal.SIGUSR1)  # delivered to this thread and acted on before it returns: no wait
print("ALIVE", flush=True)
"""


@pytest.mark.parametrize("how", ["after-close", "thread"])
def test_sigusr1_does_not_kill_the_process(tmp_path, how):
    """After close(), and after install() from a thread (no handler can be set there),
    SIGUSR1 used to take its default action and terminate the process."""
    import subprocess

    from support.launch import PYTHON, base_env

    done = subprocess.run([PYTHON, "-c", SIGNAL_PROGRAM, how, str(tmp_path / "out")], capture_output=True, text=True,
                          timeout=120, env=base_env(tmp_path / "reg"))
    assert (done.returncode, done.stdout) == (0, "ALIVE\n"), done.stderr[-2000:]
    if how == "thread":
        warnings = [line for line in done.stderr.splitlines() if "SIGUSR1 trigger not installed" in line]
        assert len(warnings) == 1, done.stderr
        assert "install() ran in thread 'Thread-1" in warnings[0]
        assert "SIGUSR1 is ignored in this process so that it cannot kill it" in warnings[0]
