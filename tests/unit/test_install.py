"""The Sidecar in this process: install, close, a capture aborted or failing; nothing leaks, nothing
raises. A saved capture (whose gzip writer is a child process): tests/e2e/test_install_capture.py."""

from __future__ import annotations

import os
import signal

import pytest
import torch

from sidecar.common.config import ProfilerConfig, SubProfilerConfig
from sidecar.common.exceptions import ConfigError
from sidecar.common.recordscan import read_records
from sidecar.common.registry import write_request
from sidecar.rank.core import build_sidecar
from support.training import train_until
from support.wait import wait_for


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
    train_until(sc, lambda: sc.state == "tracing")
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
        train_until(sc, lambda: sc.state == "error")
        for _ in range(5):
            sc.step()
        assert "kineto exploded" in sc.record().error


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
