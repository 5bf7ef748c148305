"""The CLI's errors and exit codes: which library error becomes which exit, with its JSON `code`.

    usage_error   BadOption (a value wrong for this replica) -> the option's BadParameter, exit 2
    refused       any other SidecarError -> `Error: ...` (Cosmos-RL's own refusals verbatim), exit 1
    error_code    the JSON `code` of an error (docs/json.md); ERROR_CODES is the table
    CliError      exit 1 with a message, its JSON `code` and what to do next (`hint`)
    JsonError     any error of a --json command line as `{"error", "code", "hint"}` on stdout, same exit

At the bottom of `sidecar.cli`: `params` (the options), `render` (the output) and `app` raise
these; what a refusal says next (its hint) is `render_refusal.refusal`'s.
"""

from __future__ import annotations

import json
from typing import Any

import click

from sidecar.common.exceptions import (
    BadOption,
    ConfigError,
    ControllerError,
    NoLiveRank,
    RegistryError,
    ReplicaBusy,
    ReplicaNotFound,
    RequestError,
    SidecarError,
    TraceError,
)

GENERIC_CODE = "error"  # the JSON `code` of an error no class names (ERROR_CODES)
# ctx.meta key: the command's resolved `sidecar.fleet.replicas.Source` (for the hints of `render_refusal.refusal`)
SOURCE_META = "sidecar.source"
# Cosmos-RL prints these as they are, without "Error: ".
VERBATIM_ERRORS = (ReplicaNotFound, ReplicaBusy)
# The `code` of a JSON error (docs/json.md): the first class the error is an instance of.
ERROR_CODES: tuple[tuple[type[BaseException], str], ...] = (
    (ReplicaNotFound, "not_found"),
    (ReplicaBusy, "busy"),
    (NoLiveRank, "no_live_rank"),
    (BadOption, "usage"),
    (click.UsageError, "usage"),
    (ConfigError, "config"),
    (ControllerError, "controller"),
    (TraceError, "trace"),
    (RegistryError, "registry"),
    (RequestError, "request"),
)


def error_code(exc: BaseException) -> str:
    """The JSON `code` of `exc` (ERROR_CODES), "error" for anything else."""
    return next((code for cls, code in ERROR_CODES if isinstance(exc, cls)), GENERIC_CODE)


class CliError(click.ClickException):
    """Exit 1 with a message, its JSON `code`, and what to do next (`hint`, a line of its own).

    `verbatim`: Cosmos-RL prints the message as it is, without "Error: "."""

    def __init__(self, message: str, code: str = GENERIC_CODE, hint: str = "", verbatim: bool = False) -> None:
        super().__init__(message)
        self.code, self.hint, self.verbatim = code, hint, verbatim

    def show(self, file: Any = None) -> None:
        text = self.format_message() if self.verbatim else f"Error: {self.format_message()}"
        click.echo(text + (f"\n{self.hint}" if self.hint else ""), err=True, file=file)


class VerbatimError(CliError):
    """Exit 1 with the message exactly as Cosmos-RL prints it."""

    def __init__(self, message: str, code: str = GENERIC_CODE, hint: str = "") -> None:
        super().__init__(message, code, hint, verbatim=True)


def usage_error(exc: BadOption, ctx: click.Context) -> click.UsageError:
    """A value wrong for this replica (exit 2): a BadParameter naming the option it came from, else a UsageError."""
    param = next((p for p in ctx.command.params if p.name == exc.option), None)
    if param is None:
        return click.UsageError(str(exc), ctx=ctx)
    return click.BadParameter(str(exc), ctx=ctx, param=param)


def refused(exc: SidecarError, message: str, hint: str = "") -> CliError:
    """A library refusal (exit 1) as the CLI says it: `message` and `hint` (`render_refusal.refusal`), its JSON code,
    verbatim for Cosmos-RL's own (VERBATIM_ERRORS)."""
    cls = VerbatimError if isinstance(exc, VERBATIM_ERRORS) else CliError
    return cls(message, error_code(exc), hint)


class JsonError(click.ClickException):
    """Any error of a --json command line: `{"error": ..., "code": ...}` (and `hint`) on stdout, same exit code."""

    def __init__(self, exc: click.ClickException) -> None:
        super().__init__(exc.format_message())
        # click types exit_code as a ClassVar; this wrapper exits as the error it wraps would
        self.exit_code = exc.exit_code  # type: ignore[misc]
        # a usage error's message as click shows it, without the usage lines: "Invalid value for ...: ..."
        self.data: dict[str, Any] = {"error": exc.format_message(),
                                     "code": getattr(exc, "code", None) or error_code(exc)}
        hint = getattr(exc, "hint", "")
        if hint:
            self.data["hint"] = hint

    def show(self, file: Any = None) -> None:
        click.echo(json.dumps(self.data, indent=2, sort_keys=True))
