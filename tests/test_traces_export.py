"""sidecar.traces.export: a capture laid out flat for HolisticTraceAnalysis, read back by HTA when it is installed."""

from __future__ import annotations

import gzip
import importlib.util
import json
import os
import subprocess

import pytest

from sidecar.common.exceptions import TraceError
from sidecar.traces.catalog import find_captures
from sidecar.traces.export import export_flat
from support.launch import PYTHON
from support.traces import load_trace, profiler_steps, span, step_trace, write_trace


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
