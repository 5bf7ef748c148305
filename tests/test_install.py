"""The Sidecar in this process: install, capture, close; nothing leaks, nothing raises."""

from __future__ import annotations

import os
import signal
import time

import pytest
import torch

import sidecar
from sidecar.common.config import ProfilerConfig, SubProfilerConfig
from sidecar.common.exceptions import ConfigError
from sidecar.common.recordscan import read_records
from sidecar.common.registry import write_request
from sidecar.rank.core import build_sidecar
from support.traces import load_trace, profiler_steps
from support.wait import wait_for


def _train_until(sc, predicate, timeout=30.0):
    model = torch.nn.Linear(16, 16)
    deadline = time.monotonic() + timeout
    while not predicate():
        model(torch.randn(4, 16)).sum().backward()
        sc.step()
        time.sleep(0.002)
        assert time.monotonic() < deadline, "timed out"


def test_capture_in_process_and_clean_close(env):
    with sidecar.install(output_dir=env / "out", replica="inproc") as sc:
        assert sidecar.current() is sc
        assert sidecar.install(replica="other") is sc, "a second install reuses the running sidecar"
        _train_until(sc, lambda: sc.step_num >= 3)
        write_request(env / "reg", "inproc", {"id": "x", "active_steps": 2})
        _train_until(sc, lambda: sc.trace_paths)
        trace = load_trace(sc.trace_paths[0])
        start = wait_for(lambda: read_records(env / "reg", "inproc")[0].capture_start_step)
        assert profiler_steps(trace) == [start + 2, start + 3]
        assert signal.getsignal(signal.SIGUSR1) == sc.signal_trigger._handle
    assert sidecar.current() is None
    # close() puts the previous handler back, but SIG_DFL would let SIGUSR1 kill the job: ignored instead
    assert signal.getsignal(signal.SIGUSR1) == signal.SIG_IGN
    record = read_records(env / "reg", "inproc")[0]
    assert record.exited_at is not None and record.num_captures == 1


def test_close_twice_and_step_after_close_are_harmless(env):
    sc = build_sidecar(output_dir=env / "out", replica="c2").start()
    sc.step()
    sc.close()
    sc.close()
    for _ in range(3):
        sc.step()
    assert sc.step_num == 4


def test_close_mid_capture_aborts_and_records_it(env):
    sc = build_sidecar(output_dir=env / "out", replica="mid").start()
    write_request(env / "reg", "mid", {"id": "long", "wait_steps": 1000})
    _train_until(sc, lambda: sc.state == "tracing")
    sc.close()
    record = read_records(env / "reg", "mid")[0]
    assert record.state == "error" and "aborted: the sidecar closed" in record.error
    assert not torch.autograd._profiler_enabled()


def test_profiler_config_object_is_accepted(env):
    cfg = ProfilerConfig(enable_profiler=True, sub_profiler_config=SubProfilerConfig(active_steps=3))
    with build_sidecar(output_dir=env / "out", replica="cfg", config=cfg).start() as sc:
        assert sc.enabled and sc._ctx.defaults["active_steps"] == 3
    with pytest.raises(ConfigError, match="config must be a TOML path"):
        build_sidecar(config=42)


def test_signal_off_installs_no_handler(env, monkeypatch):
    monkeypatch.setenv("COSMOS_PROFILER_SIGNAL", "off")
    before = signal.getsignal(signal.SIGUSR1)
    with build_sidecar(output_dir=env / "out", replica="nosig").start() as sc:
        assert sc.signal_trigger is None
        assert signal.getsignal(signal.SIGUSR1) == before


def test_a_failing_capture_never_raises_into_training(env, monkeypatch):
    from sidecar.rank import driver

    def broken_start(self, request, step, **kwargs):
        raise RuntimeError("kineto exploded")

    monkeypatch.setattr(driver.ProfilerDriver, "start", broken_start)
    with build_sidecar(output_dir=env / "out", replica="boom").start() as sc:
        write_request(env / "reg", "boom", {"id": "b"})
        _train_until(sc, lambda: sc.state == "error")
        for _ in range(5):
            sc.step()
        assert "kineto exploded" in sc.record().error


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


# --- SIGUSR1 never kills the job because of the sidecar -------------------------------

SIGNAL_PROGRAM = r"""
import os, signal, sys, threading, time
import sidecar

how = sys.argv[1]
if how == "after-close":
    sidecar.install(output_dir=sys.argv[2], replica="sig").close()
elif how == "thread":
    for _ in range(2):  # the warning comes once
        t = threading.Thread(target=lambda: sidecar.install(output_dir=sys.argv[2], replica="sig").close())
        t.start()
        t.join()
os.kill(os.getpid(), signal.SIGUSR1)
deadline = time.monotonic() + 1.0
while time.monotonic() < deadline:  # a pending signal is delivered at the next bytecode boundaries
    time.sleep(0.01)
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


def test_close_restores_a_python_handler_that_was_there_before(env):
    seen = []
    previous = signal.signal(signal.SIGUSR1, lambda s, f: seen.append(s))
    try:
        build_sidecar(output_dir=env / "out", replica="prev").start().close()
        assert signal.getsignal(signal.SIGUSR1) is not signal.SIG_IGN
        os.kill(os.getpid(), signal.SIGUSR1)
        wait_for(lambda: seen, what="the previous handler to run")
    finally:
        signal.signal(signal.SIGUSR1, previous)
