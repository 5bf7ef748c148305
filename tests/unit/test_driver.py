"""The profiler driver's CUDA memory history: Python stacks only (no GPU here: the recorder is a stand-in)."""

from __future__ import annotations

import sys

import torch

from sidecar.common.request import ProfileRequest
from sidecar.rank import driver


def _record_memory(monkeypatch, recorder) -> None:
    monkeypatch.setattr(driver, "cuda_available", lambda: True)
    monkeypatch.setattr(torch.cuda.memory, "_record_memory_history", recorder)
    d = driver.ProfilerDriver()
    d.start(ProfileRequest(id="m", kind="memory", wait_steps=0, warmup_steps=0, active_steps=1), step=5)
    d.abort()


def test_memory_history_records_python_stacks_only(monkeypatch):
    calls = []

    # torch 2.13's signature
    def recorder(enabled="all", context="all", stacks="all", max_entries=sys.maxsize, device=None,
                 clear_history=False, compile_context=False, global_record_annotations=False, skip_actions=None):
        calls.append({"enabled": enabled, "stacks": stacks, "max_entries": max_entries, "context": context})

    _record_memory(monkeypatch, recorder)
    assert calls[0] == {"enabled": "all", "context": "all", "stacks": "python",
                        "max_entries": driver.MEMORY_HISTORY_MAX_ENTRIES}
    assert calls[1]["enabled"] is None  # turned off again


def test_a_recorder_without_stacks_is_called_without_it(monkeypatch):
    calls = []

    def recorder(enabled="all", context="all", max_entries=sys.maxsize, device=None):
        calls.append({"enabled": enabled, "max_entries": max_entries})

    _record_memory(monkeypatch, recorder)
    assert calls[0] == {"enabled": "all", "max_entries": driver.MEMORY_HISTORY_MAX_ENTRIES}


def test_the_running_torch_takes_stacks():
    assert driver.memory_history_kwargs(torch.cuda.memory._record_memory_history) == {
        "max_entries": driver.MEMORY_HISTORY_MAX_ENTRIES, "stacks": "python"}
