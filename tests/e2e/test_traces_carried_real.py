"""Summaries that travel: each saved trace's `<n>_summary.json` beside it and the copy its rank's record
carries, and `profile summary|report|diff` answering from those copies once the traces are out of reach.

Two ranks of tests/programs/train.py take two captures (rank 1's matmul grown in the second, as
test_traces_diff_real does). Each command answers once from the trace files, then again with the
trace directory moved away (as on a CLI machine that does not see the ranks' local disks): the
numbers, the top ops and the verdict must be the same, and the output must say where they came from."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from sidecar.common.capturesummary import MAX_ENTRY_BYTES, MAX_SUMMARIES, size
from sidecar.common.layout import carried_summaries_path, summary_path_for
from sidecar.traces.summary import rank_of_summary, summarize
from support.capture import published_summaries, two_rank_capture
from support.cli import invoke
from support.launch import Spawner
from support.wait import wait_for

REQUEST = {"rank_filter": "all", "active_steps": 2, "wait_steps": 1, "warmup_steps": 1}


@pytest.fixture(scope="module")
def taken(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("carried")
    work = tmp / "work"

    def before(n: int) -> None:
        if n == 1:
            staged = tmp / "work.tmp"
            staged.write_text("256 1")
            os.replace(staged, work)

    return two_rank_capture(tmp, [(REQUEST, (0, 1)), (REQUEST, (0, 1))], args=["--work-file", str(work)],
                            before_request=before, summaries=True)


def cli_json(taken, *args: str) -> dict:
    done = invoke("profile", *args, "--json", "--registry", str(taken.registry))
    assert done.exit_code == 0, done.output
    return json.loads(done.stdout)


def cli_text(taken, *args: str) -> str:
    done = invoke("profile", *args, "--registry", str(taken.registry))
    assert done.exit_code == 0, done.output
    return done.stdout


def test_each_trace_has_its_summary_beside_it_and_in_the_record(taken):
    for n, records in enumerate(taken.captures):
        for rank, record in records.items():
            trace = Path(record["trace_path"]) if n == len(taken.captures) - 1 else \
                Path(record["trace_path"]).with_name(f"{n}_trace.json.gz")
            beside = summary_path_for(trace)
            assert beside is not None and beside.is_file()
            data = json.loads(beside.read_text())
            # the file is the CLI's own summary of that trace, every op kept
            from_file = rank_of_summary(data)
            from_trace = summarize([trace], top_k=None).ranks[0]
            assert (from_file.rank, from_file.capture, from_file.steps) == (rank, n, from_trace.steps)
            assert from_file.top_cpu_ops == from_trace.top_cpu_ops and from_file.num_collectives == from_trace.num_collectives
            assert data["num_cpu_ops"] == len(data["top_cpu_ops"]) > 0 and not data["compact"]
            carried = {s["capture"]: s for s in record["summaries"]}
            assert n in carried
            entry = carried[n]
            assert entry["compact"] and entry["summary_path"] == str(beside) and entry["trace_path"] == str(trace)
            assert size(entry) <= MAX_ENTRY_BYTES and len(record["summaries"]) <= MAX_SUMMARIES
            assert entry["steps"] == data["steps"] and entry["top_cpu_ops"] == data["top_cpu_ops"][:len(entry["top_cpu_ops"])]
    # the summary files are no traces: a rank directory still reads as two captures
    listing = cli_json(taken, "summary", str(taken.out), "--capture", "0")
    assert [r["trace_path"].endswith("/0_trace.json.gz") for r in listing["ranks"]] == [True, True]


def hide(taken) -> Path:
    """Move the traces out of reach: the records' output directory no longer holds them."""
    hidden = taken.out.parent / "elsewhere"
    os.rename(taken.out, hidden)
    return hidden


def strip(data: dict, *keys: str) -> dict:
    return {k: v for k, v in data.items() if k not in keys}


def test_same_answers_from_the_summaries_when_the_traces_are_out_of_reach(taken):
    from_files = {
        "summary": cli_json(taken, "summary", "r1"),
        "summary0": cli_json(taken, "summary", "r1", "--capture", "0", "--top", "5"),
        "diff": cli_json(taken, "diff", "r1"),
    }
    texts = {"summary": cli_text(taken, "summary", "r1"), "diff": cli_text(taken, "diff", "r1")}
    report_dir = taken.out.parent / "reports"
    report_dir.mkdir()
    report_files = cli_json(taken, "report", "r1", "-o", str(report_dir / "files.html"))
    assert from_files["summary"]["from_summaries"] == [] and {r["source"] for r in from_files["summary"]["ranks"]} == {"trace"}
    hidden = hide(taken)
    try:
        carried = {
            "summary": cli_json(taken, "summary", "r1"),
            "summary0": cli_json(taken, "summary", "r1", "--capture", "0", "--top", "5"),
            "diff": cli_json(taken, "diff", "r1"),
        }
        carried_texts = {"summary": cli_text(taken, "summary", "r1"), "diff": cli_text(taken, "diff", "r1")}
        report_carried = cli_json(taken, "report", "r1", "-o", str(report_dir / "carried.html"))
    finally:
        os.rename(hidden, taken.out)
    for key in ("summary", "summary0"):
        a, b = from_files[key], carried[key]
        assert b["from_summaries"] == [0, 1] and {r["source"] for r in b["ranks"]} == {"summary"}
        assert any("not on this machine" in w and "summar" in w for w in b["warnings"]), b["warnings"]
        assert b["straggler"] == a["straggler"]
        assert (b["replica"], b["capture"]) == (a["replica"], a["capture"])
        for ra, rb in zip(a["ranks"], b["ranks"], strict=True):
            # the rank's numbers, ops and identity, exactly; only its `source` differs (and num_events:
            # the summary says how many the trace had)
            assert strip(rb, "source") == strip(ra, "source"), (ra, rb)
    a, b = from_files["diff"], carried["diff"]
    assert b["from_summaries"] == {"base": [0, 1], "new": [0, 1]} and a["from_summaries"] == {"base": [], "new": []}
    for key in ("mean_step_s", "compute_s", "collective_wait_s", "ranks", "stand_out", "noise_s", "kernels"):
        assert b[key] == a[key], key
    assert b["ranks"] and [r["rank"] for r in b["ranks"]] == [0, 1]
    # The records hold each trace's top ops only (this program has ~47): the changes of the ops both
    # sides list are the traces' own, to the last digit, in the traces' order (the op that grew among
    # them); the ops one side does not list are left out (an op below the top may still be there, as
    # aten::cumsum, new on rank 1, is not in base's lists), and the warnings say so.
    assert all(s["num_cpu_ops"] > len(s["top_cpu_ops"]) for rec in taken.captures[1].values() for s in rec["summaries"])
    by_name = {o["name"]: o for o in a["ops"]}
    assert b["ops"] and all(by_name[o["name"]] == o for o in b["ops"])
    shown = {o["name"] for o in b["ops"]}
    assert "aten::mm" in shown and [o["name"] for o in b["ops"]] == [o["name"] for o in a["ops"] if o["name"] in shown]
    assert a["appeared"]["ops"] == ["aten::cumsum"] and b["appeared"]["ops"] == [] == b["vanished"]["ops"]
    assert any("ops: a summary holds only its top ops" in w for w in b["warnings"])
    # text: the same lines, and where the numbers come from
    assert "from the summary it published (the trace is not on this machine)" in carried_texts["summary"]
    assert "from the summary" not in texts["summary"]
    assert carried_texts["summary"].splitlines()[-1] == texts["summary"].splitlines()[-1]  # the verdict
    assert "r1:1: ranks 0-1 from the summaries they published" in carried_texts["diff"]
    assert carried_texts["diff"].splitlines()[:6] == texts["diff"].splitlines()[:6]  # the header and the split
    # report: the same verdict and split; no merged trace without a trace here
    assert report_carried["straggler"] == report_files["straggler"] and report_carried["from_summaries"] == [0, 1]
    assert report_carried["merged_trace_path"] is None and report_files["merged_trace_path"]
    for ra, rb in zip(report_files["ranks"], report_carried["ranks"], strict=True):
        assert strip(rb, "source") == strip(ra, "source") and rb["source"] == "summary"
    page = Path(report_carried["report_path"]).read_text()
    assert "not on this machine: read from the summary it published" in page


def test_a_rank_started_again_carries_the_summaries_already_beside_its_traces(taken, tmp_path):
    published = carried_summaries_path(taken.registry, "r1", 1)
    published.unlink()  # the last run's: this run publishes its own, from the files beside its traces
    spawner = Spawner(tmp_path)
    try:
        proc = spawner.rank(taken.registry, name="again", output=taken.out, env_extra={"RANK": "1", "WORLD_SIZE": "2"},
                            wait=False)
        proc.wait_ready()
        first = proc.wait_idle(taken.registry, "r1", 1)  # its first record, before any capture of this run
        assert first["num_captures"] == 0
        again = wait_for(lambda: published_summaries(taken.registry, "r1", 1) or None, 60,
                         what="rank 1 to publish the summaries beside its traces")
        assert [(s["capture"], s["trace_path"]) for s in again] == [
            (n, taken.captures[n][1]["trace_path"]) for n in (0, 1)]
        assert again == [s for n in (0, 1) for s in taken.captures[-1][1]["summaries"] if s["capture"] == n]
        assert proc.stop() == 0
    finally:
        spawner.close()
