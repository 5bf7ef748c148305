"""Trace analysis (sidecar.traces): real traces from a 2-rank training job, plus synthetic edge cases."""

from __future__ import annotations

import gzip
import importlib.util
import itertools
import json
import os
import subprocess
import tempfile
import tracemalloc
from collections import Counter, defaultdict
from pathlib import Path
from types import SimpleNamespace

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import PYTHON, ROOT, TrainProc, base_env, load_trace, profiler_steps, read_json, wait_for
from sidecar import traces
from sidecar.errors import SidecarError, TraceError
from sidecar.registry import record_path, write_request
from sidecar.traces.catalog import find_captures
from sidecar.traces.export import export_flat
from sidecar.traces.merge import merge
from sidecar.traces.reader import TraceReader, iter_events
from sidecar.traces.summary import STRAGGLER_THRESHOLD, render_summary, summarize

STEP_SLEEP = {0: "0.01", 1: "0.05"}  # rank 1 sleeps inside each ProfilerStep span: the straggler


@pytest.fixture(scope="module")
def capture(tmp_path_factory):
    """One real capture: two ranks of tests/programs/train.py profile 3 active steps."""
    tmp = tmp_path_factory.mktemp("capture")
    registry, out = tmp / "registry", tmp / "out"
    procs = []
    try:
        for rank, sleep in STEP_SLEEP.items():
            env = base_env(registry, RANK=str(rank), WORLD_SIZE="2")
            args = ["--replica", "r1", "--output", str(out), "--step-sleep", sleep]
            procs.append(TrainProc(tmp, f"rank{rank}", args, env))
        for rank, proc in enumerate(procs):
            proc.wait_ready()
            wait_for(lambda r=rank: (read_json(record_path(registry, "r1", r)) or {}).get("state") == "idle",
                     60, what=f"rank {rank} record")
        write_request(registry, "r1", {"rank_filter": "all", "active_steps": 3, "wait_steps": 1, "warmup_steps": 1})

        def saved(rank):
            rec = read_json(record_path(registry, "r1", rank)) or {}
            return rec if rec.get("trace_path") and rec.get("state") == "idle" else None

        records = {rank: wait_for(lambda r=rank: saved(r), 90, what=f"rank {rank} trace") for rank in STEP_SLEEP}
        for proc in procs:
            assert proc.stop() == 0
    finally:
        for proc in procs:
            proc.kill()
    paths = {rank: Path(rec["trace_path"]) for rank, rec in records.items()}
    return SimpleNamespace(out=out, paths=paths, records=records, docs={r: load_trace(p) for r, p in paths.items()})


# -- helpers -------------------------------------------------------------------


def write_trace(path: Path, events: list[dict], **meta) -> Path:
    """A Chrome trace file (gzip when the name ends in .gz)."""
    data = json.dumps({**meta, "traceEvents": events}, indent=1).encode()
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(gzip.compress(data) if path.name.endswith(".gz") else data)
    return path


def span(name, ts, dur, cat="cpu_op", pid=1, tid=1, **extra):
    return {"ph": "X", "cat": cat, "name": name, "pid": pid, "tid": tid, "ts": ts, "dur": dur, **extra}


def step_trace(path: Path, rank: int, step_us: list[float], host: str = "h", **meta) -> Path:
    events, ts = [], 0.0
    for n, dur in enumerate(step_us):
        events.append(span(f"ProfilerStep#{10 + n}", ts, dur, cat="user_annotation"))
        events.append(span("aten::mm", ts + 1, dur / 2))
        ts += dur + 5
    meta.setdefault("cosmos_profiler", {"replica": "r1", "rank": rank, "host": host})
    return write_trace(path, events, **meta)


def non_meta(events: list[dict]) -> list[dict]:
    return [e for e in events if e.get("ph") != "M"]


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


# -- real capture -------------------------------------------------------------------


def test_find_captures_finds_the_real_capture(capture):
    found = find_captures(capture.out, "r1")
    assert found.index == 0 and found.available == [0] and found.missing_ranks == []
    assert found.paths == capture.paths
    assert find_captures(capture.out / "profile_trace", "r1").paths == capture.paths
    assert find_captures(capture.paths[1].parent, "r1").paths == capture.paths
    with pytest.raises(TraceError, match="has no capture 3; captures: 0"):
        find_captures(capture.out, "r1", capture=3)
    with pytest.raises(TraceError, match=r"no traces found for replica 'r2' .*\(traces found for: r1\)"):
        find_captures(capture.out, "r2")


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

    s = summary.straggler
    assert s is not None and s.rank == 1
    assert s.slowdown >= STRAGGLER_THRESHOLD
    assert s.others_median_us == pytest.approx(summary.ranks[0].mean_step_us)
    assert s.mean_step_us == pytest.approx(summary.ranks[1].mean_step_us)

    text = render_summary(summary)
    assert "trace summary: replica r1, capture 0, 2 ranks" in text
    for r in summary.ranks:
        assert f"rank {r.rank} ({r.host})" in text
        assert all(f"#{n} " in text for n in r.step_numbers)
    assert r.top_cpu_ops[0].name in text
    assert f"straggler: rank 1 ({s.host}): mean step" in text and "threshold 10%" in text

    data = json.loads(json.dumps(summary.to_json()))
    assert data["straggler"]["rank"] == 1 and data["replica"] == "r1"
    assert [r["rank"] for r in data["ranks"]] == [0, 1]
    assert data["ranks"][1]["mean_step_us"] == pytest.approx(s.mean_step_us)
    assert data["ranks"][0]["top_cpu_ops"][0]["name"] == summary.ranks[0].top_cpu_ops[0].name


@pytest.mark.parametrize("chunk", [1, 7, 4096, traces.CHUNK_CHARS])
def test_streaming_reader_equals_json_load_on_real_traces(capture, chunk):
    for rank, path in capture.paths.items():
        doc = capture.docs[rank]
        with TraceReader(path, chunk_chars=chunk) as reader:
            header = dict(reader.header())
            events = list(reader.events())
            assert reader.is_gzip
        assert events == doc["traceEvents"]
        assert reader.metadata == {k: v for k, v in doc.items() if k != "traceEvents"}
        assert header["cosmos_profiler"]["rank"] == rank and "baseTimeNanoseconds" in header


def test_merge_of_the_real_capture(capture, tmp_path):
    out = tmp_path / "merged" / "r1.json.gz"
    result = merge(capture.paths.values(), out)
    merged = load_trace(out)
    assert not [p for p in out.parent.iterdir() if p != out], "temp files left behind"
    events = merged["traceEvents"]
    inputs = {rank: non_meta(doc["traceEvents"]) for rank, doc in capture.docs.items()}
    assert result.ranks == [0, 1]
    assert len(non_meta(events)) == result.num_events == sum(len(e) for e in inputs.values())

    names = {e["pid"]: e["args"]["name"] for e in events if e.get("ph") == "M" and e["name"] == "process_name"}
    assert len(names) == len(set(names.values())), "each pid has one name"
    sort_index = {e["pid"]: e["args"]["sort_index"] for e in events if e["ph"] == "M" and e["name"] == "process_sort_index"}
    assert set(sort_index) == set(names)
    pids_of = {}
    for rank, rec in capture.records.items():
        label = f"rank {rank} ({rec['host']})"
        assert label in names.values()
        pids_of[rank] = {pid for pid, name in names.items() if name == label or name.startswith(label + " ")}
        main = next(pid for pid, name in names.items() if name == label)
        steps = [e for e in events if e.get("name", "").startswith("ProfilerStep#") and e["pid"] in pids_of[rank]]
        assert {e["pid"] for e in steps} == {main}, "the steps are on the rank's main track"
        assert sorted(int(e["name"].split("#")[1]) for e in steps) == profiler_steps(capture.docs[rank])
    assert not pids_of[0] & pids_of[1], "ranks share no pid"
    assert max(sort_index[p] for p in pids_of[0]) < min(sort_index[p] for p in pids_of[1])

    # every input event is there, on its rank's pids, at its time on the merged timeline
    for rank, expected in inputs.items():
        shift = result.shifts_us[rank]
        got = [e for e in non_meta(events) if e.get("pid") in pids_of[rank]]

        def key(e, shift=0.0):
            return (e.get("name"), e.get("ph"), e.get("cat"), round(e.get("ts", 0) - shift, 3), e.get("dur"))

        assert Counter(key(e, shift) for e in got) == Counter(key(e) for e in expected)
        base_in = capture.docs[rank]["baseTimeNanoseconds"]
        first_in = min(e["ts"] for e in expected if "ts" in e)
        first_out = min(e["ts"] for e in got if "ts" in e)
        assert abs((merged["baseTimeNanoseconds"] - base_in) / 1000 + first_out - first_in) < 1e-3
    flow_ids = [{e["id"] for e in events if e.get("ph") in ("s", "f") and e["pid"] in pids_of[r]} for r in (0, 1)]
    assert flow_ids[0] and flow_ids[1] and not flow_ids[0] & flow_ids[1], "flow arrows stay within a rank"

    plain = merge(capture.paths, tmp_path / "r1.json")
    assert json.loads(plain.path.read_text())["traceEvents"] == events


def test_export_flat_links_the_real_capture(capture, tmp_path):
    flat = tmp_path / "hta"
    files = export_flat(capture.paths, flat)
    assert [f.name for f in files] == ["rank0.0_trace.json.gz", "rank1.0_trace.json.gz"]
    for rank, f in enumerate(files):
        assert os.path.samefile(f, capture.paths[rank]) and not f.is_symlink()
        assert f.stat().st_nlink >= 2, "a hard link on the same filesystem"
    assert export_flat(capture.paths, flat) == files, "running it again is a no-op"
    assert sorted(p.name for p in flat.iterdir()) == [f.name for f in files]

    (flat / "rank2.0_trace.json.gz").write_bytes(b"another capture")
    with pytest.raises(TraceError, match="already holds other traces.*rank2.0_trace.json.gz"):
        export_flat(capture.paths, flat)

    other = tmp_path / "other"
    other.mkdir()
    (other / "rank1.0_trace.json.gz").write_bytes(b"something else")
    with pytest.raises(TraceError, match="rank1.0_trace.json.gz already exists and is not"):
        export_flat(capture.paths, other)
    assert (other / "rank1.0_trace.json.gz").read_bytes() == b"something else"

    with pytest.raises(TraceError, match="is the trace of rank 0 .*not rank 1"):
        export_flat({1: capture.paths[0]}, tmp_path / "wrong")


@pytest.mark.skipif(importlib.util.find_spec("hta") is None, reason="HolisticTraceAnalysis is not installed")
def test_hta_reads_the_exported_capture(capture, tmp_path):
    flat = tmp_path / "hta"
    export_flat(find_captures(capture.out, "r1").paths, flat)
    # In a subprocess: HTA forks a pool and pandas warns, neither of which this test process should host.
    script = (
        "import json, sys\n"
        "from hta.trace_analysis import TraceAnalysis\n"
        "a = TraceAnalysis(trace_dir=sys.argv[1])\n"
        "print(json.dumps({'ranks': sorted(int(r) for r in a.t.traces),"
        " 'steps': sorted(int(s) for s in a.get_profiler_steps())}))\n"
    )
    run = subprocess.run([PYTHON, "-c", script, str(flat)], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(run.stdout.strip().splitlines()[-1])
    assert result["ranks"] == [0, 1]
    ours = {n for doc in capture.docs.values() for n in profiler_steps(doc)}
    assert result["steps"] and set(result["steps"]) <= ours


# -- the streaming reader ---------------------------------------------------------

_json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=5), inner, max_size=3),
    max_leaves=8,
)
_keys = st.text(max_size=8).filter(lambda k: k != "traceEvents")


@settings(max_examples=80, deadline=None)
@given(
    events=st.lists(st.dictionaries(st.text(max_size=6), _json_values, max_size=4), max_size=8),
    before=st.dictionaries(_keys, _json_values, max_size=3),
    after=st.dictionaries(_keys, _json_values, max_size=3),
    chunk=st.integers(1, 40),
    indent=st.sampled_from([None, 0, 2]),
    compress=st.booleans(),
    array_format=st.booleans(),
)
def test_streaming_reader_equals_json_load(events, before, after, chunk, indent, compress, array_format):
    after = {k: v for k, v in after.items() if k not in before}
    if array_format:
        text = json.dumps(events, indent=indent)
        before, after = {}, {}
    else:
        members = [f"{json.dumps(k)}: {json.dumps(v, indent=indent)}" for k, v in before.items()]
        members.append(f'"traceEvents": {json.dumps(events, indent=indent)}')
        members += [f"{json.dumps(k)}: {json.dumps(v, indent=indent)}" for k, v in after.items()]
        text = "{\n" + ",\n".join(members) + "\n}\n"
    assert json.loads(text) == (events if array_format else {**before, "traceEvents": events, **after})
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "t.json"
        path.write_bytes(gzip.compress(text.encode()) if compress else text.encode())
        with TraceReader(path, chunk_chars=chunk) as reader:
            assert reader.header() == before
            assert list(reader.events()) == events
            assert reader.metadata == {**before, **after}
            assert reader.is_gzip == compress


def _read_all(path: Path, chunk: int) -> list[dict]:
    with TraceReader(path, chunk_chars=chunk) as reader:
        return list(reader.events())


def test_every_cut_of_a_trace_is_a_trace_error(tmp_path):
    doc = {"schemaVersion": 1, "baseTimeNanoseconds": 17, "traceEvents": [
        span("ProfilerStep#1", 0.5, 1e3, cat="user_annotation", args={"s": "caf\u00e9 \U0001f600"}),
        {"ph": "M", "name": "process_name", "pid": 1, "args": {"name": "python"}},
    ], "traceName": "t"}
    data = json.dumps(doc, indent=1, ensure_ascii=False).encode()
    path = tmp_path / "t.json"
    packed = gzip.compress(data)
    cuts = [data[:cut] for cut in range(len(data.rstrip()))] + [packed[:cut] for cut in range(len(packed))]
    for content in cuts:
        path.write_bytes(content)
        with pytest.raises(TraceError):
            _read_all(path, chunk=3)
    path.write_bytes(data)
    assert _read_all(path, chunk=3) == doc["traceEvents"]


@settings(max_examples=200, deadline=None)
@given(flips=st.lists(st.tuples(st.integers(0, 10_000), st.integers(0, 255)), min_size=1, max_size=4))
def test_a_damaged_trace_is_read_or_a_trace_error(flips):
    events = [span("aten::mm", 1, 2), span("aten::t", 1.5, 0.5), {"ph": "s", "id": 3, "pid": 1, "ts": 1}]
    data = bytearray(json.dumps({"traceEvents": events}).encode())
    for at, byte in flips:
        data[at % len(data)] = byte
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "r1_0" / "t.json"
        path.parent.mkdir()
        for content in (bytes(data), gzip.compress(bytes(data))):
            path.write_bytes(content)
            for call in (lambda: summarize([path]), lambda: merge([path], Path(tmp) / "m.json")):
                try:
                    call()
                except TraceError:
                    pass


def _write_huge_trace(path: Path, num_events: int, pad: int = 0) -> tuple[int, int]:
    """Kineto-like: steps of 1000 us, each holding aten::linear spans (10 us) that hold aten::addmm (4 us)."""
    template = (
        '  {{\n    "ph": "X", "cat": "{cat}", "name": "{name}", "pid": 7, "tid": 7,\n'
        '    "ts": {ts}, "dur": {dur},\n    "args": {{"External id": {n}, "pad": "{pad}"}}\n  }}'
    )
    padding = "x" * pad
    num_steps = n = 0
    with open(path, "w") as f:
        f.write('{"schemaVersion": 1, "cosmos_profiler": {"rank": 0, "host": "h"},\n "traceEvents": [\n')
        ts = 0.0
        while n < num_events:
            parts = [template.format(cat="user_annotation", name=f"ProfilerStep#{num_steps}", ts=ts, dur=1000.0, n=n, pad=padding)]
            t = ts + 1
            for _ in range(49):
                parts.append(template.format(cat="cpu_op", name="aten::linear", ts=t, dur=10.0, n=n, pad=padding))
                parts.append(template.format(cat="cpu_op", name="aten::addmm", ts=t + 1, dur=4.0, n=n, pad=padding))
                t += 20
            f.write(("" if n == 0 else ",\n") + ",\n".join(parts))
            n += len(parts)
            ts += 1000.0
            num_steps += 1
        f.write('\n], "traceName": "huge"}\n')
    return n, num_steps


def test_summarize_streams_a_huge_trace_in_bounded_memory(tmp_path):
    path = tmp_path / "huge.json"
    num_events, num_steps = _write_huge_trace(path, 200_000)
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


def test_merge_streams_in_bounded_memory(tmp_path):
    path = tmp_path / "big.json"
    num_events, _ = _write_huge_trace(path, 20_000, pad=1500)
    size = path.stat().st_size
    tracemalloc.start()
    try:
        result = merge([path], tmp_path / "merged.json.gz")
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < size / 8, f"peak {peak} bytes for a {size}-byte trace"
    assert result.num_events == num_events
    assert sum(1 for e in iter_events(result.path) if e["ph"] != "M") == num_events


# -- synthetic traces ---------------------------------------------------------------


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


def test_rank_comes_from_distributed_info_then_metadata_then_directory(tmp_path):
    ours = {"replica": "r9", "rank": 3, "host": "node-a", "world_size": 8, "request_id": "q"}
    steps = [span("ProfilerStep#1", 0, 10, cat="user_annotation")]
    a = write_trace(tmp_path / "r9_7" / "0_trace.json.gz", steps, distributedInfo={"rank": 2}, cosmos_profiler=ours)
    b = write_trace(tmp_path / "r9_6" / "1_trace.json", steps, cosmos_profiler=ours | {"rank": 5})
    c = write_trace(tmp_path / "r9_4" / "0_trace.json", steps, host_name="node-k")
    d = write_trace(tmp_path / "misc" / "trace.json", steps)
    ranks = {r.path: r for r in summarize([a, b, c, d]).ranks}
    assert (ranks[str(a)].rank, ranks[str(a)].rank_source, ranks[str(a)].host) == (2, "distributedInfo", "node-a")
    assert (ranks[str(b)].rank, ranks[str(b)].rank_source, ranks[str(b)].capture) == (5, "cosmos_profiler", 1)
    assert (ranks[str(c)].rank, ranks[str(c)].rank_source, ranks[str(c)].host) == (4, "directory", "node-k")
    assert (ranks[str(c)].replica, ranks[str(d)].replica) == ("r9", None)
    assert (ranks[str(d)].rank, ranks[str(d)].rank_source, ranks[str(d)].host) == (3, "position", None)
    with pytest.raises(TraceError, match="two traces are for rank 2"):
        summarize([a, write_trace(tmp_path / "r9_2" / "0_trace.json", steps)])


def test_straggler_threshold(tmp_path):
    calls = itertools.count()

    def ranks(*means):
        root = tmp_path / str(next(calls))
        return [step_trace(root / f"r1_{k}" / "0_trace.json", k, [m, m]) for k, m in enumerate(means)]

    assert summarize(ranks(100, 100, 109, 101)).straggler is None
    s = summarize(ranks(100, 100, 112, 101)).straggler
    assert (s.rank, s.mean_step_us, s.others_median_us) == (2, 112, 100) and s.slowdown == pytest.approx(0.12)
    assert summarize(ranks(100, 100, 112, 101), threshold=0.2).straggler is None
    assert summarize(ranks(100, 300, 500)).straggler.rank == 2  # the one the most above the others
    one = summarize(ranks(100))
    assert one.straggler is None and "it takes two ranks" in render_summary(one)
    text = render_summary(summarize(ranks(100, 101)))
    assert "straggler: none (no rank's mean step time is 10% or more above the median of the others)" in text


def test_render_points_out_mixed_steps_and_requests(tmp_path):
    a = step_trace(tmp_path / "r1_0" / "0_trace.json", 0, [100, 100], cosmos_profiler={"rank": 0, "request_id": "x"})
    events = [span("ProfilerStep#99", 0, 100, cat="user_annotation")]
    b = write_trace(tmp_path / "r1_1" / "0_trace.json", events, cosmos_profiler={"rank": 1, "request_id": "y"})
    text = render_summary(summarize([a, b]))
    assert "the ranks captured different steps (rank 0: #10-#11, rank 1: #99)" in text
    assert "different requests (rank 0: x, rank 1: y)" in text
    assert "CUDA kernels: none in this trace" in text


def test_merge_lines_up_different_base_times(tmp_path):
    base = 1_700_000_000_000_000_000
    a = write_trace(tmp_path / "r1_0" / "0_trace.json", [span("a", 100.5, 1)], baseTimeNanoseconds=base + 2_000_000)
    b = write_trace(tmp_path / "r1_1" / "0_trace.json", [span("b", 100.5, 1)], baseTimeNanoseconds=base)
    # the base after the events: read before merging them
    c = tmp_path / "r1_2" / "0_trace.json"
    c.parent.mkdir()
    c.write_text(json.dumps({"traceEvents": [span("c", 100.5, 1)], "baseTimeNanoseconds": base + 1000}))
    result = merge([a, b, c], tmp_path / "m.json")
    merged = json.loads(result.path.read_text())
    assert merged["baseTimeNanoseconds"] == result.base_time_ns == base
    assert result.shifts_us == {0: 2000.0, 1: 0.0, 2: 1.0}
    ts = {e["name"]: e["ts"] for e in merged["traceEvents"] if e["ph"] == "X"}
    assert ts == {"a": 2100.5, "b": 100.5, "c": 101.5}
    names = sorted(e["args"]["name"] for e in merged["traceEvents"] if e.get("name") == "process_name")
    assert names == ["rank 0", "rank 1", "rank 2"]


def test_merge_refuses_two_traces_of_one_rank(tmp_path):
    a = step_trace(tmp_path / "a" / "t.json", 0, [1])
    with pytest.raises(TraceError, match="two traces are for rank 0"):
        merge([a, step_trace(tmp_path / "b" / "t.json", 0, [1])], tmp_path / "m.json")
    assert not (tmp_path / "m.json").exists()


def test_find_captures_groups_by_index(tmp_path):
    root = tmp_path / "out" / "profile_trace"
    layout = {"r1_0": [0, 1, 2], "r1_1": [0, 1], "r1_2": [0, 2], "r2_0": [0], "r1_x_0": [5]}
    for rank_dir, indexes in layout.items():
        for n in indexes:
            step_trace(root / rank_dir / f"{n}_trace.json.gz", 0, [1])
    (root / "r1_0" / ".3_trace.json.tmp-99").write_text("{")  # a save in progress
    (root / "r1_1" / "notes.txt").write_text("")
    latest = find_captures(tmp_path / "out", "r1")
    assert (latest.index, latest.available, latest.missing_ranks) == (2, [0, 1, 2], [1])
    assert latest.paths == {0: root / "r1_0" / "2_trace.json.gz", 2: root / "r1_2" / "2_trace.json.gz"}
    first = find_captures(root, "r1", capture=1)
    assert sorted(first.paths) == [0, 1] and first.missing_ranks == [2]
    assert find_captures(root, "r1_x").paths == {0: root / "r1_x_0" / "5_trace.json.gz"}
    with pytest.raises(TraceError, match=r"no traces found for replica 'r3' .*\(traces found for: r1, r1_x, r2\)"):
        find_captures(root, "r3")
    with pytest.raises(TraceError, match="not a directory"):
        find_captures(tmp_path / "nowhere", "r1")


def test_export_flat_falls_back_to_symlinks_then_copies(tmp_path, monkeypatch):
    paths = {k: step_trace(tmp_path / "out" / f"r1_{k}" / "0_trace.json.gz", k, [1]) for k in (0, 1)}

    def refuse(*args):
        raise OSError(18, "Invalid cross-device link")

    monkeypatch.setattr(os, "link", refuse)
    for f in export_flat(paths, tmp_path / "sym"):
        assert f.is_symlink() and os.path.isabs(os.readlink(f))
    monkeypatch.setattr(os, "symlink", refuse)
    copies = export_flat(paths, tmp_path / "copy")
    for rank, f in enumerate(copies):
        assert not f.is_symlink() and f.stat().st_nlink == 1 and f.read_bytes() == paths[rank].read_bytes()
    assert export_flat(paths, tmp_path / "copy") == copies, "an identical copy is accepted"
    assert not [p for p in (tmp_path / "copy").iterdir() if p not in copies]


def test_export_flat_adds_distributed_info_when_the_trace_names_no_rank(tmp_path):
    events = [span("ProfilerStep#4", 0, 10, cat="user_annotation")]
    src = write_trace(tmp_path / "r1_3" / "0_trace.json.gz", events, schemaVersion=1)
    (flat,) = export_flat({3: src}, tmp_path / "flat")
    assert flat.name == "rank3.0_trace.json.gz" and not os.path.samefile(flat, src)
    doc = load_trace(flat)
    assert doc["distributedInfo"] == {"rank": 3} and doc["traceEvents"] == events and doc["schemaVersion"] == 1
    first_line = gzip.decompress(flat.read_bytes()).decode().splitlines()[0]
    assert '"rank": 3' in first_line, "HTA takes the first '\"rank\": N' it sees"
    assert export_flat({3: src}, tmp_path / "flat") == [flat], "the same copy again is a no-op"
    plain = write_trace(tmp_path / "misc" / "trace.json", events)
    assert [f.name for f in export_flat({0: plain}, tmp_path / "flat2")] == ["rank0.trace.json"]


BAD_TRACES = [
    (b"", "is empty, not a Chrome trace"),
    (b"hello", "not a Chrome trace: it starts with 'h'"),
    (b'{"foo": 1}', "not a Chrome trace: it has no traceEvents array"),
    (b'{"traceEvents": 5}', "traceEvents is not an array"),
    (b"[1, 2]", "event 0 of traceEvents is a JSON number, not an object"),
    (b'{"traceEvents": [{"ph": "X"} {"ph": "X"}]}', "expected ',' or ']' between events"),
    (b'{"traceEvents": [{"ph": }]}', "malformed JSON in an event in traceEvents"),
    (b'{"traceEvents": [], "x": 1} trailing', "extra data after the end of the trace"),
    (b'{"traceEvents": [{"ph": "X", "name": "aten::mm", "ts": 1', "is truncated: it ends in the middle of an event"),
    (b'{"traceEvents": [{"ph": "X"},', "is truncated: it ends inside the traceEvents array"),
    (b'{"a": 1, "traceEvents": [], "traceEvents": []}', "two traceEvents arrays"),
    (b"\xff\xfe\x00{", "not UTF-8 text"),
]


@pytest.mark.parametrize("data, message", BAD_TRACES)
def test_malformed_traces_raise_trace_error(tmp_path, data, message):
    path = tmp_path / "r1_0" / "0_trace.json"
    path.parent.mkdir()
    path.write_bytes(data)
    for call in (lambda: summarize([path]), lambda: merge([path], tmp_path / "m.json.gz")):
        with pytest.raises(TraceError, match=message):
            call()
    assert not list(tmp_path.glob("*m.json*"))


def test_cut_and_corrupt_real_traces_raise_trace_error(capture, tmp_path):
    data = capture.paths[0].read_bytes()
    cut = tmp_path / "cut.json.gz"
    cut.write_bytes(data[: len(data) // 2])
    with pytest.raises(TraceError, match="truncated gzip file"):
        summarize([cut])
    corrupt = bytearray(data)
    corrupt[len(data) // 2 : len(data) // 2 + 64] = bytes(64)
    (tmp_path / "corrupt.json.gz").write_bytes(bytes(corrupt))
    with pytest.raises(TraceError, match="corrupt gzip data|is not a valid Chrome trace|not UTF-8"):
        summarize([tmp_path / "corrupt.json.gz"])
    text = gzip.decompress(data)
    (tmp_path / "cut.json").write_bytes(text[: int(len(text) * 0.6)])
    with pytest.raises(TraceError, match="is truncated"):
        summarize([tmp_path / "cut.json"])


def test_missing_inputs_raise_trace_error(tmp_path):
    with pytest.raises(TraceError, match="no traces to summarize"):
        summarize([])
    with pytest.raises(TraceError, match="no traces to merge"):
        merge([], tmp_path / "m.json")
    with pytest.raises(TraceError, match="no traces to export"):
        export_flat({}, tmp_path / "flat")
    with pytest.raises(TraceError, match="no such trace file"):
        summarize([tmp_path / "nope.json.gz"])
    with pytest.raises(TraceError, match="is a directory"):
        summarize([tmp_path])
    with pytest.raises(TraceError, match="no such trace file"):
        export_flat({0: tmp_path / "nope.json.gz"}, tmp_path / "flat")
    assert issubclass(TraceError, SidecarError)


def test_layout_matches_the_sidecar():
    from sidecar import core

    assert (traces.TRACE_DIR, traces.RANK_DIR_TEMPLATE, traces.TRACE_TEMPLATE) == (
        core.TRACE_DIR, core.RANK_DIR_TEMPLATE, core.TRACE_TEMPLATE
    )


def test_traces_module_imports_only_the_standard_library():
    code = (
        "import sys\n"
        "before = set(sys.modules)\n"
        "import sidecar.traces\n"
        "added = {m.split('.')[0] for m in set(sys.modules) - before}\n"
        "print(sorted(added - set(sys.stdlib_module_names) - {'sidecar'}))\n"
    )
    run = subprocess.run([PYTHON, "-c", code], capture_output=True, text=True, timeout=60, cwd=ROOT, env=base_env())
    assert run.returncode == 0, run.stderr
    assert run.stdout.strip() == "[]", "sidecar.traces must import only the standard library (no torch)"
