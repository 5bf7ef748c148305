"""One rank's summary of one capture, written as a file beside its trace.

    write_beside(trace)            # <n>_summary.json beside <n>_trace.json.gz: summarize, every op kept

The shape is `sidecar.common.capturesummary`'s; `sidecar.traces.summary` turns a RankSummary into
one (`summary_object`) and back (`rank_of_summary`). The rank writes the file in a child process
once the trace is saved (`sidecar.rank.summarizer` runs `python -c` with `main`), with the
`summarize` the CLI runs on a trace, so both say the same.
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from sidecar.common.exceptions import TraceError
from sidecar.common.layout import summary_path_for
from sidecar.common.registry import atomic_write
from sidecar.traces.summary import summarize, summary_object

__all__ = ["main", "write_beside"]


def write_beside(trace: str | os.PathLike[str]) -> Path:
    """Summarize one saved trace (every op) into `<n>_summary.json` beside it, atomically.

    Raises:
        TraceError: the trace cannot be read, or is not named `<n>_trace.json[.gz]`.
        OSError: the summary cannot be written.
    """
    path = Path(trace)
    out = summary_path_for(path)
    if out is None:
        raise TraceError(f"{path} is not named <n>_trace.json.gz: its summary has no name")
    rank = summarize([path], top_k=None).ranks[0]
    atomic_write(out, (json.dumps(summary_object(rank), separators=(",", ":")) + "\n").encode())
    return out


def main(argv: Sequence[str]) -> int:
    """`write_beside(argv[0])`; prints the summary's path. 1 with the reason on stderr when it fails."""
    try:
        print(write_beside(argv[0]))
    except (TraceError, OSError) as exc:
        sys.stderr.write(f"{exc}\n")
        return 1
    return 0
