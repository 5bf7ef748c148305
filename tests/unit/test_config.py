"""Config loading: Cosmos-RL's tables taken as cosmos-rl takes them, a strict [sidecar] table,
and the one table of COSMOS_PROFILER_* variables."""

from __future__ import annotations

import dataclasses
import os
from types import SimpleNamespace

import pytest

from cosmos_rl.policy.config import ProfilerConfig, SubProfilerConfig
from sidecar.common import envvars
from sidecar.common.config import SidecarSettings, job_config, load_config
from sidecar.common.exceptions import ConfigError, RequestError
from sidecar.common.request import config_defaults, parse_request
from support.launch import ROOT
from support.settings import BAD_VALUES

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
        # what cosmos-rl 0.4.7 refuses too (tests/e2e/test_cosmos_rl.py holds the two equal)
        ("[profiler]\nenable_profiler = 'maybe'", "profiler.enable_profiler must be true or false"),
        ("[profiler.sub_profiler_config]\nactive_steps = 'two'", "profiler.sub_profiler_config.active_steps must be an integer"),
        ("[profiler.sub_profiler_config]\nactive_steps = 1.5", "profiler.sub_profiler_config.active_steps must be an integer"),
        ("[profiler.sub_profiler_config]\nrank_filter = 0", "rank_filter must be a list of integers"),
        ("[profiler]\nsub_profiler_config = 3", "profiler.sub_profiler_config must be a table"),
        ("profiler = 3", "profiler must be a table"),
        ("[sidecar]\nwatch = 'fanotify'", "sidecar.watch must be one of auto, inotify, poll"),
        ("[sidecar]\npoll_interval = 0", "sidecar.poll_interval must be between"),
        ("[sidecar]\nsignal = 'SIGNOPE'", "sidecar.signal: 'SIGNOPE' names no signal"),
        ("[sidecar]\nstacks_signal = 'SIGSEGV'", "sidecar.stacks_signal cannot be SIGSEGV"),
        ("[sidecar]\ncontroller_url = 'ftp://x'", "sidecar.controller_url must be a controller address"),
        ("[sidecar]\nwatchh = 'poll'", "unknown key sidecar.watchh"),
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
    s = envvars.apply(SidecarSettings(), {"COSMOS_PROFILER_WATCH": "POLL", "COSMOS_PROFILER_POLL_INTERVAL": "0.25"})
    assert (s.watch, s.poll_interval) == ("poll", 0.25)
    with pytest.raises(ConfigError, match="COSMOS_PROFILER_POLL_INTERVAL must be a number"):
        envvars.apply(SidecarSettings(), {"COSMOS_PROFILER_POLL_INTERVAL": "soon"})


def test_sub_profiler_config_takes_what_cosmos_rl_takes():
    # Any integer, as pydantic coerces it; bounded only where the sidecar uses it.
    assert SubProfilerConfig(active_steps=-2).active_steps == -2
    assert SubProfilerConfig(active_steps="1_500", with_stack="yes", rank_filter=[1.0, "2"]) == SubProfilerConfig(
        active_steps=1500, with_stack=True, rank_filter=[1, 2])
    assert ProfilerConfig(sub_profiler_config={"active_steps": 4, "future_key": 1}).sub_profiler_config.active_steps == 4
    with pytest.raises(ConfigError, match="profiler.sub_profiler_config.active_steps must be an integer, got 'two'"):
        SubProfilerConfig(active_steps="two")


def test_a_toml_cosmos_rl_accepts_loads_and_is_bounded_where_used(tmp_path):
    # active_steps = 1500 refused the whole TOML (the CLI's --config) and turned a worker's sidecar off.
    path = tmp_path / "job.toml"
    path.write_text("[profiler]\nenable_profiler = 'true'\nnew_key = 1\n"
                    "[profiler.sub_profiler_config]\nactive_steps = 1500\nwarmup_steps = '2'\nwait_steps = -1\n"
                    "rank_filter = [0, -1, 3]\nfuture = 'x'\n")
    job = load_config(path)
    sub = job.profiler.sub_profiler_config
    assert job.profiler.enable_profiler is True
    assert (sub.active_steps, sub.warmup_steps, sub.wait_steps, sub.rank_filter) == (1500, 2, -1, [0, -1, 3])
    defaults, notes = config_defaults(sub)
    assert defaults["active_steps"] == 1000 and sorted(defaults["rank_filter"].ranks) == [0, 3]
    assert notes == [
        "profiler.sub_profiler_config.active_steps = 1500 is above the sidecar's limit of 1000; 1000 is used",
        "profiler.sub_profiler_config.wait_steps = -1 is below 0: a request that does not give wait_steps is refused",
        "profiler.sub_profiler_config.rank_filter: -1 name no rank (0..1048576) and are left out",
    ]
    # a request that takes the unusable count from the config is refused, naming the key; one that gives it is not
    with pytest.raises(RequestError, match=r"profiler.sub_profiler_config.wait_steps = -1, but wait_steps must be at "
                                           r"least 0; give wait_steps in the request"):
        parse_request(b"", defaults, "r1")
    request = parse_request(b'{"wait_steps": 0, "active_steps": 2}', defaults, "r2")
    assert (request.wait_steps, request.warmup_steps, request.active_steps) == (0, 2, 2)
    assert parse_request(b'{"kind": "cancel"}', defaults, "r3").kind == "cancel"


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
    assert job_config(_cosmos_like(str(tmp_path), active_steps=0))[0].profiler.sub_profiler_config.active_steps == 0
    with pytest.raises(ConfigError, match="profiler.sub_profiler_config.active_steps"):
        job_config(_cosmos_like(str(tmp_path), active_steps=None))
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
     "COSMOS_PROFILER_SIGNAL: 'SIGNOPE' names no signal (spell it as `kill -s` does: SIGUSR1, USR2, SIGRTMIN+3) "
     "(or 'off')"),
    # KeyError: 'stall_after_s' (ENV_OF_SETTING had no entry for it), and likewise for stacks_signal
    ("COSMOS_PROFILER_STALL_AFTER_S", "-5", "COSMOS_PROFILER_STALL_AFTER_S (0 is off) must be between 1.0 and "
     "604800.0, got -5.0"),
    ("COSMOS_PROFILER_STACKS_SIGNAL", "SIGKILL", "COSMOS_PROFILER_STACKS_SIGNAL cannot be SIGKILL: no handler can "
     "catch it; use e.g. SIGUSR1 or SIGRTMIN+3 (or 'off')"),
])
def test_a_bad_environment_variable_is_named_not_the_key_it_sets(var, value, message):
    # It said "sidecar.watch must be ...": a key the user never wrote.
    with pytest.raises(ConfigError) as err:
        envvars.apply(SidecarSettings(), {var: value})
    assert str(err.value) == message


def test_a_bad_key_in_a_config_file_names_the_file_and_the_key(tmp_path):
    path = tmp_path / "job.toml"
    path.write_text("[sidecar]\nwatch = 'sometimes'\n")
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert str(err.value) == f"config {path}: sidecar.watch must be one of auto, inotify, poll, got 'sometimes'"


# --- the one table of COSMOS_PROFILER_* variables ----------------------------------

def test_every_variable_read_anywhere_is_in_the_table_and_every_checked_one_has_a_bad_value():
    import re

    read = set()
    for path in [*(ROOT / "sidecar").rglob("*.py"), ROOT / "sitehook" / "_cosmos_profiler_startup.py"]:
        read |= set(re.findall(r"COSMOS_PROFILER_[A-Z_]*[A-Z]", path.read_text()))
    assert read == set(envvars.BY_NAME)
    assert set(BAD_VALUES) == {v.name for v in envvars.TABLE if v.convert is not None}


@pytest.mark.parametrize("var", sorted(BAD_VALUES))
def test_a_bad_value_is_one_line_naming_the_variable_and_the_value(var):
    with pytest.raises(ConfigError) as err:
        envvars.convert(var, {var: BAD_VALUES[var]})
    message = str(err.value)
    assert message.startswith(var) and BAD_VALUES[var] in message and "\n" not in message, message
    envvars.check({})  # unset: nothing to refuse


def test_a_running_job_turns_off_only_what_a_bad_variable_configures():
    bad = {v.name: BAD_VALUES[v.name] for v in envvars.TABLE if v.key is not None and v.convert is not None}
    settings = envvars.apply(SidecarSettings(watch="poll", poll_interval=0.5), bad, strict=False)
    assert (settings.watch, settings.poll_interval) == ("poll", 0.5)  # the file's values stay
    assert (settings.signal, settings.stacks_signal, settings.stall_after_s, settings.controller_url) == (
        "off", "off", 0.0, "")
    env = {"COSMOS_PROFILER_SIGNAL": "rtmin+3", "COSMOS_PROFILER_STACKS_SIGNAL": "off",
           "COSMOS_PROFILER_STALL_AFTER_S": "30"}
    assert envvars.apply(SidecarSettings(), env).signal == "SIGRTMIN+3"
    assert envvars.read("COSMOS_PROFILER_SAVE_WRITER", {"COSMOS_PROFILER_SAVE_WRITER": "Fork"}) == "fork"
    assert envvars.read("COSMOS_PROFILER_FORK_STALL_S", {}) == 60.0


def test_docs_list_the_table():
    text = (ROOT / "docs" / "config.md").read_text()
    assert envvars.docs_table() in text
