"""Config loading: Cosmos-RL field names and defaults, strict [profiler] and [sidecar] tables."""

from __future__ import annotations

import dataclasses

import pytest

from cosmos_rl.policy.config import ProfilerConfig, SubProfilerConfig
from sidecar.config import SidecarSettings, load_config
from sidecar.errors import ConfigError

COSMOS_DEFAULTS = {
    "enable_profiler": False,
    "enable_nsys": False,
    "sub_profiler_config": {
        "do_profile": False,
        "active_steps": 1,
        "warmup_steps": 1,
        "wait_steps": 1,
        "rank_filter": [],
        "record_shape": False,
        "profile_memory": False,
        "with_stack": False,
        "with_modules": False,
    },
}


def test_defaults_are_cosmos_rls():
    assert dataclasses.asdict(ProfilerConfig()) == COSMOS_DEFAULTS


def test_load_full_cosmos_config(tmp_path):
    path = tmp_path / "train.toml"
    path.write_text(
        """
redis = "12800"

[train]
output_dir = "./outputs/qwen/20250101"
epoch = 3
optm_lr = 1e-6

[policy.parallelism]
tp_size = 2

[profiler]
enable_profiler = true

[profiler.sub_profiler_config]
active_steps = 2
rank_filter = [0, 1]
record_shape = true
with_stack = true

[sidecar]
watch = "poll"
poll_interval = 0.5
signal = "USR2"
allowed_uids = [1234]
"""
    )
    job = load_config(path)
    assert job.profiler.enable_profiler is True
    sub = job.profiler.sub_profiler_config
    assert (sub.active_steps, sub.rank_filter, sub.record_shape, sub.with_stack) == (2, [0, 1], True, True)
    assert (sub.warmup_steps, sub.wait_steps, sub.profile_memory) == (1, 1, False)
    assert job.train_output_dir == "./outputs/qwen/20250101"
    assert job.sidecar.watch == "poll" and job.sidecar.poll_interval == 0.5
    assert job.sidecar.signal == "SIGUSR2" and job.sidecar.allowed_uids == [1234]


@pytest.mark.parametrize(
    "toml, message",
    [
        ("[profiler]\nenable_profilr = true", "unknown key profiler.enable_profilr"),
        ("[profiler]\nenable_profiler = 1", "profiler.enable_profiler must be true or false"),
        ("[profiler.sub_profiler_config]\nactive_steps = 'two'", "profiler.sub_profiler_config.active_steps must be an integer"),
        ("[profiler.sub_profiler_config]\nactive_steps = 0", "active_steps must be between 1 and 1000"),
        ("[profiler.sub_profiler_config]\nrank_filter = 0", "rank_filter must be a list of integers"),
        ("[profiler.sub_profiler_config]\nrank_filter = [-1]", "rank_filter must be between 0"),
        ("[profiler.sub_profiler_config]\nfoo = 1", "unknown key profiler.sub_profiler_config.foo"),
        ("[profiler]\nsub_profiler_config = 3", "profiler.sub_profiler_config must be a table"),
        ("profiler = 3", "profiler must be a table"),
        ("[sidecar]\nwatch = 'fanotify'", "sidecar.watch must be one of auto, inotify, poll"),
        ("[sidecar]\npoll_interval = 0", "sidecar.poll_interval must be between"),
        ("[sidecar]\nsignal = 'SIGNOPE'", "sidecar.signal must name a signal"),
        ("[sidecar]\nregistry = 5", "sidecar.registry must be a string"),
        ("[train]\noutput_dir = 5", "train.output_dir must be a non-empty string"),
        ("[profiler\n", "not valid TOML"),
    ],
)
def test_bad_config_names_the_key(tmp_path, toml, message):
    path = tmp_path / "bad.toml"
    path.write_text(toml)
    with pytest.raises(ConfigError, match=message):
        load_config(path)


def test_config_error_is_a_value_error(tmp_path):
    with pytest.raises(ValueError, match="cannot read config"):
        load_config(tmp_path / "missing.toml")


def test_env_overrides_settings():
    s = SidecarSettings().with_env({"COSMOS_PROFILER_WATCH": "POLL", "COSMOS_PROFILER_POLL_INTERVAL": "0.25"})
    assert (s.watch, s.poll_interval) == ("poll", 0.25)
    with pytest.raises(ConfigError, match="COSMOS_PROFILER_POLL_INTERVAL must be a number"):
        SidecarSettings().with_env({"COSMOS_PROFILER_POLL_INTERVAL": "soon"})


def test_sub_profiler_config_validates_on_construction():
    with pytest.raises(ConfigError, match="active_steps"):
        SubProfilerConfig(active_steps=-2)
    assert ProfilerConfig(sub_profiler_config={"active_steps": 4}).sub_profiler_config.active_steps == 4


@pytest.mark.parametrize(
    "table, message",
    [
        ("[sidecar]\nallowed_uids = [9007199254740992]",
         "sidecar.allowed_uids: 9007199254740992 is outside the safe integer range"),
        ("[sidecar]\nmax_control_bytes = -9007199254740993",
         "sidecar.max_control_bytes: -9007199254740993 is outside the safe integer range"),
        ("[sidecar]\npoll_interval = 1" + "0" * 400,
         "sidecar.poll_interval: 1" + "0" * 400 + " is outside the safe integer range"),
        ("[sidecar]\nsettle_time = 11", "sidecar.settle_time must be between 0.0 and 10.0, got 11.0"),
    ],
)
def test_integers_past_the_safe_json_range_are_refused_naming_the_key(tmp_path, table, message):
    path = tmp_path / "train.toml"
    path.write_text(table + "\n")
    with pytest.raises(ConfigError) as info:
        load_config(path)
    assert message in str(info.value)
