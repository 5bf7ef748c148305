"""Config loading: Cosmos-RL field names and defaults, strict [profiler] and [sidecar] tables."""

from __future__ import annotations

import dataclasses
import os
from types import SimpleNamespace

import pytest

from cosmos_rl.policy.config import ProfilerConfig, SubProfilerConfig
from sidecar.config import SidecarSettings, job_config, load_config
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


# --- one output root, whatever cosmos-rl's timestamp ------------------------------


@pytest.mark.parametrize(
    ("train", "root"),
    [
        ("output_dir = '{d}/run'", "{d}/run"),  # cosmos-rl appends a timestamp, traces land in run/
        ("output_dir = '{d}/run'\ntimestamp = ''", "{d}/run"),
        ("output_dir = '{d}/run/20250101120000'\ntimestamp = '20250101120000'", "{d}/run"),  # used as is
        ("epoch = 1", "{cwd}/outputs"),  # cosmos-rl's default output_dir, plus a timestamp
    ],
)
def test_output_root_of_a_toml_is_where_cosmos_rl_puts_traces(tmp_path, train, root):
    path = tmp_path / "job.toml"
    path.write_text("[train]\n" + train.format(d=tmp_path) + "\n")
    assert load_config(path).output_root == root.format(d=tmp_path, cwd=os.getcwd())


def test_no_train_table_means_no_output_root(tmp_path):
    path = tmp_path / "job.toml"
    path.write_text("[profiler]\nenable_profiler = true\n")
    assert load_config(path).output_root is None


def _cosmos_like(output_dir, enable=True, **sub):
    """An object shaped like cosmos-rl's pydantic Config: read by attribute access only."""
    values = dict(do_profile=False, active_steps=1, warmup_steps=1, wait_steps=1, rank_filter=[],
                  record_shape=False, profile_memory=False, with_stack=False, with_modules=False)
    values.update(sub)
    profiler = SimpleNamespace(enable_profiler=enable, enable_nsys=False, sub_profiler_config=SimpleNamespace(**values))
    return SimpleNamespace(profiler=profiler, train=SimpleNamespace(output_dir=output_dir, timestamp="20250101120000"))


def test_job_config_takes_cosmos_rl_config_objects(tmp_path):
    cfg = _cosmos_like(str(tmp_path / "run" / "20250101120000"), active_steps=3, rank_filter=[0, 2])
    job, enabled = job_config(cfg)
    assert enabled and job.output_root == str(tmp_path / "run")
    assert job.profiler.sub_profiler_config.active_steps == 3 and job.profiler.sub_profiler_config.rank_filter == [0, 2]
    job, enabled = job_config(cfg.profiler)  # a bare ProfilerConfig
    assert enabled and job.output_root is None and job.profiler.sub_profiler_config.active_steps == 3
    assert job_config(None)[1] is True  # no config at all: installing is the opt-in
    assert job_config(_cosmos_like(str(tmp_path), enable=False))[1] is False


def test_job_config_names_the_bad_key_of_a_config_object(tmp_path):
    with pytest.raises(ConfigError, match="profiler.sub_profiler_config.active_steps"):
        job_config(_cosmos_like(str(tmp_path), active_steps=0))
    with pytest.raises(ConfigError, match="config must be a TOML path, a ProfilerConfig, a cosmos-rl Config"):
        job_config(42)


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


@pytest.mark.parametrize(("var", "value", "message"), [
    ("COSMOS_PROFILER_WATCH", "bogus", "COSMOS_PROFILER_WATCH must be one of auto, inotify, poll, got 'bogus'"),
    ("COSMOS_PROFILER_POLL_INTERVAL", "7200", "COSMOS_PROFILER_POLL_INTERVAL must be between 0.01 and 3600.0, got 7200.0"),
    ("COSMOS_PROFILER_SIGNAL", "SIGNOPE",
     "COSMOS_PROFILER_SIGNAL must name a signal (e.g. SIGUSR1) or be 'off', got 'SIGNOPE'"),
])
def test_a_bad_environment_variable_is_named_not_the_key_it_sets(var, value, message):
    # It said "sidecar.watch must be ...": a key the user never wrote.
    with pytest.raises(ConfigError) as err:
        SidecarSettings().with_env({var: value})
    assert str(err.value) == message


def test_a_bad_key_in_a_config_file_names_the_file_and_the_key(tmp_path):
    path = tmp_path / "job.toml"
    path.write_text("[sidecar]\nwatch = 'sometimes'\n")
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert str(err.value) == f"config {path}: sidecar.watch must be one of auto, inotify, poll, got 'sometimes'"
