"""sidecar.traces.export on hand-written captures: a capture laid out flat for HolisticTraceAnalysis.
The real capture, read back by HTA: tests/e2e/test_traces_export_real.py."""

from __future__ import annotations

import gzip
import os

from sidecar.traces.export import export_flat
from support.traces import load_trace, span, step_trace, write_trace


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
