"""sidecar.traces.straggler: each step split into compute and collective wait, and the straggler as
the rank the others wait for, on hand-written traces (nested, parallel and boundary-crossing
collectives, NCCL kernels, the noise rule). Real torchrun jobs: tests/e2e/test_traces_straggler_real.py."""

from __future__ import annotations

import itertools
import json
import random

import pytest

from sidecar.cli.render_traces import summary_text
from sidecar.traces import straggler as straggler_module
from sidecar.traces.straggler import CollectiveIntervals, is_collective, merge_intervals
from sidecar.traces.summary import summarize
from support.traces import span, write_trace


def test_collective_names():
    for name in ("gloo:all_reduce", "gloo:broadcast", "nccl:all_reduce", "nccl:_all_gather_base", "c10d::allreduce_",
                 "c10d::barrier", "ncclDevKernel_AllReduce_Sum_f32_RING_LL",
                 "ncclKernel_AllReduce_RING_LL_Sum_float(ncclWorkElem)", "void ncclDevKernel_Generic(ncclDevComm*)"):
        assert is_collective(name), name
    for name in ("aten::mm", "ProfilerStep#3", "Memcpy DtoD", "autograd::engine::evaluate_function: AddBackward0",
                 "ampere_sgemm_128x64_nn"):
        assert not is_collective(name), name


def test_wait_is_the_union_of_collective_spans_in_each_step_window(tmp_path):
    events = [
        span("ProfilerStep#1", 0, 100, cat="user_annotation"),
        span("ProfilerStep#2", 100, 100, cat="user_annotation"),
        span("gloo:all_reduce", -50, 40, cat="user_annotation", tid=9),  # before the first step: not counted
        # step 1: two worker threads in parallel and the main thread's enqueue: 10..50, once
        span("c10d::allreduce_", 12, 2),
        span("gloo:all_reduce", 10, 30, cat="user_annotation", tid=2),
        span("gloo:all_reduce", 30, 20, cat="user_annotation", tid=3),
        span("aten::mm", 60, 20),  # compute
        # step 2: a CPU span over its NCCL kernel on the GPU (once: 120..140), and a span that crosses
        # the end of the capture (180..230: 20 in step 2, the rest in no step)
        span("nccl:all_reduce", 125, 5),
        span("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 120, 20, cat="kernel", pid=0, tid="stream 7"),
        span("gloo:all_reduce", 180, 50, cat="user_annotation", tid=2),
        span("ProfilerStep#2", 100, 100, cat="gpu_user_annotation", pid=0, tid="stream 7"),  # the GPU mirror
    ]
    random.Random(3).shuffle(events)  # any order: the union does not care
    rank = summarize([write_trace(tmp_path / "r1_0" / "0_trace.json", events)]).ranks[0]
    assert [(s.step, s.duration_us, s.collective_wait_us, s.compute_us) for s in rank.steps] == [
        (1, 100, 40, 60), (2, 100, 40, 60)]
    assert rank.num_collectives == 7
    assert (rank.mean_wait_us, rank.median_wait_us, rank.mean_compute_us) == (40, 40, 60)
    # and a span that crosses a step boundary is split between the two steps
    crossing = [span("ProfilerStep#1", 0, 100, cat="user_annotation"),
                span("ProfilerStep#2", 100, 100, cat="user_annotation"),
                span("gloo:all_reduce", 90, 30, cat="user_annotation", tid=2)]
    rank = summarize([write_trace(tmp_path / "r1_1" / "0_trace.json", crossing)]).ranks[0]
    assert [s.collective_wait_us for s in rank.steps] == [10, 20]


def test_intervals_match_brute_force_with_and_without_compaction(monkeypatch):
    rng = random.Random(7)
    spans = [(rng.randrange(0, 2000), rng.randrange(0, 30)) for _ in range(600)]
    windows = [(ts, 100) for ts in range(0, 2000, 100)] + [(150, 300), (1990, 50)]  # overlapping, past the end
    covered = {t for ts, dur in spans for t in range(ts, ts + dur)}
    expected = [sum(1 for t in range(ts, ts + dur) if t in covered) for ts, dur in windows]
    for compact_at in (1 << 16, 8):
        monkeypatch.setattr(straggler_module, "_COMPACT_AT", compact_at)
        intervals = CollectiveIntervals()
        for ts, dur in spans:
            intervals.add(ts, dur)
        assert intervals.count == 600
        assert intervals.wait_per_window(windows) == expected
    assert merge_intervals([(5, 6), (0, 2), (1, 3), (3, 4), (7, 9), (8, 8.5)]) == [(0, 4), (5, 6), (7, 9)]


_TRACE_SETS = itertools.count()


def sync_ranks(tmp_path, waits_ms, step_ms=None, steps=4):
    """One trace per rank: `steps` steps of step_ms[k] ms, each with waits_ms[k] ms in gloo:all_reduce
    on a worker thread (a list per rank: one wait per step)."""
    root = tmp_path / str(next(_TRACE_SETS))
    paths = []
    for k, wait in enumerate(waits_ms):
        step = (step_ms or [20.0] * len(waits_ms))[k] * 1000
        per_step = wait if isinstance(wait, list) else [wait] * steps
        events, ts = [], 0.0
        for n, w in enumerate(per_step):
            events.append(span(f"ProfilerStep#{10 + n}", ts, step, cat="user_annotation"))
            events.append(span("aten::mm", ts + 1, step - w * 1000 - 2))
            events.append(span("gloo:all_reduce", ts + step - w * 1000 - 1, w * 1000, cat="user_annotation", tid=2))
            ts += step
        paths.append(write_trace(root / f"r1_{k}" / "0_trace.json", events,
                                 cosmos_profiler={"replica": "r1", "rank": k, "host": f"h{k}"}))
    return summarize(paths)


def test_the_straggler_is_the_rank_the_others_wait_for_not_the_one_with_the_longest_steps(tmp_path):
    """The issue's 2-rank job: rank 1 slowed, rank 0 waiting 21.9 ms of each step in gloo:all_reduce
    against 2.5 ms on rank 1. Rank 0's steps read 20% longer (its window also holds the wait), so the
    old rule (10% over the median step time) named rank 0."""
    summary = sync_ranks(tmp_path, [21.9, 2.5], step_ms=[60.0, 50.0])
    s = summary.straggler
    assert s is not None and s.rank == 1, s
    assert (s.basis, s.host) == ("collective_wait", "h1")
    assert (s.candidate_us, s.others_us) == (2500, 21900) and s.gap_us == pytest.approx(19400)
    assert s.noise_us == pytest.approx(5500)  # 10% of the 55 ms median step
    text = summary_text(summary)
    assert text.splitlines()[-1] == (
        "straggler: rank 1 (h1): the others wait for it: rank 1 waits 2.500 ms per step in collectives, "
        "the other rank 21.900 ms (median per step), 19.400 ms more, above the noise bound 5.500 ms "
        "(10% of the 55.000 ms step, at least 1.000 ms)")
    assert "compute 38.100 ms + collective wait 21.900 ms (36% of 60.000 ms)" in text
    assert "compute 47.500 ms + collective wait 2.500 ms (5% of 50.000 ms)" in text
    data = json.loads(json.dumps(summary.to_json()))
    assert data["straggler"]["rank"] == 1 and data["straggler"]["gap_s"] == pytest.approx(0.0194)
    assert data["noise_fraction"] == 0.1 and data["noise_floor_s"] == 0.001
    r0 = data["ranks"][0]
    assert (r0["step_s"], r0["collective_wait_s"]) == pytest.approx((0.060, 0.0219))
    assert r0["compute_s"] == pytest.approx(0.0381)
    assert r0["steps"][0]["collective_wait_s"] == pytest.approx(0.0219)


def test_no_straggler_when_the_spread_is_within_the_noise(tmp_path):
    # 20 ms steps: the bound is 2 ms (10%)
    s = sync_ranks(tmp_path, [5.0, 5.5, 3.2, 5.1]).straggler
    assert s.rank is None and s.candidate == 2 and s.gap_us == pytest.approx(1900) and s.noise_us == 2000
    assert s.reason == ("rank 2 waits 3.200 ms per step in collectives, the other ranks 5.100 ms (median per step): "
                        "1.900 ms apart, within the noise bound 2.000 ms (10% of the 20.000 ms step, at least 1.000 ms)")
    assert sync_ranks(tmp_path, [5.0, 5.5, 2.9, 5.1]).straggler.rank == 2
    # short steps: the 1 ms floor holds (10% of 4 ms is 0.4 ms)
    assert sync_ranks(tmp_path, [1.6, 0.9], step_ms=[4.0, 4.0]).straggler.rank is None
    assert sync_ranks(tmp_path, [2.1, 0.9], step_ms=[4.0, 4.0]).straggler.rank == 1
    text = summary_text(sync_ranks(tmp_path, [1.6, 0.9], step_ms=[4.0, 4.0]))
    assert text.splitlines()[-1].startswith("no straggler: rank 1 waits 0.900 ms per step")


def test_one_slow_step_is_not_a_straggler_and_two_slow_ranks_are_named(tmp_path):
    # rank 0 stalled once (the others waited 30 ms in that one step): the median per step ignores it
    assert sync_ranks(tmp_path, [[2, 2, 2, 2], [2, 32, 2, 2], [2, 32, 3, 2]], step_ms=[50.0] * 3).straggler.rank is None
    # ranks 1 and 2 both slow: the least waiting is named, and the other one too in the reason
    s = sync_ranks(tmp_path, [15.0, 1.0, 1.5, 15.0]).straggler
    assert (s.rank, s.also_low) == (1, [2])
    assert s.reason.endswith("; rank 2 also waits little and may be slow too")


def test_a_rank_with_no_collectives_is_flagged_as_such(tmp_path):
    root = tmp_path / "mixed"
    sync = sync_ranks(tmp_path, [10.0, 10.0])
    bare = write_trace(root / "r1_2" / "0_trace.json",
                       [span("ProfilerStep#10", 0, 20000, cat="user_annotation"), span("aten::mm", 1, 19000)],
                       cosmos_profiler={"replica": "r1", "rank": 2})
    s = summarize([*(r.path for r in sync.ranks), bare]).straggler
    assert s.rank == 2 and "its trace holds no collective ops at all" in s.reason
