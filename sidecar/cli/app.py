"""The CLI: Cosmos-RL's `replica ls|lsr` and `profile set|status` verbs and flags, plus
`profile cancel|stacks|summary|merge|export`.

    cosmos-profiler replica ls [-ch HOST -cp PORT] [--registry DIR] [--json]
    cosmos-profiler profile set REPLICA [-rf 0-3] [--wait]
    cosmos-profiler profile cancel REPLICA          # disarm, or stop and save what was recorded
    cosmos-profiler profile stacks REPLICA          # which rank hangs, and where
    cosmos-profiler profile summary REPLICA         # step times, top ops, the straggler

`cosmos-profiler` = `python -m sidecar`; where the real cosmos-rl is absent, the
stand-in's `python -m cosmos_rl.cli.cli` runs this same CLI.

Each command parses, calls one library function (`sidecar.fleet` reads the
fleet, `sidecar.control` writes a request, `sidecar.follow` follows it,
`sidecar.traces` reads what was saved) and renders its result with
`sidecar.cli.render`, as text or `--json`. A new command is a function under
`replica` or `profile` decorated with `@source_options` (and `@json_option`);
errors from the library become `Error: ...` lines through `params.SidecarCommand`.
This process never imports torch.
"""

from __future__ import annotations

from typing import Any

import click

from sidecar import __version__, control, fleet, follow
from sidecar.cli import render
from sidecar.cli.params import (
    SOURCE_PARAMS,
    SidecarGroup,
    capture_option,
    follow_options,
    json_option,
    rank_filter_option,
    source_options,
    target_argument,
)
from sidecar.cli.render import echo_json, jsonable, show, warn
from sidecar.config import MAX_ACTIVE_STEPS, MAX_WAIT_STEPS, MAX_WARMUP_STEPS
from sidecar.controller import DEFAULT_TIMEOUT_S as CONTROLLER_TIMEOUT_S
from sidecar.request import MAX_START_AHEAD_S, MAX_START_AHEAD_STEPS, MAX_START_STEP, RankFilter
from sidecar.traces.summary import TOP_K

# The trace analysis modules are imported by the commands that use them, so that
# `profile set` (a login node, a script in a loop) starts without them.

MAX_TOP_K = 1000


def _source(controller_host: str | None = None, controller_port: str | None = None, registry: str | None = None,
            timeout: float = CONTROLLER_TIMEOUT_S, config_path: str | None = None) -> fleet.Source:
    return fleet.resolve_source(registry, controller_host, controller_port, timeout, config_path=config_path)


def _following_source(source: dict[str, Any]) -> fleet.Source:
    """The source of a command whose --timeout bounds the following: the controller gets at most its own."""
    return _source(**{**source, "timeout": min(source["timeout"], CONTROLLER_TIMEOUT_S)})


@click.group(cls=SidecarGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="cosmos-profiler-sidecar")
def cosmos() -> None:
    """Cosmos-RL profiler CLI: list replicas and profile them on demand.

    Replicas come from the filesystem registry, or with -ch/-cp from a
    Cosmos-RL controller. Profiling always goes through the control file.
    """


@cosmos.group()
def replica() -> None:
    """Query replica information (registry or controller)."""


@cosmos.group()
def profile() -> None:
    """Manage profiler behavior of the training."""


# --- replica ls / lsr ------------------------------------------------------------------


@replica.command(name="ls")
@source_options()
@json_option
def replica_ls(as_json: bool, **source: Any) -> None:
    """List replicas: ranks alive/total, hosts, state and newest heartbeat."""
    src = _source(**source)
    replicas = fleet.list_replicas(src.root, src.controller)
    if as_json:
        echo_json(replicas)
        return
    warn([f"replica {r.name}: {problem}" for r in replicas for problem in r.problems])
    if not replicas:
        click.echo("No replicas registered to the controller." if src.controller is not None
                   else f"No replicas registered under {src.root}.")
        return
    click.echo(render.replicas_table(replicas, with_controller=src.controller is not None))


@replica.command(name="lsr")
@click.argument("name")
@source_options()
@json_option
def replica_lsr(name: str, as_json: bool, **source: Any) -> None:
    """List the ranks of replica NAME: host, pid, liveness, step, state, last trace and error."""
    src = _source(**source)
    show(fleet.replica_ranks(src.root, name, src.controller), as_json, render.ranks_table)


# --- profile set / cancel / status ---------------------------------------------------------


@profile.command(name="set")
@click.argument("name")
@click.option("--active-steps", "-as", type=click.IntRange(1, MAX_ACTIVE_STEPS),
              help="The number of steps that profiler traces (default: the rank's config, else 1).")
@rank_filter_option("that profiler traces", fleet.DEFAULT_RANK_FILTER)
@click.option("--record-shape", "-rs", is_flag=True, help="Record the shapes of the tensors.")
@click.option("--profile-memory", "-pm", is_flag=True, help="Profile tensor memory allocations.")
@click.option("--with-stack", "-ws", is_flag=True, help="Record the Python stack of each op.")
@click.option("--with-modules", "-wm", is_flag=True, help="Record the module hierarchy of each op.")
@click.option("--wait-steps", type=click.IntRange(0, MAX_WAIT_STEPS),
              help="Steps to skip before warmup (default: the rank's config).")
@click.option("--warmup-steps", type=click.IntRange(0, MAX_WARMUP_STEPS),
              help="Warmup steps, traced but discarded (default: the rank's config).")
@click.option("--start-step", type=click.IntRange(0, MAX_START_STEP),
              help="Absolute step at which the schedule begins on every rank "
                   f"(default: the replica's highest step plus a lead of at least {control.MIN_LEAD_STEPS} steps "
                   f"and {control.LEAD_SECONDS:g}s at the recent step rate, more for a rank that polls). "
                   f"At most {MAX_START_AHEAD_STEPS} steps and {MAX_START_AHEAD_S / 3600:g} h ahead.")
@click.option("--wait/--no-wait", default=False, show_default=True,
              help="Follow every selected rank until its trace is saved, and print the trace paths.")
@follow_options(follow.DEFAULT_WAIT_TIMEOUT_S, "With --wait: give up after this long")
@json_option
def profile_set(name: str, wait: bool, as_json: bool, **options: Any) -> None:
    """Set profile mode of the replica named NAME."""
    source = {key: options.pop(key) for key in SOURCE_PARAMS}
    src = _following_source(source)
    result = control.set_profile(src.root, name, controller=src.controller, **options)
    warn(result.warnings + [f"rank {k} will not be profiled: {why}" for k, why in result.skipped.items()])
    if not as_json:
        click.echo("\n".join(render.set_lines(result)))
    if not wait:
        if as_json:
            echo_json(result)
        return
    on_progress = None if as_json else (lambda c: click.echo(render.describe_capture(c)))
    captures = follow.wait_for_capture(src.root, name, result.request_id, result.ranks, source["timeout"],
                                       on_progress)
    if as_json:
        echo_json({**jsonable(result), "captures": jsonable(captures)})
    else:
        for line in render.saved_lines(captures):
            click.echo(line)
    failure = render.unfinished(captures)
    if failure:
        raise click.ClickException(failure)


@profile.command(name="cancel")
@click.argument("name")
@rank_filter_option("whose request ends", RankFilter.ALL_TEXT)
@click.option("--wait/--no-wait", default=True, show_default=True,
              help="Follow every selected rank until it answered and is idle again, and print each answer.")
@follow_options(follow.DEFAULT_CANCEL_TIMEOUT_S, "With --wait: give up after this long")
@json_option
def profile_cancel(name: str, rank_filter: RankFilter | None, wait: bool, as_json: bool, **source: Any) -> None:
    """End replica NAME's profile request: an armed rank disarms, a tracing rank
    stops at its next step and saves the steps it recorded, an idle rank has
    nothing to cancel."""
    src = _following_source(source)
    result = control.cancel_profile(src.root, name, rank_filter=rank_filter, controller=src.controller)
    warn([f"rank {k} will not answer: {why}" for k, why in result.skipped.items()])
    if not as_json:
        click.echo(render.cancel_line(result))
    if not wait:
        if as_json:
            echo_json(result)
        return
    on_progress = None if as_json else (lambda a: click.echo(render.describe_cancel(a)))
    answers = follow.wait_for_cancel(src.root, name, result.request_id, result.ranks, source["timeout"], on_progress)
    if as_json:
        echo_json({**jsonable(result), "answers": jsonable(answers)})
    failure = render.unanswered_cancel(answers)
    if failure:
        raise click.ClickException(failure)


@profile.command(name="status")
@click.argument("name")
@source_options()
@json_option
def profile_status(name: str, as_json: bool, **source: Any) -> None:
    """Show the per-rank state of replica NAME's current or last profile request."""
    src = _source(**source)
    show(follow.profile_status(src.root, name, src.controller), as_json, render.status_text)


# --- profile stacks / summary / merge / export -----------------------------------------------


@profile.command(name="stacks")
@click.argument("name")
@rank_filter_option("to ask", control.DEFAULT_STACKS_RANK_FILTER)
@click.option("--group/--no-group", default=True, show_default=True,
              help="Group ranks whose main threads stand in the same frames (the odd rank out stands apart).")
@click.option("--all-threads", is_flag=True, help="Show every thread's stack, not only the main thread's.")
@follow_options(follow.DEFAULT_STACKS_TIMEOUT_S, "Give up on ranks that have not answered after this long")
@json_option
def profile_stacks(name: str, rank_filter: RankFilter | None, group: bool, all_threads: bool, as_json: bool,
                   **source: Any) -> None:
    """Dump the Python stacks of every thread of replica NAME's ranks, and group
    the ranks by their main thread's stack.

    The ranks answer from their watcher threads, so this works while training
    is stuck: a rank that hangs a collective stands apart from the ranks that
    wait for it in that collective.
    """
    src = _following_source(source)
    result = control.dump_stacks(src.root, name, rank_filter, src.controller, source["timeout"])
    from sidecar.traces.stacks import group_stacks

    groups = group_stacks(result.ranks, by_stack=group, all_threads=all_threads)
    if as_json:
        echo_json(render.stacks_json(result, groups))
    else:
        click.echo(render.stacks_text(result, groups, all_threads))
    failure = render.unanswered_stacks(result)
    if failure:
        raise click.ClickException(failure)


@profile.command(name="summary")
@target_argument
@capture_option
@click.option("--top", "top_k", type=click.IntRange(1, MAX_TOP_K), default=TOP_K, show_default=True,
              metavar="K", help="How many CPU ops and CUDA kernels to show per rank.")
@source_options()
@json_option
def profile_summary(target: str, capture: int | None, top_k: int, as_json: bool, **source: Any) -> None:
    """Summarize a capture: step times and top ops per rank, and the straggler.

    PATH_OR_REPLICA is a trace file, a directory of traces (an output
    directory, its profile_trace directory, or a folder of *.json.gz), or a
    replica name, whose traces are found from its ranks' records (an existing
    path is taken for a path).
    """
    from sidecar.traces.summary import render_summary, summarize_traces

    src = _source(**source)
    found, summary = summarize_traces(target, src.root, capture, top_k, src.controller)
    warn(found.warnings)
    if as_json:
        echo_json({**summary.to_json(), "missing_ranks": found.missing_ranks, "warnings": found.warnings})
    else:
        click.echo(render_summary(summary), nl=False)


@profile.command(name="merge")
@target_argument
@click.option("--output", "-o", "out_path", required=True, type=click.Path(dir_okay=False), metavar="FILE",
              help="The merged Chrome trace to write (gzip when it ends in .gz); replaced if it exists.")
@capture_option
@source_options()
@json_option
def profile_merge(target: str, out_path: str, capture: int | None, as_json: bool, **source: Any) -> None:
    """Merge one capture of every rank into one Chrome/Perfetto trace, a process per rank, on one clock.

    PATH_OR_REPLICA is as for `profile summary`.
    """
    from sidecar.traces.merge import merge_traces

    src = _source(**source)
    merged = merge_traces(target, out_path, src.root, capture, src.controller)
    warn(merged.warnings)
    show(merged, as_json, lambda m: render.merged_text(m, target))


@profile.command(name="export")
@target_argument
@capture_option
@click.argument("out_dir", metavar="DIR", type=click.Path(file_okay=False))
@source_options()
@json_option
def profile_export(target: str, capture: int | None, out_dir: str, as_json: bool, **source: Any) -> None:
    """Lay one capture out flat in DIR, a file per rank, for HolisticTraceAnalysis or Perfetto.

    PATH_OR_REPLICA is a replica name or a directory in the sidecar's layout
    (as for `profile summary`). Files are hard links where possible; use one
    DIR per capture (HTA reads every trace in a folder as one more rank).
    """
    from sidecar.traces.export import export_traces

    src = _source(**source)
    exported = export_traces(target, out_dir, src.root, capture, src.controller)
    warn(exported.warnings)
    show(exported, as_json, lambda e: render.exported_text(e, target))


def main(prog_name: str | None = None) -> None:
    cosmos(prog_name=prog_name)
