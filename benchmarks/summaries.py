"""12. Trace summaries: what the summary child takes per trace, and what carrying summaries costs a record.

Each saved trace is summarized beside it by a child interpreter (`sidecar.rank.summarizer`, at
nice 19, off the training process): its wall time is measured here on kineto-like gzipped
traces of 100,000 and 1,000,000 events (14 and 140 MB of JSON; --quick: the first only), through
`TraceSummarizer` as a rank runs it. The record then carries the last three summaries, each cut to
`capturesummary.MAX_ENTRY_BYTES`: the record's size and the time to parse and check it (what
`replica ls` pays per rank) are measured with 0 and 3 summaries of a trace of 60 distinct ops
(cut to the top 16), against the same record without them.
"""

from __future__ import annotations

import gzip
import json
import queue
import shutil
import tempfile
import time
from pathlib import Path

from benchmarks.common import Row, main, median
from sidecar.common.capturesummary import compact
from sidecar.common.records import RankRecord
from sidecar.rank.summarizer import TraceSummarizer
from sidecar.traces.summary import summarize, summary_object

BENCH = "12 trace summaries"


def huge_trace(path: Path, num_events: int) -> float:
    """A kineto-like trace of `num_events` (steps of 49 aten::linear spans), gzipped at level 1; its JSON MB."""
    raw = path.with_name("raw.json")
    template = ('  {{"ph": "X", "cat": "{cat}", "name": "{name}", "pid": 7, "tid": 7, "ts": {ts}, "dur": {dur}, '
                '"args": {{"External id": {n}}}}}')
    with open(raw, "w") as f:
        f.write('{"schemaVersion": 1, "cosmos_profiler": {"rank": 0, "host": "h"},\n "traceEvents": [\n')
        n, step, ts, first = 0, 0, 0.0, True
        while n < num_events:
            parts = [template.format(cat="user_annotation", name=f"ProfilerStep#{step}", ts=ts, dur=1000.0, n=n)]
            for i in range(49):
                parts.append(template.format(cat="cpu_op", name="aten::linear", ts=ts + 1 + 20 * i, dur=10.0, n=n + i))
            f.write(("" if first else ",\n") + ",\n".join(parts))
            first, n, step, ts = False, n + 50, step + 1, ts + 1000.0
        f.write("\n]}\n")
    mb = raw.stat().st_size / 1e6
    with open(raw, "rb") as src, gzip.open(path, "wb", compresslevel=1) as out:
        shutil.copyfileobj(src, out)
    raw.unlink()
    return mb


def child_seconds(trace: Path, repeats: int) -> list[float]:
    done: queue.Queue = queue.Queue()
    summarizer = TraceSummarizer(0, lambda path, summary, error: done.put(error), lambda *args: None)
    samples = []
    try:
        for _ in range(repeats):
            started = time.perf_counter()
            summarizer.summarize(trace)
            error = done.get(timeout=900)
            samples.append(time.perf_counter() - started)
            if error:
                raise RuntimeError(error)
    finally:
        summarizer.close()
    return samples


def many_ops_summary(tmp: Path) -> dict:
    """The record's copy of a summary of a trace of 60 distinct CPU ops over 3 steps."""
    events = []
    for step in range(3):
        ts = step * 10_000.0
        events.append({"ph": "X", "cat": "user_annotation", "name": f"ProfilerStep#{step}", "ts": ts, "dur": 9000.0,
                       "pid": 1, "tid": 1})
        events += [{"ph": "X", "cat": "cpu_op", "name": f"aten::op_number_{i}", "ts": ts + 1 + 100 * i,
                    "dur": 50.0 + i, "pid": 1, "tid": 1} for i in range(60)]
    trace = tmp / "r1_0" / "0_trace.json"
    trace.parent.mkdir(parents=True, exist_ok=True)
    trace.write_text(json.dumps({"traceEvents": events, "cosmos_profiler": {"rank": 0, "host": "h"}}))
    return compact(summary_object(summarize([trace], top_k=None).ranks[0]))


def parse_us(data: bytes, repeats: int) -> list[float]:
    RankRecord.from_json(data)
    samples = []
    for _ in range(repeats):
        n = 2000
        started = time.perf_counter()
        for _ in range(n):
            RankRecord.from_json(data)
        samples.append((time.perf_counter() - started) / n * 1e6)
    return samples


def run(quick: bool) -> list[Row]:
    rows = []
    with tempfile.TemporaryDirectory(prefix="bench-summaries-") as tmp_name:
        tmp = Path(tmp_name)
        for events in (100_000,) if quick else (100_000, 1_000_000):
            trace = tmp / "r1_0" / f"{events}_trace.json.gz"
            trace.parent.mkdir(parents=True, exist_ok=True)
            mb = huge_trace(trace, events)
            samples = child_seconds(trace, 1 if quick else 3)
            rows.append(Row(BENCH, f"summary child, {mb:.0f} MB trace ({events:,} events)", median(samples), "s",
                            samples=samples, note="wall time of the child at nice 19, trace saved to summary read back",
                            extra={"trace_mb": mb, "gz_mb": trace.stat().st_size / 1e6}))
        summary = many_ops_summary(tmp)
        record = RankRecord(replica="r1", role="policy", rank=0, world_size=8, host="node-a", pid=1234,
                            output_dir="/scratch/job/outputs", trace_path="/scratch/job/outputs/profile_trace/r1_0/2_trace.json.gz",
                            history=[{"request_id": f"req-{i}", "step": 100 * i, "saved": f"/x/{i}_trace.json.gz"} for i in range(3)])
        bare = record.to_json()
        record.summaries = [summary] * 3
        carrying = record.to_json()
        base = parse_us(bare, 3 if quick else 5)
        with_three = parse_us(carrying, 3 if quick else 5)
        rows.append(Row(BENCH, "record parse + check, 3 summaries", median(with_three), "us", baseline=median(base),
                        baseline_label="no summaries", delta=f"x{median(with_three) / median(base):.2f}; "
                        f"{len(bare):,} -> {len(carrying):,} bytes", samples=with_three,
                        note="what replica ls pays per rank (best case: one core, warm)",
                        extra={"bytes_without": len(bare), "bytes_with": len(carrying), "baseline_samples": base}))
    return rows


if __name__ == "__main__":
    main(run)
