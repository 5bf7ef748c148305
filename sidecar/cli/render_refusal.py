"""What a refused command says, and what to do next: the sentence of each library refusal the CLI
prints (`Error: ...`, or Cosmos-RL's own verbatim) and its hint line.

    refusal        (message, hint) for a library error in a command: which registry was searched and
                   where it came from, the replicas there, the cancel command to type, ...
    busy_text      Cosmos-RL's sentence for a busy replica, from `ReplicaBusy`'s fields
    not_found_hint which registry was searched, where it came from, and what is there

Which exit code and JSON `code` a refusal gets is `sidecar.cli.errors`'.
"""

from __future__ import annotations

import shlex
from typing import Any

import click

from sidecar.cli.errors import SOURCE_META
from sidecar.cli.render import CLI_NAME, MAX_FILES_SHOWN, ranks_text
from sidecar.common.exceptions import NoLiveRank, RegistryError, ReplicaBusy, ReplicaNotFound


def source_flags(params: dict[str, Any]) -> str:
    """The source options a command was given, as they would be typed again (leading space), else ""."""
    flags = []
    for key, flag in (("controller_host", "-ch"), ("controller_port", "-cp"), ("registry", "--registry"),
                      ("config_path", "--config")):
        if params.get(key):
            flags.append(f"{flag} {shlex.quote(str(params[key]))}")
    return "".join(" " + f for f in flags)


def not_found_hint(source: Any, name: str) -> str:
    """Which registry was searched, where it came from, and the replicas that exist."""
    from sidecar.common import registry

    if source.controller is not None:
        names = [r.name for r in source.controller]
        where = f"Asked the controller at {source.controller_url}"
    else:
        try:
            names = registry.list_replicas(source.root)
        except Exception:  # noqa: BLE001 - a hint never hides the refusal it explains
            names = []
        where = f"Searched the registry {source.root} (from {source.origin})"
    relative = getattr(source, "relative", "")
    if relative:
        return f"{where}. {relative}"
    if names:
        shown = ", ".join(names[:MAX_FILES_SHOWN]) + (f" and {len(names) - MAX_FILES_SHOWN} more"
                                                      if len(names) > MAX_FILES_SHOWN else "")
        return f"{where}; replicas there: {shown}."
    return (f"{where}; it has no replicas: is the job's sidecar using another registry "
            "(--registry DIR, $COSMOS_PROFILER_DIR, --config TOML)?")


def busy_text(exc: ReplicaBusy, flags: str = "") -> str:
    """Cosmos-RL's sentence for a busy replica, each request with its ranks, start step and phase, and
    the cancel command exactly as it must be typed for this registry (`flags`: `source_flags`)."""
    held = " and ".join(f"request {r.request_id} (ranks {ranks_text(r.ranks)}, start step "
                        f"{'next' if r.start_step is None else r.start_step}, phase {r.phase})" for r in exc.requests)
    it = "it" if len(exc.requests) == 1 else "them"
    return f"Replica {exc.replica} is busy with {held}. `{CLI_NAME} profile cancel {exc.replica}{flags}` ends {it}."


def refusal(exc: Exception, ctx: click.Context) -> tuple[str, str]:
    """(message, hint) for a library error in command `ctx`: the hint says what to do next."""
    message = str(exc)
    source = ctx.meta.get(SOURCE_META)
    relative: str = getattr(source, "relative", "") if source is not None else ""
    name = ctx.params.get("name") or ctx.params.get("target")
    flags = source_flags(ctx.params)
    if isinstance(exc, ReplicaNotFound) and source is not None and name:
        return message, not_found_hint(source, name)
    if isinstance(exc, ReplicaBusy):
        return busy_text(exc, flags), ""
    if isinstance(exc, RegistryError) and source is not None and str(source.root) in message:
        return message, relative or f"The registry came from {source.origin}."
    if isinstance(exc, NoLiveRank) and name:
        if relative:
            return message, relative
        return message, f"`cosmos-profiler replica lsr {name}{flags}` shows every rank; is the job still running?"
    # A registry derived from a relative output_dir that holds no replica: what was relative, what to do.
    return message, relative
