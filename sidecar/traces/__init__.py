"""Saved Chrome traces, read without torch: find a capture, summarize it, merge it, lay it out for HTA.

This runs in the CLI on login nodes, so it imports only the standard library.

    reader   TraceReader, iter_events: stream one trace, one event at a time; who wrote it
    catalog  find_captures: one capture of a replica in <output>/profile_trace/<replica>_<rank>/;
             find_traces: a trace file, a directory or a replica name (via the registry) -> a FoundCapture;
             find_pair: the two captures of a diff (default_pair picks them for one side)
    summary  summarize: step times, compute vs collective wait, top ops and kernels per rank, the
             straggler
    straggler  each step's collective wait (CollectiveIntervals), the straggler verdict (find_straggler)
    merge    merge: one timeline, a process track per rank, on one clock
    export   export_flat: one capture as a flat folder HolisticTraceAnalysis reads
    page     build_page: one capture as one self-contained HTML page (bars, verdict, top ops, links);
             build_diff_page: a diff as one; not imported here (only `profile report` and `profile diff -o`
             need it): `from sidecar.traces.htmlreport import ...`
    diff     diff_traces: two captures (BASE [NEW]; find_pair finds them) -> what changed;
             not imported here either: `from sidecar.traces.diff import ...`

Each of summary, merge, export and page also has the function `profile summary|merge|export|report`
calls: `summarize_traces`, `merge_traces`, `export_traces`, `report_traces` (find_traces, then the above;
`diff_traces`: find_pair, then the diff).

    capture = find_captures(output_dir, "r1")        # latest capture: rank -> path
    result = summarize(capture.paths.values())
    merge.merge(capture.paths.values(), "r1.json.gz")
    export_flat(capture.paths, "hta/r1-0")

The modules' public names are re-exported here, but for `merge`: `traces.merge` is
the module (its function is `traces.merge.merge`), since a function of that name
would hide the module.
"""

from __future__ import annotations

import importlib
from typing import Any

from sidecar.common.layout import RANK_DIR_TEMPLATE, TRACE_DIR, TRACE_TEMPLATE

# The re-exported names, by module, imported on first use (PEP 562): the CLI's
# a command that needs one of them does not pay for the rest.
_EXPORTS = {
    "catalog": ("Capture", "FoundCapture", "find_captures", "find_pair", "find_traces", "replicas_with_traces",
                "trace_location"),
    "export": ("ExportResult", "export_flat", "export_traces"),
    "merge": ("MergedTrace", "MergeResult", "merge_traces"),
    "reader": ("CHUNK_CHARS", "MAX_VALUE_CHARS", "TraceReader", "iter_events"),
    "summary": ("STRAGGLER_THRESHOLD", "TOP_K", "OpStat", "RankSummary", "StepTime", "Straggler", "TraceSummary",
                "find_straggler", "summarize", "summarize_traces"),
    "straggler": ("NOISE_FLOOR_US", "NOISE_FRACTION", "CollectiveIntervals", "is_collective"),
}
_MODULE_OF = {name: module for module, names in _EXPORTS.items() for name in names}


def __getattr__(name: str) -> Any:
    module = _MODULE_OF.get(name)
    if module is not None:
        value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
        globals()[name] = value
        return value
    if name in _EXPORTS:  # a submodule (`traces.merge` is the module)
        return importlib.import_module(f"{__name__}.{name}")
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


__all__ = [
    "CHUNK_CHARS",
    "MAX_VALUE_CHARS",
    "NOISE_FLOOR_US",
    "NOISE_FRACTION",
    "RANK_DIR_TEMPLATE",
    "STRAGGLER_THRESHOLD",
    "TOP_K",
    "TRACE_DIR",
    "TRACE_TEMPLATE",
    "Capture",
    "CollectiveIntervals",
    "ExportResult",
    "FoundCapture",
    "MergeResult",
    "MergedTrace",
    "OpStat",
    "RankSummary",
    "StepTime",
    "Straggler",
    "TraceReader",
    "TraceSummary",
    "export_flat",
    "export_traces",
    "find_captures",
    "find_pair",
    "find_straggler",
    "find_traces",
    "is_collective",
    "iter_events",
    "merge_traces",
    "replicas_with_traces",
    "summarize",
    "summarize_traces",
    "trace_location",
]
