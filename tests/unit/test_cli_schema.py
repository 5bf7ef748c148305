"""The one `--json` schema (sidecar/cli/schema.json) names every state and phase the code has, and its
validator (tests/support/schema.py) rejects what breaks it. Every command's output is checked
against it in tests/e2e/test_cli_json.py."""

from __future__ import annotations

from sidecar.cli.errors import ERROR_CODES, GENERIC_CODE
from sidecar.common.records import BUSY_STATES, State
from sidecar.fleet.answers import CAPTURE_TERMINAL, PENDING, STACKS_TERMINAL
from support.schema import load_schema, violations


def test_the_schema_names_every_state_and_phase_the_code_has():
    defs = load_schema()["$defs"]
    assert set(defs["record_state"]["enum"]) == {s.value for s in State} | {"unknown"}
    assert set(defs["capture_phase"]["enum"]) == {PENDING, *BUSY_STATES, *CAPTURE_TERMINAL, "no request"}
    assert set(defs["stacks_phase"]["enum"]) == {PENDING, *STACKS_TERMINAL}
    assert set(defs["error"]["properties"]["code"]["enum"]) == {c for _, c in ERROR_CODES} | {GENERIC_CODE,
                                                                                              "incomplete"}


def test_the_validator_rejects_what_breaks_the_schema():
    root = load_schema()
    good = {"replica": "r1", "registry": "/r", "registry_from": "--registry", "controller": None, "ranks": []}
    assert violations(good, root["commands"]["replica lsr"], root) == []
    bad = {**good, "ranks": [{"rank": "0"}]}
    problems = violations(bad, root["commands"]["replica lsr"], root)
    assert "$.ranks[0].rank: '0' is not of type integer" in problems and "$.ranks[0]: missing 'replica'" in problems
    assert violations({"error": "x", "code": "oops"}, root["$defs"]["error"], root) == [
        "$.code: 'oops' is not one of " + str(root["$defs"]["error"]["properties"]["code"]["enum"])]
