"""The CLI: Cosmos-RL's `replica ls|lsr` and `profile set|status` verbs and flags, plus
`profile stacks|summary|merge|export` to look into a replica.

    cosmos-profiler replica ls [-ch HOST -cp PORT] [--registry DIR] [--json]
    cosmos-profiler profile set REPLICA [-rf 0-3] [--wait]
    cosmos-profiler profile cancel REPLICA          # disarm, or stop and save what was recorded
    cosmos-profiler profile stacks REPLICA          # which rank hangs, and where
    cosmos-profiler profile summary REPLICA         # step times, top ops, the straggler

`cosmos-profiler` = `python -m sidecar`; where the real cosmos-rl is absent, the
stand-in's `python -m cosmos_rl.cli.cli` runs this same CLI.

Commands are thin: parse, call one `sidecar.control` (or `sidecar.fleet`, `sidecar.follow`,
`sidecar.traces`) function, render a plain table or `--json`. A new command is a function under `replica` or `profile`
decorated with `@source_options` (and `@json_option`); errors from the library
become `Error: ...` lines through `SidecarCommand`. This process never imports
torch.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable, Sequence
from typing import Any

import click

from sidecar import __version__, control, fleet, follow
from sidecar.config import MAX_ACTIVE_STEPS, MAX_SAFE_INTEGER, MAX_WAIT_STEPS, MAX_WARMUP_STEPS
from sidecar.controller import DEFAULT_TIMEOUT_S as CONTROLLER_TIMEOUT_S
from sidecar.errors import BadOption, ReplicaBusy, ReplicaNotFound, RequestError, SidecarError
from sidecar.request import MAX_START_AHEAD_S, MAX_START_AHEAD_STEPS, MAX_START_STEP, RankFilter, parse_rank_filter
from sidecar.traces.export import export_traces
from sidecar.traces.merge import merge_traces
from sidecar.traces.stacks import StackGroup, group_stacks
from sidecar.traces.summary import TOP_K, render_summary, summarize_traces

MAX_HOSTS_SHOWN = 3
MAX_FILES_SHOWN = 8
MAX_TOP_K = 1000
# Cosmos-RL prints these as they are, without "Error: ".
VERBATIM_ERRORS = (ReplicaNotFound, ReplicaBusy)


# --- click plumbing ---------------------------------------------------------


class VerbatimError(click.ClickException):
    """Exit 1 with the message exactly as Cosmos-RL prints it."""

    def show(self, file: Any = None) -> None:
        click.echo(self.format_message(), err=True, file=file)


class SidecarCommand(click.Command):
    """Maps the library's errors: `BadOption` -> usage error (exit 2), other `SidecarError` -> exit 1."""

    def invoke(self, ctx: click.Context) -> Any:
        try:
            return super().invoke(ctx)
        except BadOption as exc:
            param = next((p for p in self.params if p.name == exc.option), None)
            if param is None:
                raise click.UsageError(str(exc), ctx=ctx) from None
            raise click.BadParameter(str(exc), ctx=ctx, param=param) from None
        except VERBATIM_ERRORS as exc:
            raise VerbatimError(str(exc)) from None
        except SidecarError as exc:
            raise click.ClickException(str(exc)) from None


class SidecarGroup(click.Group):
    command_class = SidecarCommand
    group_class = type  # subgroups are SidecarGroups too


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


def source_options(timeout: float = CONTROLLER_TIMEOUT_S, timeout_help: str = "") -> Callable[[Callable], Callable]:
    """-ch/-cp (Cosmos-RL's), --registry and --timeout: where replicas come from."""
    return _compose(
        click.option("--controller-host", "-ch", metavar="HOST",
                     help="Cosmos-RL controller host: list replicas from its /api/status."),
        click.option("--controller-port", "-cp", metavar="PORT", help="Cosmos-RL controller port."),
        click.option("--registry", metavar="DIR",
                     help="Registry root (default: $COSMOS_PROFILER_DIR, else from --config, else from the "
                          "controller's /api/meta, else the per-user default)."),
        click.option("--config", "config_path", metavar="TOML", type=click.Path(dir_okay=False),
                     help="The job's Cosmos-RL TOML: its registry ([sidecar] registry, else "
                          "<train.output_dir>/profile_control, as its workers derive it)."),
        click.option("--timeout", type=click.FloatRange(min=0, min_open=True), default=timeout, show_default=True,
                     metavar="SECONDS", help=timeout_help or "Give up on the controller after this long."),
    )


json_option = click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")


def _source(controller_host: str | None, controller_port: str | None, registry: str | None,
            timeout: float, config_path: str | None = None) -> fleet.Source:
    return fleet.resolve_source(registry, controller_host, controller_port, timeout, config_path=config_path)


# --- rendering ----------------------------------------------------------------


def format_table(headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> str:
    """Plain aligned columns, two spaces apart."""
    cells = [[str(h) for h in headers]] + [["-" if c is None or c == "" else str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    return "\n".join("  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells)


def _jsonable(obj: Any) -> Any:
    if dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        return {k: _jsonable(v) for k, v in dataclasses.asdict(obj).items()}
    if isinstance(obj, dict):
        return {str(k): _jsonable(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_jsonable(v) for v in obj]
    return obj


def echo_json(obj: Any) -> None:
    click.echo(json.dumps(_jsonable(obj), indent=2, sort_keys=True, default=str))


def _hosts(hosts: Sequence[str]) -> str:
    shown = ",".join(hosts[:MAX_HOSTS_SHOWN])
    return shown + (f",+{len(hosts) - MAX_HOSTS_SHOWN}" if len(hosts) > MAX_HOSTS_SHOWN else "")


def conflict_text(rank: int, conflict: dict[str, Any]) -> str:
    """rank 0: also held by pid 123 on node-b (job pid:node-b:123)"""
    return f"rank {rank}: also held by pid {conflict['pid']} on {conflict['host'] or '?'} (job {conflict['job'] or '?'})"


def _yes_no(alive: bool, why: str = "") -> str:
    return "yes" if alive else f"no ({why})" if why else "no"


def _ranks_text(ranks: Sequence[int]) -> str:
    return str(RankFilter(frozenset(ranks))) if ranks else "none"


def describe_capture(c: follow.RankCapture) -> str:
    """One progress line for a rank."""
    if c.phase == "saved":
        text = f"saved {c.trace_path}"
    elif c.phase == "tracing":
        text = f"tracing from step {c.capture_start_step}"
    elif c.phase == "armed":
        text = f"armed at step {c.step}"
    elif c.error:
        text = f"{c.phase}: {c.error}"
    else:
        text = c.phase
    if c.misaligned:
        text += " (misaligned: it saw the request after the start step had passed)"
    return f"rank {c.rank}: {text}"


def describe_cancel(result: follow.RankCancel) -> str:
    """One line for a rank's answer to a cancel."""
    if result.phase in (follow.PENDING, "done") and result.text:
        text = result.text
    elif result.phase == follow.PENDING:
        text = "waiting for the rank to see the cancel"
    else:
        text = f"{result.phase}: {result.error}"
    return f"rank {result.rank}: {text}"


# --- commands ---------------------------------------------------------------


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
    _warn([f"replica {r.name}: {problem}" for r in replicas for problem in r.problems])
    if not replicas:
        click.echo("No replicas registered to the controller." if src.controller is not None
                   else f"No replicas registered under {src.root}.")
        return
    headers = ["REPLICA", "ROLE", "RANKS", "HOSTS", "STATE", "HEARTBEAT", "STEP"]
    rows = [
        [r.name, r.role, f"{r.num_alive}/{r.num_ranks}", _hosts(r.hosts), r.state,
         fleet.format_age(r.heartbeat_age), r.step]
        for r in replicas
    ]
    if src.controller is not None:
        headers.append("ARRIVED")
        for row, r in zip(rows, replicas, strict=True):
            row.append(_yes_no(bool(r.arrived)))
    if any(r.conflicts for r in replicas):
        # Two live jobs under one replica name overwrite each other's records.
        headers.append("CONFLICT")
        for row, r in zip(rows, replicas, strict=True):
            row.append("; ".join(conflict_text(c["rank"], c) for c in r.conflicts))
    click.echo(format_table(headers, rows))


@replica.command(name="lsr")
@click.argument("name")
@source_options()
@json_option
def replica_lsr(name: str, as_json: bool, **source: Any) -> None:
    """List the ranks of replica NAME: host, pid, liveness, step, state, last trace and error."""
    src = _source(**source)
    ranks = fleet.replica_ranks(src.root, name, src.controller)
    if as_json:
        echo_json(ranks)
        return
    headers = ["RANK", "HOST", "PID", "ALIVE", "STEP", "STATE", "TRACE", "ERROR"]
    rows = [
        [r.rank, r.host, r.pid, _yes_no(r.alive, r.liveness), r.step, r.state, r.trace_path, r.error]
        for r in ranks
    ]
    if any(r.conflict for r in ranks):
        headers.append("CONFLICT")
        for row, r in zip(rows, ranks, strict=True):
            row.append(conflict_text(r.rank, r.conflict).split(": ", 1)[1] if r.conflict else "")
    click.echo(format_table(headers, rows))


@profile.command(name="set")
@click.argument("name")
@click.option("--active-steps", "-as", type=click.IntRange(1, MAX_ACTIVE_STEPS),
              help="The number of steps that profiler traces (default: the rank's config, else 1).")
@click.option("--rank-filter", "-rf", type=RANKS,
              help="The ranks that profiler traces: '0,1', '0-3,8' or 'all' (default: 0).")
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
@source_options(follow.DEFAULT_WAIT_TIMEOUT_S, "With --wait: give up after this long (the controller gets "
                f"at most {CONTROLLER_TIMEOUT_S:g}s).")
@json_option
def profile_set(name: str, wait: bool, as_json: bool, controller_host: str | None, controller_port: str | None,
                registry: str | None, config_path: str | None, timeout: float, **options: Any) -> None:
    """Set profile mode of the replica named NAME."""
    src = _source(controller_host, controller_port, registry, min(timeout, CONTROLLER_TIMEOUT_S), config_path)
    result = control.set_profile(src.root, name, controller=src.controller, **options)
    for warning in result.warnings + [f"rank {k} will not be profiled: {why}" for k, why in result.skipped.items()]:
        click.echo(f"Warning: {warning}", err=True)
    if not as_json:
        click.echo(result.message)
        click.echo(
            f"Request {result.request_id} for rank{'s' if len(result.ranks) != 1 else ''} {_ranks_text(result.ranks)}: "
            f"the schedule starts at step {result.start_step} (replica at step {result.current_step})."
        )
    if not wait:
        if as_json:
            echo_json(result)
        return
    on_progress = None if as_json else (lambda c: click.echo(describe_capture(c)))
    captures = follow.wait_for_capture(src.root, name, result.request_id, result.ranks, timeout, on_progress)
    if as_json:
        echo_json({**_jsonable(result), "captures": _jsonable(captures)})
    else:
        saved = [c for c in captures if c.is_finished]
        if saved:
            click.echo("Traces:")
            for c in saved:
                click.echo(f"  rank {c.rank}: {c.trace_path}")
    failed = [c for c in captures if not c.is_finished]
    if failed:
        ranks = ", ".join(str(c.rank) for c in failed)
        reasons = "; ".join(f"rank {c.rank}: {c.phase}: {c.error}" for c in failed)
        raise click.ClickException(f"rank{'s' if len(failed) > 1 else ''} {ranks} did not finish ({reasons})")


@profile.command(name="cancel")
@click.argument("name")
@click.option("--rank-filter", "-rf", type=RANKS,
              help="The ranks whose request ends: '0,1', '0-3,8' or 'all' (default: all).")
@click.option("--wait/--no-wait", default=True, show_default=True,
              help="Follow every selected rank until it answered and is idle again, and print each answer.")
@source_options(follow.DEFAULT_CANCEL_TIMEOUT_S, "With --wait: give up after this long (the controller gets "
                f"at most {CONTROLLER_TIMEOUT_S:g}s).")
@json_option
def profile_cancel(name: str, rank_filter: RankFilter | None, wait: bool, as_json: bool,
                   controller_host: str | None, controller_port: str | None, registry: str | None,
                   config_path: str | None, timeout: float) -> None:
    """End replica NAME's profile request: an armed rank disarms, a tracing rank
    stops at its next step and saves the steps it recorded, an idle rank has
    nothing to cancel."""
    src = _source(controller_host, controller_port, registry, min(timeout, CONTROLLER_TIMEOUT_S), config_path)
    result = control.cancel_profile(src.root, name, rank_filter=rank_filter, controller=src.controller)
    _warn([f"rank {k} will not answer: {why}" for k, why in result.skipped.items()])
    if not as_json:
        busy = ", ".join(f"rank {k} with request {rid}" for k, rid in result.busy.items()) or "none"
        click.echo(f"Cancel {result.request_id} sent to replica {name}, rank{'s' if len(result.ranks) != 1 else ''} "
                   f"{_ranks_text(result.ranks)} (busy: {busy}).")
    if not wait:
        if as_json:
            echo_json(result)
        return
    on_progress = None if as_json else (lambda a: click.echo(describe_cancel(a)))
    answers = follow.wait_for_cancel(src.root, name, result.request_id, result.ranks, timeout, on_progress)
    if as_json:
        echo_json({**_jsonable(result), "answers": _jsonable(answers)})
    failed = [a for a in answers if a.phase != "done"]
    if failed:
        reasons = "; ".join(f"rank {a.rank}: {a.phase}: {a.error}" for a in failed)
        raise click.ClickException(f"rank{'s' if len(failed) > 1 else ''} {_compact([a.rank for a in failed])} "
                                   f"did not answer the cancel ({reasons})")


@profile.command(name="status")
@click.argument("name")
@source_options()
@json_option
def profile_status(name: str, as_json: bool, **source: Any) -> None:
    """Show the per-rank state of replica NAME's current or last profile request."""
    src = _source(**source)
    status = follow.profile_status(src.root, name, src.controller)
    if as_json:
        echo_json(status)
        return
    if status.request_id:
        req = status.request or {}
        click.echo(
            f"Replica {name}, request {status.request_id}: ranks {req.get('rank_filter', fleet.DEFAULT_RANK_FILTER)}"
            + (f", start step {req['start_step']}" if req.get("start_step") is not None else "")
        )
    else:
        click.echo(f"Replica {name}: no JSON request in {status.control_path}; showing each rank's last request.")
    headers = ["RANK", "HOST", "ALIVE", "REQUEST", "PHASE", "STEP", "START", "TRACE", "ERROR"]
    rows = [
        [c.rank, c.host, _yes_no(c.alive), c.request_id, c.phase + (" (misaligned)" if c.misaligned else ""),
         c.step, c.capture_start_step, c.trace_path, c.error]
        for c in status.ranks
    ]
    click.echo(format_table(headers, rows))


# --- profile stacks / summary / merge / export -----------------------------------


def _compact(numbers: Sequence[int]) -> str:
    """0,2-3 for [0, 2, 3]."""
    return str(RankFilter(frozenset(numbers)))


def _ranks_label(ranks: Sequence[int]) -> str:
    n = len(ranks)
    return f"rank{'s' if n != 1 else ''} {_compact(ranks)} ({n} rank{'s' if n != 1 else ''})"


def render_stacks(result: control.StacksResult, groups: Sequence[StackGroup],
                  all_threads: bool = False) -> str:
    """Each group as `ranks 0,2-3 (3 ranks): MainThread, step 20` over its frames, innermost last."""
    answered = result.answered
    lines = [f"Stacks of replica {result.replica} (request {result.request_id}): "
             f"{len(answered)} of {len(result.ranks)} rank{'s' if len(result.ranks) != 1 else ''} answered."]
    for group in groups:
        lines.append("")
        steps = f", step{'s' if len(group.steps) > 1 else ''} {_compact(group.steps)}" if group.steps else ""
        if group.is_main:
            lines.append(f"{_ranks_label(group.ranks)}: {group.thread}{steps}")
        else:
            lines.append(f"thread {group.thread}: {_ranks_label(group.ranks)}:")
        lines.extend(f"  {frame}" for frame in group.frames or ["(no Python frames)"])
        if group.is_main and group.other_threads and not all_threads:
            n = len(group.other_threads)
            lines.append(f"  + {n} other thread{'s' if n != 1 else ''}: {', '.join(group.other_threads)} "
                         "(--all-threads shows them)")
    if answered:
        lines.append("")
        lines.append("Stack files:")
        for answer in answered[:MAX_FILES_SHOWN]:
            lines.append(f"  rank {answer.rank}: {answer.path}")
        if len(answered) > MAX_FILES_SHOWN:
            lines.append(f"  ... and {len(answered) - MAX_FILES_SHOWN} more (--json lists them)")
    return "\n".join(lines)


def _capture_name(replica: str | None, capture: int | None, target: str) -> str:
    if replica and capture is not None:
        return f"capture {capture} of replica {replica}"
    return target


def _warn(warnings: Sequence[str]) -> None:
    for warning in warnings:
        click.echo(f"Warning: {warning}", err=True)


capture_option = click.option(
    "--capture", type=click.IntRange(0, MAX_SAFE_INTEGER), metavar="N",
    help="The capture to read: n of <n>_trace.json.gz (default: the latest).",
)
target_argument = click.argument("target", metavar="PATH_OR_REPLICA")


@profile.command(name="stacks")
@click.argument("name")
@click.option("--rank-filter", "-rf", type=RANKS,
              help="The ranks to ask: '0,1', '0-3,8' or 'all' (default: all).")
@click.option("--group/--no-group", default=True, show_default=True,
              help="Group ranks whose main threads stand in the same frames (the odd rank out stands apart).")
@click.option("--all-threads", is_flag=True, help="Show every thread's stack, not only the main thread's.")
@source_options(follow.DEFAULT_STACKS_TIMEOUT_S,
                f"Give up on ranks that have not answered after this long (the controller gets at most "
                f"{CONTROLLER_TIMEOUT_S:g}s).")
@json_option
def profile_stacks(name: str, rank_filter: RankFilter | None, group: bool, all_threads: bool, as_json: bool,
                   controller_host: str | None, controller_port: str | None, registry: str | None,
                   config_path: str | None, timeout: float) -> None:
    """Dump the Python stacks of every thread of replica NAME's ranks, and group
    the ranks by their main thread's stack.

    The ranks answer from their watcher threads, so this works while training
    is stuck: a rank that hangs a collective stands apart from the ranks that
    wait for it in that collective.
    """
    src = _source(controller_host, controller_port, registry, min(timeout, CONTROLLER_TIMEOUT_S), config_path)
    result = control.dump_stacks(src.root, name, rank_filter, src.controller, timeout)
    groups = group_stacks(result.ranks, by_stack=group, all_threads=all_threads)
    if as_json:
        ranks = [{k: v for k, v in _jsonable(r).items() if k not in ("threads", "main_thread")} for r in result.ranks]
        echo_json({**_jsonable(result), "ranks": ranks,
                   "groups": [{**_jsonable(g), "ranks_text": g.ranks_text} for g in groups]})
    else:
        click.echo(render_stacks(result, groups, all_threads))
    missing = result.unanswered
    if missing:
        reasons = "; ".join(f"rank {r.rank}: {r.phase}: {r.error}" if r.error else f"rank {r.rank}: {r.phase}"
                            for r in missing)
        raise click.ClickException(f"no stacks from rank{'s' if len(missing) > 1 else ''} "
                                   f"{_compact([r.rank for r in missing])} ({reasons})")


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
    src = _source(**source)
    found, summary = summarize_traces(target, src.root, capture, top_k, src.controller)
    _warn(found.warnings)
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
    src = _source(**source)
    merged = merge_traces(target, out_path, src.root, capture, src.controller)
    _warn(merged.warnings)
    if as_json:
        echo_json(merged)
        return
    n = len(merged.ranks)
    click.echo(f"Merged {_capture_name(merged.replica, merged.capture, target)}: "
               f"{n} rank{'s' if n != 1 else ''} ({_compact(merged.ranks)}), {merged.num_events} events.")
    click.echo(f"Wrote {merged.path}; open it in https://ui.perfetto.dev or chrome://tracing.")


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
    src = _source(**source)
    exported = export_traces(target, out_dir, src.root, capture, src.controller)
    _warn(exported.warnings)
    if as_json:
        echo_json(exported)
        return
    n = len(exported.files)
    click.echo(f"Exported {_capture_name(exported.replica, exported.capture, target)} "
               f"({n} rank{'s' if n != 1 else ''}) to {exported.out_dir}:")
    for rank, path in exported.files.items():
        click.echo(f"  rank {rank}: {path}")
    click.echo(f"Read it with HolisticTraceAnalysis: TraceAnalysis(trace_dir={exported.out_dir!r})")


def main(prog_name: str | None = None) -> None:
    cosmos(prog_name=prog_name)
