"""A capture's summary (sidecar.common.capturesummary, sidecar.traces.summary's summary_object and
rank_of_summary): the record's copy cut to fit, checked on the way in; carried through a node
record whole; read by the catalog for ranks whose traces are out of reach, and never taken for a
trace; a diff of cut summaries leaving out what they cannot tell. The real capture, its file and
the side-by-side answers are tests/e2e/test_traces_carried_real.py's."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from sidecar.common.capturesummary import (
    MAX_CARRIED_BYTES,
    MAX_ENTRY_BYTES,
    MAX_NAME_CHARS,
    MAX_OPS,
    carried_file,
    check,
    compact,
    is_cut,
    read_carried,
    size,
)
from sidecar.common.exceptions import TraceError
from sidecar.common.layout import carried_summaries_path, summary_path_for
from sidecar.common.records import RankRecord, write_record
from sidecar.traces.catalog import find_traces, traces_only
from sidecar.traces.diff import diff_traces
from sidecar.traces.summary import rank_of_summary, summarize, summarize_found, summary_object
from support.traces import step_trace


def _summary(tmp_path: Path, rank: int = 0, n: int = 0, steps=(1000.0, 1100.0)) -> dict:
    trace = step_trace(tmp_path / f"r1_{rank}" / f"{n}_trace.json.gz", rank, list(steps))
    return summary_object(summarize([trace], top_k=None).ranks[0])


def _many_ops(summary: dict, num: int, name_len: int = 40) -> dict:
    ops = [[f"op{i:04d}".ljust(name_len, "x"), 1, float(num - i), float(num - i)] for i in range(num)]
    return dict(summary, top_cpu_ops=ops, num_cpu_ops=num, top_kernels=ops, num_kernels=num)


def test_a_summary_read_back_is_the_rank_it_was_made_from(tmp_path):
    trace = step_trace(tmp_path / "r1_3" / "2_trace.json.gz", 3, [1000.0, 1500.0, 1200.0])
    rank = summarize([trace], top_k=None).ranks[0]
    data = json.loads(json.dumps(summary_object(rank)))
    back = rank_of_summary(data)
    assert back.source == "summary" and rank.source == "trace"
    back.source = "trace"
    assert back == rank and (back.rank, back.capture) == (3, 2)
    assert summary_path_for(trace) == trace.with_name("2_summary.json")


def test_compact_cuts_to_the_bound_and_says_what_it_cut(tmp_path):
    full = _many_ops(_summary(tmp_path), 500, name_len=100)
    cut = compact(full)
    assert size(cut) <= MAX_ENTRY_BYTES and cut["compact"] and not full.get("compact")
    assert 0 < len(cut["top_cpu_ops"]) < MAX_OPS and is_cut(cut, "top_cpu_ops") and not is_cut(cut, "steps")
    assert cut["top_cpu_ops"] == full["top_cpu_ops"][:len(cut["top_cpu_ops"])]  # the most self time first
    long_name = _many_ops(_summary(tmp_path), 3, name_len=5000)
    names = [op[0] for op in compact(long_name)["top_kernels"]]
    assert all(len(n) == MAX_NAME_CHARS and n.endswith("...") for n in names)
    small = _summary(tmp_path)
    assert compact(small) == dict(small, compact=True)  # a small summary travels whole
    many_steps = dict(small, steps=[[k, 1000.0, 0.0] for k in range(2000)], num_steps=2000)
    cut_steps = compact(many_steps)
    assert size(cut_steps) <= MAX_ENTRY_BYTES and is_cut(cut_steps, "steps")


@pytest.mark.parametrize(("change", "says"), [
    ({"summary_format": 2}, "summary_format"),
    ({"rank": -1}, "rank"),
    ({"rank": True}, "rank"),
    ({"steps": [[1, "x", 0.0]]}, "steps"),
    ({"steps": [[1, float("nan"), 0.0]]}, "steps"),
    ({"top_cpu_ops": [["aten::mm", 1, 1.0]]}, "top_cpu_ops"),
    ({"trace_path": None}, "trace_path"),
    ({"num_steps": "2"}, "num_steps"),
    ({"trace_url": 3}, "trace_url"),
    ({"kernel_us": -1.0}, "kernel_us"),
])
def test_check_refuses_what_is_no_summary(tmp_path, change, says):
    good = _summary(tmp_path)
    assert check(good) is good
    with pytest.raises(ValueError, match=says):
        check(dict(good, **change))
    with pytest.raises(ValueError):
        check([good])


def test_the_summaries_are_published_beside_the_record_not_in_it(tmp_path):
    """Every `replica ls` reads every record: the summaries (up to 12 KiB a rank) stay out of it, in a
    file of their own that only the analysis commands read."""
    summaries = [compact(_summary(tmp_path, rank=1, n=n)) for n in (0, 1)]
    data = carried_file("r1", 1, summaries)
    assert len(data) <= MAX_CARRIED_BYTES and read_carried(data, 1) == summaries
    with pytest.raises(ValueError, match="it holds rank 1"):
        read_carried(data, 0)
    with pytest.raises(ValueError, match="not a summaries file"):
        read_carried(b'{"summaries": []}', 1)
    assert "summaries" not in {f.name for f in dataclasses.fields(RankRecord)}
    path = carried_summaries_path(tmp_path, "r1", 300)
    assert path.relative_to(tmp_path).parts == ("replicas", "r1", "summaries", "001", "rank-300.json")


def _registry_with_summaries(tmp_path: Path, carried: dict[int, list[dict]], output_dir: str) -> Path:
    registry = tmp_path / "reg"
    for rank, summaries in carried.items():
        write_record(registry, RankRecord(replica="r1", role="policy", rank=rank, host="elsewhere", world_size=2,
                                          output_dir=output_dir))
        path = carried_summaries_path(registry, "r1", rank)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(carried_file("r1", rank, summaries))
    return registry


def test_the_catalog_reads_the_summaries_of_ranks_whose_traces_are_out_of_reach(tmp_path):
    made = tmp_path / "made" / "profile_trace"
    carried = {k: [compact(_summary(made, rank=k, n=n, steps=(1000.0 + 100 * k, 1000.0))) for n in (0, 1)]
               for k in (0, 1)}
    registry = _registry_with_summaries(tmp_path, carried, str(tmp_path / "not-here"))
    found = find_traces("r1", registry)
    assert (found.capture, found.available, found.paths, sorted(found.summaries)) == (1, [0, 1], {}, [0, 1])
    assert not any(w.startswith("not included") for w in found.warnings)
    result = summarize_found(found)
    assert "ranks 0-1: their traces are not on this machine; read from the summaries they published" in found.warnings
    assert result.from_summaries == [0, 1] and [r.path for r in result.ranks] == [
        str(made / f"r1_{k}" / "1_trace.json.gz") for k in (0, 1)]
    assert find_traces("r1", registry, capture=0).summaries[1]["capture"] == 0


def test_a_bad_published_summary_is_a_warning_and_the_others_are_read(tmp_path):
    made = tmp_path / "made" / "profile_trace"
    good = compact(_summary(made, rank=0))
    registry = _registry_with_summaries(tmp_path, {0: [good], 1: [dict(good, rank=1, steps="many")]},
                                        str(tmp_path / "not-here"))
    found = find_traces("r1", registry)
    assert sorted(found.summaries) == [0]
    assert any("rank 1 published a summary that cannot be read: its steps" in w for w in found.warnings)
    assert any(w.startswith("not included: ranks 0-1: ") for w in found.warnings)  # one directory, both ranks


def test_summary_files_are_never_taken_for_traces(tmp_path):
    loose = tmp_path / "loose"
    loose.mkdir()
    step_trace(loose / "a.json.gz", 0, [1000.0])
    (loose / "0_summary.json").write_text(json.dumps(_summary(tmp_path)))
    found = find_traces(str(loose))
    assert [p.name for p in found.paths.values()] == ["a.json.gz"]


def test_a_diff_of_cut_summaries_leaves_out_what_they_cannot_tell(tmp_path):
    made = tmp_path / "made" / "profile_trace"
    base = _many_ops(_summary(made, n=0), 8)
    new = _many_ops(_summary(made, n=1), 8)
    new["top_cpu_ops"] = [["only-new", 1, 50.0, 50.0]] + new["top_cpu_ops"]
    new["num_cpu_ops"] += 1
    # base lists its top 4 of 8 ops; new lists all 9
    base_cut = dict(base, top_cpu_ops=base["top_cpu_ops"][:4], compact=True)
    registry = _registry_with_summaries(tmp_path, {0: [base_cut, dict(new, compact=True)]}, str(tmp_path / "gone"))
    diff = diff_traces("r1", root=registry)
    names = {o.name for o in diff.ops}
    assert "only-new" not in names and names == {op[0] for op in base_cut["top_cpu_ops"]}
    assert diff.appeared["ops"] == [] and diff.vanished["ops"] == []
    assert any("ops: a summary holds only its top ops" in w for w in diff.warnings)
    assert diff.to_json()["from_summaries"] == {"base": [0], "new": [0]}


def test_no_summaries_where_the_save_writer_starts_no_child(tmp_path, monkeypatch):
    from sidecar.rank.summarizer import TraceSummarizer

    monkeypatch.setenv("COSMOS_PROFILER_SAVE_WRITER", "thread")  # JSON and gzip on the saver's thread
    logged, done = [], []
    summarizer = TraceSummarizer(0, lambda *a: done.append(a), lambda key, level, msg: logged.append((key, msg)))
    trace = step_trace(tmp_path / "r1_0" / "0_trace.json.gz", 0, [1000.0])
    summarizer.summarize(trace)
    summarizer.summarize(trace)
    assert summarizer.close(timeout=0.0) and done == []  # nothing queued, no process (this is a unit test)
    assert [k for k, _ in logged] == ["summary-thread"] * 2 and "no trace summaries" in logged[0][1]
    assert not trace.with_name("0_summary.json").exists()


def test_merge_and_export_need_the_traces_themselves(tmp_path):
    made = tmp_path / "made" / "profile_trace"
    registry = _registry_with_summaries(tmp_path, {0: [compact(_summary(made, rank=0))]}, str(tmp_path / "not-here"))
    found = find_traces("r1", registry)
    with pytest.raises(TraceError, match="no trace of capture 0 of replica r1 is on this machine: rank 0: its trace is "
                                         "not on this machine"):
        traces_only(found)
    # one rank here, one elsewhere: merge what is here, and say what is not
    here = tmp_path / "here"
    step_trace(here / "profile_trace" / "r1_1" / "0_trace.json.gz", 1, [1000.0])
    write_record(registry, RankRecord(replica="r1", role="policy", rank=1, world_size=2, output_dir=str(here)))
    found = find_traces("r1", registry)
    assert sorted(found.paths) == [1] and sorted(found.summaries) == [0]
    kept = traces_only(found)
    assert kept.summaries == {} and sorted(kept.paths) == [1] and found.summaries  # a copy
    assert kept.warnings[-1] == "not included: rank 0: its trace is not on this machine (only its summary travels, in its record)"
    assert summarize_found(found).from_summaries == [0]


def test_the_diff_and_summary_say_where_each_trace_went(tmp_path):
    from sidecar.cli.render_traces import diff_text, summary_text

    made = tmp_path / "made" / "profile_trace"
    url = "s3://b/p/profile_trace/r1_0/{n}_trace.json.gz"
    carried = [dict(compact(_summary(made, n=0)), trace_url=url.format(n=0)),
               dict(compact(_summary(made, n=1)), upload_url=url.format(n=1), upload_error="uploading failed: no")]
    registry = _registry_with_summaries(tmp_path, {0: carried}, str(tmp_path / "gone"))
    text = diff_text(diff_traces("r1", root=registry), 10)
    assert f"r1:0: rank 0: trace uploaded to {url.format(n=0)}" in text
    assert "r1:1: rank 0: trace not uploaded: uploading failed: no" in text
    found = find_traces("r1", registry, capture=0)
    assert f"  trace uploaded to {url.format(n=0)}\n" in summary_text(summarize_found(found))


def test_one_output_path_on_every_node_reads_the_ranks_here_from_traces_and_the_others_from_summaries(tmp_path):
    # Every node writes to the same path on its own disk: this machine's copy holds rank 0's traces only.
    out = tmp_path / "outputs"
    trace0 = step_trace(out / "profile_trace" / "r1_0" / "0_trace.json.gz", 0, [1000.0, 1000.0])
    elsewhere = tmp_path / "node-b" / "profile_trace"
    carried1 = compact(_summary(elsewhere, rank=1, steps=(1500.0, 1500.0)))
    registry = _registry_with_summaries(tmp_path, {0: [compact(summary_object(summarize([trace0], top_k=None).ranks[0]))],
                                                   1: [carried1]}, str(out))
    found = find_traces("r1", registry)
    assert found.paths == {0: trace0} and sorted(found.summaries) == [1] and found.missing_ranks == []
    result = summarize_found(found)
    assert [(r.rank, r.source) for r in result.ranks] == [(0, "trace"), (1, "summary")]
    assert result.straggler.rank == 1 and result.straggler.basis == "step_time"
    assert "rank 1: its trace is not on this machine; read from the summary it published" in found.warnings
