"""sidecar.traces.summary of the real 2-rank capture: step times, self times and the straggler."""

from __future__ import annotations

import json
from collections import defaultdict

import pytest

from sidecar.cli.render_traces import summary_text
from sidecar.traces.summary import STRAGGLER_THRESHOLD, summarize
from support.traces import profiler_steps


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
