"""sidecar.rank.runner.CaptureRunner: a capture run at step boundaries through the real torch.profiler
(a tiny CPU model), handed to the saver, and what a cancel, another profiler or an early stop leave.
The trace is written on the saver's thread with the gzip on that thread too (no process started)."""

from __future__ import annotations

import pytest
import torch

from sidecar.common.request import ProfileRequest, RankFilter
from sidecar.rank.runner import CaptureRunner
from sidecar.rank.saver import Saver
from support.rooms import advance, rank_context, was_woken
from support.traces import load_trace, profiler_steps

ADMIT = {"rank": 1, "world_size": 4, "replica": "r1", "enabled": True}


@pytest.fixture
def rank(tmp_path, monkeypatch):
    """(ctx, runner, a training step that ends at a step boundary); the runner is closed after."""
    monkeypatch.setenv("COSMOS_PROFILER_SAVE_WRITER", "thread")  # JSON and gzip on the saver's thread
    ctx = rank_context(tmp_path)
    runner = CaptureRunner(ctx, Saver(ctx))
    model = torch.nn.Linear(8, 8)
    data = torch.randn(4, 8)

    def train_step() -> int:
        model(data).sum().backward()
        step = advance(ctx)
        runner.on_boundary(step)
        return step

    yield ctx, runner, train_step
    runner.close(ctx.steps())


def _arm(ctx, **fields) -> ProfileRequest:
    request = ProfileRequest(id="req-1", rank_filter=RankFilter(frozenset({1})), **fields)
    assert ctx.capture.admit(request, step=ctx.steps(), **ADMIT).action == "armed"
    return request


def test_a_capture_starts_at_its_step_and_its_trace_holds_those_steps(rank):
    ctx, runner, train_step = rank
    _arm(ctx, start_step=3, wait_steps=0, warmup_steps=0, active_steps=2)
    train_step(), train_step()
    assert ctx.capture.state.value == "armed" and runner.profiler is None
    train_step()  # step 3: the schedule begins
    assert ctx.capture.state.value == "tracing" and runner.profiler is not None and was_woken(ctx)
    train_step(), train_step()
    assert ctx.capture.state.value in ("saving", "idle")  # handed to the saver, on its own thread
    runner.saver.join()
    fields = ctx.capture.record_fields()
    assert fields["state"] == "idle" and fields["num_captures"] == 1 and fields["capture_start_step"] == 3
    path = ctx.trace_dir / "0_trace.json.gz"
    assert fields["trace_path"] == str(path) and runner.saver.trace_paths == [str(path)]
    trace = load_trace(path)
    assert profiler_steps(trace) == [3, 4]
    meta = trace["cosmos_profiler"]
    assert (meta["replica"], meta["rank"], meta["request_id"], meta["start_step"]) == ("r1", 1, "req-1", 3)


def test_a_cancel_before_any_step_was_recorded_saves_nothing(rank):
    ctx, runner, train_step = rank
    _arm(ctx, wait_steps=3, warmup_steps=0, active_steps=1)
    train_step()
    assert ctx.capture.state.value == "tracing"
    cancel = ProfileRequest(id="stop-1", kind="cancel", rank_filter=RankFilter(None))
    assert ctx.capture.cancel(cancel, ctx.steps()).outcome == "stopping"
    train_step()
    fields = ctx.capture.record_fields()
    assert fields["state"] == "idle" and fields["cancelled"] is True and runner.profiler is None
    assert fields["cancel"]["outcome"] == "stopped" and "nothing saved" in fields["cancel"]["detail"]
    assert not ctx.trace_dir.exists() or list(ctx.trace_dir.iterdir()) == []


def test_another_profiler_running_refuses_the_capture_and_leaves_it_alone(rank):
    ctx, runner, train_step = rank
    _arm(ctx, active_steps=1)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]):
        train_step()
    fields = ctx.capture.record_fields()
    assert fields["state"] == "error" and "another torch.profiler is already running" in fields["error"]
    assert fields["refused"] == fields["error"] and fields["num_refused"] == 1 and runner.profiler is None


def test_finish_now_before_anything_was_recorded_fails_and_after_saves(rank):
    ctx, runner, train_step = rank
    _arm(ctx, wait_steps=2, warmup_steps=0, active_steps=3)
    train_step()
    assert runner.finish_now() is False
    assert ctx.capture.record_fields()["error"] == "capture req-1 stopped at step 1 before any step was recorded"
    request = ProfileRequest(id="req-2", rank_filter=RankFilter(frozenset({1})), wait_steps=0, warmup_steps=0,
                             active_steps=5)
    assert ctx.capture.admit(request, step=ctx.steps(), **ADMIT).action == "armed"
    train_step(), train_step()  # begins at step 2, records step 2
    assert runner.finish_now() is True
    runner.saver.join()
    assert ctx.capture.record_fields()["trace_path"] == str(ctx.trace_dir / "0_trace.json.gz")


def test_an_abort_fails_the_capture_and_can_settle_the_boundary(rank):
    ctx, runner, train_step = rank
    _arm(ctx, active_steps=3)
    train_step()
    assert ctx.hot._boundary_work is True and runner.profiler is not None
    runner.abort("capture failed at step 1: RuntimeError: boom", settle=True)
    fields = ctx.capture.record_fields()
    assert fields["state"] == "error" and fields["error"] == "capture failed at step 1: RuntimeError: boom"
    assert ctx.hot._boundary_work is False and runner.profiler is None
