"""The environment libkineto's on-demand path needs, set before `import torch` (standard library only).

kineto reads `KINETO_USE_DAEMON` while `torch._C` initialises: `prepare()` must run before torch is
imported, and does, from `python -m sidecar.run` and from the startup hook (`COSMOS_PROFILER_SIDECAR=1`).
It sets, for this process (and its children inherit them):

- `KINETO_USE_DAEMON=1`: kineto polls the endpoint named `dynolog` for on-demand configs;
- `KINETO_IPC_SOCKET_DIR`: a private 0700 directory with a short path (a socket's path must fit
  108 bytes), where that endpoint is a socket file of this process, not an abstract name shared
  by every process of the network namespace;
- `KINETO_CONFIG`: a base config in that directory with a 1 s poll interval, which carries the user's
  own base config (`KINETO_CONFIG`, else /etc/libkineto.conf) if there is one;
- `KINETO_ONDEMAND_TRACE_DIR`: the same directory (later kineto writes on-demand traces only there or
  under /tmp).

The endpoint is bound here, at once, and stays bound until the process exits: kineto's polls log
errors without it, and a dead one delays the exit. The directory of a process that is gone is
removed by the next `prepare()` of the same user (its name carries the pid). The sidecar's responder (`rank.ondemand`) takes
it over. A child that imports torch inherits the variables; `prepare()` in the child (its own
startup hook) makes it a directory of its own, and a child that does not run it polls the parent's
endpoint, which answers only the parent.

Nothing is set where the user runs a real dynolog (`KINETO_USE_DAEMON` set by someone else), where
`COSMOS_PROFILER_ONDEMAND=off`, where torch is imported already, or where anything fails: the
sidecar then captures on the Python path (`why_not()` says why).
"""

from __future__ import annotations

import os
import shutil
import socket
import sys
import tempfile
import threading
from collections.abc import MutableMapping
from dataclasses import dataclass, field

ENV_OPT = "COSMOS_PROFILER_ONDEMAND"  # auto (default) or off
ENV_OWNER = "COSMOS_PROFILER_ONDEMAND_PID"  # the process whose endpoint the kineto variables name
OFF_WORDS = ("off",)
ENDPOINT = "dynolog"
BASE_CONFIG_NAME = "libkineto.conf"
SYSTEM_BASE_CONFIG = "/etc/libkineto.conf"
SUN_PATH_MAX = 107  # sun_path's 108 bytes, less the NUL
CLIENT_NAME_LEN = 52  # "dynoconfigclient" + a uuid4: kineto's own endpoint in the same directory
POLL_INTERVAL_S = 1
DIR_PREFIX = "cpk"  # <tmp>/cpk<pid>-<random>: the pid tells a later sweep whether its process is gone
KINETO_VARS = ("KINETO_USE_DAEMON", "KINETO_IPC_SOCKET_DIR", "KINETO_CONFIG", "KINETO_ONDEMAND_TRACE_DIR")


@dataclass
class Prepared:
    """This process's on-demand environment: its directory and its bound endpoint."""

    pid: int
    directory: str
    sock: socket.socket
    user_base: str | None  # the user's base config carried over, or None
    # Set when the sidecar's responder reads the endpoint (`rank.ondemand`); until then a drain thread
    # reads kineto's polls and answers none, so that a process with no sidecar (a torchrun agent, a
    # worker that never installs one) never fills the endpoint's buffer: kineto would then retry each
    # poll for seconds, logging errors.
    taken_over: threading.Event = field(default_factory=threading.Event)


_prepared: Prepared | None = None
_why_not: str | None = "the on-demand environment was not prepared before torch was imported"


def opted_out(environ: MutableMapping[str, str] | None = None) -> bool:
    """`COSMOS_PROFILER_ONDEMAND` turns the on-demand path off."""
    env = os.environ if environ is None else environ
    return env.get(ENV_OPT, "").strip().lower() in OFF_WORDS


def prepared() -> Prepared | None:
    """This process's on-demand environment, or None (a forked child has none of its own)."""
    p = _prepared
    return p if p is not None and p.pid == os.getpid() else None


def why_not() -> str | None:
    """Why this process has no on-demand environment (None: it has one)."""
    if prepared() is not None:
        return None
    if _prepared is not None:
        return "a forked child has no on-demand endpoint of its own"
    return _why_not


def prepare(environ: MutableMapping[str, str] | None = None) -> Prepared | None:
    """Set the on-demand environment up for this process (see the module docstring); never raises.

    Returns the prepared environment, or None (`why_not()` says why).
    """
    global _prepared, _why_not
    env = os.environ if environ is None else environ
    if prepared() is not None:
        return _prepared
    try:
        reason = _refusal(env)
        if reason is not None:
            _why_not = reason
            return None
        _prepared = _setup(env)
        _why_not = None
        return _prepared
    except Exception as exc:  # noqa: BLE001 - the Python path remains; never break the start
        _why_not = f"the on-demand environment could not be set up: {type(exc).__name__}: {exc}"
        return None


def _refusal(env: MutableMapping[str, str]) -> str | None:
    if opted_out(env):
        return f"{ENV_OPT}={env.get(ENV_OPT)} turns the on-demand path off"
    if sys.platform != "linux":
        return "the on-demand path needs Linux"
    if "torch" in sys.modules:
        return "torch was imported before the sidecar could set kineto's environment"
    owner = env.get(ENV_OWNER)
    if env.get("KINETO_USE_DAEMON", "").strip() and not owner:
        return "KINETO_USE_DAEMON is set by the job (a dynolog of its own): the sidecar leaves it alone"
    return None


def _short_tmp() -> str:
    """A directory for the private one: a socket's whole path must fit `SUN_PATH_MAX`."""
    for candidate in (tempfile.gettempdir(), "/tmp"):
        if len(candidate) + 1 + 24 + 1 + CLIENT_NAME_LEN <= SUN_PATH_MAX:
            return candidate
    return "/tmp"


def _user_base(env: MutableMapping[str, str]) -> str | None:
    """The user's base config text: `KINETO_CONFIG`, else /etc/libkineto.conf (in a child of a prepared
    process, `KINETO_CONFIG` is the parent's, which carries the user's already)."""
    path = env.get("KINETO_CONFIG") or SYSTEM_BASE_CONFIG
    try:
        with open(path) as f:
            return f.read(1 << 20)
    except OSError:
        return None


def _sweep(parent: str) -> None:
    """Remove the directories of this user's processes that are gone (each keeps its endpoint until exit)."""
    try:
        names = os.listdir(parent)
    except OSError:
        return
    for name in names:
        head, _, _ = name.partition("-")
        if not (name.startswith(DIR_PREFIX) and head[len(DIR_PREFIX):].isdigit()):
            continue
        path = os.path.join(parent, name)
        try:
            if os.lstat(path).st_uid != os.getuid():
                continue
            os.kill(int(head[len(DIR_PREFIX):]), 0)
        except ProcessLookupError:
            shutil.rmtree(path, ignore_errors=True)
        except OSError:
            continue


def _setup(env: MutableMapping[str, str]) -> Prepared:
    from sidecar.rank.kinetoipc import base_config  # standard library only, as this module

    user = _user_base(env)
    parent = _short_tmp()
    _sweep(parent)
    directory = tempfile.mkdtemp(prefix=f"{DIR_PREFIX}{os.getpid()}-", dir=parent)  # mode 0700
    try:
        with open(os.path.join(directory, BASE_CONFIG_NAME), "w") as f:
            f.write(base_config(user, POLL_INTERVAL_S))
        sock = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
        sock.bind(os.path.join(directory, ENDPOINT))
    except BaseException:
        shutil.rmtree(directory, ignore_errors=True)
        raise
    env.update({
        "KINETO_USE_DAEMON": "1",
        "KINETO_IPC_SOCKET_DIR": directory,
        "KINETO_CONFIG": os.path.join(directory, BASE_CONFIG_NAME),
        "KINETO_ONDEMAND_TRACE_DIR": directory,
        ENV_OWNER: str(os.getpid()),
    })
    prepared = Prepared(os.getpid(), directory, sock, user)
    threading.Thread(target=_drain, args=(prepared,), name="cosmos-profiler-kineto-drain", daemon=True).start()
    return prepared


DRAIN_TICK_S = 1.0


def _drain(prepared: Prepared) -> None:
    """Read and drop kineto's polls until the responder takes the endpoint over."""
    sock = prepared.sock
    while not prepared.taken_over.is_set():
        try:
            readable = _wait_readable(sock, DRAIN_TICK_S)
            if readable and not prepared.taken_over.is_set():
                sock.recv(65536, socket.MSG_DONTWAIT)
        except BlockingIOError:
            continue
        except OSError:
            return


def _wait_readable(sock: socket.socket, timeout: float) -> bool:
    import select

    ready, _, _ = select.select([sock], [], [], timeout)
    return bool(ready)
