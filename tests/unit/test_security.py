"""Security: a request can only ever say what the documented fields say, in the documented bounds,
and a FIFO named as a file is refused, not waited on. The request model is checked in process:
it is pure. Control files in a real training process: tests/e2e/test_security_files.py."""

from __future__ import annotations

import dataclasses
import json
import os
import threading

import pytest

from sidecar.common.config import MAX_ACTIVE_STEPS, MAX_RANK, MAX_WAIT_STEPS, MAX_WARMUP_STEPS, SubProfilerConfig
from sidecar.common.exceptions import RequestError
from sidecar.common.request import (
    FIELDS,
    MAX_ID_LEN,
    MAX_RANK_FILTER_ITEMS,
    MAX_RANK_FILTER_TEXT,
    MAX_START_STEP,
    ProfileRequest,
    defaults_from_config,
    parse_request,
)
from support.cli import invoke

DEFAULTS = defaults_from_config(SubProfilerConfig())

# Fields a request might try to use to choose a path, a program, or our internals.
FOREIGN_FIELDS = [
    "output_dir", "trace_path", "path", "file", "dir", "registry", "replica", "rank", "exec", "command", "cmd",
    "on_trace_ready", "callback", "module", "source", "__class__", "__init__", "env", "LD_PRELOAD", "pid",
    "signal", "controller_url", "config", "kind ", "ID",
]


# Proves: no field outside the documented ones (paths, programs, callbacks, internals) is accepted, and the model has none to carry them.
@pytest.mark.parametrize("name", FOREIGN_FIELDS)
def test_a_request_cannot_name_a_field_outside_the_documented_ones(name):
    with pytest.raises(RequestError, match=f"unknown field {name!r}"):
        parse_request(f'{{"{name}": "/etc/passwd"}}'.encode(), DEFAULTS, "x")
    assert {f.name for f in dataclasses.fields(ProfileRequest)} == set(FIELDS) | {"source"}


BAD_VALUES = [
    ({"id": "../../etc/passwd"}, "id must be"),
    ({"id": "a/b"}, "id must be"),
    ({"id": "x\n"}, "id must be"),
    ({"id": "-rf"}, "id must be"),
    ({"id": "$(reboot)"}, "id must be"),
    ({"id": "x" * (MAX_ID_LEN + 1)}, "id must be"),
    ({"id": ""}, "id must be"),
    ({"id": 7}, "id must be a string"),
    ({"kind": "exec"}, "kind must be one of"),
    ({"kind": "../trace"}, "kind must be one of"),
    ({"active_steps": 0}, f"active_steps must be between 1 and {MAX_ACTIVE_STEPS}"),
    ({"active_steps": MAX_ACTIVE_STEPS + 1}, f"active_steps must be between 1 and {MAX_ACTIVE_STEPS}"),
    ({"warmup_steps": -1}, f"warmup_steps must be between 0 and {MAX_WARMUP_STEPS}"),
    ({"warmup_steps": MAX_WARMUP_STEPS + 1}, f"warmup_steps must be between 0 and {MAX_WARMUP_STEPS}"),
    ({"wait_steps": MAX_WAIT_STEPS + 1}, f"wait_steps must be between 0 and {MAX_WAIT_STEPS}"),
    ({"start_step": -1}, f"start_step must be between 0 and {MAX_START_STEP}"),
    ({"start_step": MAX_START_STEP + 1}, f"start_step must be between 0 and {MAX_START_STEP}"),
    ({"start_step": 2**53}, "start_step must be between 0 and 9007199254740991 (2**53-1"),
    ({"active_steps": 10**400}, "active_steps must be between"),
    ({"active_steps": True}, "active_steps must be an integer"),
    ({"active_steps": 1.0}, "active_steps must be an integer"),
    ({"active_steps": "1"}, "active_steps must be an integer"),
    ({"with_stack": 1}, "with_stack must be true or false"),
    ({"record_shape": "yes"}, "record_shape must be true or false"),
    ({"rank_filter": f"0-{MAX_RANK + 1}"}, f"above the limit {MAX_RANK}"),
    ({"rank_filter": [MAX_RANK + 1]}, f"out of range 0..{MAX_RANK}"),
    ({"rank_filter": [-1]}, f"out of range 0..{MAX_RANK}"),
    ({"rank_filter": [True]}, "must list integer ranks"),
    ({"rank_filter": list(range(MAX_RANK_FILTER_ITEMS + 1))}, f"at most {MAX_RANK_FILTER_ITEMS} are allowed"),
    ({"rank_filter": "0-" + str(MAX_RANK_FILTER_ITEMS)}, f"more than {MAX_RANK_FILTER_ITEMS} ranks"),
    ({"rank_filter": "1," * (MAX_RANK_FILTER_TEXT // 2 + 1)}, f"at most {MAX_RANK_FILTER_TEXT} are allowed"),
    ({"rank_filter": "0;rm -rf /"}, "cannot parse"),
    ({"rank_filter": {"ranks": [0]}}, "must be a list of ranks or a string"),
]


# Proves: numbers one past each bound, bool/float/string numbers, path or shell characters in ids, and oversized rank filters are refused.
@pytest.mark.parametrize(("request_obj", "message"), BAD_VALUES, ids=[str(i) for i in range(len(BAD_VALUES))])
def test_out_of_bounds_or_ill_typed_values_are_refused(request_obj, message):
    with pytest.raises(RequestError) as info:
        parse_request(json.dumps(request_obj).encode(), DEFAULTS, "x")
    assert message in str(info.value)


# Proves: the documented bounds themselves are accepted, so the README's bounds table is exact.
def test_the_documented_bounds_are_inclusive():
    edge = {"active_steps": MAX_ACTIVE_STEPS, "warmup_steps": MAX_WARMUP_STEPS, "wait_steps": MAX_WAIT_STEPS,
            "start_step": MAX_START_STEP, "rank_filter": [MAX_RANK], "id": "a" * MAX_ID_LEN}
    req = parse_request(json.dumps(edge).encode(), DEFAULTS, "x")
    assert (req.active_steps, req.warmup_steps, req.wait_steps, req.start_step) == (
        MAX_ACTIVE_STEPS, MAX_WARMUP_STEPS, MAX_WAIT_STEPS, MAX_START_STEP)
    low = parse_request(b'{"active_steps": 1, "warmup_steps": 0, "wait_steps": 0, "start_step": 0}', DEFAULTS, "x")
    assert (low.active_steps, low.warmup_steps, low.wait_steps, low.start_step) == (1, 0, 0, 0)
    wide = parse_request(f'{{"rank_filter": "0-{MAX_RANK_FILTER_ITEMS - 1}"}}'.encode(), DEFAULTS, "x")
    assert len(wide.rank_filter.ranks) == MAX_RANK_FILTER_ITEMS


def test_a_fifo_named_as_a_trace_stacks_or_dump_file_is_refused_not_waited_on(tmp_path):
    # Paths come from rank records and from users: a plain open() of a FIFO blocks until a writer comes.
    from sidecar.common.stackdump import read_stacks
    from sidecar.fleet.hang import read_dump

    fifo = tmp_path / "0_trace.json.gz"
    os.mkfifo(fifo)
    outcome: dict[str, object] = {}

    def attempt() -> None:
        for name, call in (("stacks", read_stacks), ("dump", read_dump)):
            try:
                call(fifo)
            except OSError as exc:
                outcome[name] = exc.strerror
        outcome["summary"] = invoke("profile", "summary", str(fifo))

    worker = threading.Thread(target=attempt, daemon=True)
    worker.start()
    worker.join(timeout=60)
    assert not worker.is_alive(), "reading a FIFO blocked"
    assert outcome["stacks"] == outcome["dump"] == "not a regular file (a FIFO, socket or device)"
    summary = outcome["summary"]
    assert summary.exit_code == 1 and "not a regular file" in summary.stderr, summary.output
