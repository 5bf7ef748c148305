"""sidecar.traces.summary: step times, self times and the straggler of a real 2-rank capture and of
synthetic traces, in bounded memory."""

from __future__ import annotations

import itertools
import json
import tracemalloc
from collections import defaultdict

import pytest

from sidecar.cli.render_traces import summary_text
from sidecar.traces.summary import STRAGGLER_THRESHOLD, summarize
from support.traces import profiler_steps, span, step_trace, write_huge_trace, write_trace


def oracle_self_times(events: list[dict], cat: str) -> dict[str, float]:
    """Self time per name by brute force: a span's direct children are the spans whose innermost
    enclosing span it is (a different method from the library's stack)."""
    threads = defaultdict(list)
    for e in events:
        if e.get("ph") == "X":
            threads[(e["pid"], e["tid"])].append(e)
    totals: dict[str, float] = defaultdict(float)
    for spans in threads.values():
        order = sorted(range(len(spans)), key=lambda i: (spans[i]["ts"], -spans[i]["dur"]))
        position = {i: k for k, i in enumerate(order)}
        children = defaultdict(float)
        for c, child in enumerate(spans):
            parents = [
                p for p, parent in enumerate(spans)
                if position[p] < position[c] and parent["ts"] <= child["ts"] < parent["ts"] + parent["dur"]
            ]
            if parents:
                children[max(parents, key=position.__getitem__)] += child["dur"]
        for i, e in enumerate(spans):
            if e.get("cat") == cat:
                totals[e["name"]] += max(0.0, e["dur"] - children[i])
    return dict(totals)


def host_steps(doc: dict) -> dict[int, float]:
    return {
        int(e["name"].split("#")[1]): e["dur"]
        for e in doc["traceEvents"]
        if e.get("ph") == "X" and e.get("name", "").startswith("ProfilerStep#") and not e.get("cat", "").startswith("gpu_")
    }


def test_summary_of_the_real_capture(capture):
    summary = summarize(capture.paths.values())
    assert [r.rank for r in summary.ranks] == [0, 1]
    assert summary.replica == "r1" and summary.capture == 0
    for r in summary.ranks:
        doc, rec = capture.docs[r.rank], capture.records[r.rank]
        assert r.rank_source in ("distributedInfo", "cosmos_profiler")  # the sidecar writes both
        assert r.host == rec["host"] and r.world_size == 2 and r.request_id == rec["request_id"]
        assert r.step_numbers == profiler_steps(doc)
        start = rec["capture_start_step"]
        assert r.step_numbers == [start + 2, start + 3, start + 4]  # wait 1, warmup 1, active 3
        assert {s.step: s.duration_us for s in r.steps} == host_steps(doc)
        assert all(s.duration_us > 0 for s in r.steps)
        assert r.num_events == len(doc["traceEvents"])

        assert 0 < len(r.top_cpu_ops) <= summary.top_k
        assert any(op.name.startswith("aten::") for op in r.top_cpu_ops)
        assert [op.self_us for op in r.top_cpu_ops] == sorted((op.self_us for op in r.top_cpu_ops), reverse=True)
        for op in r.top_cpu_ops:
            assert 0 <= op.self_us <= op.total_us and op.count >= 1
        expected = oracle_self_times(doc["traceEvents"], "cpu_op")
        for op in r.top_cpu_ops:
            assert op.self_us == pytest.approx(expected[op.name], rel=1e-9, abs=1e-6)
        assert r.cpu_op_self_us == pytest.approx(sum(expected.values()), rel=1e-9)
        top_name = max(expected, key=expected.__getitem__)
        assert r.top_cpu_ops[0].self_us == pytest.approx(expected[top_name], rel=1e-9)
        assert r.top_kernels == []  # CPU-only torch: no CUDA kernels

    # two processes that do not synchronise (no collectives): step times decide, and rank 1 sleeps more
    s = summary.straggler
    assert s.rank == 1 and s.basis == "step_time"
    assert s.gap_us / s.others_us >= STRAGGLER_THRESHOLD
    assert s.others_us == pytest.approx(summary.ranks[0].mean_step_us)
    assert s.candidate_us == pytest.approx(summary.ranks[1].mean_step_us)
    for r in summary.ranks:
        assert r.num_collectives == 0 and r.mean_wait_us == 0 and r.mean_compute_us == pytest.approx(r.mean_step_us)

    text = summary_text(summary)
    assert "trace summary: replica r1, capture 0, 2 ranks" in text
    for r in summary.ranks:
        assert f"rank {r.rank} ({r.host})" in text
        assert all(f"#{n} " in text for n in r.step_numbers)
    assert r.top_cpu_ops[0].name in text
    assert f"straggler: rank 1 ({s.host}): no collectives in the traces, so step times decide" in text
    assert "at or above the threshold 10%" in text

    data = json.loads(json.dumps(summary.to_json()))
    assert data["straggler"]["rank"] == 1 and data["replica"] == "r1"
    assert [r["rank"] for r in data["ranks"]] == [0, 1]
    assert data["ranks"][1]["mean_step_us"] == pytest.approx(s.candidate_us)
    assert data["ranks"][1]["step_s"] == pytest.approx(s.candidate_us / 1e6)
    assert data["ranks"][1]["collective_wait_s"] == 0 and data["straggler"]["basis"] == "step_time"
    assert data["ranks"][0]["top_cpu_ops"][0]["name"] == summary.ranks[0].top_cpu_ops[0].name


def test_summarize_streams_a_huge_trace_in_bounded_memory(tmp_path):
    path = tmp_path / "huge.json"
    num_events, num_steps = write_huge_trace(path, 200_000)
    size = path.stat().st_size
    tracemalloc.start()
    try:
        summary = summarize([path])
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < size / 8, f"peak {peak} bytes for a {size}-byte trace"
    rank = summary.ranks[0]
    assert rank.num_events == num_events
    assert rank.step_numbers == list(range(num_steps)) and {s.duration_us for s in rank.steps} == {1000.0}
    linear, addmm = rank.top_cpu_ops
    assert (linear.name, linear.count, linear.self_us, linear.total_us) == (
        "aten::linear", 49 * num_steps, 6.0 * 49 * num_steps, 10.0 * 49 * num_steps
    )
    assert (addmm.name, addmm.self_us, addmm.total_us) == ("aten::addmm", 4.0 * 49 * num_steps, 4.0 * 49 * num_steps)


def test_self_time_is_right_when_events_are_out_of_order(tmp_path):
    ordered = [
        span("ProfilerStep#3", 0, 100, cat="user_annotation"),
        span("aten::linear", 10, 50),
        span("aten::t", 10, 5),  # same start as its parent: the longer one is the parent
        span("aten::addmm", 20, 30),
        span("aten::copy_", 25, 10),
        span("aten::relu", 70, 20),
        span("aten::linear", 10, 8, tid=2),  # another thread: nothing nests across threads
        span("kern", 5, 40, cat="kernel", pid=0, tid="stream 7"),
        span("kern", 50, 10, cat="kernel", pid=0, tid="stream 7"),
    ]
    a = summarize([write_trace(tmp_path / "a" / "t.json", ordered)]).ranks[0]
    b = summarize([write_trace(tmp_path / "b" / "t.json", ordered[::-1])]).ranks[0]
    for r in (a, b):
        ops = {op.name: (op.count, op.self_us, op.total_us) for op in r.top_cpu_ops}
        assert ops == {
            "aten::linear": (2, 50 - 5 - 30 + 8, 58),
            "aten::t": (1, 5, 5),
            "aten::addmm": (1, 20, 30),
            "aten::copy_": (1, 10, 10),
            "aten::relu": (1, 20, 20),
        }
        assert [(k.name, k.count, k.self_us) for k in r.top_kernels] == [("kern", 2, 50)]
        assert r.kernel_us == 50 and r.step_numbers == [3]
    top2 = summarize([tmp_path / "a" / "t.json"], top_k=2).ranks[0].top_cpu_ops
    assert [op.name for op in top2] == ["aten::linear", "aten::addmm"]


def test_straggler_threshold(tmp_path):
    calls = itertools.count()

    def ranks(*means):
        root = tmp_path / str(next(calls))
        return [step_trace(root / f"r1_{k}" / "0_trace.json", k, [m, m]) for k, m in enumerate(means)]

    assert summarize(ranks(100, 100, 109, 101)).straggler.rank is None
    s = summarize(ranks(100, 100, 112, 101)).straggler
    assert (s.rank, s.candidate_us, s.others_us, s.basis) == (2, 112, 100, "step_time")
    assert summarize(ranks(100, 100, 112, 101), threshold=0.2).straggler.rank is None
    assert summarize(ranks(100, 300, 500)).straggler.rank == 2  # the one the most above the others
    one = summarize(ranks(100))
    assert one.straggler.rank is None and "no straggler: it takes two ranks" in summary_text(one)
    text = summary_text(summarize(ranks(100, 101)))
    assert ("no straggler: no collectives in the traces, so step times decide: rank 1's mean step is 0.101 ms, "
            "the median of the others' 0.100 ms: 1% slower, under the threshold 10%") in text


def test_render_points_out_mixed_steps_and_requests(tmp_path):
    a = step_trace(tmp_path / "r1_0" / "0_trace.json", 0, [100, 100], cosmos_profiler={"rank": 0, "request_id": "x"})
    events = [span("ProfilerStep#99", 0, 100, cat="user_annotation")]
    b = write_trace(tmp_path / "r1_1" / "0_trace.json", events, cosmos_profiler={"rank": 1, "request_id": "y"})
    text = summary_text(summarize([a, b]))
    assert "the ranks captured different steps (rank 0: #10-#11, rank 1: #99)" in text
    assert "different requests (rank 0: x, rank 1: y)" in text
    assert "CUDA kernels: none in this trace" in text
