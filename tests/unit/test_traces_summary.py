"""sidecar.traces.summary: step times, self times and the straggler of synthetic traces, in bounded memory."""

from __future__ import annotations

import itertools
import tracemalloc

from sidecar.cli.render_traces import summary_text
from sidecar.traces.summary import summarize
from support.traces import span, step_trace, write_huge_trace, write_trace


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
