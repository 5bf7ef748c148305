"""The CLI's own errors: exit 1 with a message, its JSON `code` (docs/json.md) and what to do next.

At the bottom of `sidecar.cli`: `params` (the options) and `render` (the output) both raise them.
"""

from __future__ import annotations

from typing import Any

import click

GENERIC_CODE = "error"  # the JSON `code` of an error no class names (`params.ERROR_CODES`)
# ctx.meta key: the command's resolved `sidecar.fleet.replicas.Source` (for the hints of `render.refusal`)
SOURCE_META = "sidecar.source"


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
