"""Configuration: Cosmos-RL's profiler tables and the sidecar's own settings.

`ProfilerConfig` and `SubProfilerConfig` mirror Cosmos-RL's field names and
defaults exactly; `cosmos_rl.policy.config` re-exports them. `SidecarSettings`
holds what Cosmos-RL has no name for (how to watch, which signal, limits).

A job config is a TOML file. Only these tables are read, strictly (unknown keys
and wrong types are a `ConfigError` naming the key):

    [profiler]                      enable_profiler, enable_nsys
    [profiler.sub_profiler_config]  the SubProfilerConfig fields
    [sidecar]                       the SidecarSettings fields

and `[train] output_dir` / `timestamp`, and `[train.ckpt] upload_s3` / `s3_bucket` /
`s3_prefix` (`sidecar.upload`: where traces are uploaded). Every other table belongs to the training
framework and is ignored.

`job_config()` also takes cosmos-rl's own (pydantic) `Config` or `ProfilerConfig`,
read by attribute access, so a worker's config object needs no conversion.

The output root (the directory that holds `profile_trace/` and, by default, the
registry `profile_control/`) is where cosmos-rl 0.4.7 puts traces, computed so that
cosmos-rl's timestamp never changes it:

- a loaded cosmos-rl `Config` (a worker's, or the controller's `/api/meta`) has
  `train.output_dir` = `<toml output_dir>/<timestamp>`: the root is its dirname;
- a TOML file read here: when `[train] timestamp` is empty or absent, cosmos-rl
  appends one, so the root is the TOML's `output_dir` itself; when the TOML sets a
  timestamp, cosmos-rl uses `output_dir` as is and the root is its dirname.
"""

from __future__ import annotations

import dataclasses
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sidecar import upload
from sidecar.errors import ConfigError

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - exercised on Python 3.10 only
    import tomli as tomllib

# Bounds shared by the config loader and the request parser.
MAX_ACTIVE_STEPS = 1000
MAX_WAIT_STEPS = 100_000
MAX_WARMUP_STEPS = 1000
MAX_RANK = 1 << 20
# The largest integer a JSON number carries exactly (JavaScript's MAX_SAFE_INTEGER);
# no integer beyond it is accepted anywhere: config, request or CLI option.
MAX_SAFE_INTEGER = 2**53 - 1

WATCH_MODES = ("auto", "inotify", "poll")
MIN_POLL_INTERVAL_S = 0.01
MAX_POLL_INTERVAL_S = 3600.0
DEFAULT_MAX_CONTROL_BYTES = 64 * 1024
DEFAULT_STACKS_SIGNAL = "SIGUSR2"
# Signals faulthandler cannot register (its fatal-error signals) or no process can catch.
UNREGISTRABLE_SIGNALS = ("SIGSEGV", "SIGFPE", "SIGABRT", "SIGBUS", "SIGILL", "SIGKILL", "SIGSTOP")
MIN_STALL_AFTER_S = 1.0
MAX_STALL_AFTER_S = 7 * 86400.0


@dataclass
class SubProfilerConfig:
    """Cosmos-RL's `profiler.sub_profiler_config`: what one capture records."""

    do_profile: bool = False
    active_steps: int = 1
    warmup_steps: int = 1
    wait_steps: int = 1
    rank_filter: list[int] = field(default_factory=list)  # [] means rank 0
    record_shape: bool = False
    profile_memory: bool = False
    with_stack: bool = False
    with_modules: bool = False

    def __post_init__(self) -> None:
        _check_fields(self, "profiler.sub_profiler_config")
        _check_range("profiler.sub_profiler_config.active_steps", self.active_steps, 1, MAX_ACTIVE_STEPS)
        _check_range("profiler.sub_profiler_config.warmup_steps", self.warmup_steps, 0, MAX_WARMUP_STEPS)
        _check_range("profiler.sub_profiler_config.wait_steps", self.wait_steps, 0, MAX_WAIT_STEPS)
        for rank in self.rank_filter:
            _check_range("profiler.sub_profiler_config.rank_filter", rank, 0, MAX_RANK)


@dataclass
class ProfilerConfig:
    """Cosmos-RL's `[profiler]` table."""

    enable_profiler: bool = False
    enable_nsys: bool = False
    sub_profiler_config: SubProfilerConfig = field(default_factory=SubProfilerConfig)

    def __post_init__(self) -> None:
        if isinstance(self.sub_profiler_config, dict):
            self.sub_profiler_config = _build(
                SubProfilerConfig, self.sub_profiler_config, "profiler.sub_profiler_config"
            )
        _check_fields(self, "profiler")


# The environment variables that override a `[sidecar]` key (SidecarSettings.with_env).
ENV_OF_SETTING = {
    "watch": "COSMOS_PROFILER_WATCH",
    "poll_interval": "COSMOS_PROFILER_POLL_INTERVAL",
    "signal": "COSMOS_PROFILER_SIGNAL",
    "controller_url": "COSMOS_PROFILER_CONTROLLER",
}


@dataclass
class SidecarSettings:
    """The sidecar's own knobs (`[sidecar]` table; env vars override).

    Attributes:
        registry: registry root; empty means the resolution of DESIGN.md.
        watch: "auto" (inotify unless the registry is on a network filesystem),
            "inotify" or "poll". Env: COSMOS_PROFILER_WATCH.
        poll_interval: seconds between stats of the control file when polling.
            Env: COSMOS_PROFILER_POLL_INTERVAL.
        signal: signal name that starts a capture on this rank ("SIGUSR1"), or
            "off". Env: COSMOS_PROFILER_SIGNAL.
        heartbeat_interval: seconds between heartbeats: a rewrite of the rank
            record when it changed, else a tick that only sets its mtime.
        max_control_bytes: larger control files are refused.
        allowed_uids / allowed_gids: owners of control files accepted besides
            this process's own user (and root).
        controller_url: a Cosmos-RL controller to report trace paths to.
        settle_time: seconds a control file seen empty or half-written is
            read again before it counts as it is (empty = defaults, bad JSON
            = an error): a writer may be between its truncate and its write.
            With inotify, only until the writer closes the file.
        stacks_signal: the signal on which `faulthandler` dumps every thread's
            stack into the rank's trace dir (`layout.FAULT_STACKS_NAME`); it works
            while a C call holds the GIL, and `profile stacks` sends it when the
            watcher thread does not answer. "off" turns it off; a signal that
            already has a handler is left alone. Env: COSMOS_PROFILER_STACKS_SIGNAL.
        stall_after_s: a rank whose training thread has not stepped for this
            many seconds dumps its stacks (and flight recorder) once per stall
            and marks its record "stalled"; 0 (the default) is off.
            Env: COSMOS_PROFILER_STALL_AFTER_S.
    """

    registry: str = ""
    watch: str = "auto"
    poll_interval: float = 1.0
    signal: str = "SIGUSR1"
    heartbeat_interval: float = 5.0
    max_control_bytes: int = DEFAULT_MAX_CONTROL_BYTES
    allowed_uids: list[int] = field(default_factory=list)
    allowed_gids: list[int] = field(default_factory=list)
    controller_url: str = ""
    settle_time: float = 0.2
    stacks_signal: str = DEFAULT_STACKS_SIGNAL
    stall_after_s: float = 0.0

    def __post_init__(self) -> None:
        _check_fields(self, "sidecar")
        if self.watch not in WATCH_MODES:
            raise ConfigError(f"sidecar.watch must be one of {', '.join(WATCH_MODES)}, got {self.watch!r}")
        _check_range("sidecar.poll_interval", self.poll_interval, MIN_POLL_INTERVAL_S, MAX_POLL_INTERVAL_S)
        _check_range("sidecar.heartbeat_interval", self.heartbeat_interval, 0.05, 3600.0)
        _check_range("sidecar.max_control_bytes", self.max_control_bytes, 16, 16 * 1024 * 1024)
        _check_range("sidecar.settle_time", self.settle_time, 0.0, 10.0)
        if self.signal.lower() != "off":
            import signal as _signal

            name = self.signal.upper()
            if not name.startswith("SIG"):
                name = "SIG" + name
            if not isinstance(getattr(_signal, name, None), _signal.Signals):
                raise ConfigError(f"sidecar.signal must name a signal (e.g. SIGUSR1) or be 'off', got {self.signal!r}")
            self.signal = name
        self.stacks_signal = _check_stacks_signal(self.stacks_signal)
        if self.stall_after_s != 0.0:
            _check_range("sidecar.stall_after_s (0 is off)", self.stall_after_s, MIN_STALL_AFTER_S, MAX_STALL_AFTER_S)

    def with_env(self, env: dict[str, str] | os._Environ[str] | None = None) -> SidecarSettings:
        """Return a copy with COSMOS_PROFILER_* environment overrides applied."""
        env = os.environ if env is None else env
        changes: dict[str, Any] = {}
        if env.get("COSMOS_PROFILER_WATCH"):
            changes["watch"] = env["COSMOS_PROFILER_WATCH"].strip().lower()
        if env.get("COSMOS_PROFILER_POLL_INTERVAL"):
            raw = env["COSMOS_PROFILER_POLL_INTERVAL"]
            try:
                changes["poll_interval"] = float(raw)
            except ValueError:
                raise ConfigError(f"COSMOS_PROFILER_POLL_INTERVAL must be a number of seconds, got {raw!r}") from None
        if env.get("COSMOS_PROFILER_SIGNAL"):
            changes["signal"] = env["COSMOS_PROFILER_SIGNAL"].strip()
        if env.get("COSMOS_PROFILER_STACKS_SIGNAL"):
            changes["stacks_signal"] = env["COSMOS_PROFILER_STACKS_SIGNAL"].strip()
        if env.get("COSMOS_PROFILER_STALL_AFTER_S"):
            raw = env["COSMOS_PROFILER_STALL_AFTER_S"]
            try:
                changes["stall_after_s"] = float(raw)
            except ValueError:
                raise ConfigError(f"COSMOS_PROFILER_STALL_AFTER_S must be a number of seconds (0 is off), got {raw!r}") from None
        if env.get("COSMOS_PROFILER_CONTROLLER"):
            changes["controller_url"] = env["COSMOS_PROFILER_CONTROLLER"].strip()
        for key, value in changes.items():
            # A bad value is the variable's fault: name it, not the config key it sets.
            try:
                dataclasses.replace(self, **{key: value})
            except ConfigError as exc:
                var = ENV_OF_SETTING[key]
                raise ConfigError(str(exc).replace(f"sidecar.{key}", var, 1)) from None
        return dataclasses.replace(self, **changes) if changes else self


@dataclass
class JobConfig:
    """What the sidecar reads from a Cosmos-RL style TOML config (or config object)."""

    profiler: ProfilerConfig = field(default_factory=ProfilerConfig)
    sidecar: SidecarSettings = field(default_factory=SidecarSettings)
    train_output_dir: str | None = None  # [train] output_dir, verbatim
    path: str | None = None  # where it was loaded from
    output_root: str | None = None  # see the module docstring; None: no [train] table
    s3: Any = None  # sidecar.upload.S3Target from [train.ckpt] upload_s3; None: traces are not uploaded

    def __post_init__(self) -> None:
        if self.output_root is None and self.train_output_dir:
            # Built in code from a bare output_dir: read it as a loaded cosmos-rl Config's.
            self.output_root = os.path.dirname(os.path.abspath(self.train_output_dir))


def load_config(path: str | os.PathLike[str]) -> JobConfig:
    """Load a job config from a TOML file.

    Raises:
        ConfigError: the file is missing, not TOML, or a profiler/sidecar key is
            unknown or of the wrong type; the message names the key.
    """
    try:
        text = Path(path).read_bytes().decode("utf-8")
    except OSError as exc:
        raise ConfigError(f"cannot read config {path}: {exc.strerror or exc}") from None
    except UnicodeDecodeError:
        raise ConfigError(f"config {path} is not UTF-8 text") from None
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"config {path} is not valid TOML: {exc}") from None
    except RecursionError:
        raise ConfigError(f"config {path} is not valid TOML: nested too deeply") from None
    except ValueError as exc:  # not a decode error: e.g. an integer longer than sys.get_int_max_str_digits()
        raise ConfigError(f"config {path} is not valid TOML: {exc}") from None
    try:
        job = config_from_dict(doc)
    except ConfigError as exc:
        raise ConfigError(f"config {path}: {exc}") from None  # the file, then the key
    job.path = os.fspath(path)
    return job


def config_from_dict(doc: dict[str, Any]) -> JobConfig:
    """Build a JobConfig from a parsed TOML document (see `load_config`)."""
    profiler = _build(ProfilerConfig, _table(doc, "profiler"), "profiler")
    settings = _build(SidecarSettings, _table(doc, "sidecar"), "sidecar")
    output_root = None
    output_dir = None
    if "train" in doc:
        train = _table(doc, "train")
        output_dir = train.get("output_dir", COSMOS_DEFAULT_OUTPUT_DIR)
        if not isinstance(output_dir, str) or not output_dir:
            raise ConfigError(f"train.output_dir must be a non-empty string, got {output_dir!r}")
        timestamp = train.get("timestamp", "")
        if not isinstance(timestamp, str):
            raise ConfigError(f"train.timestamp must be a string, got {timestamp!r}")
        output_root = output_root_of(output_dir, timestamped=bool(timestamp))
    return JobConfig(profiler=profiler, sidecar=settings, train_output_dir=output_dir, output_root=output_root,
                     s3=upload.target_from_toml(doc))


COSMOS_DEFAULT_OUTPUT_DIR = "./outputs"  # cosmos-rl's train.output_dir default


def output_root_of(train_output_dir: str, timestamped: bool = True) -> str:
    """The directory holding `profile_trace/` for a `train.output_dir`.

    Args:
        train_output_dir: as cosmos-rl's loaded Config holds it (`timestamped`),
            or as a TOML file spells it with no `train.timestamp` (not `timestamped`:
            cosmos-rl will append one, and take the dirname of the result).
    """
    path = os.path.abspath(train_output_dir)
    return os.path.dirname(path) if timestamped else path


def job_config(config: Any) -> tuple[JobConfig, bool]:
    """Accept every form of config that `sidecar.install(config=...)` takes.

    Args:
        config: None, a TOML path, our `JobConfig` or `ProfilerConfig`, or
            cosmos-rl's own `Config` / `ProfilerConfig` (pydantic; read by
            attribute access, so any object of that shape works).

    Returns:
        (job, enabled): with no config at all, installing the sidecar is the
        opt-in, so profiling is enabled; otherwise `enable_profiler` decides.

    Raises:
        ConfigError: the config, or a value in it, is unusable (naming the key).
    """
    if config is None:
        return JobConfig(), True
    if isinstance(config, JobConfig):
        job = config
    elif isinstance(config, ProfilerConfig):
        job = JobConfig(profiler=config)
    elif isinstance(config, (str, os.PathLike)):
        job = load_config(config)
    elif hasattr(config, "enable_profiler") and hasattr(config, "sub_profiler_config"):
        job = JobConfig(profiler=_foreign_profiler(config))
    elif hasattr(config, "profiler") and hasattr(config, "train"):
        job = _foreign_config(config)
    else:
        raise ConfigError(
            "config must be a TOML path, a ProfilerConfig, a cosmos-rl Config (with .profiler and .train), "
            f"or None; got {type(config).__name__}"
        )
    return job, job.profiler.enable_profiler


def _foreign_profiler(obj: Any) -> ProfilerConfig:
    """A ProfilerConfig from any object with cosmos-rl's ProfilerConfig attributes."""
    sub = obj.sub_profiler_config
    values = {}
    for f in dataclasses.fields(SubProfilerConfig):
        if hasattr(sub, f.name):
            value = getattr(sub, f.name)
            values[f.name] = list(value) if f.name == "rank_filter" and isinstance(value, (list, tuple)) else value
    return ProfilerConfig(
        enable_profiler=getattr(obj, "enable_profiler", False),
        enable_nsys=getattr(obj, "enable_nsys", False),
        sub_profiler_config=SubProfilerConfig(**values),
    )


def _foreign_config(obj: Any) -> JobConfig:
    """A JobConfig from a loaded cosmos-rl `Config` (its output_dir already timestamped)."""
    output_dir = getattr(obj.train, "output_dir", None)
    if output_dir is not None and (not isinstance(output_dir, str) or not output_dir):
        raise ConfigError(f"train.output_dir must be a non-empty string, got {output_dir!r}")
    return JobConfig(
        profiler=_foreign_profiler(obj.profiler),
        train_output_dir=output_dir,
        output_root=output_root_of(output_dir) if output_dir else None,
        s3=upload.target_from_config(obj),
    )


def _table(doc: dict[str, Any], key: str) -> dict[str, Any]:
    value = doc.get(key, {})
    if not isinstance(value, dict):
        raise ConfigError(f"{key} must be a table, got {type(value).__name__}")
    return value


def _build(cls: type, values: dict[str, Any], prefix: str) -> Any:
    if not isinstance(values, dict):
        raise ConfigError(f"{prefix} must be a table, got {type(values).__name__}")
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - names)
    if unknown:
        raise ConfigError(
            f"unknown key {prefix}.{unknown[0]} (known keys: {', '.join(sorted(names))})"
        )
    return cls(**values)


_ELEMENT_TYPES = {"rank_filter": int, "allowed_uids": int, "allowed_gids": int}


def _check_fields(obj: Any, prefix: str) -> None:
    """Type-check a dataclass instance built from untrusted values."""
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        key = f"{prefix}.{f.name}"
        default = f.default if f.default is not dataclasses.MISSING else f.default_factory()  # type: ignore[misc]
        if dataclasses.is_dataclass(default):
            if not isinstance(value, type(default)):
                raise ConfigError(f"{key} must be a table, got {type(value).__name__}")
        elif isinstance(default, bool):
            if not isinstance(value, bool):
                raise ConfigError(f"{key} must be true or false, got {value!r}")
        elif isinstance(default, int):
            if isinstance(value, bool) or not isinstance(value, int):
                raise ConfigError(f"{key} must be an integer, got {value!r}")
            _check_safe_integer(key, value)
        elif isinstance(default, float):
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise ConfigError(f"{key} must be a number, got {value!r}")
            if isinstance(value, int):
                _check_safe_integer(key, value)
            setattr(obj, f.name, float(value))
        elif isinstance(default, str):
            if not isinstance(value, str):
                raise ConfigError(f"{key} must be a string, got {value!r}")
        elif isinstance(default, list):
            kind = _ELEMENT_TYPES[f.name]
            if not isinstance(value, list) or any(
                isinstance(v, bool) or not isinstance(v, kind) for v in value
            ):
                raise ConfigError(f"{key} must be a list of integers, got {value!r}")
            if len(value) > 65536:
                raise ConfigError(f"{key} has {len(value)} entries; at most 65536 are allowed")
            for item in value:
                _check_safe_integer(key, item)


def _check_safe_integer(key: str, value: int) -> None:
    if abs(value) > MAX_SAFE_INTEGER:
        raise ConfigError(
            f"{key}: {value} is outside the safe integer range -{MAX_SAFE_INTEGER}..{MAX_SAFE_INTEGER} (2**53-1)"
        )


def _check_stacks_signal(value: str) -> str:
    """`sidecar.stacks_signal` spelled as a signal name (or "off"). The same signal as
    `sidecar.signal` is not an error: the sidecar then leaves the stacks dump off, and says so."""
    if value.lower() == "off":
        return "off"
    import signal as _signal

    name = value.upper()
    if not name.startswith("SIG"):
        name = "SIG" + name
    if not isinstance(getattr(_signal, name, None), _signal.Signals):
        raise ConfigError(f"sidecar.stacks_signal must name a signal (e.g. SIGUSR2) or be 'off', got {value!r}")
    if name in UNREGISTRABLE_SIGNALS:
        raise ConfigError(f"sidecar.stacks_signal cannot be {name} (faulthandler cannot catch it); use e.g. SIGUSR2")
    return name


def _check_range(key: str, value: float, low: float, high: float) -> None:
    if not low <= value <= high:
        raise ConfigError(f"{key} must be between {low} and {high}, got {value!r}")
