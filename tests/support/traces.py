"""Chrome traces: read back (`load_trace`, `profiler_steps`) and written by hand for the
tests/unit/test_traces_*.py modules (`write_trace`, `span`, `step_trace`, `write_huge_trace`).

The real 2-rank capture the tests/e2e/test_traces_*_real.py modules share is tests/e2e/conftest.py's
`capture` fixture.
"""

from __future__ import annotations

import gzip
import json
import re
from pathlib import Path
from typing import Any


def load_trace(path: Path) -> dict[str, Any]:
    with gzip.open(path, "rb") as f:
        return json.load(f)


def profiler_steps(trace: dict[str, Any]) -> list[int]:
    """The N of every `ProfilerStep#N` span in a Chrome trace, sorted, unique."""
    steps = set()
    for event in trace["traceEvents"]:
        match = re.fullmatch(r"ProfilerStep#(\d+)", str(event.get("name", "")))
        if match and event.get("ph") == "X":
            steps.add(int(match.group(1)))
    return sorted(steps)


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


def write_huge_trace(path: Path, num_events: int, pad: int = 0) -> tuple[int, int]:
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
