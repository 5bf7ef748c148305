"""Live progress on stderr, only when stderr is a terminal: nothing else ever sees it.

    WaitProgress    `profile set --wait`, `cancel --wait`, `stacks`: one line rewritten in place with each
                    selected rank's phase and step, and a warning when a rank has not stepped for a while
    read_progress   `profile summary`, `merge`, `export`: one line naming each trace file as it is read

A `WaitProgress` is the `observer` of `sidecar.fleet.follow.follow` (it sees every
waiting rank's answer and record at each poll); `read_progress` hooks
`sidecar.traces.reader.observe_reads`. Lines that a command prints for good
(on stdout, or a warning) go through `echo`, which first clears the live line,
so the two never tangle on one terminal. Stdout and `--json` are never touched.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import click

from sidecar.common import clock, envvars, startstep
from sidecar.common.records import RankRecord

# A rank that has not stepped for max(STALL_FLOOR_S, STALL_PACES x its usual step time) is
# worth a warning. The floor is COSMOS_PROFILER_STALL_WARN_S where set.
ENV_STALL_FLOOR = "COSMOS_PROFILER_STALL_WARN_S"
STALL_FLOOR_S = envvars.BY_NAME[ENV_STALL_FLOOR].default
STALL_PACES = 10.0
MAX_RANKS_LISTED = 8  # more ranks than this: counted by phase, with their step range
REDRAW_S = 0.2  # the live line is redrawn at most this often (the observer sees every rank at every poll)
CLEAR = "\r\x1b[K"


def is_terminal(stream: IO[str]) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def stall_floor(env: dict[str, str] | os._Environ[str] | None = None) -> float:
    """COSMOS_PROFILER_STALL_WARN_S, else (unset or bad) STALL_FLOOR_S."""
    return envvars.read(ENV_STALL_FLOOR, env)  # a bad value is said once, naming the variable


class LiveLine:
    """One line on a terminal, rewritten in place; `echo` prints a line for good above it."""

    def __init__(self, stream: IO[str] | None = None, enabled: bool | None = None) -> None:
        self.stream = stream if stream is not None else sys.stderr
        self.enabled = is_terminal(self.stream) if enabled is None else enabled
        self.text = ""

    def show(self, text: str) -> None:
        if self.enabled and text != self.text:
            width = _width(self.stream)
            self.stream.write(CLEAR + (text if len(text) < width else text[: max(1, width - 2)] + "…"))
            self.stream.flush()
            self.text = text

    def clear(self) -> None:
        if self.enabled and self.text:
            self.stream.write(CLEAR)
            self.stream.flush()
            self.text = ""

    def echo(self, line: str, err: bool = False) -> None:
        """`line` on stdout (stderr with `err`), clearing the live line first; it is drawn again on the next show."""
        text, self.text = self.text, ""
        if self.enabled and text:
            self.stream.write(CLEAR)
            self.stream.flush()
        click.echo(line, err=err)


def _width(stream: IO[str]) -> int:
    """The terminal's columns; 120 where it does not say (a fresh pseudo-terminal has 0)."""
    try:
        columns = os.get_terminal_size(stream.fileno()).columns
    except (OSError, ValueError, AttributeError):
        columns = 0
    return columns if columns > 0 else 120


@dataclass
class _Rank:
    phase: str = ""
    step: int | None = None
    stepped_at: float = 0.0  # when its step last changed (as far as we know)
    step_s: float | None = None  # its usual seconds per step
    warned: bool = False


class WaitProgress(LiveLine):
    """The observer of a `follow` loop: each waiting rank's phase and step, and stall warnings.

    A rank "has not stepped" when its record's step stays the same for
    max(the floor, STALL_PACES steps at its recent pace); it is warned about
    once per stall, on stderr.
    """

    def __init__(self, replica: str, stream: IO[str] | None = None, enabled: bool | None = None,
                 floor_s: float | None = None) -> None:
        super().__init__(stream, enabled)
        self.replica = replica
        self.floor_s = stall_floor() if floor_s is None else floor_s
        self.ranks: dict[int, _Rank] = {}
        self.warnings: list[str] = []
        self._drawn_at = -REDRAW_S

    def __call__(self, answer: Any, record: RankRecord | None, now: float) -> None:
        if not self.enabled:
            return
        view = self.ranks.get(answer.rank)
        step = record.step if record is not None else None
        if view is None:
            view = self.ranks[answer.rank] = _Rank(stepped_at=_last_stepped(record, now))
        if step != view.step:
            if view.step is not None:
                view.stepped_at, view.warned = _last_stepped(record, now), False
            view.step = step
        view.phase = answer.phase
        if record is not None:
            rate = startstep.recent_rate([(float(t), int(n)) for t, n in record.recent_steps]) if record.recent_steps else None
            view.step_s = 1.0 / rate if rate else view.step_s
        self._check_stall(answer, view, now)
        if time.monotonic() - self._drawn_at >= REDRAW_S:
            self._drawn_at = time.monotonic()
            self.show(self.summary())

    def _check_stall(self, answer: Any, view: _Rank, now: float) -> None:
        if view.warned or view.step is None or answer.is_terminal or not getattr(answer, "alive", True):
            return
        limit = max(self.floor_s, STALL_PACES * (view.step_s or 0.0))
        still = now - view.stepped_at
        if still >= limit:
            view.warned = True
            message = (f"rank {answer.rank} has not stepped for {still:.0f} s (step {view.step}): "
                       f"`cosmos-profiler profile hang {self.replica}` shows where it is")
            self.warnings.append(message)
            self.echo(f"Warning: {message}", err=True)

    def summary(self) -> str:
        """`rank 0 armed @1234 | rank 1 tracing @1240`, or by phase for many ranks."""
        ranks = sorted(self.ranks.items())
        if len(ranks) <= MAX_RANKS_LISTED:
            parts = [f"rank {k} {v.phase}" + (f" @{v.step}" if v.step is not None else "") for k, v in ranks]
        else:
            by_phase: dict[str, list[int]] = {}
            for _, v in ranks:
                by_phase.setdefault(v.phase, []).append(v.step if v.step is not None else -1)
            parts = []
            for phase, steps in by_phase.items():
                known = [s for s in steps if s >= 0]
                span = (f" @{min(known)}" + (f"-{max(known)}" if max(known) != min(known) else "")) if known else ""
                parts.append(f"{len(steps)} {phase}{span}")
        return f"{self.replica}: " + " | ".join(parts)


def _last_stepped(record: RankRecord | None, now: float) -> float:
    """When `record`'s rank reached its current step, as far as its record tells (else `now`),
    on the clock of `now` (the registry's: sidecar.common.clock), never the rank's own."""
    if record is None:
        return now
    if record.last_step_at:
        return now - clock.step_age(record, now)
    at = [float(t) for t, n in record.recent_steps if int(n) == record.step]
    return now - clock.step_age(record, now, stepped_at=min(at)) if at else now


@contextlib.contextmanager
def read_progress(stream: IO[str] | None = None, enabled: bool | None = None) -> Iterator[LiveLine]:
    """Within the block, name each trace file as it is opened: `reading trace 3: r1_2/0_trace.json.gz (120.4 MB), 4 s`
    (a file read twice, as `merge` does, keeps its number)."""
    from sidecar.traces.reader import observe_reads

    line = LiveLine(stream, enabled)
    if not line.enabled:
        yield line
        return
    numbers: dict[Path, int] = {}
    started = time.monotonic()

    def on_open(path: Path) -> None:
        n = numbers.setdefault(path, len(numbers) + 1)
        try:
            size = f" ({_size(path.stat().st_size)})"
        except OSError:
            size = ""
        line.show(f"reading trace {n}: {path.parent.name}/{path.name}{size}, {time.monotonic() - started:.0f} s")

    try:
        with observe_reads(on_open):
            yield line
    finally:
        line.clear()


def _size(num_bytes: int) -> str:
    for unit, scale in (("GB", 1e9), ("MB", 1e6), ("kB", 1e3)):
        if num_bytes >= scale:
            return f"{num_bytes / scale:.1f} {unit}"
    return f"{num_bytes} B"
