"""Every COSMOS_PROFILER_* environment variable, in one table: variable, setting, converter.

`TABLE` is the one place that knows which variable sets which setting, how its
text becomes a value, who reads it, and what a bad value does. docs/config.md
lists the same rows (tests/test_config.py holds them equal).

A bad value (one the converter refuses) is handled by where it is read:

- `python -m sidecar.run` checks every variable the sidecar reads before the
  script starts (`check`): a bad one is one line naming it, exit 2.
- inside a job that is already running (`sidecar.install()`, or a cosmos-rl
  worker hooked by COSMOS_PROFILER_SIDECAR=1) nothing is refused: the bad value
  turns off only the piece it configures, or is ignored where "off" has no
  meaning (`EnvVar.if_bad` says which), with one warning line per process
  naming the variable, the value and what was done instead (`warn_bad`).
- the CLI refuses a bad value of a variable it reads, naming it (exit 2).

Pure: reads the mapping it is given, logs through the "sidecar" logger.
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from sidecar.common import config
from sidecar.common.exceptions import ConfigError

log = logging.getLogger("sidecar")

SIDECAR = "sidecar"  # read inside the training process
CLI = "CLI"
STARTUP = "interpreter start"  # the installed .pth file (standard library only)

# Who writes a trace (COSMOS_PROFILER_SAVE_WRITER; `sidecar.rank.exporter.export`), and who gzips it
# where kineto's own writer runs in this process (`sidecar.rank.compress`).
GZIP_WRITERS = ("process", "thread")
SAVE_WRITERS = ("auto", "fork", *GZIP_WRITERS)


@dataclass(frozen=True)
class EnvVar:
    """One environment variable.

    Attributes:
        name: the variable.
        setting: what it sets: a `[sidecar]` key ("sidecar.watch"), or the
            setting it is on its own ("replica", "save writer").
        convert: `(text, name) -> value`; raises ConfigError naming `name` when
            the text is bad. None: any text is a value (nothing to refuse).
        readers: who reads it (SIDECAR, CLI, STARTUP).
        off: for a `[sidecar]` key, the value a bad variable leaves it at
            inside a running job; None: the variable is ignored and the key
            keeps the config file's value (or its default).
        if_bad: what a bad value does where it is read (logged; for the CLI's
            variables, "" means the command refuses it).
        meaning: one line for docs/config.md.
        default: the value when unset (or bad, see `read`), for variables that
            are not `[sidecar]` keys.
    """

    name: str
    setting: str
    convert: Callable[[str, str], Any] | None
    readers: tuple[str, ...]
    meaning: str
    if_bad: str = ""
    off: Any = None
    default: Any = None

    @property
    def key(self) -> str | None:
        """The SidecarSettings field it overrides, or None."""
        return self.setting.split(".", 1)[1] if self.setting.startswith("sidecar.") else None


def _number(text: str, name: str) -> float:
    try:
        return float(text)
    except ValueError:
        raise ConfigError(f"{name} must be a number of seconds, got {text!r}") from None


def _word(text: str, name: str) -> str:
    return text.strip().lower()


def _text(text: str, name: str) -> str:
    return text.strip()


def _setting(key: str, parse: Callable[[str, str], Any]) -> Callable[[str, str], Any]:
    """Parse the text, then check the value as the `[sidecar]` key is checked, naming the variable."""
    def convert(text: str, name: str) -> Any:
        return config.check_setting(key, parse(text, name), name)

    return convert


def _choice(choices: tuple[str, ...]) -> Callable[[str, str], str]:
    def convert(text: str, name: str) -> str:
        value = text.strip().lower()
        if value not in choices:
            raise ConfigError(f"{name} must be one of {', '.join(choices)}, got {text!r}")
        return value

    return convert


def _seconds(low: float, high: float, low_open: bool = False) -> Callable[[str, str], float]:
    def convert(text: str, name: str) -> float:
        try:
            value = float(text)
        except ValueError:
            value = float("nan")
        if not (low < value <= high if low_open else low <= value <= high):
            bound = f"above {low:g} and at most {high:g}" if low_open else f"between {low:g} and {high:g}"
            raise ConfigError(f"{name} must be a number of seconds {bound}, got {text!r}")
        return value

    return convert


TABLE: tuple[EnvVar, ...] = (
    # identity and directories: any text is a name or a path (identity.py resolves them)
    EnvVar("COSMOS_PROFILER_DIR", "sidecar.registry", None, (SIDECAR, CLI), "the registry root"),
    EnvVar("COSMOS_PROFILER_REDIS_PASSWORD", "the Redis password", None, (SIDECAR, CLI),
           "the password of a `redis://` registry (never in the URL: argv and logs show it; "
           "[multi-node.md](multi-node.md#no-shared-filesystem-a-redis-registry))"),
    EnvVar("COSMOS_PROFILER_REDIS_PASSWORD_FILE", "the Redis password", None, (SIDECAR, CLI),
           "a file whose first line is that password (where the variable is not set)"),
    EnvVar("COSMOS_PROFILER_REPLICA", "replica", None, (SIDECAR,),
           "the replica name (one that is not a valid name is made safe, with a warning naming it)"),
    EnvVar("COSMOS_PROFILER_OUTPUT_DIR", "output_dir", None, (SIDECAR,), "the trace root (`<output>`)"),
    EnvVar("COSMOS_PROFILER_HOST", "host", None, (SIDECAR, CLI),
           "this host's name in rank records (default: `socket.gethostname()`)"),
    EnvVar("COSMOS_PROFILER_SIDECAR", "the cosmos-rl hook", None, (STARTUP,),
           "`1`: hook cosmos-rl's `CosmosProfiler` in every Python process ([cosmos-rl.md](cosmos-rl.md)); "
           "`0`, `false`, `no`, `off` or empty: not"),
    EnvVar("COSMOS_PROFILER_ONDEMAND", "the on-demand path", _choice(("auto", "off")), (SIDECAR, STARTUP),
           "`auto` (default): where torch is imported after `sidecar.run` or the startup hook, captures run on "
           "kineto's on-demand path (the save off the training thread: [ondemand.md](ondemand.md)); `off`: the "
           "Python path (`KINETO_USE_DAEMON` is not set)", if_bad="ignored: auto is used", default="auto"),
    EnvVar("COSMOS_PROFILER_ONDEMAND_PID", "the on-demand endpoint's owner", None, (SIDECAR, STARTUP),
           "set by the sidecar, not by you: the process whose on-demand endpoint the `KINETO_*` variables name "
           "(a child that sees another pid sets its own up)"),
    # [sidecar] keys
    EnvVar("COSMOS_PROFILER_WATCH", "sidecar.watch", _setting("watch", _word), (SIDECAR,),
           "`auto`, `inotify` or `poll`", if_bad="ignored: [sidecar] watch (default auto) is used"),
    EnvVar("COSMOS_PROFILER_POLL_INTERVAL", "sidecar.poll_interval", _setting("poll_interval", _number), (SIDECAR,),
           "seconds between polls of the control file", if_bad="ignored: [sidecar] poll_interval (default 1 s) is used"),
    EnvVar("COSMOS_PROFILER_SIGNAL", "sidecar.signal", _setting("signal", _text), (SIDECAR,),
           "the trigger signal (`SIGUSR1`, `USR2`, `SIGRTMIN+3`, ...), or `off`",
           if_bad="no signal starts a capture (the control file still does)", off="off"),
    EnvVar("COSMOS_PROFILER_STACKS_SIGNAL", "sidecar.stacks_signal", _setting("stacks_signal", _text), (SIDECAR,),
           "faulthandler's stacks signal, or `off`", if_bad="the faulthandler stacks dump is off", off="off"),
    EnvVar("COSMOS_PROFILER_STALL_AFTER_S", "sidecar.stall_after_s", _setting("stall_after_s", _number), (SIDECAR,),
           "seconds without a step before a rank dumps its stacks and flight recorder and shows `stalled` (0: off)",
           if_bad="the stall watch is off", off=0.0),
    EnvVar("COSMOS_PROFILER_SLOWDOWN_FACTOR", "sidecar.slowdown_factor", _setting("slowdown_factor", _number),
           (SIDECAR,), "keep a slowdown watch armed: capture when 3 steps in a row take more than this factor times "
           "the recent median (0: off; [cli.md](cli.md#the-slowdown-watch))", if_bad="the always-on slowdown watch is off",
           off=0.0),
    EnvVar("COSMOS_PROFILER_SLOWDOWN_MIN_INTERVAL_S", "sidecar.slowdown_min_interval_s",
           _setting("slowdown_min_interval_s", _number), (SIDECAR,),
           "seconds between two captures of the always-on slowdown watch (default 1800)",
           if_bad="ignored: [sidecar] slowdown_min_interval_s (default 1800 s) is used"),
    EnvVar("COSMOS_PROFILER_SLOWDOWN_MIN_FREE_PCT", "sidecar.slowdown_min_free_pct",
           _setting("slowdown_min_free_pct", _number), (SIDECAR,),
           "no slowdown watch captures while the trace directory's filesystem has less than this percent free "
           "(default 5; 0: no floor)", if_bad="ignored: [sidecar] slowdown_min_free_pct (default 5) is used"),
    EnvVar("COSMOS_PROFILER_NODE_AGENT", "sidecar.node_agent", _setting("node_agent", _word), (SIDECAR,),
           "`auto` (one rank per node watches the control file and writes one node record, where the registry is "
           "on shared storage), `on` or `off` ([multi-node.md](multi-node.md#one-poller-per-node))",
           if_bad="ignored: [sidecar] node_agent (default auto) is used"),
    EnvVar("COSMOS_PROFILER_NODE_DIR", "sidecar.node_dir", None, (SIDECAR,),
           "the node-local directory a node's ranks share with their agent (default: $XDG_RUNTIME_DIR, "
           "else /dev/shm, else /tmp)"),
    EnvVar("COSMOS_PROFILER_CONTROLLER", "sidecar.controller_url", _setting("controller_url", _text), (SIDECAR,),
           "a Cosmos-RL controller to report trace directories to",
           if_bad="trace directories are not reported to a controller", off=""),
    # the sidecar's other knobs
    EnvVar("COSMOS_PROFILER_SAVE_WRITER", "save writer", _choice(SAVE_WRITERS), (SIDECAR,),
           "who writes a trace: `auto` (default: a forked child writes the JSON where that pays, a child interpreter "
           "gzips it), `fork` (always fork), `process` (the JSON on the saver thread, gzip in a child), `thread` "
           "(both on the saver thread; no trace summaries, which a child writes) ([reliability.md](reliability.md#what-the-training-thread-pays-and-what-it-"
           "never-sees))", if_bad="ignored: auto is used", default="auto"),
    EnvVar("COSMOS_PROFILER_FORK_STALL_S", "fork writer stall", _seconds(0.0, 86400.0, low_open=True),
           (SIDECAR,), "seconds a forked JSON writer may write nothing before it is killed and the saver thread "
           "writes the trace (default 60)", if_bad="ignored: 60 s is used", default=60.0),
    # the CLI's
    EnvVar("COSMOS_PROFILER_STACKS_FALLBACK_S", "stacks fallback", _seconds(0.0, 3600.0), (CLI,),
           "seconds `profile stacks`/`hang` give a rank's watcher thread before signalling a silent rank on this "
           "host whose heartbeat has stopped for two intervals (default 2; 0..3600)", default=2.0),
    EnvVar("COSMOS_PROFILER_STALL_WARN_S", "stall warning floor", _seconds(0.0, 7 * 86400.0, low_open=True),
           (CLI,), "seconds a rank may go without a step before `--wait` warns (a floor: the warning comes after "
           "max(this, 10 steps at the rank's recent pace); default 30; [cli.md](cli.md#live-progress))",
           if_bad="ignored: 30 s is used", default=30.0),
)

BY_NAME = {var.name: var for var in TABLE}
OF_KEY = {var.key: var for var in TABLE if var.key is not None}  # [sidecar] key -> its variable

_warned: set[tuple[str, str]] = set()
_warned_lock = threading.Lock()


def raw(name: str, env: Mapping[str, str] | None = None) -> str | None:
    """The variable's text, or None when it is unset or empty (both mean "not set")."""
    value = (os.environ if env is None else env).get(name, "")
    return value if value.strip() else None


def convert(name: str, env: Mapping[str, str] | None = None) -> Any:
    """The variable's value, or None when unset.

    Raises:
        ConfigError: one line naming the variable and its bad value.
    """
    var = BY_NAME[name]
    text = raw(name, env)
    if text is None:
        return None
    return var.convert(text, name) if var.convert is not None else text.strip()


def read(name: str, env: Mapping[str, str] | None = None) -> Any:
    """The variable's value where a bad one must not stop anything: its default when it
    is unset, or bad (then one warning per process, see `warn_bad`). Never raises."""
    default = BY_NAME[name].default
    try:
        value = convert(name, env)
    except ConfigError as exc:
        warn_bad(BY_NAME[name], str(exc), raw(name, env) or "")
        return default
    return default if value is None else value


def check(env: Mapping[str, str] | None = None, reader: str = SIDECAR) -> None:
    """Refuse a bad value of any variable `reader` reads (`python -m sidecar.run` at launch).

    Raises:
        ConfigError: for the first bad variable in table order, naming it.
    """
    for var in TABLE:
        if reader in var.readers and var.convert is not None:
            convert(var.name, env)


def warn(env: Mapping[str, str] | None = None) -> None:
    """Warn (once per process, `warn_bad`) about every bad variable the sidecar reads:
    at install, so a bad value read only later (at the first save) is said at once."""
    for var in TABLE:
        if SIDECAR in var.readers and var.convert is not None:
            try:
                convert(var.name, env)
            except ConfigError as exc:
                warn_bad(var, str(exc), raw(var.name, env) or "")


def warn_bad(var: EnvVar, error: str, text: str) -> None:
    """One warning line per process and value: what was wrong, and what was done instead."""
    with _warned_lock:
        if (var.name, text) in _warned:
            return
        _warned.add((var.name, text))
    log.warning("[Profiler] %s; %s", error, var.if_bad)


def apply(settings: config.SidecarSettings, env: Mapping[str, str] | None = None,
          strict: bool = True) -> config.SidecarSettings:
    """`settings` with the variables of `[sidecar]` keys applied: a bad value raises when `strict`, else warns
    once and turns off only the piece it configures."""
    import dataclasses

    changes: dict[str, Any] = {}
    for key, var in OF_KEY.items():
        if var.convert is None:
            continue  # COSMOS_PROFILER_DIR: resolved with the identity (identity.resolve_registry_root)
        try:
            value = convert(var.name, env)
        except ConfigError as exc:
            if strict:
                raise
            warn_bad(var, str(exc), raw(var.name, env) or "")
            if var.off is not None:
                changes[key] = var.off
            continue
        if value is not None:
            changes[key] = value
    return dataclasses.replace(settings, **changes) if changes else settings


def docs_table() -> str:
    """The table as docs/config.md shows it (tests/test_config.py holds the two equal)."""
    lines = ["| variable | read by | sets | meaning | a bad value (where it is read) |", "|---|---|---|---|---|"]
    for var in TABLE:
        setting = f"`[sidecar] {var.key}`" if var.key else var.setting
        if var.convert is None:
            bad = "none: any text is taken"
        elif SIDECAR in var.readers:
            bad = f"`sidecar.run` refuses it (exit 2); a running job: {var.if_bad}"
        else:
            bad = var.if_bad or "the command refuses it"
        lines.append(f"| `{var.name}` | {', '.join(var.readers)} | {setting} | {var.meaning} | {bad} |")
    return "\n".join(lines) + "\n"
