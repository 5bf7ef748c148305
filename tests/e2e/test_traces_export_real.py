"""sidecar.traces.export on the real 2-rank capture: laid out flat, and read back by
HolisticTraceAnalysis when it is installed."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess

import pytest

from sidecar.common.exceptions import TraceError
from sidecar.traces.catalog import find_captures
from sidecar.traces.export import export_flat
from support.launch import PYTHON
from support.traces import profiler_steps


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
