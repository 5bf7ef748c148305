"""One typed request, one way to the wire: `ControlRequest.to_wire()`, written by `registry.write_request`."""

from __future__ import annotations

import json

import pytest

from sidecar.common.config import SubProfilerConfig
from sidecar.common.exceptions import RequestError
from sidecar.common.layout import control_path
from sidecar.common.registry import write_request
from sidecar.common.request import (
    ControlRequest,
    RankFilter,
    defaults_from_config,
    parse_rank_filter,
    parse_request,
)


def test_only_the_fields_a_writer_names_go_on_the_wire():
    request = ControlRequest(id="cli-1", kind="trace", rank_filter=parse_rank_filter("0-3,8"), start_step=120)
    assert request.to_wire() == b'{"id": "cli-1", "kind": "trace", "rank_filter": "0-3,8", "start_step": 120}\n'
    assert ControlRequest(id="c", kind="cancel", rank_filter=RankFilter(None)).to_json() == {
        "id": "c", "kind": "cancel", "rank_filter": "all"}


def test_a_flag_set_false_is_sent_and_a_flag_left_out_is_not():
    """False is an answer (the config's true is overridden); None leaves the rank's config."""
    assert ControlRequest(id="a", with_stack=False).to_json() == {"id": "a", "with_stack": False}
    assert ControlRequest(id="a").to_json() == {"id": "a"}


def test_what_a_rank_parses_from_the_wire_is_what_was_sent():
    sent = ControlRequest(id="w1", kind="watch", rank_filter=parse_rank_filter("all"), start_step=50, factor=2.5,
                          consecutive=4, repeat=1, baseline=False, active_steps=2, record_shape=True)
    got = parse_request(sent.to_wire(), defaults_from_config(SubProfilerConfig()), "fallback")
    assert (got.id, got.kind, got.rank_filter.is_all, got.start_step, got.factor, got.consecutive, got.repeat,
            got.baseline, got.active_steps, got.record_shape) == ("w1", "watch", True, 50, 2.5, 4, 1, False, 2, True)


def test_same_capture_copies_what_a_request_records_and_the_flags_it_turns_on():
    watch = parse_request(b'{"id": "w", "kind": "watch", "factor": 3, "rank_filter": "0,2", "active_steps": 2, '
                          b'"warmup_steps": 0, "wait_steps": 1, "with_stack": true}',
                          defaults_from_config(SubProfilerConfig()), "x")
    capture = ControlRequest.same_capture(watch, id="w.slow-1", kind="trace", start_step=90, reason="slow")
    assert capture.to_json() == {"id": "w.slow-1", "kind": "trace", "rank_filter": "0,2", "start_step": 90,
                                 "active_steps": 2, "warmup_steps": 0, "wait_steps": 1, "with_stack": True,
                                 "reason": "slow"}


def test_a_json_object_is_read_into_the_typed_request_and_an_unknown_field_is_refused():
    assert ControlRequest.from_json({"id": "h", "rank_filter": [2, 0, 1]}).to_json() == {"id": "h", "rank_filter": "0-2"}
    with pytest.raises(RequestError, match="unknown field 'output'"):
        ControlRequest.from_json({"id": "h", "output": "/tmp/x"})


def test_write_request_writes_the_wire_bytes_and_leaves_no_temp_file(tmp_path):
    request = ControlRequest(id="s1", kind="stacks", rank_filter=RankFilter(None))
    path = write_request(tmp_path, "r1", request)
    assert path == control_path(tmp_path, "r1")
    assert path.read_bytes() == request.to_wire()
    assert json.loads(path.read_bytes()) == {"id": "s1", "kind": "stacks", "rank_filter": "all"}
    assert write_request(tmp_path, "r1", {"id": "s1", "kind": "stacks", "rank_filter": "all"}).read_bytes() == \
        request.to_wire()
    assert write_request(tmp_path, "r1", None).read_bytes() == b""
    assert sorted(p.name for p in path.parent.iterdir()) == ["r1.json"]
