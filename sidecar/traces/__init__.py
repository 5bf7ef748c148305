"""Saved Chrome traces, read without torch: find a capture, summarize it, merge it, lay it out for HTA.

This runs in the CLI on login nodes, so it imports only the standard library.

    reader   TraceReader, iter_events: stream one trace, one event at a time; who wrote it
    catalog  find_captures: one capture of a replica in the layout <output>/profile_trace/<replica>_<rank>/
    summary  summarize: step times, top ops and kernels per rank, the straggler; render_summary
    merge    merge: one timeline, a process track per rank, on one clock
    export   export_flat: one capture as a flat folder HolisticTraceAnalysis reads

    capture = find_captures(output_dir, "r1")        # latest capture: rank -> path
    result = summarize(capture.paths.values())
    print(render_summary(result))
    merge.merge(capture.paths.values(), "r1.json.gz")
    export_flat(capture.paths, "hta/r1-0")

The public names of the modules are re-exported here, but for `merge`: `traces.merge`
is the module (its function is `traces.merge.merge`), since a function of the same
name would hide the module.
"""

from __future__ import annotations

from sidecar.layout import RANK_DIR_TEMPLATE, TRACE_DIR, TRACE_TEMPLATE
from sidecar.traces.catalog import Capture, find_captures, replicas_with_traces, trace_location
from sidecar.traces.export import export_flat
from sidecar.traces.merge import MergedTrace
from sidecar.traces.reader import CHUNK_CHARS, MAX_VALUE_CHARS, TraceReader, iter_events
from sidecar.traces.summary import (
    STRAGGLER_THRESHOLD,
    TOP_K,
    OpStat,
    RankSummary,
    StepTime,
    Straggler,
    TraceSummary,
    find_straggler,
    render_summary,
    summarize,
)

__all__ = [
    "CHUNK_CHARS",
    "MAX_VALUE_CHARS",
    "RANK_DIR_TEMPLATE",
    "STRAGGLER_THRESHOLD",
    "TOP_K",
    "TRACE_DIR",
    "TRACE_TEMPLATE",
    "Capture",
    "MergedTrace",
    "OpStat",
    "RankSummary",
    "StepTime",
    "Straggler",
    "TraceReader",
    "TraceSummary",
    "export_flat",
    "find_captures",
    "find_straggler",
    "iter_events",
    "render_summary",
    "replicas_with_traces",
    "summarize",
    "trace_location",
]
