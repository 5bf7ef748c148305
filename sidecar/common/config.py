"""Configuration: Cosmos-RL's profiler tables and the sidecar's own settings.

`ProfilerConfig` and `SubProfilerConfig` mirror Cosmos-RL's field names and
defaults exactly; `cosmos_rl.policy.config` re-exports them. `SidecarSettings`
holds what Cosmos-RL has no name for (how to watch, which signal, limits).

A job config is a TOML file. Only these tables are read:

    [profiler]                      enable_profiler, enable_nsys
    [profiler.sub_profiler_config]  the SubProfilerConfig fields
    [sidecar]                       the SidecarSettings fields

and `[train] output_dir` / `timestamp`, and `[train.ckpt] upload_s3` / `s3_bucket` /
`s3_prefix` (`sidecar.rank.upload`: where traces are uploaded). Every other table belongs to the training
framework and is ignored.

Cosmos-RL's two tables are taken as cosmos-rl 0.4.7 takes them: unknown keys are
ignored, values coerced as its pydantic models coerce them, and no value is bounded
here (the sidecar bounds what it uses, where it uses it: `request.defaults_from_config`).
What cosmos-rl refuses is a `ConfigError` naming the key. `[sidecar]` is ours and
strict: unknown keys, wrong types and out-of-range values are errors naming the key.

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
import math
import os
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sidecar.common import s3target
from sidecar.common.exceptions import ConfigError

# The sidecar's bounds on a capture (applied to requests, and to config values where used).
MAX_ACTIVE_STEPS = 1000
MAX_WAIT_STEPS = 100_000
MAX_WARMUP_STEPS = 1000
MAX_RANK = 1 << 20
# The largest integer a JSON number carries exactly (JavaScript's MAX_SAFE_INTEGER);
# no integer beyond it is accepted anywhere: config, request or CLI option.
MAX_SAFE_INTEGER = 2**53 - 1

WATCH_MODES = ("auto", "inotify", "poll")
NODE_AGENT_MODES = ("auto", "on", "off")
MIN_POLL_INTERVAL_S = 0.01
MAX_POLL_INTERVAL_S = 3600.0
DEFAULT_MAX_CONTROL_BYTES = 64 * 1024
DEFAULT_STACKS_SIGNAL = "SIGUSR2"
MIN_STALL_AFTER_S = 1.0
MAX_STALL_AFTER_S = 7 * 86400.0


# The slowdown watch's factor (`profile set --on-slowdown`, `[sidecar] slowdown_factor`).
MIN_FACTOR = 1.0  # exclusive: a step must be slower than the median to count
MAX_FACTOR = 1000.0

@dataclass
class SubProfilerConfig:
    """Cosmos-RL's `profiler.sub_profiler_config`: what one capture records.

    Accepted as cosmos-rl 0.4.7's pydantic model accepts it (`_coerce`): "2" and
    2.0 are 2, "yes" is true, any integer is taken. The sidecar bounds a value
    only where it uses it (`request.defaults_from_config`), never here.
    """

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
        _coerce(self, "profiler.sub_profiler_config")


@dataclass
class ProfilerConfig:
    """Cosmos-RL's `[profiler]` table (accepted as cosmos-rl accepts it, see SubProfilerConfig)."""

    enable_profiler: bool = False
    enable_nsys: bool = False
    sub_profiler_config: SubProfilerConfig = field(default_factory=SubProfilerConfig)

    def __post_init__(self) -> None:
        if isinstance(self.sub_profiler_config, dict):
            self.sub_profiler_config = _build(
                SubProfilerConfig, self.sub_profiler_config, "profiler.sub_profiler_config", lenient=True
            )
        if not isinstance(self.sub_profiler_config, SubProfilerConfig):
            raise ConfigError(
                f"profiler.sub_profiler_config must be a table, got {type(self.sub_profiler_config).__name__}"
            )
        _coerce(self, "profiler")


@dataclass
class SidecarSettings:
    """The sidecar's own knobs (`[sidecar]` table; env vars override, see `sidecar.common.envvars`).

    Attributes:
        registry: registry root; empty means the resolution of docs/contract.md ("Who a rank is").
        watch: "auto" (inotify unless the registry is on a network filesystem),
            "inotify" or "poll". Env: COSMOS_PROFILER_WATCH.
        poll_interval: seconds between stats of the control file when polling.
            Env: COSMOS_PROFILER_POLL_INTERVAL.
        signal: signal name that starts a capture on this rank ("SIGUSR1",
            "SIGRTMIN+3"), or "off". Env: COSMOS_PROFILER_SIGNAL.
        heartbeat_interval: seconds between heartbeats: a rewrite of the rank
            record when it changed, else a tick that only sets its mtime.
        max_control_bytes: larger control files are refused.
        allowed_uids / allowed_gids: owners of control files accepted besides
            this process's own user (and root).
        controller_url: a Cosmos-RL controller to report trace paths to
            (http(s)://host[:port][/path] or host:port). Env: COSMOS_PROFILER_CONTROLLER.
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
        slowdown_factor: keep a slowdown watch armed on every rank without anyone asking
            (sidecar.rank.slowdown): K=3 steps in a row slower than this factor times the recent
            median capture the replica's ranks; 0 (the default) is off. Env: COSMOS_PROFILER_SLOWDOWN_FACTOR.
        slowdown_min_interval_s: that always-on watch captures at most once per this many
            seconds (default 1800). Env: COSMOS_PROFILER_SLOWDOWN_MIN_INTERVAL_S.
        slowdown_min_free_pct: no slowdown watch captures while the trace directory's
            filesystem has less than this percentage free (default 5; 0: no floor).
            Env: COSMOS_PROFILER_SLOWDOWN_MIN_FREE_PCT.
        node_agent: "auto" (where the registry is on a network or FUSE filesystem, one rank per node watches the control file and rolls its node's records
            up into one node record: sidecar.rank.nodeagent), "on" or "off" (every rank on its
            own, as before). Env: COSMOS_PROFILER_NODE_AGENT.
        node_dir: the node-local directory the ranks of a node share with their agent; empty:
            $XDG_RUNTIME_DIR/cosmos-profiler-node, else /dev/shm/cosmos-profiler-<uid>, else
            /tmp/cosmos-profiler-node-<uid>. Env: COSMOS_PROFILER_NODE_DIR.
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
    slowdown_factor: float = 0.0
    slowdown_min_interval_s: float = 1800.0
    slowdown_min_free_pct: float = 5.0
    node_agent: str = "auto"
    node_dir: str = ""

    def __post_init__(self) -> None:
        _check_fields(self, "sidecar")
        for key in _SETTING_CHECKS:
            setattr(self, key, check_setting(key, getattr(self, key), f"sidecar.{key}"))


def check_setting(key: str, value: Any, label: str) -> Any:
    """`value` for the `[sidecar]` key `key`, checked (and spelled canonically).

    Raises:
        ConfigError: naming `label` (the key, or the variable that set it).
    """
    check = _SETTING_CHECKS.get(key)
    return check(value, label) if check is not None else value


def _check_watch(value: str, label: str) -> str:
    if value not in WATCH_MODES:
        raise ConfigError(f"{label} must be one of {', '.join(WATCH_MODES)}, got {value!r}")
    return value


def _check_node_agent(value: str, label: str) -> str:
    if value not in NODE_AGENT_MODES:
        raise ConfigError(f"{label} must be one of {', '.join(NODE_AGENT_MODES)}, got {value!r}")
    return value


def _bounded(low: float, high: float) -> Any:
    def check(value: float, label: str) -> float:
        _check_range(label, value, low, high)
        return value

    return check


def _check_signal(value: str, label: str) -> str:
    """A signal name as `kill -s` takes it, that a handler can catch; or "off"."""
    from sidecar.common import signames

    if value.strip().lower() == "off":
        return "off"
    try:
        return signames.catchable_signal(value, label)
    except ValueError as exc:
        raise ConfigError(f"{exc} (or 'off')") from None


def _check_stall_after(value: float, label: str) -> float:
    if value != 0.0:
        _check_range(f"{label} (0 is off)", value, MIN_STALL_AFTER_S, MAX_STALL_AFTER_S)
    return value


def _check_slowdown_factor(value: float, label: str) -> float:
    if value != 0.0:
        if not MIN_FACTOR < value <= MAX_FACTOR:
            raise ConfigError(f"{label} must be above {MIN_FACTOR:g} and at most {MAX_FACTOR:g} (0 is off), got {value!r}")
    return value


def _check_controller_url(value: str, label: str) -> str:
    """"" (none), http(s)://host[:port][/path], or host:port (http)."""
    from urllib.parse import urlsplit

    if not value:
        return value
    url = value if "://" in value else f"http://{value}"
    try:
        parts = urlsplit(url)
        port_ok = parts.port is None or parts.port > 0
    except ValueError:
        parts, port_ok = None, False
    if (parts is None or parts.scheme not in ("http", "https") or not parts.hostname or not port_ok
            or any(c.isspace() for c in value)):
        raise ConfigError(f"{label} must be a controller address like http://host:8000 or host:8000, got {value!r}")
    return value


_SETTING_CHECKS: dict[str, Any] = {
    "watch": _check_watch,
    "poll_interval": _bounded(MIN_POLL_INTERVAL_S, MAX_POLL_INTERVAL_S),
    "signal": _check_signal,
    "heartbeat_interval": _bounded(0.05, 3600.0),
    "max_control_bytes": _bounded(16, 16 * 1024 * 1024),
    "controller_url": _check_controller_url,
    "settle_time": _bounded(0.0, 10.0),
    "stacks_signal": _check_signal,
    "stall_after_s": _check_stall_after,
    "slowdown_factor": _check_slowdown_factor,
    "slowdown_min_interval_s": _bounded(0.0, 365 * 86400.0),
    "slowdown_min_free_pct": _bounded(0.0, 100.0),
    "node_agent": _check_node_agent,
}


@dataclass
class JobConfig:
    """What the sidecar reads from a Cosmos-RL style TOML config (or config object)."""

    profiler: ProfilerConfig = field(default_factory=ProfilerConfig)
    sidecar: SidecarSettings = field(default_factory=SidecarSettings)
    train_output_dir: str | None = None  # [train] output_dir, verbatim
    path: str | None = None  # where it was loaded from
    output_root: str | None = None  # see the module docstring; None: no [train] table
    s3: Any = None  # sidecar.common.s3target.S3Target from [train.ckpt] upload_s3; None: traces are not uploaded

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
    if sys.version_info >= (3, 11):  # here, not at the top: only a command given a TOML parses one
        import tomllib
    else:  # pragma: no cover - exercised on Python 3.10 only
        import tomli as tomllib
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
    profiler = _build(ProfilerConfig, _table(doc, "profiler"), "profiler", lenient=True)
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
                     s3=s3target.target_from_toml(doc))


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
    values: dict[str, Any] = {}
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
        s3=s3target.target_from_config(obj),
    )


def _table(doc: dict[str, Any], key: str) -> dict[str, Any]:
    value = doc.get(key, {})
    if not isinstance(value, dict):
        raise ConfigError(f"{key} must be a table, got {type(value).__name__}")
    return value


def _build(cls: type, values: dict[str, Any], prefix: str, lenient: bool = False) -> Any:
    """`cls(**values)`; an unknown key is an error naming it, or (`lenient`: cosmos-rl's
    tables, whose pydantic models ignore unknown keys) left out."""
    if not isinstance(values, dict):
        raise ConfigError(f"{prefix} must be a table, got {type(values).__name__}")
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(values) - names)
    if unknown and not lenient:
        raise ConfigError(
            f"unknown key {prefix}.{unknown[0]} (known keys: {', '.join(sorted(names))})"
        )
    return cls(**{k: v for k, v in values.items() if k in names})


# What pydantic 2 (cosmos-rl 0.4.7's models) takes in its default "lax" mode, for the
# types of Cosmos-RL's profiler tables; tests/test_cosmos_rl.py holds the two equal.
_TRUE_WORDS = frozenset({"1", "on", "t", "true", "y", "yes"})
_FALSE_WORDS = frozenset({"0", "off", "f", "false", "n", "no"})
_INT_TEXT = re.compile(r"[+-]?[0-9]+(?:_[0-9]+)*(?:\.0+)?")
_I64 = 2**63


def _lax_bool(value: Any) -> bool:
    if isinstance(value, bool):
        return value
    if isinstance(value, (int, float)) and value in (0, 1):
        return bool(value)
    if isinstance(value, str) and value.lower() in _TRUE_WORDS | _FALSE_WORDS:
        return value.lower() in _TRUE_WORDS
    raise ValueError("must be true or false")


def _lax_int(value: Any) -> int:
    if isinstance(value, int):  # bool included: pydantic takes True as 1
        return int(value)
    if isinstance(value, float) and math.isfinite(value) and value.is_integer() and abs(value) < _I64:
        return int(value)
    if isinstance(value, str) and _INT_TEXT.fullmatch(value.strip()):
        return int(value.strip().split(".")[0])
    raise ValueError("must be an integer")


def _coerce(obj: Any, prefix: str) -> None:
    """Coerce a Cosmos-RL profiler table's fields in place as pydantic's lax mode does.

    Raises:
        ConfigError: a value cosmos-rl refuses too, naming the key.
    """
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        key = f"{prefix}.{f.name}"
        default = _field_default(f)
        try:
            if isinstance(default, bool):
                value = _lax_bool(value)
            elif isinstance(default, int):
                value = _lax_int(value)
            elif isinstance(default, list):
                if not isinstance(value, (list, tuple, set, frozenset)):
                    raise ValueError("must be a list of integers")
                value = [_lax_int(item) for item in value]
        except ValueError as exc:
            what = "a list of integers" if isinstance(default, list) else str(exc).removeprefix("must be ")
            raise ConfigError(f"{key} must be {what}, got {value!r}") from None
        setattr(obj, f.name, value)


_ELEMENT_TYPES = {"allowed_uids": int, "allowed_gids": int}


def _field_default(f: dataclasses.Field[Any]) -> Any:
    """A dataclass field's default: its value, or a fresh one from its factory."""
    if f.default is not dataclasses.MISSING:
        return f.default
    assert f.default_factory is not dataclasses.MISSING, f"{f.name} has no default"
    return f.default_factory()


def _check_fields(obj: Any, prefix: str) -> None:
    """Type-check a dataclass instance built from untrusted values."""
    for f in dataclasses.fields(obj):
        value = getattr(obj, f.name)
        key = f"{prefix}.{f.name}"
        default = _field_default(f)
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


def _check_range(key: str, value: float, low: float, high: float) -> None:
    if not low <= value <= high:
        raise ConfigError(f"{key} must be between {low} and {high}, got {value!r}")
