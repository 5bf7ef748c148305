"""12. Trace summaries: what the summary child takes per trace, and what reading the published ones costs.

Each saved trace is summarized beside it by a child interpreter (`sidecar.rank.summarizer`, at
nice 19, off the training process): its wall time is measured here on kineto-like gzipped
traces of 100,000 and 1,000,000 events (14 and 140 MB of JSON; --quick: the first only), through
`TraceSummarizer` as a rank runs it. The rank then publishes its last three summaries beside its
record (`layout.carried_summaries_path`), each cut to `capturesummary.MAX_ENTRY_BYTES`: the file's
size and the time to parse and check it (what `profile summary|report|diff` pay per rank whose trace
is out of reach) are measured with 3 summaries of a trace of 60 distinct ops (cut to the top 16),
against a rank record's parse (what `replica ls` pays per rank, and still pays: the summaries are
not in the record).
"""

from __future__ import annotations

import gzip
import json
import queue
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from benchmarks.common import Row, main, median
from sidecar.common.capturesummary import carried_file, check, compact, read_carried
from sidecar.common.records import RankRecord
from sidecar.rank.summarizer import TraceSummarizer
from sidecar.traces.summary import summarize, summary_object

BENCH = "13 trace summaries"


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


def parse_us(parse: Callable[[], object], repeats: int) -> list[float]:
    parse()
    samples = []
    for _ in range(repeats):
        n = 2000
        started = time.perf_counter()
        for _ in range(n):
            parse()
        samples.append((time.perf_counter() - started) / n * 1e6)
    return samples


def _read_published(data: bytes) -> list[dict]:
    return [check(s) for s in read_carried(data, 0)]


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
        published = carried_file("r1", 0, [summary] * 3)
        base = parse_us(lambda: RankRecord.from_json(bare), 3 if quick else 5)
        three = parse_us(lambda: _read_published(published), 3 if quick else 5)
        rows.append(Row(BENCH, "published summaries parse + check, 3 summaries", median(three), "us",
                        baseline=median(base), baseline_label="the rank record", delta=f"x{median(three) / median(base):.2f}; "
                        f"{len(published):,} bytes beside a record of {len(bare):,}", samples=three,
                        note="what profile summary|report|diff pay per rank read from its summaries; replica ls "
                             "reads only the record (best case: one core, warm)",
                        extra={"record_bytes": len(bare), "published_bytes": len(published), "baseline_samples": base}))
    return rows


if __name__ == "__main__":
    main(run)
