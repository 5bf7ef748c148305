"""The Sidecar in this process: install, capture, close; nothing leaks, nothing raises."""

from __future__ import annotations

import os
import signal
import time

import pytest
import torch

import sidecar
from sidecar.config import ProfilerConfig, SubProfilerConfig
from sidecar.core import build_sidecar
from sidecar.errors import ConfigError
from sidecar.registry import read_records, write_request
from support.traces import load_trace, profiler_steps
from support.wait import wait_for


@pytest.fixture
def env(tmp_path, monkeypatch):
    for key in list(os.environ):
        if key.startswith(("COSMOS_PROFILER_", "TORCHELASTIC_", "SLURM_")) or key in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
            monkeypatch.delenv(key)
    monkeypatch.setenv("COSMOS_PROFILER_DIR", str(tmp_path / "reg"))
    return tmp_path


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
    assert signal.getsignal(signal.SIGUSR1) == signal.SIG_DFL, "close() restores the signal handler"
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
        assert sc.enabled and sc._defaults["active_steps"] == 3
    with pytest.raises(ConfigError, match="config must be a TOML path"):
        build_sidecar(config=42)


def test_signal_off_installs_no_handler(env, monkeypatch):
    monkeypatch.setenv("COSMOS_PROFILER_SIGNAL", "off")
    with build_sidecar(output_dir=env / "out", replica="nosig").start() as sc:
        assert sc.signal_trigger is None
        assert signal.getsignal(signal.SIGUSR1) == signal.SIG_DFL


def test_a_failing_capture_never_raises_into_training(env, monkeypatch):
    from sidecar import driver

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
