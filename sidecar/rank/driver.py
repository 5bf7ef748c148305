"""The torch.profiler driver: one capture at a time, advanced from step boundaries.

This module holds the torch.profiler calls. Torch is imported on the rank side
only: here, by `flightrec` (the flight recorder, on a hang request), by
`forkwriter` (in its child, to write a trace's JSON) and by `autostep` (the
optimizer step hook that counts steps); `tests/test_imports.py` holds that no
operator-side module imports it. The profiler's `step_num` is seeded
with the training step at which the schedule begins, so `ProfilerStep#N` in a
trace is training step N on every rank. The schedule is relative to that step.

Saving is split so the training thread does as little as possible: the thread
that calls `step()` only stops the profiler (torch collects the events there;
that cannot move); `export()` writes the JSON and gzips it, and is meant to run
on another thread. Kineto's JSON write holds the GIL, so where it pays (a large
trace in a process that forks cheaply) a forked child writes it
(`sidecar.rank.forkwriter`). `export` then frees the collected events at once (on
its own thread, instead of whichever thread the cyclic GC next runs on, usually
the training thread; torch's free holds the GIL too), and a child process at
nice 19 gzips the JSON at level 1 (`sidecar.rank.compress`), taking neither the GIL
nor busy CPU. A capture without `with_stack` runs with kineto's `trace_only`,
so stop and free skip the event list torch builds for `key_averages()`, which
the sidecar never calls (summaries read the file).
"""

from __future__ import annotations

import errno
import inspect
import json
import os
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from torch.profiler import ProfilerAction, ProfilerActivity, profile

from sidecar.common.registry import TEMP_MARK, unlink_quietly
from sidecar.common.request import ProfileRequest
from sidecar.rank import compress, forkwriter

# Level 1: ~3x faster than the default 6 on trace JSON, files ~1.4x larger.
GZIP_LEVEL = 1


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
        """Stop (if still running) and hand over the result for `export`.

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


# Moves a finished temp file to its final name: (temp file, final path) -> where it went.
MoveIntoPlace = Callable[[Path, Path], Path]


def _replace(tmp: Path, final_path: Path) -> Path:
    os.replace(tmp, final_path)
    return final_path


def export(result: tuple[str, Any], final_path: Path, gzip_level: int = GZIP_LEVEL, place: MoveIntoPlace = _replace,
           writer: str | None = None) -> Path:
    """Write a result of `ProfilerDriver.take` to `final_path` via temp names.

    Runs off the training thread. `place(tmp, final_path)` moves the finished
    temp file to its name and returns where it went (default: a rename to
    `final_path`; the Sidecar claims the next free number instead). `writer`
    (None: `compress.default_writer()`): "auto" (a forked child writes the
    JSON where that pays, see `sidecar.rank.forkwriter`, else this thread; a child
    interpreter gzips it), "fork" (the JSON always forked), "process" (the JSON
    on this thread, the gzip in a child interpreter) or "thread" (both on this
    thread).
    On failure no file exists under the final name, and the temp files are
    removed. Returns the path of the file.
    """
    kind, payload = result
    if kind == "memory":
        return _export_memory(payload, Path(final_path), place)
    return _export_trace(payload, Path(final_path), gzip_level, place, writer)


def _temp_token() -> str:
    # pid and a random part: pids repeat on other hosts writing the same shared directory
    return f"{TEMP_MARK}{os.getpid()}-{os.urandom(4).hex()}"


def _export_memory(snapshot: Any, final_path: Path, place: MoveIntoPlace) -> Path:
    import pickle

    tmp = final_path.with_name(f".{final_path.name}{_temp_token()}")
    try:
        with open(tmp, "wb") as f:
            pickle.dump(snapshot, f)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        return place(tmp, final_path)
    finally:
        unlink_quietly(tmp)


def _export_trace(prof: profile, final_path: Path, gzip_level: int, place: MoveIntoPlace, writer: str | None) -> Path:
    writer = writer or compress.default_writer()
    token = _temp_token()
    raw_tmp = final_path.with_name(f".{final_path.stem}{token}")
    gz_tmp = final_path.with_name(f".{final_path.name}{token}")
    kineto_tmp = raw_tmp.with_name(raw_tmp.name + ".tmp")  # kineto writes here, then renames to raw_tmp
    try:
        # Kineto logs its own open/write failures and returns normally, leaving
        # no file (or an empty one). Create the temp ourselves so EACCES, EPERM,
        # ENOTDIR or EROFS surface here with their errno, and check what it wrote.
        os.close(os.open(raw_tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600))
        try:
            if not (_forks(prof, writer) and forkwriter.write(prof, raw_tmp)):
                prof.export_chrome_trace(os.fspath(raw_tmp))
        finally:
            release_events(prof)  # a forked writer has exited by now: freeing them earlier copies their pages
        if os.path.getsize(raw_tmp) == 0:
            raise _kineto_write_error(final_path.parent, raw_tmp)
        with open(raw_tmp, "rb") as src, open(gz_tmp, "wb") as raw_out:
            compress.gzip_file(src, raw_out, final_path.stem, gzip_level, writer)
            raw_out.flush()
            os.fsync(raw_out.fileno())
        os.chmod(gz_tmp, 0o644)
        return place(gz_tmp, final_path)
    finally:
        unlink_quietly(raw_tmp, kineto_tmp, gz_tmp)


def _forks(prof: profile, writer: str) -> bool:
    """Whether a forked child writes this trace: always for "fork", where it pays for "auto"."""
    if writer not in forkwriter.MODES or not forkwriter.can_fork():
        return False
    if writer == "fork":
        return True
    return forkwriter.kernel_keeps_pinned_pages() and forkwriter.worth_forking(getattr(prof, "stop_s", None))


def release_events(prof: profile) -> None:
    """Free what the profiler collected, now and on this thread.

    A finished `profile` sits in a reference cycle, so without this its events
    (as costly to free as the stop was to collect them) go when the cyclic GC
    next runs, on whichever thread triggers it: mostly the training thread.
    Freeing them here releases the GIL (torch's destructor does).
    """
    inner = getattr(prof, "profiler", None)
    if inner is not None and getattr(inner, "kineto_results", None) is not None:
        inner.kineto_results = None


def _kineto_write_error(directory: Path, path: Path) -> OSError:
    """Why torch.profiler wrote nothing: kineto does not say, so look at the filesystem."""
    try:
        full = os.statvfs(directory).f_bavail == 0
    except OSError:
        full = False
    if full:
        return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), os.fspath(path))
    return OSError(errno.EIO, "torch.profiler wrote no trace (its log above says why)", os.fspath(path))
