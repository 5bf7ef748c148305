"""Click plumbing of the CLI: the error mapping, the rank-list type, and the options commands share.

    SidecarCommand, SidecarGroup   the library's errors through `errors` (exit 1, or 2 for a usage error);
                                   with --json, any error -> {"error": ..., "code": ...} on stdout
    RANKS, rank_filter_option      `0,1`, `0-3,8` or `all`, checked as the ranks check it
    source_options, follow_options where replicas come from (-ch/-cp, --registry, --config, --timeout)
    json_option, capture_option, target_argument
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import click

from sidecar.cli.errors import SOURCE_META, JsonError, refused, usage_error
from sidecar.common.config import MAX_SAFE_INTEGER
from sidecar.common.exceptions import BadOption, RequestError, SidecarError
from sidecar.common.request import RankFilter, parse_rank_filter
from sidecar.fleet.controller import DEFAULT_TIMEOUT_S as CONTROLLER_TIMEOUT_S

# ctx.meta key: the command line asked for --json (set by the top group, seen by every command)
JSON_META = "sidecar.json"


def remember_source(source: Any) -> None:
    """Keep the command's resolved `fleet.replicas.Source` for the hints of its refusals (`render_refusal.refusal`)."""
    ctx = click.get_current_context(silent=True)
    if ctx is not None:
        ctx.meta[SOURCE_META] = source


def wants_json(args: Sequence[str]) -> bool:
    """--json among the options (not after a `--`)."""
    args = list(args)
    return "--json" in (args[: args.index("--")] if "--" in args else args)


class SidecarCommand(click.Command):
    """Maps the library's errors (`errors.usage_error`, `errors.refused`): `BadOption` -> usage error
    (exit 2), other `SidecarError` -> exit 1, with its JSON `code` and, where `render_refusal.refusal` knows
    one, what to do next."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except BadOption as exc:
            raise usage_error(exc, ctx) from None
        except SidecarError as exc:
            from sidecar.cli.render_refusal import refusal

            raise refused(exc, *refusal(exc, ctx)) from None


class SidecarGroup(click.Group):
    """The CLI's groups; the top one turns every error of a `--json` command line into JSON."""

    command_class = SidecarCommand
    group_class = type  # subgroups are SidecarGroups too

    def make_context(self, info_name: str | None, args: list[str], parent: click.Context | None = None,
                     **extra: Any) -> click.Context:
        if parent is not None:
            return super().make_context(info_name, args, parent, **extra)
        as_json = wants_json(args)  # the top group sees the whole command line
        try:
            ctx = super().make_context(info_name, args, parent, **extra)
        except click.ClickException as exc:
            raise (JsonError(exc) if as_json else exc) from None
        ctx.meta[JSON_META] = as_json
        return ctx

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except JsonError:
            raise
        except click.ClickException as exc:
            if ctx.meta.get(JSON_META):
                raise JsonError(exc) from None
            raise


class RankFilterType(click.ParamType):
    """`0,1`, `0-3,8` or `all`."""

    name = "ranks"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> RankFilter:
        if isinstance(value, RankFilter):
            return value
        try:
            return parse_rank_filter(str(value))
        except RequestError as exc:
            message = str(exc)
            for prefix in ("rank_filter: ", "rank_filter "):
                if message.startswith(prefix):
                    message = message[len(prefix):]
            self.fail(message, param, ctx)


RANKS = RankFilterType()


def _compose(*decorators: Callable[[Callable], Callable]) -> Callable[[Callable], Callable]:
    def decorate(f: Callable) -> Callable:
        for decorator in reversed(decorators):
            f = decorator(f)
        return f

    return decorate


# The parameters `source_options` adds, as commands receive them.
SOURCE_PARAMS = ("controller_host", "controller_port", "registry", "config_path", "timeout")


def source_options(timeout: float = CONTROLLER_TIMEOUT_S, timeout_help: str = "") -> Callable[[Callable], Callable]:
    """-ch/-cp (Cosmos-RL's), --registry, --config and --timeout: where replicas come from."""
    return _compose(
        click.option("--controller-host", "-ch", metavar="HOST",
                     help="Cosmos-RL controller host: list replicas from its /api/status."),
        click.option("--controller-port", "-cp", metavar="PORT", help="Cosmos-RL controller port."),
        click.option("--registry", metavar="DIR",
                     help="Registry root, or a redis://host:port/db URL (password: "
                          "$COSMOS_PROFILER_REDIS_PASSWORD) (default: $COSMOS_PROFILER_DIR, else from --config, "
                          "else from the controller's /api/meta, else the per-user default)."),
        click.option("--config", "config_path", metavar="TOML", type=click.Path(dir_okay=False),
                     help="The job's Cosmos-RL TOML: its registry ([sidecar] registry, else "
                          "<train.output_dir>/profile_control, as its workers derive it)."),
        click.option("--timeout", type=click.FloatRange(min=0, min_open=True), default=timeout, show_default=True,
                     metavar="SECONDS", help=timeout_help or "Give up on the controller after this long."),
    )


def follow_options(timeout: float, what: str) -> Callable[[Callable], Callable]:
    """`source_options` for a command that follows the ranks: --timeout bounds the following."""
    return source_options(timeout, f"{what} (the controller gets at most {CONTROLLER_TIMEOUT_S:g}s).")


json_option = click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")



def rank_filter_option(which: str, default: str) -> Callable[[Callable], Callable]:
    """-rf/--rank-filter, Cosmos-RL's spelling: "The ranks {which}: ... (default: {default})"."""
    return click.option("--rank-filter", "-rf", type=RANKS,
                        help=f"The ranks {which}: '0,1', '0-3,8' or 'all' (default: {default}).")


capture_option = click.option(
    "--capture", type=click.IntRange(0, MAX_SAFE_INTEGER), metavar="N",
    help="The capture to read: n of <n>_trace.json.gz (default: the latest).",
)
target_argument = click.argument("target", metavar="PATH_OR_REPLICA")
