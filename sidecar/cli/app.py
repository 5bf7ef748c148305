"""The CLI: Cosmos-RL's `replica ls|lsr` and `profile set|status` verbs and flags, plus
`profile cancel|stacks|summary|merge|export|report|diff`.

    cosmos-profiler replica ls [-ch HOST -cp PORT] [--registry DIR] [--json]
    cosmos-profiler profile set REPLICA [-rf 0-3] [--wait]
    cosmos-profiler profile cancel REPLICA          # disarm, or stop and save what was recorded
    cosmos-profiler profile stacks REPLICA          # which rank hangs, and where
    cosmos-profiler profile hang REPLICA            # the rank the others wait for (flight recorder + stacks)
    cosmos-profiler profile summary REPLICA         # step times, top ops, the straggler
    cosmos-profiler profile report REPLICA -o r.html  # the same as one HTML page, with bars
    cosmos-profiler profile diff REPLICA            # what changed between its last two captures

`cosmos-profiler` = `python -m sidecar`; where the real cosmos-rl is absent, the
stand-in's `python -m cosmos_rl.cli.cli` runs this same CLI.

Each command parses, calls one library function (`sidecar.fleet` reads the
fleet, `sidecar.fleet.control` writes a request, `sidecar.fleet.follow` follows it,
`sidecar.traces` reads what was saved) and renders the data it returns with
`sidecar.cli.render` (`render_traces` for saved traces, `render_hang` for a hang), as
text or `--json`: every line the CLI prints comes from a render module. A new command
is a function under `replica` or `profile` decorated with `@source_options` (and
`@json_option`); errors from the library become `Error: ...` lines (exit 1) or usage
errors (exit 2) through `params.SidecarCommand` and `cli.errors` (with what to do next,
`render_refusal.refusal`), and with `--json` one `{"error", "code"}` object through
`params.SidecarGroup` (docs/json.md; each command's JSON is built in a render module,
its schema is sidecar/cli/schema.json).
Long waits and trace reads show live progress on a terminal (`cli.progress`).
This process never imports torch.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import click

from sidecar.cli import render
from sidecar.cli.exit import exit_now
from sidecar.cli.params import (
    RANKS,
    SOURCE_PARAMS,
    SidecarGroup,
    capture_option,
    follow_options,
    json_option,
    rank_filter_option,
    remember_source,
    source_options,
    target_argument,
)
from sidecar.cli.render import echo_json, finish, warn
from sidecar.common import startstep
from sidecar.common.config import MAX_ACTIVE_STEPS, MAX_WAIT_STEPS, MAX_WARMUP_STEPS
from sidecar.common.recordscan import collector_paused
from sidecar.common.request import (
    DEFAULT_CONSECUTIVE,
    MAX_CONSECUTIVE,
    MAX_FACTOR,
    MAX_REPEAT,
    MAX_START_AHEAD_S,
    MAX_START_AHEAD_STEPS,
    MAX_START_STEP,
    MIN_FACTOR,
    RankFilter,
)
from sidecar.common.version import __version__
from sidecar.fleet import replicas
from sidecar.fleet.controller import DEFAULT_TIMEOUT_S as CONTROLLER_TIMEOUT_S
from sidecar.fleet.defaults import (
    DEFAULT_CANCEL_TIMEOUT_S,
    DEFAULT_STACKS_RANK_FILTER,
    DEFAULT_STACKS_TIMEOUT_S,
    DEFAULT_WAIT_TIMEOUT_S,
)

if TYPE_CHECKING:
    from sidecar.fleet.answers import RankCapture

# The modules that write and follow requests (`fleet.control`, `fleet.follow`), the live
# progress (`cli.progress`) and the trace analysis modules are imported by the commands that
# use them, so that `replica ls` and `profile set` (a login node, a script in a loop) start
# without what they do not run.

MAX_TOP_K = 1000
TOP_K = 10  # sidecar.traces.summary.TOP_K, not imported here: most commands need no trace module


def _source(controller_host: str | None = None, controller_port: str | None = None, registry: str | None = None,
            timeout: float = CONTROLLER_TIMEOUT_S, config_path: str | None = None) -> replicas.Source:
    src = replicas.resolve_source(registry, controller_host, controller_port, timeout, config_path=config_path)
    remember_source(src)
    return src


def _following_source(source: dict[str, Any]) -> replicas.Source:
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
    # The collector off until the ranks' records and statuses are gone (10,000 of each for a big
    # job): it would walk all of them, as young objects, to find no garbage.
    with collector_paused():
        if as_json:
            echo_json(render.ls_json(src, replicas.replicas_with_ranks(src.root, src.controller)))
            return
        found = replicas.list_replicas(src.root, src.controller)
    warn(render.problem_lines(found))
    click.echo(render.replicas_table(found, with_controller=src.controller is not None) if found
               else render.no_replicas_line(src))


@replica.command(name="lsr")
@click.argument("name")
@source_options()
@json_option
def replica_lsr(name: str, as_json: bool, **source: Any) -> None:
    """List the ranks of replica NAME: host, pid, liveness, step, state, last trace and error."""
    src = _source(**source)
    with collector_paused():  # as `replica ls`
        ranks = replicas.replica_ranks(src.root, name, src.controller)
        if as_json:
            echo_json(render.lsr_json(src, name, ranks))
        else:
            click.echo(render.ranks_table(ranks))
        del ranks


# --- profile set / cancel / status ---------------------------------------------------------


@profile.command(name="set")
@click.argument("name")
@click.option("--active-steps", "-as", type=click.IntRange(1, MAX_ACTIVE_STEPS),
              help="The number of steps that profiler traces (default: the rank's config, else 1).")
@rank_filter_option("that profiler traces", replicas.DEFAULT_RANK_FILTER)
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
                   f"(default: the replica's highest step plus a lead of at least {startstep.MIN_LEAD_STEPS} steps "
                   f"and {startstep.LEAD_SECONDS:g}s at the recent step rate, more for a rank that polls). "
                   f"At most {MAX_START_AHEAD_STEPS} steps and {MAX_START_AHEAD_S / 3600:g} h ahead.")
@click.option("--on-slowdown", type=click.FloatRange(MIN_FACTOR, MAX_FACTOR, min_open=True), metavar="FACTOR",
              help="Arm a slowdown watch instead of capturing now: when steps run slower than FACTOR times "
                   "each rank's recent median, the selected ranks capture the same steps (once; see --repeat).")
@click.option("--consecutive", type=click.IntRange(1, MAX_CONSECUTIVE), metavar="K",
              help=f"With --on-slowdown: slow steps in a row that fire the watch (default {DEFAULT_CONSECUTIVE}).")
@click.option("--repeat", type=click.IntRange(0, MAX_REPEAT), metavar="N",
              help="With --on-slowdown: re-arm after a capture, up to N times (default 0: one capture).")
@click.option("--no-baseline", is_flag=True,
              help="With --on-slowdown: take no baseline capture when the watch is armed.")
@click.option("--wait/--no-wait", default=False, show_default=True,
              help="Follow every selected rank until its trace is saved, and print the trace paths "
                   "(with --on-slowdown: the baseline's, then the slow capture's).")
@follow_options(DEFAULT_WAIT_TIMEOUT_S, "With --wait: give up after this long")
@json_option
@click.pass_context
def profile_set(ctx: click.Context, name: str, wait: bool, as_json: bool, no_baseline: bool,
                **options: Any) -> None:
    """Set profile mode of the replica named NAME."""
    from sidecar.cli.progress import WaitProgress
    from sidecar.fleet import control, follow

    source = {key: options.pop(key) for key in SOURCE_PARAMS}
    if options["on_slowdown"] is None:
        given = [flag for flag, on in (("--consecutive", options["consecutive"] is not None),
                                       ("--repeat", options["repeat"] is not None), ("--no-baseline", no_baseline)) if on]
        if given:
            raise click.UsageError(f"{given[0]} is an option of the slowdown watch; give --on-slowdown FACTOR too",
                                   ctx)
    src = _following_source(source)
    result = control.set_profile(src.root, name, controller=src.controller, baseline=not no_baseline, **options)
    warn(render.set_warnings(result))
    if not as_json:
        click.echo("\n".join(render.set_lines(result)))
    if not wait:
        if as_json:
            echo_json(render.set_json(result))
        return
    live = WaitProgress(name)  # stderr, when it is a terminal

    def on_baseline(baseline: list[RankCapture]) -> None:
        live.clear()
        if not as_json:
            click.echo("\n".join(render.baseline_lines(baseline)))

    noted: list[int] = []

    def on_note(rank: int, note: str) -> None:
        noted.append(rank)
        for line in render.note_lines(rank, note, len(noted), name):
            live.echo(line)

    followed = follow.follow_set(
        src.root, name, result.request_id, result.ranks, source["timeout"], watch=options["on_slowdown"] is not None,
        baseline=not no_baseline, on_progress=None if as_json else (lambda c: live.echo(render.describe_capture(c))),
        observer=live, on_baseline=on_baseline,
        on_fired=None if as_json else (lambda fired: click.echo(render.fired_line(fired))),
        on_note=None if as_json else on_note)
    live.clear()
    if not as_json and followed.stage == "capture" and followed.captures is not None:
        for line in render.saved_lines(followed.captures):
            click.echo(line)
    finish(as_json, render.set_json(result, followed.captures), render.set_failure(followed, name))


@profile.command(name="cancel")
@click.argument("name")
@rank_filter_option("whose request ends", RankFilter.ALL_TEXT)
@click.option("--wait/--no-wait", default=True, show_default=True,
              help="Follow every selected rank until it answered and is idle again, and print each answer.")
@follow_options(DEFAULT_CANCEL_TIMEOUT_S, "With --wait: give up after this long")
@json_option
def profile_cancel(name: str, rank_filter: RankFilter | None, wait: bool, as_json: bool, **source: Any) -> None:
    """End replica NAME's profile request: an armed rank disarms, a tracing rank
    stops at its next step and saves the steps it recorded, an idle rank has
    nothing to cancel."""
    from sidecar.cli.progress import WaitProgress
    from sidecar.fleet import control, follow

    src = _following_source(source)
    result = control.cancel_profile(src.root, name, rank_filter=rank_filter, controller=src.controller)
    warn(render.cancel_warnings(result))
    if not as_json:
        click.echo(render.cancel_line(result))
    if not wait:
        if as_json:
            echo_json(render.cancel_json(result))
        return
    live = WaitProgress(name)  # stderr, when it is a terminal
    on_progress = None if as_json else (lambda a: live.echo(render.describe_cancel(a)))
    answers = follow.wait_for_cancel(src.root, name, result.request_id, result.ranks, source["timeout"], on_progress,
                                     observer=live)
    live.clear()
    finish(as_json, render.cancel_json(result, answers), render.unanswered_cancel(answers))


@profile.command(name="status")
@click.argument("name")
@source_options()
@json_option
def profile_status(name: str, as_json: bool, **source: Any) -> None:
    """Show the per-rank state of replica NAME's current or last profile request."""
    from sidecar.fleet import follow

    src = _source(**source)
    status = follow.profile_status(src.root, name, src.controller)
    if as_json:
        echo_json(render.status_json(status))
    else:
        click.echo(render.status_text(status))


# --- profile stacks / summary / merge / export -----------------------------------------------


@profile.command(name="stacks")
@click.argument("name")
@rank_filter_option("to ask", DEFAULT_STACKS_RANK_FILTER)
@click.option("--group/--no-group", default=True, show_default=True,
              help="Group ranks whose main threads stand in the same frames (the odd rank out stands apart).")
@click.option("--all-threads", is_flag=True, help="Show every thread's stack, not only the main thread's.")
@follow_options(DEFAULT_STACKS_TIMEOUT_S, "Give up on ranks that have not answered after this long")
@json_option
def profile_stacks(name: str, rank_filter: RankFilter | None, group: bool, all_threads: bool, as_json: bool,
                   **source: Any) -> None:
    """Dump the Python stacks of every thread of replica NAME's ranks, and group
    the ranks by their main thread's stack.

    The ranks answer from their watcher threads, so this works while training
    is stuck: a rank that hangs a collective stands apart from the ranks that
    wait for it in that collective.
    """
    from sidecar.cli.progress import WaitProgress
    from sidecar.fleet import control
    from sidecar.fleet.stackgroups import group_stacks

    src = _following_source(source)
    live = WaitProgress(name)  # stderr, when it is a terminal
    result = control.dump_stacks(src.root, name, rank_filter, src.controller, source["timeout"], observer=live)
    live.clear()
    groups = group_stacks(result.ranks, by_stack=group, all_threads=all_threads)
    if not as_json:
        click.echo(render.stacks_text(result, groups, all_threads))
    finish(as_json, render.stacks_json(result, groups), render.unanswered_stacks(result))


@profile.command(name="hang")
@click.argument("name")
@rank_filter_option("to ask", DEFAULT_STACKS_RANK_FILTER)
@follow_options(DEFAULT_STACKS_TIMEOUT_S, "Give up on ranks that have not answered after this long")
@click.option("--fr-trace/--no-fr-trace", "fr_trace", default=True, show_default=True,
              help="Also run torch's own analysis (torch.distributed.flight_recorder's fr_trace) on the same "
                   "dumps, with this Python's torch, and take the suspects from it where it names them.")
@json_option
def profile_hang(name: str, rank_filter: RankFilter | None, fr_trace: bool, as_json: bool, **source: Any) -> None:
    """Which rank holds up a hung job, and where: every selected rank dumps its
    Python stacks and its torch.distributed flight recorder (from its watcher
    thread), and the ranks are lined up by the collectives they entered and
    completed, per process group.

    Names the suspects (ranks that have not entered the collective the others
    wait in, or that entered another one), the collective, how long the others
    have waited, and each suspect's main-thread stack. Without a flight
    recorder, falls back to stacks and step counters, and says so. Prints the
    fr_trace command for the dumps of this request.
    """
    from sidecar.cli.progress import WaitProgress
    from sidecar.cli.render_hang import hang_json, hang_text
    from sidecar.fleet.hang import find_hang

    src = _following_source(source)
    live = WaitProgress(name)  # stderr, when it is a terminal
    report = find_hang(src.root, name, rank_filter, src.controller, source["timeout"], observer=live,
                       fr_trace=fr_trace)
    live.clear()
    if as_json:
        echo_json(hang_json(report))
    else:
        click.echo(hang_text(report))


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
    from sidecar.cli.progress import read_progress
    from sidecar.cli.render_traces import summary_json, summary_text
    from sidecar.traces.summary import summarize_traces

    src = _source(**source)
    with read_progress():  # stderr, when it is a terminal
        found, summary = summarize_traces(target, src.root, capture, top_k, src.controller)
    warn(found.warnings)
    if as_json:
        echo_json(summary_json(summary.to_json(), found.missing_ranks, found.warnings))
    else:
        click.echo(summary_text(summary), nl=False)


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
    from sidecar.cli.progress import read_progress
    from sidecar.cli.render_traces import merge_json, merged_text
    from sidecar.traces.merge import merge_traces

    src = _source(**source)
    with read_progress():
        merged = merge_traces(target, out_path, src.root, capture, src.controller)
    warn(merged.warnings)
    if as_json:
        echo_json(merge_json(merged))
    else:
        click.echo(merged_text(merged, target))


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
    from sidecar.cli.progress import read_progress
    from sidecar.cli.render_traces import export_json, exported_text
    from sidecar.traces.export import export_traces

    src = _source(**source)
    with read_progress():
        exported = export_traces(target, out_dir, src.root, capture, src.controller)
    warn(exported.warnings)
    if as_json:
        echo_json(export_json(exported))
    else:
        click.echo(exported_text(exported, target))


@profile.command(name="report")
@target_argument
@capture_option
@click.option("--output", "-o", "out_path", required=True, type=click.Path(dir_okay=False), metavar="FILE",
              help="The HTML page to write (replaced if it exists); the merged trace goes beside it, "
                   "as <FILE stem>.merged.json.gz.")
@click.option("--merge/--no-merge", "merged", default=True, show_default=True,
              help="Also write the merged trace of every rank beside the page, and link it.")
@click.option("--top", "top_k", type=click.IntRange(1, MAX_TOP_K), default=TOP_K, show_default=True,
              metavar="K", help="How many CPU ops and CUDA kernels to show per rank.")
@source_options()
@json_option
def profile_report(target: str, capture: int | None, out_path: str, merged: bool, top_k: int, as_json: bool,
                   **source: Any) -> None:
    """Write one capture as one self-contained HTML page: compute vs collective wait per rank and step,
    the straggler, the top ops, and links to the trace files and the merged trace.

    PATH_OR_REPLICA is as for `profile summary`. The page loads nothing from
    the network; open it in any browser.
    """
    from sidecar.cli.progress import read_progress
    from sidecar.cli.render_traces import report_lines
    from sidecar.traces.htmlreport import report_traces  # only this command needs the page builder

    src = _source(**source)
    with read_progress():  # stderr, when it is a terminal
        report = report_traces(target, out_path, src.root, capture, src.controller, top_k, merged)
    warn(report.warnings)
    if as_json:
        echo_json(report.to_json())
        return
    click.echo("\n".join(report_lines(report, target)))


@profile.command(name="diff")
@click.argument("base", metavar="BASE")
@click.argument("new", metavar="[NEW]", required=False)
@click.option("--rank", "ranks", type=RANKS, metavar="RANKS",
              help="The ranks to compare: '0,1', '0-3,8' or 'all' (default: every rank in both captures).")
@click.option("--top", "top_k", type=click.IntRange(1, MAX_TOP_K), default=TOP_K, show_default=True,
              metavar="K", help="How many CPU ops and CUDA kernels to show, and on the page.")
@click.option("--output", "-o", "out_path", type=click.Path(dir_okay=False), metavar="FILE",
              help="Also write the diff as one HTML page (the two captures' step breakdowns side by side and "
                   "the top changes); replaced if it exists.")
@source_options()
@json_option
def profile_diff(base: str, new: str | None, ranks: RankFilter | None, top_k: int, out_path: str | None,
                 as_json: bool, **source: Any) -> None:
    """Say what changed between two captures: step time, compute vs collective wait, the ops and
    kernels whose self time per step changed most, ops that appeared or vanished, the ranks that stand out.

    BASE and NEW are each a replica (its latest capture), REPLICA:CAPTURE, a capture directory or a
    trace file. With BASE alone: its capture against the one before it (for a replica, its last two
    captures, the older as base).
    """
    from sidecar.cli.progress import read_progress
    from sidecar.cli.render_traces import diff_json, diff_text, diff_written_line
    from sidecar.traces.diff import diff_traces

    src = _source(**source)
    with read_progress():  # stderr, when it is a terminal
        result = diff_traces(base, new, src.root, src.controller, ranks)
    report_path = None
    if out_path:
        from sidecar.traces.htmlreport import write_diff_page

        report_path = write_diff_page(result, out_path, top_k)
    warn(result.warnings)
    if as_json:
        echo_json(diff_json(result, report_path))
        return
    click.echo(diff_text(result, top_k), nl=False)
    if report_path:
        click.echo(diff_written_line(report_path))


def main(prog_name: str | None = None) -> None:
    """The console entry point (`cosmos-profiler`, `python -m sidecar`): run the command,
    then end the process at once (`sidecar.cli.exit`)."""
    try:
        cosmos(prog_name=prog_name)
    except SystemExit as exc:
        exit_now(exc.code)
    except BrokenPipeError:  # the reader of an error went away (click pacifies only a command's own output)
        exit_now(1)
