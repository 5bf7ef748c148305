"""The CLI in-process (click's CliRunner) over hand-written registries: parsing, rendering, errors."""

from __future__ import annotations

import json
import time
from pathlib import Path

import click
import pytest

from sidecar.cli import cosmos, format_table, render, render_refusal
from sidecar.cli.render import describe_cancel
from sidecar.common import startstep
from sidecar.common.exceptions import BusyRequest
from sidecar.common.identity import host_name
from sidecar.common.layout import control_path
from sidecar.common.records import RankRecord
from sidecar.common.registry import write_request
from sidecar.common.request import FIELDS
from sidecar.fleet import control, follow, replicas
from sidecar.fleet.answers import cancel_of, capture_of
from support.cli import invoke as run
from support.files import read_json
from support.records import alive_record, dead_record, remote_record, update_record


def two_ranks(registry: Path, replica: str = "r1", **fields) -> list[RankRecord]:
    return [alive_record(registry, replica, k, **fields) for k in (0, 1)]


# --- the golden surface ------------------------------------------------------

# Every command and option, frozen. The Cosmos-RL ones (-ch/-cp, and profile
# set's -as/-rf/-rs/-pm/-ws/-wm with their flag-ness) must never change;
# additions are deliberate edits of this table.
SOURCE = [
    "--controller-host -ch value",
    "--controller-port -cp value",
    "--registry value",
    "--config value",
    "--timeout value",
]
GOLDEN = {
    "replica ls": [*SOURCE, "--json flag"],
    "replica lsr": ["argument name", *SOURCE, "--json flag"],
    "profile set": [
        "argument name",
        "--active-steps -as value",
        "--rank-filter -rf value",
        "--record-shape -rs flag",
        "--profile-memory -pm flag",
        "--with-stack -ws flag",
        "--with-modules -wm flag",
        "--wait-steps value",
        "--warmup-steps value",
        "--start-step value",
        "--on-slowdown value",
        "--consecutive value",
        "--repeat value",
        "--no-baseline flag",
        "--wait --no-wait flag",
        *SOURCE,
        "--json flag",
    ],
    "profile cancel": ["argument name", "--rank-filter -rf value", "--wait --no-wait flag", *SOURCE, "--json flag"],
    "profile status": ["argument name", *SOURCE, "--json flag"],
    "profile stacks": [
        "argument name",
        "--rank-filter -rf value",
        "--group --no-group flag",
        "--all-threads flag",
        *SOURCE,
        "--json flag",
    ],
    "profile hang": ["argument name", "--rank-filter -rf value", *SOURCE, "--fr-trace --no-fr-trace flag", "--json flag"],
    "profile summary": ["argument target", "--capture value", "--top value", *SOURCE, "--json flag"],
    "profile merge": ["argument target", "--output -o value", "--capture value", *SOURCE, "--json flag"],
    "profile export": ["argument target", "--capture value", "argument out_dir", *SOURCE, "--json flag"],
    "profile diff": ["argument base", "argument new", "--rank value", "--top value", "--output -o value", *SOURCE,
                     "--json flag"],
    "profile report": ["argument target", "--capture value", "--output -o value", "--merge --no-merge flag",
                       "--top value", *SOURCE, "--json flag"],
}


def _surface(group: click.Group, prefix: str = "") -> dict[str, list[str]]:
    found: dict[str, list[str]] = {}
    for name, command in group.commands.items():
        path = f"{prefix}{name}"
        if isinstance(command, click.Group):
            found.update(_surface(command, path + " "))
            continue
        params = []
        for p in command.params:
            if isinstance(p, click.Argument):
                params.append(f"argument {p.name}")
            elif p.name != "help":
                params.append(" ".join([*p.opts, *p.secondary_opts, "flag" if p.is_flag else "value"]))
        found[path] = params
    return found


def test_golden_commands_and_options():
    surface = _surface(cosmos)
    for path, expected in GOLDEN.items():
        assert surface.get(path) == expected, path
    assert sorted(surface) == sorted(GOLDEN), "a command was added or removed: edit GOLDEN deliberately"
    assert set(cosmos.commands) >= {"replica", "profile"}


def test_cosmos_rl_invocation_order_parses(tmp_path):
    # The Cosmos-RL profiler page: options after the subcommand, -cp before -ch.
    result = run("replica", "ls", "-cp", "notaport", "-ch", "localhost")
    assert result.exit_code == 1
    assert result.stderr.strip() == "Error: controller port must be a number from 1 to 65535, got 'notaport'"


# --- replica ls / lsr -----------------------------------------------------------


def test_ls_lists_replicas_with_liveness_state_and_hosts(tmp_path):
    reg = tmp_path / "reg"
    alive_record(reg, "r1", 0, step=120)
    dead_record(reg, "r1", 1, step=130)
    alive_record(reg, "r2", 0, role="rollout", world_size=1, state="tracing")
    remote_record(reg, "r3", 0, heartbeat_age=600.0, world_size=1)
    alive_record(reg, "r4", 0, world_size=1, state="error", error="saving trace failed")

    result = run("replica", "ls", "--registry", str(reg))
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0].split() == ["REPLICA", "ROLE", "RANKS", "HOSTS", "STATE", "HEARTBEAT", "STEP"]
    rows = {line.split()[0]: line.split() for line in lines[1:]}
    assert rows["r1"][1:5] == ["policy", "1/2", rows["r1"][3], "idle"]
    assert rows["r1"][6] == "120"  # the highest step of a live rank
    assert rows["r2"][1:3] == ["rollout", "1/1"] and rows["r2"][4] == "profiling"
    assert rows["r3"][2:5] == ["0/1", "node-elsewhere", "down"] and rows["r3"][5] == "10m00s"
    assert rows["r4"][4] == "error"

    data = json.loads(run("replica", "ls", "--registry", str(reg), "--json").stdout)
    assert (data["registry"], data["registry_from"], data["controller"]) == (str(reg), "--registry", None)
    replicas = data["replicas"]
    assert [r["replica"] for r in replicas] == ["r1", "r2", "r3", "r4"]
    assert replicas[0]["num_alive"] == 1 and replicas[0]["num_ranks"] == 2 and replicas[0]["state"] == "idle"
    # each replica with its ranks, the same objects as `replica lsr`
    lsr = json.loads(run("replica", "lsr", "r1", "--registry", str(reg), "--json").stdout)
    assert [r["rank"] for r in replicas[0]["ranks"]] == [r["rank"] for r in lsr["ranks"]] == [0, 1]
    assert replicas[0]["ranks"][0].keys() == lsr["ranks"][0].keys()
    assert replicas[2]["heartbeat_age_s"] >= 600.0


def test_ls_uses_cosmos_profiler_dir_and_says_when_empty(tmp_path):
    reg = tmp_path / "reg"
    reg.mkdir()
    result = run("replica", "ls", env={"COSMOS_PROFILER_DIR": str(reg)})
    assert result.exit_code == 0
    assert result.stdout.strip() == f"No replicas registered under {reg}."
    empty = json.loads(run("replica", "ls", "--json", env={"COSMOS_PROFILER_DIR": str(reg)}).stdout)
    assert empty == {"registry": str(reg), "registry_from": "$COSMOS_PROFILER_DIR", "controller": None, "replicas": []}


def test_lsr_shows_every_rank_with_liveness_and_last_error(tmp_path):
    reg = tmp_path / "reg"
    alive_record(reg, "r1", 0, world_size=4, trace_path="/t/0_trace.json.gz", signal="SIGRTMIN+3")
    dead_record(reg, "r1", 1, world_size=4, state="error", error="capture failed at step 9: boom")
    remote_record(reg, "r1", 2, heartbeat_age=120.0, world_size=4)
    # rank 3 never wrote a record

    result = run("replica", "lsr", "r1", "--registry", str(reg))
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0].split() == ["RANK", "HOST", "PID", "SIGNAL", "ALIVE", "STEP", "STATE", "TRACE", "ERROR"]
    assert lines[1].split()[3:8] == ["SIGRTMIN+3", "yes", "1000", "idle", "/t/0_trace.json.gz"]
    assert "no (process gone)" in lines[2] and lines[2].rstrip().endswith("capture failed at step 9: boom")
    assert "node-elsewhere" in lines[3] and "no (no heartbeat for 2m00s)" in lines[3]
    assert lines[4].split()[:5] == ["3", "-", "-", "-", "no"] and "(no record)" in lines[4]

    data = json.loads(run("replica", "lsr", "r1", "--registry", str(reg), "--json").stdout)["ranks"]
    assert [(r["rank"], r["alive"], r["liveness"]) for r in data] == [
        (0, True, "alive"), (1, False, "process gone"), (2, False, "no heartbeat for 2m00s"), (3, False, "no record"),
    ]


def test_exited_rank_is_dead_even_with_a_fresh_heartbeat(tmp_path):
    reg = tmp_path / "reg"
    remote_record(reg, "r1", 0, heartbeat_age=0.0, world_size=1, exited_at=time.time())
    data = json.loads(run("replica", "lsr", "r1", "--registry", str(reg), "--json").stdout)["ranks"]
    assert (data[0]["alive"], data[0]["liveness"]) == (False, "exited")


@pytest.mark.parametrize("command", [["replica", "lsr"], ["profile", "set"], ["profile", "status"]])
def test_unknown_replica_prints_cosmos_line(tmp_path, command):
    reg = tmp_path / "reg"
    alive_record(reg, "r1", 0)
    result = run(*command, "nope", "--registry", str(reg))
    assert result.exit_code == 1
    # Cosmos-RL's line, then where this CLI looked and what is there
    assert result.stderr == f"Replica nope not found.\nSearched the registry {reg} (from --registry); replicas there: r1.\n"
    assert not control_path(reg, "nope").exists()


def test_invalid_replica_name_is_a_usage_error(tmp_path):
    result = run("profile", "set", "../etc", "--registry", str(tmp_path / "reg"))
    assert result.exit_code == 2
    assert "Invalid value for 'NAME'" in result.stderr and "not valid" in result.stderr


# --- profile set ----------------------------------------------------------------


def test_set_writes_a_valid_request_aligned_past_the_highest_step(tmp_path):
    reg = tmp_path / "reg"
    alive_record(reg, "r1", 0, step=1000)
    alive_record(reg, "r1", 1, step=990)

    result = run("profile", "set", "r1", "--registry", str(reg))
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[0] == "Requested a profile of replica r1 through its control file."
    request = read_json(control_path(reg, "r1"))
    assert set(request) <= set(FIELDS)
    assert request["rank_filter"] == "0" and request["kind"] == "trace"
    assert request["id"].startswith("cli-")
    # 1000 steps in 10 s (a record without samples: the lifetime average), 100 steps/s,
    # so a lead of LEAD_SECONDS plus inotify's delay worth of steps.
    lead = 100 * (startstep.LEAD_SECONDS + startstep.INOTIFY_LATENCY_S)
    assert 1000 + lead <= request["start_step"] <= 1000 + lead + 10
    assert "active_steps" not in request and "record_shape" not in request  # the rank's config decides
    assert f"Request {request['id']} for rank 0: the schedule starts at step {request['start_step']}" in result.stdout


def test_set_passes_every_flag(tmp_path):
    reg = tmp_path / "reg"
    two_ranks(reg)
    result = run(
        "profile", "set", "r1", "--registry", str(reg), "-as", "3", "-rf", "0-1", "-rs", "-pm", "-ws", "-wm",
        "--wait-steps", "0", "--warmup-steps", "2", "--start-step", "5000",
    )
    assert result.exit_code == 0, result.output
    request = read_json(control_path(reg, "r1"))
    request.pop("id")
    assert request == {
        "kind": "trace", "rank_filter": "0-1", "start_step": 5000, "active_steps": 3, "wait_steps": 0,
        "warmup_steps": 2, "record_shape": True, "profile_memory": True, "with_stack": True, "with_modules": True,
    }


@pytest.mark.parametrize("value", ["9007199254740992", "-1"])
def test_start_step_outside_the_safe_range_is_a_usage_error(tmp_path, value):
    reg = tmp_path / "reg"
    two_ranks(reg)
    result = run("profile", "set", "r1", "--start-step", value, "--registry", str(reg))
    assert result.exit_code == 2
    assert f"Invalid value for '--start-step': {value} is not in the range 0<=x<=9007199254740991." in result.stderr
    assert not control_path(reg, "r1").exists()
    result = run("profile", "summary", "r1", "--capture", "9007199254740992", "--registry", str(reg))
    assert result.exit_code == 2 and "0<=x<=9007199254740991" in result.stderr


def test_start_step_past_the_horizon_is_refused_naming_the_bound(tmp_path):
    """The README's own `--start-step 99999999` used to leave the replica armed for ever."""
    reg = tmp_path / "reg"
    # At step 1000, and there to stay: started 10 days ago, so its pace (0.001 steps/s) projects no
    # further step however long a loaded machine takes between the write and the CLI's read.
    two_ranks(reg, started_at=time.time() - 864_000)
    result = run("profile", "set", "r1", "--start-step", "99999999", "--registry", str(reg))
    assert result.exit_code == 2
    assert result.stderr.splitlines()[-1] == (
        "Error: Invalid value for '--start-step': start_step 99999999 is 99998999 steps past step 1000; the limit is "
        "100000 steps ahead (replica r1); give a nearer step, or leave it out"
    )
    assert not control_path(reg, "r1").exists()
    # within 100,000 steps, but a slow job: 50,000 steps at 0.5 steps/s are about 28 hours
    slow = [[time.time() - 4.0, 998], [time.time(), 1000]]
    for record in two_ranks(reg, recent_steps=slow, started_at=time.time() - 2000):
        assert startstep.step_rate(record) == pytest.approx(0.5)
    result = run("profile", "set", "r1", "--start-step", "51000", "--registry", str(reg))
    assert result.exit_code == 2
    assert "start_step 51000 is 50000 steps past step 1000, about 27.8 h at the recent 0.5 steps/s; " \
           "the limit is 24 h ahead" in result.stderr
    assert not control_path(reg, "r1").exists()
    assert run("profile", "set", "r1", "--start-step", "5000", "--registry", str(reg)).exit_code == 0


def test_set_json_prints_the_result(tmp_path):
    reg = tmp_path / "reg"
    two_ranks(reg)
    data = json.loads(run("profile", "set", "r1", "-rf", "all", "--registry", str(reg), "--json").stdout)
    assert [r["rank"] for r in data["ranks"]] == [0, 1] and data["replica"] == "r1"
    assert {r["phase"] for r in data["ranks"]} == {"pending"}
    assert data["request"] == read_json(control_path(reg, "r1"))


@pytest.mark.parametrize(
    ("text", "ranks"),
    [("0,1", [0, 1]), ("0-3,8", [0, 1, 2, 3, 8]), ("all", None), (" 1 ", [1]), ("2-2", [2])],
)
def test_rank_filter_forms(tmp_path, text, ranks):
    reg = tmp_path / "reg"
    for k in range(9):
        alive_record(reg, "r1", k, world_size=9)
    data = json.loads(run("profile", "set", "r1", "-rf", text, "--registry", str(reg), "--json").stdout)
    assert [r["rank"] for r in data["ranks"]] == (list(range(9)) if ranks is None else ranks)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("0-x", "cannot parse '0-x'"),
        ("1,,2", "cannot parse ''"),
        ("3-1", "range '3-1' runs backwards"),
        ("", "is empty"),
        ("a", "cannot parse 'a'"),
    ],
)
def test_bad_rank_filter_is_a_usage_error_naming_the_part(tmp_path, text, message):
    reg = tmp_path / "reg"
    two_ranks(reg)
    result = run("profile", "set", "r1", "-rf", text, "--registry", str(reg))
    assert result.exit_code == 2
    assert "Invalid value for '--rank-filter' / '-rf'" in result.stderr and message in result.stderr
    assert not control_path(reg, "r1").exists()


def test_rank_filter_beyond_the_world_size_is_a_usage_error(tmp_path):
    reg = tmp_path / "reg"
    two_ranks(reg)
    result = run("profile", "set", "r1", "-rf", "0,7", "--registry", str(reg))
    assert result.exit_code == 2
    assert "rank 7 is out of range: replica r1 has 2 ranks (0-1)" in result.stderr
    assert not control_path(reg, "r1").exists()


def test_busy_replica_prints_cosmos_message_and_writes_nothing(tmp_path):
    reg = tmp_path / "reg"
    alive_record(reg, "r1", 0, state="tracing", request_id="earlier")
    alive_record(reg, "r1", 1)
    before = control_path(reg, "r1")
    result = run("profile", "set", "r1", "--registry", str(reg))
    assert result.exit_code == 1
    assert result.stderr == (
        "Replica r1 is busy with request earlier (ranks 0, start step next, phase tracing). "
        f"`cosmos-profiler profile cancel r1 --registry {reg}` ends it.\n"
    )
    assert not before.exists()
    # a busy rank that is not selected does not block
    assert run("profile", "set", "r1", "-rf", "1", "--registry", str(reg)).exit_code == 0


def test_dead_ranks_are_skipped_with_a_warning_and_all_dead_is_an_error(tmp_path):
    reg = tmp_path / "reg"
    alive_record(reg, "r1", 0)
    dead_record(reg, "r1", 1, heartbeat_at=time.time() - 3600 - 60)  # an hour and a minute ago: "1h01m"
    result = run("profile", "set", "r1", "-rf", "all", "--registry", str(reg), "--json")
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert ([r["rank"] for r in data["ranks"]], data["skipped"]) == ([0], [{"rank": 1, "error": "process gone"}])
    assert "Warning: rank 1 will not be profiled: process gone" in result.stderr

    result = run("profile", "set", "r1", "-rf", "1", "--registry", str(reg))
    assert result.exit_code == 1
    assert result.stderr == (
        f"Error: no live rank of replica r1 matches rank filter 1 (rank 1: process gone (on {host_name()}, "
        f"last heartbeat 1h01m ago at step 1000))\n`cosmos-profiler replica lsr r1 --registry {reg}` shows every rank; "
        "is the job still running?\n")


def test_start_step_in_the_past_and_a_disabled_profiler_warn(tmp_path):
    reg = tmp_path / "reg"
    alive_record(reg, "r1", 0, enabled=False)
    result = run("profile", "set", "r1", "--start-step", "10", "--registry", str(reg))
    assert result.exit_code == 0
    assert ("Warning: rank 0 has the profiler disabled ([profiler] enable_profiler = false) and will refuse the "
            "request; set [profiler] enable_profiler = true in the job's config and restart it\n") in result.stderr
    assert "Warning: start step 10 has probably passed" in result.stderr


def test_set_wait_times_out_naming_the_ranks(tmp_path):
    reg = tmp_path / "reg"
    two_ranks(reg)
    started = time.monotonic()
    result = run("profile", "set", "r1", "-rf", "all", "--wait", "--timeout", "0.3", "--registry", str(reg))
    assert time.monotonic() - started < 10
    assert result.exit_code == 1
    assert "rank 0: timeout: timed out after 0.3s, still pending at step 1000" in result.stdout
    assert result.stderr.startswith("Error: ranks 0, 1 did not finish (rank 0: timeout: timed out after 0.3s")


def test_set_wait_reports_refusal_and_death(tmp_path):
    reg = tmp_path / "reg"
    # rank 0 already refused whatever comes next; rank 1 is already dead
    rec0 = alive_record(reg, "r1", 0)
    dead_record(reg, "r1", 1)
    result = control.set_profile(reg, "r1", rank_filter="all")
    assert result.ranks == [0] and result.skipped == {1: "process gone"}
    update_record(reg, rec0, refused=f"request {result.request_id} refused: profiler is disabled for this job")
    captures = follow.wait_for_capture(reg, "r1", result.request_id, [0], timeout=5.0)
    assert [(c.rank, c.phase) for c in captures] == [(0, "refused")]
    assert "profiler is disabled" in captures[0].error

    dead = capture_of(RankRecord(replica="r1", role="policy", rank=1, state="armed", request_id="x"),
                              "x", alive=False, why="process gone")
    assert (dead.phase, dead.error) == ("dead", "process gone before saving (last armed at step 0)")


# --- following a request -----------------------------------------------------------


def _record(**fields) -> RankRecord:
    return RankRecord(replica="r1", role="policy", rank=0, **fields)


def test_capture_phases_follow_the_request_id():
    rid = "cli-1"
    assert capture_of(_record(request_id="old", state="armed"), rid, True).phase == "pending"
    assert capture_of(_record(request_id=rid, selected=True, state="armed"), rid, True).phase == "armed"
    tracing = capture_of(
        _record(request_id=rid, selected=True, state="tracing", capture_start_step=40, misaligned=True), rid, True
    )
    assert (tracing.phase, tracing.capture_start_step, tracing.misaligned) == ("tracing", 40, True)
    saved = capture_of(
        _record(request_id=rid, selected=True, state="idle",
                history=[{"state": "armed"}, {"state": "tracing"}, {"state": "saving"},
                         {"state": "idle", "saved": "/t/3_trace.json.gz"}]),
        rid, False,  # saved, then exited: still saved
    )
    assert (saved.phase, saved.trace_path) == ("saved", "/t/3_trace.json.gz")
    error = capture_of(_record(request_id=rid, selected=True, state="error", error="export failed"), rid, True)
    assert (error.phase, error.error) == ("error", "export failed")
    assert capture_of(_record(request_id=rid, selected=False), rid, True).phase == "not selected"
    # an old refusal of another request is not ours
    assert capture_of(_record(refused="request other refused: busy"), rid, True).phase == "pending"
    # A rank that saved this request and took a newer one (a slowdown watch's capture right after its
    # baseline): saved, from its history, where it read "pending" until the follower timed out.
    moved_on = _record(request_id="w.slow-1", selected=True, state="armed", history=[
        {"state": "saving", "request_id": rid}, {"state": "idle", "request_id": rid, "saved": "/t/0_trace.json.gz"},
        {"state": "armed", "request_id": "w.slow-1"}])
    earlier = capture_of(moved_on, rid, True)
    assert (earlier.phase, earlier.trace_path, earlier.request_id) == ("saved", "/t/0_trace.json.gz", rid)
    assert capture_of(moved_on, "w.slow-1", True).phase == "armed"
    assert capture_of(moved_on, "another", True).phase == "pending"


# --- profile status ---------------------------------------------------------------


def test_status_shows_each_rank_of_the_last_request(tmp_path):
    reg = tmp_path / "reg"
    recs = [alive_record(reg, "r1", k, world_size=4) for k in range(4)]
    result = control.set_profile(reg, "r1", rank_filter="0-2", start_step=2000)
    rid = result.request_id
    update_record(reg, recs[0], request_id=rid, selected=True, state="idle", capture_start_step=2000,
                  history=[{"state": "idle", "saved": "/t/r1_0/0_trace.json.gz"}])
    update_record(reg, recs[1], request_id=rid, selected=True, state="tracing", capture_start_step=2003,
                  misaligned=True)
    update_record(reg, recs[3], request_id=rid, selected=False)
    # rank 2 has not seen it yet

    out = run("profile", "status", "r1", "--registry", str(reg))
    assert out.exit_code == 0, out.output
    lines = out.stdout.splitlines()
    assert lines[0] == f"Replica r1, request {rid}: ranks 0-2, start step 2000"
    assert lines[1].split() == ["RANK", "HOST", "ALIVE", "REQUEST", "PHASE", "STEP", "START", "TRACE", "ERROR"]
    assert lines[2].split()[4:8] == ["saved", "1000", "2000", "/t/r1_0/0_trace.json.gz"]
    assert "tracing (misaligned)" in lines[3]
    assert lines[4].split()[4] == "pending"
    assert "not selected" in lines[5]

    data = json.loads(run("profile", "status", "r1", "--registry", str(reg), "--json").stdout)
    assert data["request_id"] == rid
    assert [c["phase"] for c in data["ranks"]] == ["saved", "tracing", "pending", "not selected"]


def test_status_of_a_touched_request_shows_where_the_ranks_started(tmp_path):
    # A touch re-issues the file's request from each rank's own step: the file's start step is history.
    reg = tmp_path / "reg"
    recs = [alive_record(reg, "r1", k, world_size=2) for k in range(2)]
    rid = control.set_profile(reg, "r1", start_step=3).request_id
    for rec in recs:
        update_record(reg, rec, request_id=rid, selected=True, state="tracing", capture_start_step=37)
    out = run("profile", "status", "r1", "--registry", str(reg))
    assert out.stdout.splitlines()[0] == f"Replica r1, request {rid}: ranks 0, start step 3 (the ranks started at 37)"


def test_status_after_a_signal_shows_the_ranks_own_capture_not_the_files_as_pending(tmp_path):
    # The rank took the file's request, saved it, then ran a SIGUSR1 capture of its own.
    reg = tmp_path / "reg"
    rec = alive_record(reg, "r1", 0, world_size=1)
    rid = control.set_profile(reg, "r1", start_step=5).request_id
    update_record(reg, rec, request_id="sig-20261203-1", state="idle", capture_start_step=40,
                  trace_path="/t/r1_0/1_trace.json.gz",
                  history=[{"state": "idle", "request_id": rid, "saved": "/t/r1_0/0_trace.json.gz"},
                           {"state": "idle", "request_id": "sig-20261203-1", "saved": "/t/r1_0/1_trace.json.gz"}])
    data = json.loads(run("profile", "status", "r1", "--registry", str(reg), "--json").stdout)
    (rank,) = data["ranks"]
    assert (rank["request_id"], rank["phase"], rank["trace_path"]) == ("sig-20261203-1", "saved",
                                                                      "/t/r1_0/1_trace.json.gz")


def test_status_without_a_json_request_shows_each_ranks_own(tmp_path):
    reg = tmp_path / "reg"
    alive_record(reg, "r1", 0, world_size=1, request_id="signal-0-1", selected=True, state="armed")
    control_path(reg, "r1").parent.mkdir(parents=True, exist_ok=True)
    control_path(reg, "r1").touch()
    out = run("profile", "status", "r1", "--registry", str(reg))
    assert out.exit_code == 0
    assert out.stdout.splitlines()[0] == (
        f"Replica r1: {control_path(reg, 'r1')} is empty (a touch: each rank takes its own defaults under its own "
        "request id); showing each rank's last request.")
    assert "signal-0-1" in out.stdout and " armed " in out.stdout


def test_status_names_a_cancel_in_the_control_file_and_follows_a_request_without_an_id(tmp_path):
    # It said "no JSON request" for both: a cancel (or stacks) request is dropped as no capture, and
    # a request without an id had none until a rank took it under the id it gives such a file.
    reg = tmp_path / "reg"
    alive_record(reg, "r1", 0, world_size=1)
    write_request(reg, "r1", {"id": "c1", "kind": "cancel", "rank_filter": "all"})
    out = run("profile", "status", "r1", "--registry", str(reg))
    assert out.stdout.splitlines()[0] == (
        f"Replica r1: {control_path(reg, 'r1')} holds a cancel request c1, which ranks answer at once and which is "
        "no capture; showing each rank's last request.")
    data = json.loads(run("profile", "status", "r1", "--registry", str(reg), "--json").stdout)
    assert (data["control_kind"], data["control_request_id"], data["request_id"]) == ("cancel", "c1", None)

    write_request(reg, "r1", {"active_steps": 2})
    _, _, file_id = follow.read_control_request(reg, "r1")
    out = run("profile", "status", "r1", "--registry", str(reg))
    assert out.stdout.splitlines()[0] == f"Replica r1, request {file_id}: ranks 0"
    assert out.stdout.splitlines()[2].split()[3:5] == [file_id, "pending"]


# --- resolution and rendering ----------------------------------------------------


def test_half_a_controller_address_is_a_usage_error(tmp_path):
    result = run("replica", "ls", "-ch", "localhost")
    assert result.exit_code == 2
    assert "give both -ch/--controller-host and -cp/--controller-port" in result.stderr


def test_format_table_and_age():
    assert format_table(["A", "LONGER"], [["xyz", None], [1, "b"]]) == "A    LONGER\nxyz  -\n1    b"
    assert [replicas.format_age(s) for s in (None, 0.4, 59, 61, 3600 * 5 + 120, 86400 * 2 + 3600)] == [
        "-", "0s", "59s", "1m01s", "5h02m", "2d01h",
    ]


def test_profile_status_after_a_stacks_request_shows_the_last_capture(tmp_path):

    from sidecar.common.registry import write_request
    from sidecar.fleet import follow
    from support.records import alive_record

    saved = str(tmp_path / "out" / "profile_trace" / "r1_0" / "0_trace.json.gz")
    alive_record(tmp_path, "r1", 0, world_size=1, request_id="t1", state="idle",
                 history=[{"state": "idle", "step": 9, "saved": saved, "request_id": "t1"}])
    write_request(tmp_path, "r1", {"id": "s1", "kind": "stacks", "rank_filter": "all"})
    status = follow.profile_status(tmp_path, "r1")
    assert status.request_id is None
    assert [(c.rank, c.phase, c.request_id, c.trace_path) for c in status.ranks] == [(0, "saved", "t1", saved)]


# --- profile cancel -----------------------------------------------------------------


def test_cancel_writes_a_cancel_for_every_rank_by_default(tmp_path):
    reg = tmp_path / "reg"
    alive_record(reg, "r1", 0, state="armed", request_id="cli-a", request={"start_step": 5000})
    alive_record(reg, "r1", 1)
    result = run("profile", "cancel", "r1", "--no-wait", "--json", "--registry", str(reg))
    assert result.exit_code == 0, result.output
    data = json.loads(result.stdout)
    assert data["ranks"] == [{"rank": 0, "phase": "pending", "cancelled_request": "cli-a"},
                             {"rank": 1, "phase": "pending", "cancelled_request": None}]
    written = read_json(control_path(reg, "r1"))
    assert written == {"id": data["request_id"], "kind": "cancel", "rank_filter": "all"}
    result = run("profile", "cancel", "r1", "-rf", "1", "--no-wait", "--registry", str(reg))
    assert result.stdout.startswith("Cancel cli-") and result.stdout.endswith(" sent to replica r1, rank 1 (busy: none).\n")
    assert read_json(control_path(reg, "r1"))["rank_filter"] == "1"
    assert run("profile", "cancel", "nope", "--registry", str(reg)).stderr.startswith("Replica nope not found.\n")


def test_cancel_answers_are_read_from_the_records(tmp_path):
    reg = tmp_path / "reg"
    cid = "cli-cancel"
    answers = {
        "disarmed": ({"outcome": "disarmed", "request_id": "a", "step": 7}, "idle", "disarmed request a at step 7"),
        "stopped": ({"outcome": "stopped", "request_id": "a", "step": 9, "trace_path": "/t/0_trace.json.gz"}, "idle",
                    "stopped request a after step 9; saved the steps recorded so far to /t/0_trace.json.gz"),
        # Stopped, and still writing what it recorded: not "nothing saved" (it is about to be).
        "stopped, saving": ({"outcome": "stopped", "request_id": "a", "step": 9}, "saving",
                            "stopped request a after step 9; saving the steps recorded so far"),
        "stopped, nothing recorded": (
            {"outcome": "stopped", "request_id": "a", "step": 2, "detail": "no step had been recorded yet; nothing saved"},
            "idle", "stopped request a after step 2; no step had been recorded yet; nothing saved"),
        "stopping": ({"outcome": "stopping", "request_id": "a", "step": 9}, "tracing",
                     "stopping request a at the next step boundary"),
        "nothing": ({"outcome": "nothing to cancel", "state": "idle"}, "idle", "nothing to cancel (idle)"),
    }
    for name, (cancel, state, text) in answers.items():
        record = alive_record(reg, "r1", 0, state=state, cancel={"id": cid, **cancel})
        result = cancel_of(record, cid, True)
        assert result.answer is not None and (result.phase, render.cancel_text(result.answer)) == (
            "pending" if state in ("tracing", "saving") else "done", text), name
        assert describe_cancel(result) == f"rank 0: {text}"
    other = cancel_of(alive_record(reg, "r1", 0, cancel={"id": "older"}), cid, True)
    assert (other.phase, describe_cancel(other)) == ("pending", "rank 0: waiting for the rank to see the cancel")
    dead = cancel_of(alive_record(reg, "r1", 0, state="armed"), cid, False, "process gone")
    assert (dead.phase, dead.error) == ("dead", "process gone before it answered (last armed)")


def test_busy_message_names_each_request_its_ranks_start_and_phase(tmp_path):
    records = [
        RankRecord(replica="r1", role="p", rank=k, state=state, request_id=rid, request=req, capture_start_step=cap)
        for k, state, rid, req, cap in [
            (0, "armed", "a", {"start_step": 50}, None), (1, "tracing", "a", {"start_step": 50}, 50),
            (2, "armed", "a", {"start_step": 50}, None), (3, "saving", "b", {"start_step": None}, 12),
        ]
    ]
    busy = control.busy_error("r1", records[:3])
    assert (busy.replica, busy.requests) == ("r1", (BusyRequest("a", (0, 1, 2), 50, "tracing"),))
    assert render_refusal.busy_text(busy) == (
        "Replica r1 is busy with request a (ranks 0-2, start step 50, phase tracing). "
        "`cosmos-profiler profile cancel r1` ends it.")
    assert render_refusal.busy_text(control.busy_error("r1", records)) == (
        "Replica r1 is busy with request a (ranks 0-2, start step 50, phase tracing) and request b (ranks 3, "
        "start step 12, phase saving). `cosmos-profiler profile cancel r1` ends them.")


# --- refusals say what to do next ------------------------------------------------------------


def test_not_found_names_the_registry_searched_where_it_came_from_and_what_is_there(tmp_path):
    reg = tmp_path / "reg"
    for name in ("a", "b"):
        alive_record(reg, name, 0, world_size=1)
    by_env = run("profile", "set", "nope", env={"COSMOS_PROFILER_DIR": str(reg)})
    assert (by_env.exit_code, by_env.stderr) == (1, (
        f"Replica nope not found.\nSearched the registry {reg} (from $COSMOS_PROFILER_DIR); replicas there: a, b.\n"))
    job = tmp_path / "job.toml"
    job.write_text(f"[train]\noutput_dir = '{tmp_path / 'outputs' / 'run'}'\n")
    derived = tmp_path / "outputs" / "run" / "profile_control"  # [train] output_dir without a timestamp
    derived.mkdir(parents=True)
    by_config = run("replica", "lsr", "nope", "--config", str(job))
    assert by_config.stderr == (
        f"Replica nope not found.\nSearched the registry {derived} (from [train] output_dir in {job}); it has no "
        "replicas: is the job's sidecar using another registry (--registry DIR, $COSMOS_PROFILER_DIR, --config TOML)?\n")
    missing = run("replica", "ls", "--registry", str(tmp_path / "none"))
    assert missing.stderr.splitlines()[1] == "The registry came from --registry."
    data = json.loads(run("replica", "lsr", "nope", "--registry", str(reg), "--json").stdout)
    assert data == {"error": "Replica nope not found.", "code": "not_found",
                    "hint": f"Searched the registry {reg} (from --registry); replicas there: a, b."}


def test_busy_names_the_cancel_command_to_type_for_this_registry(tmp_path):
    reg = tmp_path / "my reg"
    alive_record(reg, "r1", 0, state="armed", request_id="cli-x", request={"start_step": 5000})
    result = run("profile", "set", "r1", "--registry", str(reg), "--json")
    assert json.loads(result.stdout) == {
        "error": "Replica r1 is busy with request cli-x (ranks 0, start step 5000, phase armed). "
                 f"`cosmos-profiler profile cancel r1 --registry '{reg}'` ends it.",
        "code": "busy"}
