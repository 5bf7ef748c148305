"""A capture's summary as one rank writes it beside its trace and publishes it beside its record.

    <output>/profile_trace/<replica>_<rank>/<n>_summary.json   every op (sidecar.traces.summaryfile writes it)
    <registry>/replicas/<replica>/summaries/<k // 256>/rank-<k>.json
                                                               the last MAX_SUMMARIES, each `compact`ed
                                                               (`carried_file`): not in the record, which
                                                               every `replica ls` reads

One shape for both, times in microseconds as `sidecar.traces.summary.RankSummary` holds them
(JSON keeps a float exactly, so a summary read back gives the same verdict as its trace):

    {"summary_format": 1, "rank", "rank_source", "host", "replica", "role", "world_size",
     "request_id", "capture", "trace_path", "num_events",
     "steps": [[step, duration_us, collective_wait_us], ...], "num_steps",
     "top_cpu_ops": [[name, count, self_us, total_us], ...], "num_cpu_ops",
     "top_kernels": [...], "num_kernels", "cpu_op_self_us", "kernel_us", "num_collectives",
     "compact": false}

`num_steps`, `num_cpu_ops` and `num_kernels` count what the trace held; a list shorter than its
count was cut (`compact`: the published copy, at most MAX_ENTRY_BYTES). The rank adds where its
files are and went: `summary_path`, `upload_url` (where `upload_s3` sends the trace),
`trace_url` (once it is there) and `upload_error`.

Pure: no I/O. `check` is what a reader (the CLI) runs on each summary it reads.
"""

from __future__ import annotations

import json
import math
from typing import Any

SUMMARY_FORMAT = 1
MAX_SUMMARIES = 3  # a rank publishes the summaries of its last few captures
CARRIED_FORMAT = 1
MAX_CARRIED_BYTES = 64 << 10  # the published file: MAX_SUMMARIES of MAX_ENTRY_BYTES, and room
MAX_ENTRY_BYTES = 4 << 10  # one published summary, as JSON
MAX_OPS = 16  # ops and kernels a published summary keeps (the most self time first), before its size cuts more
MAX_STEPS = 64
MAX_NAME_CHARS = 200  # a longer op name (a templated kernel) is cut, ending in "..."

_STR_OR_NONE = ("host", "replica", "role", "request_id", "summary_path", "upload_url", "trace_url", "upload_error")
_INTS = ("num_events", "num_steps", "num_cpu_ops", "num_kernels", "num_collectives")
_FLOATS = ("cpu_op_self_us", "kernel_us")


def compact(full: dict[str, Any], max_bytes: int = MAX_ENTRY_BYTES) -> dict[str, Any]:
    """`full` (a summary file's object) cut to publish: at most MAX_OPS ops and kernels, names of
    at most MAX_NAME_CHARS, MAX_STEPS steps, then fewer ops until it is at most `max_bytes` as JSON."""
    out = dict(full, compact=True)
    out["steps"] = [list(s) for s in full.get("steps", [])[:MAX_STEPS]]
    cut = {key: [[_cut(op[0]), *op[1:]] for op in full.get(key, [])[:MAX_OPS]] for key in ("top_cpu_ops", "top_kernels")}
    k = MAX_OPS
    while True:
        out["top_cpu_ops"], out["top_kernels"] = cut["top_cpu_ops"][:k], cut["top_kernels"][:k]
        if k == 0 or size(out) <= max_bytes:
            break
        k //= 2
    while len(out["steps"]) > 1 and size(out) > max_bytes:
        out["steps"] = out["steps"][: len(out["steps"]) // 2]
    return out


def carried_file(replica: str, rank: int, summaries: list[dict[str, Any]]) -> bytes:
    """What a rank publishes beside its record: the summaries of its last captures, oldest first."""
    return json.dumps({"carried_format": CARRIED_FORMAT, "replica": replica, "rank": rank,
                       "summaries": summaries}, separators=(",", ":")).encode()


def read_carried(data: bytes, rank: int) -> list[Any]:
    """The summaries of a published file (`carried_file`) of rank `rank`, each still to be `check`ed.

    Raises:
        ValueError: it is no such file, or another rank's.
    """
    try:
        doc = json.loads(data)
    except (ValueError, RecursionError) as exc:
        raise ValueError(f"not JSON: {exc}") from None
    if type(doc) is not dict or doc.get("carried_format") != CARRIED_FORMAT or type(doc.get("summaries")) is not list:
        raise ValueError(f"not a summaries file of format {CARRIED_FORMAT}")
    if doc.get("rank") != rank:
        raise ValueError(f"it holds rank {doc.get('rank')!r}")
    return list(doc["summaries"])


def size(summary: dict[str, Any]) -> int:
    return len(json.dumps(summary, separators=(",", ":")))


def _cut(name: Any) -> Any:
    return name[: MAX_NAME_CHARS - 3] + "..." if isinstance(name, str) and len(name) > MAX_NAME_CHARS else name


def is_cut(summary: dict[str, Any], key: str) -> bool:
    """Whether the list `key` ("steps", "top_cpu_ops", "top_kernels") holds fewer than the trace had."""
    count = {"steps": "num_steps", "top_cpu_ops": "num_cpu_ops", "top_kernels": "num_kernels"}[key]
    return len(summary[key]) < summary[count]


def check(summary: Any) -> dict[str, Any]:
    """A summary from a published file or one beside a trace, checked: the types and ranges a reader relies on.

    Raises:
        ValueError: what is wrong with it.
    """
    if type(summary) is not dict:
        raise ValueError("a summary is not an object")
    if summary.get("summary_format") != SUMMARY_FORMAT:
        raise ValueError(f"its summary_format is {summary.get('summary_format')!r}, not {SUMMARY_FORMAT}")
    if type(summary.get("rank")) is not int or summary["rank"] < 0:
        raise ValueError(f"its rank must be an integer of at least 0, got {summary.get('rank')!r}")
    for key in ("capture", "world_size"):
        if summary.get(key) is not None and (type(summary[key]) is not int or summary[key] < 0):
            raise ValueError(f"its {key} must be an integer of at least 0 or null, got {summary[key]!r}")
    for key in ("rank_source", "trace_path"):
        if type(summary.get(key)) is not str:
            raise ValueError(f"its {key} must be a string, got {summary.get(key)!r}")
    for key in _STR_OR_NONE:
        if summary.get(key) is not None and type(summary[key]) is not str:
            raise ValueError(f"its {key} must be a string or null, got {summary[key]!r}")
    for key in _INTS:
        if type(summary.get(key)) is not int or summary[key] < 0:
            raise ValueError(f"its {key} must be an integer of at least 0, got {summary.get(key)!r}")
    for key in _FLOATS:
        if not _number(summary.get(key)):
            raise ValueError(f"its {key} must be a finite number of at least 0, got {summary.get(key)!r}")
    steps = summary.get("steps")
    if type(steps) is not list or not all(
            type(s) is list and len(s) == 3 and type(s[0]) is int and _number(s[1]) and _number(s[2]) for s in steps):
        raise ValueError("its steps must be a list of [step, duration_us, collective_wait_us]")
    for key in ("top_cpu_ops", "top_kernels"):
        ops = summary.get(key)
        if type(ops) is not list or not all(
                type(op) is list and len(op) == 4 and type(op[0]) is str and type(op[1]) is int and op[1] >= 0
                and _number(op[2]) and _number(op[3]) for op in ops):
            raise ValueError(f"its {key} must be a list of [name, count, self_us, total_us]")
    if type(summary.get("compact", False)) is not bool:
        raise ValueError("its compact must be true or false")
    return summary


def _number(value: Any) -> bool:
    return type(value) in (int, float) and math.isfinite(value) and 0 <= value <= 1e300
