"""sidecar.traces.merge: one timeline of the real 2-rank capture."""

from __future__ import annotations

import json
from collections import Counter

from sidecar.traces.merge import merge
from support.traces import load_trace, profiler_steps


def non_meta(events: list[dict]) -> list[dict]:
    return [e for e in events if e.get("ph") != "M"]


def test_merge_of_the_real_capture(capture, tmp_path):
    out = tmp_path / "merged" / "r1.json.gz"
    result = merge(capture.paths.values(), out)
    merged = load_trace(out)
    assert not [p for p in out.parent.iterdir() if p != out], "temp files left behind"
    events = merged["traceEvents"]
    inputs = {rank: non_meta(doc["traceEvents"]) for rank, doc in capture.docs.items()}
    assert result.ranks == [0, 1]
    assert len(non_meta(events)) == result.num_events == sum(len(e) for e in inputs.values())

    names = {e["pid"]: e["args"]["name"] for e in events if e.get("ph") == "M" and e["name"] == "process_name"}
    assert len(names) == len(set(names.values())), "each pid has one name"
    sort_index = {e["pid"]: e["args"]["sort_index"] for e in events if e["ph"] == "M" and e["name"] == "process_sort_index"}
    assert set(sort_index) == set(names)
    pids_of = {}
    for rank, rec in capture.records.items():
        label = f"rank {rank} ({rec['host']})"
        assert label in names.values()
        pids_of[rank] = {pid for pid, name in names.items() if name == label or name.startswith(label + " ")}
        main = next(pid for pid, name in names.items() if name == label)
        steps = [e for e in events if e.get("name", "").startswith("ProfilerStep#") and e["pid"] in pids_of[rank]]
        assert {e["pid"] for e in steps} == {main}, "the steps are on the rank's main track"
        assert sorted(int(e["name"].split("#")[1]) for e in steps) == profiler_steps(capture.docs[rank])
    assert not pids_of[0] & pids_of[1], "ranks share no pid"
    assert max(sort_index[p] for p in pids_of[0]) < min(sort_index[p] for p in pids_of[1])

    # every input event is there, on its rank's pids, at its time on the merged timeline
    for rank, expected in inputs.items():
        shift = result.shifts_us[rank]
        got = [e for e in non_meta(events) if e.get("pid") in pids_of[rank]]

        def key(e, shift=0.0):
            return (e.get("name"), e.get("ph"), e.get("cat"), round(e.get("ts", 0) - shift, 3), e.get("dur"))

        assert Counter(key(e, shift) for e in got) == Counter(key(e) for e in expected)
        base_in = capture.docs[rank]["baseTimeNanoseconds"]
        first_in = min(e["ts"] for e in expected if "ts" in e)
        first_out = min(e["ts"] for e in got if "ts" in e)
        assert abs((merged["baseTimeNanoseconds"] - base_in) / 1000 + first_out - first_in) < 1e-3
    flow_ids = [{e["id"] for e in events if e.get("ph") in ("s", "f") and e["pid"] in pids_of[r]} for r in (0, 1)]
    assert flow_ids[0] and flow_ids[1] and not flow_ids[0] & flow_ids[1], "flow arrows stay within a rank"

    plain = merge(capture.paths, tmp_path / "r1.json")
    assert json.loads(plain.path.read_text())["traceEvents"] == events
