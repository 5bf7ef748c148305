"""What the CLI says comes from cli/render*, built from the library's data: the busy sentence, a
cancel's answer, why `profile set --wait` failed, the error -> exit mapping, the analysis lines."""

from __future__ import annotations

import click
import pytest

from sidecar.cli import render, render_refusal
from sidecar.cli.errors import CliError, VerbatimError, refused, usage_error
from sidecar.cli.render_traces import capture_name, diff_written_line
from sidecar.common.exceptions import BadOption, BusyRequest, RegistryError, ReplicaBusy
from sidecar.fleet.answers import CancelAnswer, RankCancel, RankCapture
from sidecar.fleet.follow import SetFollowed


def test_busy_text_names_each_request_and_the_cancel_command_as_typed():
    busy = ReplicaBusy("r1", [BusyRequest("a", (0, 1, 2, 5), 50, "tracing"), BusyRequest("b", (3,), None, "armed")])
    assert busy.replica == "r1" and [r.request_id for r in busy.requests] == ["a", "b"]
    assert render_refusal.busy_text(busy, " --registry /reg") == (
        "Replica r1 is busy with request a (ranks 0-2,5, start step 50, phase tracing) and request b (ranks 3, "
        "start step next, phase armed). `cosmos-profiler profile cancel r1 --registry /reg` ends them.")
    assert render_refusal.busy_text(ReplicaBusy("r2", [BusyRequest("c", (0,), 7, "saving")])).endswith(
        "`cosmos-profiler profile cancel r2` ends it.")


def test_a_cancelled_capture_says_which_cancel_and_what_the_rank_did_in_text_and_json():
    answer = CancelAnswer(id="cli-c", outcome="stopped", request_id="cli-a", step=9, trace_path="/t/0_trace.json.gz")
    capture = RankCapture(rank=0, phase="cancelled", cancelled_by=answer)
    words = "cancelled by request cli-c (stopped request cli-a after step 9; saved the steps recorded so far to " \
            "/t/0_trace.json.gz)"
    assert render.capture_error(capture) == words
    assert render.describe_capture(capture) == f"rank 0: cancelled: {words}"
    data = render.capture_json(capture)
    assert data["error"] == words and "cancelled_by" not in data and "trace_url" not in data


def test_a_cancel_answer_is_text_in_json_and_empty_before_the_rank_saw_it():
    done = RankCancel(rank=1, phase="done", answer=CancelAnswer(outcome="nothing to cancel", state="idle"))
    assert render.describe_cancel(done) == "rank 1: nothing to cancel (idle)"
    assert render.cancel_answer_json(done)["text"] == "nothing to cancel (idle)"
    pending = render.cancel_answer_json(RankCancel(rank=2, phase="pending"))
    assert pending["text"] == "" and "answer" not in pending


def test_why_profile_set_wait_failed():
    saved = RankCapture(rank=0, phase="saved", trace_path="/t/0.json.gz")
    dead = RankCapture(rank=1, phase="dead", error="process gone before saving")
    assert render.set_failure(SetFollowed("capture", "x", [saved], 60.0), "r1") is None
    assert render.set_failure(SetFollowed("baseline", "w.baseline", [saved, dead], 60.0), "r1") == (
        "rank 1 did not finish (rank 1: dead: process gone before saving)")
    assert render.set_failure(SetFollowed("watch", "w", None, 90.0), "r1") == (
        "timed out after 90s: the slowdown watch w has not fired (it stays armed; "
        "`cosmos-profiler profile cancel r1` disarms it)")
    noted = SetFollowed("watch", "w", None, 90.0, {1: "step time 4.0x: not captured, 3.1% free under /t",
                                                     0: "step time 3.0x: not captured, 3.0% free under /t"})
    assert render.set_failure(noted, "r1") == (
        "timed out after 90s: the slowdown watch w has not fired (it stays armed; "
        "`cosmos-profiler profile cancel r1` disarms it); rank 0: step time 3.0x: not captured, 3.0% free under /t; "
        "rank 1: step time 4.0x: not captured, 3.1% free under /t")
    ended = SetFollowed("ended", "w", None, 90.0, {0: "cancelled by request c-1"})
    assert render.set_failure(ended, "r1") == "the slowdown watch w ended before it fired; rank 0: cancelled by request c-1"
    many = SetFollowed("watch", "w", None, 90.0, {rank: f"n{rank}" for rank in range(7)})
    assert render.set_failure(many, "r1").endswith(  # type: ignore[union-attr]
        "rank 2: n2; rank 3: n3; 3 more ranks with a note (`cosmos-profiler profile status r1`)")
    lines = [render.note_lines(rank, f"n{rank}", rank + 1, "r1") for rank in range(7)]
    assert lines[:4] == [["rank 0: n0"], ["rank 1: n1"], ["rank 2: n2"], ["rank 3: n3"]]
    assert lines[4] == ["(more ranks left a slowdown uncaptured: `cosmos-profiler profile status r1` shows each)"]
    assert lines[5:] == [[], []]
    assert render.baseline_lines([saved, dead]) == ["Baseline:", "Traces:", "  rank 0: /t/0.json.gz"]
    assert render.fired_line("w.slow-1") == "Slowdown: capture w.slow-1:"


def test_library_errors_map_to_exit_codes_and_json_codes():
    @click.command()
    @click.option("--rank-filter")
    def command(rank_filter: str) -> None:
        """A command with one option."""

    ctx = click.Context(command)
    bad = usage_error(BadOption("rank_filter", "rank 9 is out of range"), ctx)
    assert isinstance(bad, click.BadParameter) and bad.exit_code == 2 and "--rank-filter" in bad.format_message()
    assert type(usage_error(BadOption("other", "no"), ctx)) is click.UsageError
    busy = refused(ReplicaBusy("r1", []), "the sentence", "")
    assert isinstance(busy, VerbatimError) and (busy.exit_code, busy.code) == (1, "busy")
    registry = refused(RegistryError("cannot read"), "cannot read", "a hint")
    assert type(registry) is CliError and (registry.code, registry.hint) == ("registry", "a hint")


@pytest.mark.parametrize(("replica", "number", "expected"), [
    ("r1", 2, "capture 2 of replica r1"), (None, None, "some/dir"), ("r1", None, "some/dir")])
def test_capture_name(replica, number, expected):
    assert capture_name(replica, number, "some/dir") == expected


def test_diff_written_line_gives_the_page_as_a_uri():
    assert diff_written_line("/tmp/d.html") == "Wrote /tmp/d.html; open it in a browser: file:///tmp/d.html"


def test_the_slowdown_table_shows_the_newest_of_note_and_message():
    base = {"id": "w", "state": "watching", "factor": 3.0, "consecutive": 3, "median_s": 0.02, "steps_seen": 40,
            "num_fired": 1, "repeat_left": 0, "always_on": False, "message": "step time 3.4x the median ..."}
    refused = dict(base, rank=0, note="step time 4.0x the median at step 90: not captured, 3.0% free under /t")
    fired = dict(base, rank=1, note=None)
    lines = render.slowdown_text([refused, fired]).splitlines()
    assert lines[-2].endswith("not captured, 3.0% free under /t") and lines[-1].endswith("step time 3.4x the median ...")
