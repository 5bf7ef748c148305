"""`profile hang` beside torch's fr_trace, on hand-written dumps: fr_trace's suspects where it names them,
ours where it cannot run (no torch, or a torch without torch.distributed.flight_recorder), and gloo's
op-id counters lined up by collective sequence number. Real jobs: tests/e2e/test_fr_trace_jobs.py."""

from __future__ import annotations

import builtins

from sidecar import frtrace
from sidecar.cli.render_hang import hang_text
from sidecar.fleet import hang, torch_fr
from sidecar.fleet.torch_fr import TorchAnalysis, TorchFinding


def _doc(entries: list[tuple[int, int]], enqueued: int, completed: int) -> dict:
    """A cpu recorder whose default group holds (collective_seq_id, op_id) entries."""
    return {"available": True, "recorders": {"cpu": {
        "entries": [{"process_group": ["0", "default_pg"], "collective_seq_id": seq, "op_id": op,
                     "profiling_name": "gloo:all_reduce", "input_sizes": [[1]], "time_created_ns": 0}
                    for seq, op in entries],
        "pg_status": {"0": {"last_enqueued_collective": str(enqueued), "last_completed_collective": str(completed)}},
    }}}


def _views() -> list[hang.RankView]:
    # ops 2-4 were send/recv (not recorded on gloo): op 5 is collective 2
    waiting = hang.group_states(_doc([(1, 1), (2, 5)], 5, 4))
    left = hang.group_states(_doc([(1, 1)], 4, 4))
    files = {"cpu": "/out/profile_trace/r_fr_trace/req/cpu/rank_{}"}
    return [hang.RankView(0, groups=waiting, fr_trace={"cpu": files["cpu"].format(0)}),
            hang.RankView(1, groups=left, fr_trace={"cpu": files["cpu"].format(1)})]


def test_gloo_counts_op_ids_and_the_ranks_are_lined_up_by_sequence_number():
    (state,) = hang.group_states(_doc([(1, 1), (2, 5)], 5, 4)).values()
    assert (state.enqueued, state.completed, state.pending.seq) == (2, 1, 2)
    report = hang.analyze(_views(), "r")
    assert report.suspects == [1] and report.collective.seq == 2 and report.collective.behind == [1]


def test_fr_traces_suspects_are_taken_where_it_names_them():
    theirs = TorchAnalysis(True, ranks={"cpu": [0, 1]}, commands=["python -m x /d"], findings=[
        TorchFinding("cpu", "0", "default_pg", 2, "gloo:all_reduce", [1], [], None)])
    report = hang.analyze(_views(), "r", theirs=theirs)
    g = report.collective
    assert report.suspects == [1] and g.suspects_from == "fr_trace"
    assert g.fr_trace == "gloo:all_reduce seq 2: rank 1 did not join it"
    text = hang_text(report)
    assert "  torch's fr_trace, pg 0 default_pg: gloo:all_reduce seq 2: rank 1 did not join it." in text
    assert "  torch's analysis of these dumps: python -m x /d" in text


def test_a_torch_without_fr_trace_leaves_the_verdict_ours_and_says_why(monkeypatch):
    monkeypatch.setattr(torch_fr.importlib.util, "find_spec", lambda name: None)
    views = _views()
    theirs = torch_fr.analyze({v.rank: v.fr_trace for v in views}, {0, 1})
    assert not theirs.ran and theirs.reason.startswith("torch is not installed in this Python")
    assert theirs.commands == ["python -m torch.distributed.flight_recorder.fr_trace /out/profile_trace/r_fr_trace/req/cpu"]
    report = hang.analyze(views, "r", theirs=theirs)
    assert report.suspects == [1] and report.collective.suspects_from == "flight recorder positions"
    text = hang_text(report)
    assert text.startswith("Replica r: Rank 1 is the suspect.")
    assert "(torch's fr_trace did not run: torch is not installed in this Python" in text
    assert "the verdict is ours alone)" in text


def test_the_runner_says_why_when_torch_has_no_flight_recorder_package(monkeypatch):
    real = builtins.__import__

    def no_flight_recorder(name, *args, **kwargs):
        if name.startswith("torch.distributed.flight_recorder"):
            raise ImportError(f"No module named '{name}'")
        return real(name, *args, **kwargs)

    monkeypatch.setattr(builtins, "__import__", no_flight_recorder)
    answer = frtrace.analyze_dir("/nowhere")
    assert answer["available"] is False and "has no torch.distributed.flight_recorder" in answer["reason"]


def test_dumps_in_two_folders_are_not_read_as_one():
    dirs, why = torch_fr.directories({0: {"cpu": "/a/cpu/rank_0"}, 1: {"cpu": "/b/cpu/rank_1"}})
    assert dirs == {} and why.startswith("the ranks wrote their cpu dumps to 2 folders")
