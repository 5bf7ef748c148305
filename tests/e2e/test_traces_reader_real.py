"""sidecar.traces.reader on the real 2-rank capture: the streaming reader equals json.load, and every
cut or corruption of a real trace is a TraceError."""

from __future__ import annotations

import gzip

import pytest

from sidecar.common.exceptions import TraceError
from sidecar.traces.reader import CHUNK_CHARS, TraceReader
from sidecar.traces.summary import summarize


@pytest.mark.parametrize("chunk", [1, 7, 4096, CHUNK_CHARS])
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
