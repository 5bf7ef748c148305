"""`--json`: every command's output, success and error, against the one schema (sidecar/cli/schema.json).

The table ROWS runs in order against one real rank (tests/programs/train.py): a new
command is a new row (its success and an error), and its output schema a new entry
under `commands` in schema.json. Validation is tests/support/schema.py, a tiny
validator of the subset the schema uses (no dependency to install); tests/unit/test_cli_schema.py
checks the schema and the validator themselves."""

from __future__ import annotations

import json

import pytest

from support.cli import invoke
from support.launch import Spawner
from support.records import record, wait_record
from support.schema import check, check_command, load_schema

# (argv, exit code, what the output is: a command of schema.json's `commands`, or an error `code`).
# "{reg}", "{tmp}" and "{far}" (a start step far ahead) are filled in; --registry {reg} is added
# unless the row names a registry. An "incomplete" row is checked against both its command and the error.
# A row "wait STATE" waits until the rank's record is in STATE (what the next row needs).
ROWS: list[tuple[str, int, str]] = [
    ("replica ls", 0, "replica ls"),
    ("replica lsr r1", 0, "replica lsr"),
    ("replica lsr nope", 1, "not_found"),
    ("replica ls --registry {tmp}/none", 1, "registry"),
    ("replica lsr", 2, "usage"),
    ("profile set r1 -as 1 --wait --timeout 60", 0, "profile set"),
    ("profile status r1", 0, "profile status"),
    ("profile status nope", 1, "not_found"),
    ("profile set r1 --start-step {far}", 0, "profile set"),
    ("wait armed", 0, ""),
    ("profile set r1", 1, "busy"),
    ("profile set r1 -rf x", 2, "usage"),
    ("profile cancel r1 --timeout 60", 0, "profile cancel"),
    ("profile cancel r1 --no-wait", 0, "profile cancel"),
    ("profile cancel nope", 1, "not_found"),
    ("profile set r1 -as 1 --wait --timeout 0.001", 1, "incomplete:profile set"),
    ("profile cancel r1 --timeout 60", 0, "profile cancel"),
    ("profile stacks r1", 0, "profile stacks"),
    ("profile stacks r1 -rf 5", 2, "usage"),
    ("profile hang r1", 0, "profile hang"),
    ("profile hang nope", 1, "not_found"),
    ("profile summary r1 --capture 0", 0, "profile summary"),
    ("profile summary r1 --capture 99", 1, "trace"),
    ("profile report r1 --capture 0 -o {tmp}/report.html", 0, "profile report"),
    ("profile report r1 --capture 99 -o {tmp}/report.html", 1, "trace"),
    ("profile diff r1:0 r1:0 -o {tmp}/diff.html", 0, "profile diff"),
    ("profile diff r1:0", 1, "trace"),
    ("profile merge r1 --capture 0 -o {tmp}/merged.json.gz", 0, "profile merge"),
    ("profile merge {tmp}/no/such -o {tmp}/x.json", 1, "trace"),
    ("profile export r1 --capture 0 {tmp}/flat", 0, "profile export"),
    ("profile export {tmp}/flat {tmp}/again", 2, "usage"),
    ("profile bogus", 2, "usage"),
    ("--bogus replica ls", 2, "usage"),
]


@pytest.fixture(scope="module")
def rank(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("json")
    spawner = Spawner(tmp)
    registry = tmp / "registry"
    try:
        proc = spawner.rank(registry, "--width", "16")
        yield tmp, registry
        assert proc.stop() == 0
    finally:
        spawner.close()


def test_every_command_prints_json_that_conforms_to_the_schema(rank):
    tmp, registry = rank
    commands = set(load_schema()["commands"])
    seen = set()
    for row, exit_code, what in ROWS:
        if row.startswith("wait "):
            state = row.split()[1]
            wait_record(registry, lambda r, state=state: r["state"] == state, what=f"rank 0 {state}")
            continue
        far = record(registry)["step"] + 50_000
        argv = row.format(reg=registry, tmp=tmp, far=far).split()
        if not any(a.startswith("--registry") for a in argv):
            argv += ["--registry", str(registry)]
        result = invoke(*argv, "--json")
        assert result.exit_code == exit_code, (row, result.output)
        data = json.loads(result.stdout)  # one JSON object, nothing else, on stdout
        assert isinstance(data, dict), row
        if exit_code == 0:
            check_command(data, what)
            assert "error" not in data, row
            seen.add(what)
            continue
        code, _, command = what.partition(":")
        check(data, "error")
        assert data["code"] == code, (row, data)
        if command:
            check_command(data, command)
            seen.add(command)
    assert seen == commands, f"commands without a success row: {commands - seen}"
