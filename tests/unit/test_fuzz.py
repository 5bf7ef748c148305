"""Fuzz the parsers that take untrusted input: control-file requests, rank filters, job configs.

The contract: whatever comes in, the only exception that escapes is the
documented one (`RequestError` for requests and rank filters, `ConfigError`
for configs), and whatever is accepted lies inside the documented bounds.
About 10,000 generated cases; derandomized, so a run is reproducible.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import math

import pytest
from hypothesis import HealthCheck, event, example, given, settings
from hypothesis import strategies as st

from sidecar.common import envvars
from sidecar.common.config import (
    MAX_ACTIVE_STEPS,
    MAX_POLL_INTERVAL_S,
    MAX_RANK,
    MAX_WAIT_STEPS,
    MAX_WARMUP_STEPS,
    MIN_POLL_INTERVAL_S,
    WATCH_MODES,
    JobConfig,
    ProfilerConfig,
    SidecarSettings,
    SubProfilerConfig,
    config_from_dict,
    load_config,
)
from sidecar.common.exceptions import ConfigError, RequestError
from sidecar.common.request import (
    FIELDS,
    KINDS,
    MAX_ID_LEN,
    MAX_RANK_FILTER_ITEMS,
    MAX_START_STEP,
    ProfileRequest,
    RankFilter,
    defaults_from_config,
    parse_rank_filter,
    parse_request,
)

BASE = settings(derandomize=True, database=None, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def fuzz(n: int) -> settings:
    return settings(BASE, max_examples=n)


DEFAULTS = defaults_from_config(SubProfilerConfig())

# Integers near every bound, so accepted and refused edges are both hit often.
EDGES = sorted({v + d for v in (0, 1, MAX_ACTIVE_STEPS, MAX_WARMUP_STEPS, MAX_WAIT_STEPS, MAX_RANK, MAX_START_STEP,
                                MAX_RANK_FILTER_ITEMS, 1 << 63, 1 << 64) for d in (-1, 0, 1)} | {-(1 << 63), 10**400})
edge_ints = st.sampled_from(EDGES) | st.integers(min_value=-10, max_value=2000)

json_scalars = (
    st.none() | st.booleans() | edge_ints | st.integers()
    | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=24)
)
json_values = st.recursive(
    json_scalars, lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=8,
)
rank_text = st.text(alphabet="0123456789-, \tal", max_size=40) | st.sampled_from(
    ["all", "ALL", " all ", "0-3,8", "3-0", "0-", "-1", ",", "0,,1", f"0-{MAX_RANK}", f"{MAX_RANK}", f"{MAX_RANK + 1}",
     f"0-{MAX_RANK_FILTER_ITEMS - 1}", f"0-{MAX_RANK_FILTER_ITEMS}", "1" * 5000, "٣", "0-3,8\n"])
ids = st.text(max_size=MAX_ID_LEN + 2) | st.from_regex(r"[A-Za-z0-9][A-Za-z0-9._:@+-]{0,130}", fullmatch=True)
field_values = (
    json_values | edge_ints | rank_text | ids | st.sampled_from([*KINDS, "exec", ""])
    | st.lists(edge_ints, max_size=8)
)


def with_junk(tables: st.SearchStrategy, values: st.SearchStrategy) -> st.SearchStrategy:
    """`tables`, sometimes with one key that is not a documented one."""
    junk = st.dictionaries(st.text(max_size=8), values, max_size=1)
    return st.builds(lambda table, extra: {**extra, **table}, tables, junk)


def _steps(low: int, high: int) -> st.SearchStrategy:
    return st.integers(low, high) | st.sampled_from([low, high, low - 1, high + 1])


# Mostly valid requests (each field in or just past its bounds), so the accepting path is fuzzed too.
plausible_values = {
    "id": ids,
    "kind": st.sampled_from(KINDS),
    "active_steps": _steps(1, MAX_ACTIVE_STEPS),
    "warmup_steps": _steps(0, MAX_WARMUP_STEPS),
    "wait_steps": _steps(0, MAX_WAIT_STEPS),
    "start_step": st.none() | _steps(0, MAX_START_STEP),
    "rank_filter": rank_text | st.lists(st.integers(0, 8), max_size=4),
    **{name: st.booleans() for name in ("record_shape", "profile_memory", "with_stack", "with_modules")},
}
requests = (
    st.fixed_dictionaries({}, optional=plausible_values)
    | with_junk(st.fixed_dictionaries({}, optional={name: field_values for name in FIELDS}), field_values)
)


def _check_request(req: ProfileRequest) -> None:
    """An accepted request lies inside the documented bounds."""
    assert req.kind in KINDS
    assert 1 <= req.active_steps <= MAX_ACTIVE_STEPS
    assert 0 <= req.warmup_steps <= MAX_WARMUP_STEPS
    assert 0 <= req.wait_steps <= MAX_WAIT_STEPS
    assert req.start_step is None or 0 <= req.start_step <= MAX_START_STEP
    for flag in (req.record_shape, req.profile_memory, req.with_stack, req.with_modules):
        assert isinstance(flag, bool)
    _check_filter(req.rank_filter)
    assert req.source == "file"


def _check_filter(rf: RankFilter) -> None:
    if rf.ranks is not None:
        assert 0 < len(rf.ranks) <= MAX_RANK_FILTER_ITEMS
        assert all(type(k) is int and 0 <= k <= MAX_RANK for k in rf.ranks)
        assert parse_rank_filter(str(rf)) == rf  # the printed form parses back to the same set


# Proves: arbitrary bytes as a control file raise only RequestError, never another exception.
@fuzz(1500)
@given(st.binary(max_size=256))
@example(b"[" * 100_000)
@example(b'{"a":' * 50_000)
@example(b"\xef\xbb\xbf{}")
@example(b"{}\x00")
@example(b'{"active_steps": ' + b"9" * 5000 + b"}")  # longer than int() converts: ValueError, not a decode error
def test_any_bytes_raise_only_request_error(data):
    try:
        _check_request(parse_request(data, DEFAULTS, "fallback"))
    except RequestError:
        event("refused")
        return
    event("accepted")


# Proves: any JSON request (biased to real fields and edge values) raises only RequestError; accepted ones are in bounds.
@fuzz(2000)
@given(requests | json_values)
def test_any_json_request_raises_only_request_error(obj):
    data = json.dumps(obj).encode()
    try:
        req = parse_request(data, DEFAULTS, "fallback")
    except RequestError:
        event("refused")
        return
    event("accepted")
    _check_request(req)
    assert isinstance(obj, dict) and set(obj) <= set(FIELDS)


# Proves: any rank filter string or list raises only RequestError; accepted filters are bounded and print back to themselves.
@fuzz(1500)
@given(rank_text | st.text(max_size=30) | st.lists(edge_ints | json_scalars, max_size=10) | json_values)
def test_any_rank_filter_raises_only_request_error(value):
    try:
        rf = parse_rank_filter(value)
    except RequestError:
        event("refused")
        return
    event("accepted")
    _check_filter(rf)


# --- configs ------------------------------------------------------------------------


toml_scalars = (
    st.booleans() | edge_ints | st.integers(min_value=-(1 << 63), max_value=(1 << 63) - 1)
    | st.floats(allow_nan=True, allow_infinity=True) | st.text(max_size=24)
    | st.datetimes() | st.dates() | st.times()
    | st.sampled_from([*WATCH_MODES, "SIGUSR1", "usr2", "off", "OFF", "SIGKILL", "NOPE", "SIG", "", "http://x"])
)
toml_values = st.recursive(
    toml_scalars, lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=6,
)
toml_fields = toml_scalars | st.lists(edge_ints, max_size=4) | toml_values


def _names(cls: type) -> list[str]:
    return [f.name for f in dataclasses.fields(cls)]


def _table(keys: list[str], **special: st.SearchStrategy) -> st.SearchStrategy:
    """A table with any subset of `keys` (values of any TOML type), sometimes a junk key."""
    tables = st.fixed_dictionaries({}, optional={k: special.get(k, toml_fields) for k in keys})
    return with_junk(tables, toml_fields)


sub_tables = _table(_names(SubProfilerConfig))
profiler_tables = _table(_names(ProfilerConfig), sub_profiler_config=sub_tables | toml_fields)
configs = _table(
    ["profiler", "sidecar", "train", "policy"],
    profiler=profiler_tables | toml_fields,
    sidecar=_table(_names(SidecarSettings)) | toml_fields,
    train=_table(["output_dir", "epoch"]) | toml_fields,
    policy=toml_values,
)


def _check_config(job: JobConfig) -> None:
    sub, side = job.profiler.sub_profiler_config, job.sidecar
    assert isinstance(job.profiler.enable_profiler, bool) and isinstance(sub, SubProfilerConfig)
    assert all(isinstance(getattr(sub, n), int) for n in ("active_steps", "warmup_steps", "wait_steps"))
    assert side.watch in WATCH_MODES and MIN_POLL_INTERVAL_S <= side.poll_interval <= MAX_POLL_INTERVAL_S
    assert not math.isnan(side.heartbeat_interval) and 16 <= side.max_control_bytes <= 16 * 1024 * 1024
    assert side.signal == "off" or side.signal.lower() == "off" or side.signal.startswith("SIG")
    assert job.train_output_dir is None or (isinstance(job.train_output_dir, str) and job.train_output_dir)
    # any accepted config yields request defaults the sidecar can run: bounded where used (a count below
    # its floor is kept, and refuses the request that takes it)
    defaults = defaults_from_config(sub)
    assert defaults["active_steps"] <= MAX_ACTIVE_STEPS and defaults["warmup_steps"] <= MAX_WARMUP_STEPS
    assert defaults["wait_steps"] <= MAX_WAIT_STEPS
    assert defaults["rank_filter"].ranks is not None and all(0 <= k <= MAX_RANK for k in defaults["rank_filter"].ranks)


# Proves: any TOML-shaped config (biased to the real tables and keys) raises only ConfigError; accepted configs are in bounds.
@fuzz(2000)
@given(configs)
@example({"profiler": {"sub_profiler_config": {"rank_filter": list(range(70_000))}}})
@example({"sidecar": {"poll_interval": float("nan")}})
@example({"train": {"output_dir": datetime.date(2024, 1, 1)}})
def test_any_config_raises_only_config_error(doc):
    try:
        job = config_from_dict(doc)
    except ConfigError:
        event("refused")
        return
    event("accepted")
    _check_config(job)


@pytest.fixture(scope="module")
def config_file(tmp_path_factory):
    return tmp_path_factory.mktemp("fuzz") / "train.toml"


# Proves: any bytes as a config file (TOML or not, UTF-8 or not) make load_config raise only ConfigError.
@fuzz(800)
@given(st.binary(max_size=200) | st.text(alphabet="[]=.\"' \nabcdefgiklmnoprstuvwx_0123456789-+", max_size=120))
@example("[profiler]\nenable_profiler = true\n[profiler.sub_profiler_config]\nactive_steps = 0\n")
@example("[sidecar]\nwatch = 1\n")
@example("a = " + "9" * 5000)  # longer than int() converts
@example("a = " + "[" * 100_000)  # deeper than tomllib recurses
def test_any_config_file_raises_only_config_error(config_file, data):
    config_file.write_bytes(data.encode() if isinstance(data, str) else data)
    try:
        job = load_config(config_file)
    except ConfigError:
        event("refused")
        return
    event("accepted")
    _check_config(job)


ENV_KEYS = [var.name for var in envvars.TABLE if var.key is not None and var.convert is not None]


# Proves: any COSMOS_PROFILER_* environment override raises only ConfigError once applied and validated
# (at launch), and never raises inside a running job.
@fuzz(500)
@given(st.dictionaries(st.sampled_from(ENV_KEYS),
                       st.text(max_size=12) | st.sampled_from(["nan", "inf", "-1", "0.01", "1e9", "poll", "usr1", "off"]),
                       max_size=4))
def test_any_env_override_raises_only_config_error(env):
    _check_config(JobConfig(sidecar=envvars.apply(SidecarSettings(), env, strict=False)))
    try:
        settings_ = envvars.apply(SidecarSettings(), env)
        settings_.__post_init__()
    except ConfigError:
        event("refused")
        return
    event("accepted")
    _check_config(JobConfig(sidecar=settings_))
