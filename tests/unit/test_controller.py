"""The controller path: a stand-in Cosmos-RL controller on 127.0.0.1 (http.server, a thread of this
process) and its error paths."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from sidecar.common import layout
from sidecar.common.config import load_config
from sidecar.common.exceptions import ControllerError
from sidecar.common.layout import control_path
from sidecar.fleet.controller import ControllerClient, parse_status
from support.cli import invoke
from support.controller import cosmos_status
from support.files import read_json
from support.records import alive_record


@pytest.fixture
def controller(controller, tmp_path):
    """conftest's controller, answering one policy and one rollout replica and the job's output_dir."""
    controller.json("/api/status", cosmos_status(["policy-a"], ["rollout-b"]))
    controller.json("/api/meta", {"config": {"train": {"output_dir": str(tmp_path / "outputs" / "20260101120000")}}})
    return controller


def test_ls_lists_controller_replicas_joined_with_the_derived_registry(controller, tmp_path):
    derived = tmp_path / "outputs" / "profile_control"  # dirname(output_dir)/profile_control
    alive_record(derived, "policy-a", 0)
    alive_record(derived, "policy-a", 1)
    alive_record(derived, "not-at-the-controller", 0)

    result = invoke("replica", "ls", "-ch", "127.0.0.1", "-cp", str(controller.port))
    assert result.exit_code == 0, result.output
    lines = result.stdout.splitlines()
    assert lines[0].split() == ["REPLICA", "ROLE", "RANKS", "HOSTS", "STATE", "HEARTBEAT", "STEP", "ARRIVED"]
    rows = {line.split()[0]: line.split() for line in lines[1:]}
    assert set(rows) == {"policy-a", "rollout-b"}
    assert rows["policy-a"][1:3] == ["policy", "2/2"] and rows["policy-a"][4] == "idle"
    assert rows["rollout-b"][1:5] == ["rollout", "0/2", "gpu-node-7", "unknown"]
    assert controller.hits == ["/api/status", "/api/meta"]

    data = json.loads(invoke("replica", "ls", "-ch", "127.0.0.1", "-cp", str(controller.port), "--json").stdout)
    assert [(r["replica"], r["arrived"]) for r in data["replicas"]] == [("policy-a", True), ("rollout-b", True)]
    assert data["controller"] == f"http://127.0.0.1:{controller.port}"


def test_lsr_merges_atoms_and_records(controller, tmp_path):
    derived = tmp_path / "outputs" / "profile_control"
    alive_record(derived, "policy-a", 1, step=77)
    data = json.loads(invoke("replica", "lsr", "policy-a", "-ch", "127.0.0.1", "-cp", str(controller.port), "--json").stdout)["ranks"]
    assert [(r["rank"], r["alive"], r["step"], r["host_ip"]) for r in data] == [
        (0, False, None, "10.0.0.7"), (1, True, 77, "10.0.0.7"),
    ]
    result = invoke("replica", "lsr", "nope", "-ch", "127.0.0.1", "-cp", str(controller.port))
    assert result.exit_code == 1 and result.stderr == (
        f"Replica nope not found.\nAsked the controller at http://127.0.0.1:{controller.port}; "
        "replicas there: policy-a, rollout-b.\n")


def test_set_writes_the_control_file_in_the_derived_registry(controller, tmp_path):
    derived = tmp_path / "outputs" / "profile_control"
    alive_record(derived, "policy-a", 0)
    result = invoke("profile", "set", "policy-a", "-ch", "localhost", "-cp", str(controller.port))
    assert result.exit_code == 0, result.output
    assert result.stdout.splitlines()[0] == "Requested a profile of replica policy-a through its control file."
    assert read_json(control_path(derived, "policy-a"))["rank_filter"] == "0"

    # known to the controller but without a sidecar: a clear error
    result = invoke("profile", "set", "rollout-b", "-ch", "localhost", "-cp", str(controller.port))
    assert result.exit_code == 1
    assert "registered with the controller, but has no rank records under" in result.stderr

    # in the registry but unknown to the controller: not found
    alive_record(derived, "stray", 0)
    result = invoke("profile", "set", "stray", "-ch", "localhost", "-cp", str(controller.port))
    assert result.exit_code == 1 and result.stderr == (
        f"Replica stray not found.\nAsked the controller at http://localhost:{controller.port}; "
        "replicas there: policy-a, rollout-b.\n")


def test_relative_output_dir_in_meta_is_found_or_explained(controller, tmp_path, monkeypatch):
    # cosmos-rl's default output_dir is ./outputs: /api/meta answers it relative to the launch directory.
    controller.json("/api/meta", {"config": {"train": {"output_dir": "./outputs/20260101120000"}}})
    launch, elsewhere, xdg = tmp_path / "launch", tmp_path / "elsewhere", tmp_path / "xdg"
    for d in (launch, elsewhere, xdg):
        d.mkdir(mode=0o700)
    monkeypatch.chdir(elsewhere)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(xdg))
    registry = launch / "outputs" / "profile_control"
    alive_record(registry, "policy-a", 0)
    args = ("profile", "set", "policy-a", "-ch", "localhost", "-cp", str(controller.port))
    result = invoke(*args)
    assert result.exit_code == 1
    assert (f"train.output_dir from http://localhost:{controller.port}/api/meta = './outputs/20260101120000' is "
            f"relative, so it was resolved against this directory ({elsewhere}), giving the registry "
            f"{elsewhere / 'outputs' / 'profile_control'}, which holds no replica. Run the command from the job's "
            "launch directory, or pass --registry <launch directory>/outputs/profile_control.") in result.stderr
    # The pointer a rank with a relative output_dir leaves in the per-user default (sidecar.rank.pointer).
    pointer = layout.root_pointer_path(xdg / "cosmos-profiler", "policy-a")
    pointer.parent.mkdir(parents=True)
    pointer.write_text(json.dumps({"replica": "policy-a", "registry": str(registry),
                                   "output_dir": str(launch / "outputs")}))
    result = invoke(*args)
    assert result.exit_code == 0, result.output
    assert read_json(control_path(registry, "policy-a"))["rank_filter"] == "0"


def test_registry_flag_and_env_override_the_controller_meta(controller, tmp_path):
    elsewhere = tmp_path / "elsewhere"
    alive_record(elsewhere, "policy-a", 0)
    result = invoke("profile", "set", "policy-a", "-ch", "127.0.0.1", "-cp", str(controller.port), "--registry", str(elsewhere))
    assert result.exit_code == 0, result.output
    assert control_path(elsewhere, "policy-a").exists()
    result = invoke("replica", "ls", "-ch", "127.0.0.1", "-cp", str(controller.port), env={"COSMOS_PROFILER_DIR": str(elsewhere)})
    assert result.exit_code == 0
    assert "/api/meta" not in controller.hits


@pytest.mark.parametrize(
    ("route", "message"),
    [
        ((200, "text/html", b"<html>panel</html>"), "did not answer JSON for /api/status (Content-Type text/html: '<html>panel</html>')"),
        ((200, "application/json", b'{"hello": "world"}'), "/api/status answered JSON without policy_replicas or rollout_replicas"),
        ((200, "application/json", b'{"policy_replicas": [{"role": "POLICY"}]}'), "an entry of policy_replicas has no replica name"),
        ((500, "text/plain", b"boom"), "answered HTTP 500 Internal Server Error for /api/status"),
    ],
)
def test_bad_answers_are_one_clear_line(controller, route, message):
    controller.routes["/api/status"] = route
    result = invoke("replica", "ls", "-ch", "127.0.0.1", "-cp", str(controller.port))
    assert result.exit_code == 1
    assert result.stderr.startswith("Error: ") and result.stderr.count("\n") == 1
    assert message in result.stderr, result.stderr


def test_meta_without_output_dir_asks_for_registry(controller):
    controller.json("/api/meta", {"config": {}})
    result = invoke("replica", "ls", "-ch", "127.0.0.1", "-cp", str(controller.port))
    assert result.exit_code == 1
    assert "has no config.train.output_dir to find the registry from; pass --registry DIR" in result.stderr


def test_slow_controller_gives_up_at_the_timeout(controller):
    controller.mode = "slow"
    started = time.monotonic()
    result = invoke("replica", "ls", "-ch", "127.0.0.1", "-cp", str(controller.port), "--timeout", "0.3")
    assert time.monotonic() - started < 5.0
    assert result.exit_code == 1
    assert result.stderr == f"Error: controller at http://127.0.0.1:{controller.port} did not answer within 0.3s\n"


@pytest.mark.parametrize("port", ["abc", "0", "70000", "-1"])
def test_bad_port_is_one_clear_line(port):
    result = invoke("replica", "ls", "-ch", "localhost", "-cp", port)
    assert result.exit_code == 1
    assert result.stderr == f"Error: controller port must be a number from 1 to 65535, got {port!r}\n"


def test_unresolvable_host():
    with pytest.raises(ControllerError, match="cannot resolve controller host 'no-such-host.invalid'"):
        ControllerClient("no-such-host.invalid", 8000, timeout=2.0).replicas()


def test_parse_status_accepts_replicas_keyed_by_name():
    status = {"policy_replicas": {"p": {"name": "p", "role": "POLICY", "atoms": [{"global_rank": 1}, {"global_rank": 0}]}}}
    (replica,) = parse_status(status)
    assert (replica.name, replica.role, [a.global_rank for a in replica.atoms]) == ("p", "policy", [0, 1])


def test_ipv6_host_is_bracketed():
    assert ControllerClient("::1", "8000").base_url == "http://[::1]:8000"


def test_the_registry_path_matches_the_sidecar_rule(tmp_path):
    # The controller's /api/meta holds the loaded, timestamped output_dir: its dirname is
    # the output root that the workers and a TOML without a timestamp give (sidecar.common.config).
    from sidecar.common.config import output_root_of
    from sidecar.common.identity import resolve_registry_root

    meta_root = output_root_of(str(tmp_path / "outputs" / "20260101120000"))
    root, _ = resolve_registry_root(None, env={}, output_root=meta_root)
    assert root == Path(tmp_path / "outputs" / "profile_control")
    toml = tmp_path / "job.toml"
    toml.write_text(f"[train]\noutput_dir = '{tmp_path / 'outputs'}'\n")
    assert load_config(toml).output_root == meta_root
