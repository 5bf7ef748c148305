"""The torch.profiler driver: one capture at a time, advanced from step boundaries.

This module holds the torch.profiler calls, and nothing else: writing what a capture recorded
is the saver side's (`rank.saver` names and saves; `rank.exporter` writes the file). Torch is
imported on the rank side only: here, by `flightrec` (the flight recorder, on a hang request),
by `forkwriter` (in its child, to write a trace's JSON) and by `autostep` (the optimizer step
hook that counts steps); `tests/test_imports.py` holds that no operator-side module imports it.
The profiler's `step_num` is seeded with the training step at which the schedule begins, so
`ProfilerStep#N` in a trace is training step N on every rank. The schedule is relative to that
step.

The training thread that calls `step()` only stops the profiler (torch collects the events
there; that cannot move) and hands the result over (`ProfilerDriver.take`). A capture without
`with_stack` runs with kineto's `trace_only`, so stop and free skip the event list torch builds
for `key_averages()`, which the sidecar never calls (summaries read the file).
"""

from __future__ import annotations

import inspect
import json
import time
from collections.abc import Callable
from typing import Any

import torch
from torch.profiler import ProfilerAction, ProfilerActivity, profile

from sidecar.common.request import ProfileRequest


def relative_schedule(base: int, wait: int, warmup: int, active: int):
    """A torch.profiler schedule over absolute step numbers starting at `base`."""

    def schedule(step: int) -> ProfilerAction:
        rel = step - base
        if rel < wait:
            return ProfilerAction.NONE
        rel -= wait
        if rel < warmup:
            return ProfilerAction.WARMUP
        rel -= warmup
        if rel < active - 1:
            return ProfilerAction.RECORD
        if rel == active - 1:
            return ProfilerAction.RECORD_AND_SAVE
        return ProfilerAction.NONE

    return schedule


def external_profiler_active() -> bool:
    """True when some profiler (the user's own, say) is already collecting."""
    try:
        return bool(torch.autograd._profiler_enabled())
    except Exception:  # noqa: BLE001 - private API; assume nothing is running
        return False


def trace_only_config(request: ProfileRequest) -> Any:
    """kineto's `trace_only` where the request allows it, else None.

    torch turns it off itself (with a warning) for `with_stack`, whose stacks
    need the post-processing; we leave it off for `with_modules` too.
    """
    if request.with_stack or request.with_modules:
        return None
    try:
        from torch._C._profiler import _ExperimentalConfig

        return _ExperimentalConfig(trace_only=True)
    except Exception:  # noqa: BLE001 - private API (torch < 2.12 has no trace_only): the default
        return None


def cuda_available() -> bool:
    try:
        return torch.cuda.is_available()
    except Exception:  # noqa: BLE001
        return False


class _SidecarProfile(profile):
    """A profile that adds our metadata when the trace starts (kineto only
    accepts metadata while a trace is being collected)."""

    sidecar_metadata: dict[str, Any] = {}
    distributed_info: dict[str, Any] = {}

    stop_s: float | None = None  # how long the profiler's stop took: `forkwriter`'s yardstick

    def start_trace(self) -> None:
        super().start_trace()
        for key, value in self.sidecar_metadata.items():
            self.add_metadata_json(key, json.dumps(value))
        # torch writes distributedInfo itself when torch.distributed is up;
        # without it, HolisticTraceAnalysis still needs the rank.
        if self.distributed_info and not _dist_initialized():
            self.add_metadata_json("distributedInfo", json.dumps(self.distributed_info))

    def stop_trace(self) -> None:
        started = time.perf_counter()
        super().stop_trace()
        self.stop_s = time.perf_counter() - started


def _dist_initialized() -> bool:
    try:
        return torch.distributed.is_available() and torch.distributed.is_initialized()
    except Exception:  # noqa: BLE001
        return False


MEMORY_HISTORY_MAX_ENTRIES = 100_000
# Allocation stacks: Python frames only. stacks="all" adds C++ frames, whose
# symbolisation when the snapshot is taken has been measured to take minutes on
# large jobs (the training thread takes the snapshot); the Python frames are what
# the memory visualizer's users read. A torch without the `stacks` argument (< 2.1)
# records its default.
MEMORY_HISTORY_STACKS = "python"


def memory_history_kwargs(record: Callable[..., Any]) -> dict[str, Any]:
    """The arguments for `torch.cuda.memory._record_memory_history`: Python stacks
    only (MEMORY_HISTORY_STACKS), where the running torch's recorder takes `stacks`."""
    kwargs: dict[str, Any] = {"max_entries": MEMORY_HISTORY_MAX_ENTRIES}
    try:
        params = inspect.signature(record).parameters.values()
        takes_stacks = any(p.name == "stacks" or p.kind is inspect.Parameter.VAR_KEYWORD for p in params)
    except (TypeError, ValueError):  # no signature to read: assume the modern recorder
        takes_stacks = True
    if takes_stacks:
        kwargs["stacks"] = MEMORY_HISTORY_STACKS
    return kwargs


class ProfilerDriver:
    """Drives one capture through wait/warmup/active.

    kind "trace": a `torch.profiler.profile`. kind "memory": CUDA allocator
    history (`torch.cuda.memory._record_memory_history`) over the active steps,
    then a snapshot for the PyTorch memory visualizer.
    """

    def __init__(self) -> None:
        self.profiler: profile | None = None
        self.request: ProfileRequest | None = None
        self.base_step = 0
        self._ready = False
        self._memory_step: int | None = None  # steps taken by a memory capture
        self._memory_recording = False

    @property
    def is_active(self) -> bool:
        return self.profiler is not None or self._memory_step is not None

    def start(
        self,
        request: ProfileRequest,
        step: int,
        metadata: dict[str, Any] | None = None,
        distributed_info: dict[str, Any] | None = None,
    ) -> None:
        """Start the capture so its schedule begins at `step`."""
        if request.kind == "memory":
            self._start_memory(request, step)
            return
        activities = [ProfilerActivity.CPU]
        if cuda_available():
            activities.append(ProfilerActivity.CUDA)
        schedule = relative_schedule(step, request.wait_steps, request.warmup_steps, request.active_steps)
        prof = _SidecarProfile(
            activities=activities,
            schedule=schedule,
            on_trace_ready=self._on_trace_ready,
            record_shapes=request.record_shape,
            profile_memory=request.profile_memory,
            with_stack=request.with_stack,
            with_modules=request.with_modules,
            experimental_config=trace_only_config(request),
        )
        # Seed the step counter (torchtitan does the same) and re-evaluate the
        # schedule there, since the constructor evaluated it at step 0.
        prof.step_num = step
        prof.current_action = schedule(step)
        prof._prev_schedule_action = prof.current_action
        prof.sidecar_metadata = dict(metadata or {})
        prof.distributed_info = dict(distributed_info or {})
        self._ready = False
        self.profiler, self.request, self.base_step = prof, request, step
        prof.start()

    def step(self) -> bool:
        """Advance one step. Returns True when the capture is complete."""
        assert self.request is not None
        if self._memory_step is not None:
            return self._step_memory()
        assert self.profiler is not None
        self.profiler.step()
        return self._ready or self.profiler.step_num - self.base_step >= self.request.num_steps

    def has_recorded(self) -> bool:
        """Whether stopping now would leave anything to save."""
        if self._memory_step is not None:
            return self._memory_recording
        if self._ready:
            return True
        return self.profiler is not None and self.profiler.current_action in (
            ProfilerAction.RECORD,
            ProfilerAction.RECORD_AND_SAVE,
        )

    def take(self) -> tuple[str, Any]:
        """Stop (if still running) and hand over the result for `exporter.export`.

        Returns:
            ("trace", the finished profile) or ("memory", an allocator snapshot).
        """
        if self._memory_step is not None:
            snapshot = torch.cuda.memory._snapshot()
            self._stop_memory()
            self.request = None
            return "memory", snapshot
        prof = self.profiler
        assert prof is not None
        if not self._ready:  # stopped early (stop_and_save) or the callback never came
            prof.stop()
        self.profiler, self.request = None, None
        return "trace", prof

    def abort(self) -> None:
        """Stop a running capture and drop what it collected."""
        if self._memory_step is not None:
            self._stop_memory()
        prof, self.profiler, self.request = self.profiler, None, None
        if prof is not None and not self._ready:
            try:
                prof.stop()
            except Exception:  # noqa: BLE001 - aborting must not raise
                pass

    # -- memory captures ----------------------------------------------------

    def _start_memory(self, request: ProfileRequest, step: int) -> None:
        if not cuda_available():
            raise RuntimeError("kind 'memory' needs CUDA, and torch.cuda.is_available() is False on this rank")
        self.request, self.base_step, self._memory_step = request, step, 0
        if request.wait_steps + request.warmup_steps == 0:
            self._begin_memory_history()

    def _step_memory(self) -> bool:
        assert self.request is not None and self._memory_step is not None
        self._memory_step += 1
        if self._memory_step == self.request.wait_steps + self.request.warmup_steps:
            self._begin_memory_history()
        return self._memory_step >= self.request.num_steps

    def _begin_memory_history(self) -> None:
        torch.cuda.memory._record_memory_history(**memory_history_kwargs(torch.cuda.memory._record_memory_history))
        self._memory_recording = True

    def _stop_memory(self) -> None:
        if self._memory_recording:
            try:
                torch.cuda.memory._record_memory_history(enabled=None)
            except Exception:  # noqa: BLE001 - turning history off must not raise
                pass
        self._memory_step, self._memory_recording = None, False

    def _on_trace_ready(self, prof: profile) -> None:
        self._ready = True
