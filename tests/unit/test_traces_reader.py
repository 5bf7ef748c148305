"""sidecar.traces.reader: the streaming reader against json.load on generated traces, damaged and
malformed files, and who wrote a trace."""

from __future__ import annotations

import gzip
import json
import tempfile
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from sidecar.common.exceptions import SidecarError, TraceError
from sidecar.traces.export import export_flat
from sidecar.traces.merge import merge
from sidecar.traces.reader import TraceReader
from sidecar.traces.summary import summarize
from support.traces import span, write_trace

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
