"""The request model: strict parsing, bounds, rank filters, defaults."""

from __future__ import annotations

import pytest

from sidecar.common.config import SubProfilerConfig
from sidecar.common.exceptions import RequestError
from sidecar.common.request import (
    MAX_ID_LEN,
    MAX_START_AHEAD_S,
    MAX_START_AHEAD_STEPS,
    RankFilter,
    check_start_ahead,
    defaults_from_config,
    file_request_id,
    is_complete,
    parse_rank_filter,
    parse_request,
)

DEFAULTS = defaults_from_config(SubProfilerConfig(active_steps=2, rank_filter=[1, 2]))


@pytest.mark.parametrize(
    "text, ranks",
    [
        ("0,1", {0, 1}),
        ("0-3,8", {0, 1, 2, 3, 8}),
        (" 2 - 4 , 7 ", {2, 3, 4, 7}),
        ("5", {5}),
    ],
)
def test_rank_filter_strings(text, ranks):
    assert parse_rank_filter(text).ranks == frozenset(ranks)


def test_rank_filter_all_and_lists():
    assert parse_rank_filter("all").is_all
    assert parse_rank_filter("ALL").is_all
    assert 12345 in parse_rank_filter("all")
    assert parse_rank_filter([3, 1]).ranks == frozenset({1, 3})
    assert parse_rank_filter([]).ranks == frozenset({0}), "Cosmos-RL: an empty filter means rank 0"


@pytest.mark.parametrize(
    "value, message",
    [
        ("0-x", "cannot parse '0-x'"),
        ("3-1", "range '3-1' runs backwards"),
        ("", "is empty"),
        ("1,,2", "cannot parse ''"),
        ("0-99999999", "above the limit"),
        ([0, -1], "rank -1 is out of range"),
        ([0, True], "must list integer ranks"),
        ([0.5], "must list integer ranks"),
        (7, "must be a list of ranks or a string"),
        ("1" * 5000, "at most 4096"),
    ],
)
def test_rank_filter_errors_name_the_bad_part(value, message):
    with pytest.raises(RequestError, match=message.replace("(", r"\(").replace(")", r"\)")):
        parse_rank_filter(value)


def test_rank_filter_renders_compactly():
    assert str(parse_rank_filter("0-3,8,10-11")) == "0-3,8,10-11"
    assert str(RankFilter(None)) == "all"
    assert parse_rank_filter("0-2").to_json() == [0, 1, 2]


def test_empty_or_whitespace_file_means_defaults():
    for data in (b"", b"  \n\t"):
        req = parse_request(data, DEFAULTS, "fallback")
        assert req.id == "fallback"
        assert (req.active_steps, req.warmup_steps, req.wait_steps) == (2, 1, 1)
        assert req.rank_filter.ranks == frozenset({1, 2})
        assert req.num_steps == 4


def test_fields_override_defaults():
    req = parse_request(
        b'{"id": "a1", "active_steps": 5, "wait_steps": 0, "warmup_steps": 2, "rank_filter": "0-1",'
        b' "record_shape": true, "profile_memory": true, "with_stack": true, "with_modules": true, "start_step": 40}',
        DEFAULTS,
        "fallback",
    )
    assert req.id == "a1" and req.active_steps == 5 and req.wait_steps == 0 and req.warmup_steps == 2
    assert req.start_step == 40 and req.rank_filter.ranks == frozenset({0, 1})
    assert req.record_shape and req.profile_memory and req.with_stack and req.with_modules
    assert req.to_json()["rank_filter"] == [0, 1]


@pytest.mark.parametrize(
    "data, message",
    [
        (b"{", "not valid JSON"),
        (b"[]", "must be a JSON object, got a JSON array"),
        (b'"x"', "got a JSON string"),
        (b"null", "got a JSON null"),
        (b"3", "got a JSON number"),
        (b'{"bogus": 1}', "unknown field 'bogus'"),
        (b'{"active_steps": 0}', "active_steps must be between 1 and 1000, got 0"),
        (b'{"active_steps": 1001}', "active_steps must be between 1 and 1000"),
        (b'{"warmup_steps": -1}', "warmup_steps must be between 0"),
        (b'{"start_step": -5}', "start_step must be between 0"),
        (b'{"active_steps": "2"}', "active_steps must be an integer"),
        (b'{"active_steps": true}', "active_steps must be an integer"),
        (b'{"with_stack": 1}', "with_stack must be true or false"),
        (b'{"kind": "exec"}', "kind must be one of trace, stacks, memory, hang, cancel"),
        (b'{"id": "../etc"}', "id must be"),
        (b'{"id": ""}', "id must be"),
        (b'{"id": 5}', "id must be a string"),
        (b'{"output_dir": "/tmp"}', "unknown field 'output_dir'"),
        (b"\xff", "not UTF-8"),
        (b"[" * 100000, "not valid JSON"),
    ],
)
def test_bad_requests_raise_request_error(data, message):
    with pytest.raises(RequestError, match=message):
        parse_request(data, DEFAULTS, "fallback")


def test_id_length_is_bounded():
    ok = parse_request(('{"id": "%s"}' % ("a" * MAX_ID_LEN)).encode(), DEFAULTS, "f")
    assert len(ok.id) == MAX_ID_LEN
    with pytest.raises(RequestError):
        parse_request(('{"id": "%s"}' % ("a" * (MAX_ID_LEN + 1))).encode(), DEFAULTS, "f")


def test_start_step_null_means_next_step():
    assert parse_request(b'{"start_step": null}', DEFAULTS, "f").start_step is None


@pytest.mark.parametrize("value", [2**53, 9007199254740992, 2**63, 10**30])
def test_start_step_past_the_safe_json_range_is_refused(value):
    with pytest.raises(RequestError) as info:
        parse_request(b'{"start_step": %d}' % value, DEFAULTS, "f")
    assert str(info.value) == (
        f"start_step must be between 0 and 9007199254740991 (2**53-1, the largest integer JSON carries exactly), "
        f"got {value}"
    )
    assert parse_request(b'{"start_step": 9007199254740991}', DEFAULTS, "f").start_step == 2**53 - 1


def test_a_start_step_far_past_the_current_step_is_named_with_its_bound():
    assert check_start_ahead(1000 + MAX_START_AHEAD_STEPS, 1000, rate=50.0) is None
    assert check_start_ahead(99999999, 500, rate=None) == (
        f"start_step 99999999 is 99999499 steps past step 500; the limit is {MAX_START_AHEAD_STEPS} steps ahead"
    )
    # within the steps, beyond the time: 50,000 steps at 0.5 steps/s is about 28 h
    assert check_start_ahead(50_500, 500, rate=0.5) == (
        "start_step 50500 is 50000 steps past step 500, about 27.8 h at the recent 0.5 steps/s; the limit is 24 h ahead"
    )
    assert check_start_ahead(500 + int(MAX_START_AHEAD_S * 0.5), 500, rate=0.5) is None
    assert check_start_ahead(10, 500, rate=0.5) is None, "a start step that passed is not too far"


def test_a_cancel_takes_only_an_id_and_ranks_and_defaults_to_every_rank():
    cancel = parse_request(b'{"kind": "cancel"}', DEFAULTS, "f")
    assert (cancel.kind, cancel.id, cancel.rank_filter.is_all) == ("cancel", "f", True)
    some = parse_request(b'{"kind": "cancel", "id": "c1", "rank_filter": "0-1"}', DEFAULTS, "f")
    assert (some.id, some.rank_filter.ranks) == ("c1", frozenset({0, 1}))
    with pytest.raises(RequestError) as info:
        parse_request(b'{"kind": "cancel", "active_steps": 2}', DEFAULTS, "f")
    assert str(info.value) == "field 'active_steps' has no meaning in a cancel request (a cancel takes id, kind, rank_filter)"


def test_file_versions_get_their_own_id_and_incomplete_files_are_told_apart():
    assert file_request_id(123, b"") == file_request_id(123, b"")
    assert len({file_request_id(123, b""), file_request_id(124, b""), file_request_id(123, b"{}")}) == 3
    assert [is_complete(d) for d in (b"", b"  \n", b'{"id": ', b"{}", b'{"id": "a"}\n', b"[1]")] == [
        False, False, False, True, True, True]


def test_a_hang_request_asks_every_rank_unless_it_names_some():
    hang = parse_request(b'{"kind": "hang"}', DEFAULTS, "f")
    assert (hang.kind, hang.rank_filter.is_all) == ("hang", True)
    some = parse_request(b'{"kind": "hang", "rank_filter": "0,2"}', DEFAULTS, "f")
    assert some.rank_filter.ranks == frozenset({0, 2})
