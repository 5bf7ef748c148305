"""Stacks while a C call holds the GIL, the CLI side: which silent ranks to signal (`fall_back_all`:
those of this host in which no Python runs), the signal, and the faulthandler dump each appends
(the rank side: `sidecar.rank.faulthandler_stacks`)."""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sidecar.common import clock, envvars, layout
from sidecar.common.identity import host_name
from sidecar.common.records import RankRecord
from sidecar.common.recordscan import read_records
from sidecar.common.registry import open_regular
from sidecar.common.signames import signal_name
from sidecar.common.stackdump import HEADER, ThreadStack, fault_thread_name, parse_fault_dump
from sidecar.fleet.answers import PENDING, RankStacks
from sidecar.fleet.replicas import liveness

log = logging.getLogger("sidecar")

# CLI: how long the watcher thread has to answer before the signal is sent.
FALLBACK_ENV = "COSMOS_PROFILER_STACKS_FALLBACK_S"
DEFAULT_FALLBACK_AFTER_S = envvars.BY_NAME[FALLBACK_ENV].default
# CLI: how long a signalled rank has to start writing, and the quiet time that ends its dump.
DUMP_WAIT_S = 5.0
DUMP_QUIET_S = 0.15
MAX_DUMP_BYTES = 16 << 20
SOURCE = "faulthandler"

class FallbackUnavailable(Exception):
    """Why a rank's stacks cannot be taken through faulthandler from here (the message says)."""


@dataclass
class FaultDump:
    """A dump a signalled rank wrote: its threads as `sidecar.common.stackdump.ThreadStack`s."""

    path: str
    offset: int  # where this dump starts in `path`
    signal: str
    threads: list[Any]  # ThreadStack, main thread first
    main_thread: int | None


def fallback_after_s(env: Mapping[str, str] | None = None) -> float:
    """Seconds the CLI gives the watcher thread before it signals (COSMOS_PROFILER_STACKS_FALLBACK_S).

    Raises:
        ConfigError: the variable is not a number of seconds in 0..3600 (`sidecar.common.envvars`).
    """
    value = envvars.convert(FALLBACK_ENV, env)
    return DEFAULT_FALLBACK_AFTER_S if value is None else value


def advertised(record: Any) -> tuple[int, str, dict[str, Any]] | None:
    """(signal, file, info) from a record's `fault_stacks`, or None when it has none that is usable."""
    info = getattr(record, "fault_stacks", None)
    if not isinstance(info, dict):
        return None
    signum, path = info.get("signal"), info.get("path")
    if type(signum) is not int or not 0 < signum < 256 or not isinstance(path, str) or not path:
        return None
    return signum, path, info


STACKS_SUFFIX = "_stacks.txt"  # layout.STACKS_TEMPLATE's files
MAX_HEADER_BYTES = 4096


def watcher_answering(record: Any, request_id: str) -> bool:
    """Whether `record`'s watcher thread has begun to answer `request_id`: a stacks dump in the rank's
    trace dir names it on its first line (the watcher writes the stacks first, then, for a "hang",
    the flight recorder, which can take seconds on a loaded machine). That rank's Python runs, so it
    needs no signal; and a signal then can crash it: faulthandler walks the other threads' frames
    without the GIL while they run (a rank segfaulted so, importing on its watcher thread)."""
    if not getattr(record, "output_dir", ""):
        return False
    directory = layout.rank_trace_dir(record.output_dir, record.replica, record.rank)
    mark = f" request={request_id} "
    try:
        names = [name for name in os.listdir(directory) if name.endswith(STACKS_SUFFIX)]
    except OSError:
        return False
    for name in names:
        try:
            with open_regular(os.path.join(directory, name)) as f:
                first = f.readline(MAX_HEADER_BYTES).decode(errors="replace")
        except OSError:
            continue
        if first.startswith(HEADER) and mark in first:
            return True
    return False


# The fallback signals a silent rank only once its record has not been written or ticked for this many
# heartbeat intervals: no Python runs in it then (a C call holds the GIL). A rank whose heartbeat ticks
# runs Python, so its watcher answers; and a signal then can kill it, faulthandler walking the frames
# of threads that run meanwhile, without the GIL.
SIGNAL_AFTER_HEARTBEATS = 2.0
MAX_FALLBACK_THREADS = 16  # ranks of this host asked through faulthandler at once


def _signal_after(record: RankRecord) -> float:
    """Seconds without a write or tick of `record` after which no Python runs in its rank."""
    return SIGNAL_AFTER_HEARTBEATS * (record.heartbeat_interval or 2.0)


def heartbeat_stopped(record: RankRecord, now: float) -> float | None:
    """How long `record`'s rank has shown no life (no write or tick of its record, `now` on the
    registry filesystem's clock) when that is SIGNAL_AFTER_HEARTBEATS of its intervals or more:
    no Python runs in it. None while its heartbeat ticks."""
    age = clock.record_age(record, now)
    return age if age >= _signal_after(record) else None


def fall_back_all(root: Path, name: str, request_id: str, answers: list[RankStacks], waited: float,
                  given_up: set[int]) -> tuple[list[RankStacks], float | None]:
    """`fall_back` for every rank that timed out, the local ones signalled and read in parallel
    (eight stuck ranks of one host take as long as one); one of `given_up` (it cannot be asked
    through faulthandler) is only made pending again.

    Returns:
        The answers, and the seconds until a rank left pending because its heartbeat ticks could
        have stopped for long enough to be signalled (None when no rank is left so).
    """
    late = [a for a in answers if a.phase == "timeout"]
    if not late:
        return answers, None
    records = {r.rank: r for r in read_records(root, name)}
    this_host, now = host_name(), clock.fs_now(root)
    for answer in late:
        if answer.rank in given_up:
            answer.phase, answer.error = PENDING, None
    ask = [a for a in late if a.rank not in given_up]
    if ask:
        with ThreadPoolExecutor(max_workers=min(MAX_FALLBACK_THREADS, len(ask))) as pool:
            list(pool.map(lambda a: fall_back(records.get(a.rank), a, waited, this_host, name, request_id, now),
                          ask))  # in place
    ticking = [records[a.rank] for a in ask if a.phase == PENDING and not a.fallback and a.rank in records
               and records[a.rank].host == this_host and heartbeat_stopped(records[a.rank], now) is None]
    if not ticking:
        return answers, None
    return answers, min(_signal_after(r) - clock.record_age(r, now) for r in ticking)


def fall_back(record: RankRecord | None, answer: RankStacks, waited: float, this_host: str, name: str,
              request_id: str, now: float) -> RankStacks:
    """A rank whose watcher did not answer within `waited` seconds, updated in place: its faulthandler
    dump when it runs on this host and its heartbeat has stopped (saved, `source` "faulthandler"),
    else pending again, with the reason in `fallback` where it cannot be asked so. One whose Python
    runs (its heartbeat ticks, or its watcher is answering already, `watcher_answering`)
    is left to answer: pending again, not signalled."""
    answer.phase, answer.error = PENDING, None
    if record is None:
        return answer
    alive, _ = liveness(record, this_host, now)
    if not alive:
        return answer  # the next poll says dead
    silent = heartbeat_stopped(record, now)
    if (record.host == this_host and advertised(record)
            and (silent is None or watcher_answering(record, request_id))):
        return answer  # its Python runs: the watcher's answer follows
    try:
        dump = ask_rank(record, this_host)
    except FallbackUnavailable as exc:
        answer.fallback = str(exc)
        if record.host != this_host and advertised(record):
            answer.fallback = (f"rank {answer.rank} runs on host {record.host or '?'}, and its faulthandler dump "
                               f"can only be asked there: run the same command on {record.host or 'that host'} "
                               f"(e.g. cosmos-profiler profile stacks {name} -rf {answer.rank})")
        return answer
    answer.phase, answer.source, answer.path = "saved", SOURCE, dump.path
    answer.threads, answer.main_thread = dump.threads, dump.main_thread
    answer.step, answer.state = record.step, record.state
    stopped = "" if silent is None else f", and its heartbeat had stopped {silent:.0f}s before"
    answer.fallback = (f"the watcher thread did not answer within {waited:.0f}s{stopped}: sent {dump.signal} to pid "
                       f"{record.pid}; faulthandler's dump starts at byte {dump.offset}")
    return answer


def ask_rank(record: Any, this_host: str, wait_s: float = DUMP_WAIT_S) -> FaultDump:
    """Signal `record`'s process for a faulthandler dump and read it back.

    The caller has checked that the rank is alive (pid and create time).

    Raises:
        FallbackUnavailable: off on that rank, another host, cannot signal or read (the message says).
    """
    found = advertised(record)
    if found is None:
        raise FallbackUnavailable("its faulthandler stacks dump is off (sidecar.stacks_signal, or the signal was taken)")
    signum, path, info = found
    name = signal_name(signum)
    if record.host != this_host:
        raise FallbackUnavailable(f"it runs on host {record.host or '?'}, and its faulthandler dump ({name}) can only "
                                  f"be asked on that host: run this command on {record.host or 'its host'}")
    try:
        offset = os.stat(path).st_size
    except OSError as exc:
        raise FallbackUnavailable(f"cannot read its faulthandler file {path}: {exc.strerror or exc}") from None
    if not catches(record.pid, signum):
        # Its handler is gone (the sidecar closed, its exit unpublished) or unknown: the signal's
        # default action would end the process, and whatever the job does after training with it.
        raise FallbackUnavailable(f"pid {record.pid} does not catch {name} now (the sidecar closed?): not sent, since "
                                  f"its default action would end the process")
    try:
        os.kill(record.pid, signum)
    except OSError as exc:
        raise FallbackUnavailable(f"cannot send {name} to pid {record.pid}: {exc.strerror or exc}") from None
    text = _read_new(path, offset, wait_s)
    if text is None:
        raise FallbackUnavailable(f"sent {name} to pid {record.pid}, but nothing was written to {path} "
                                  f"within {wait_s:g}s")
    names = _names(info)
    main_ident = info.get("main") if type(info.get("main")) is int else None
    threads = parse_fault_dump(text)
    if not threads:
        raise FallbackUnavailable(f"sent {name} to pid {record.pid}, but {path} holds no faulthandler dump")
    threads.sort(key=lambda t: t.ident != main_ident)
    stacks = [ThreadStack(fault_thread_name(t, names), t.frames) for t in threads]
    main = 0 if main_ident is not None and threads[0].ident == main_ident else None
    return FaultDump(path=path, offset=offset, signal=name, threads=stacks, main_thread=main)


def catches(pid: int, signum: int) -> bool:
    """Whether process `pid` has a handler installed for `signum` now (its `SigCgt` mask in
    /proc/<pid>/status); False where that cannot be read."""
    try:
        with open(f"/proc/{pid}/status", "rb") as f:
            for line in f:
                if line.startswith(b"SigCgt:"):
                    return bool(int(line.split()[1], 16) >> (signum - 1) & 1)
    except (OSError, ValueError, IndexError):
        pass
    return False


def _names(info: dict[str, Any]) -> dict[int, str]:
    threads = info.get("threads")
    names: dict[int, str] = {}
    if isinstance(threads, dict):
        for key, value in threads.items():
            if isinstance(key, str) and key.isdigit() and isinstance(value, str):
                names[int(key)] = value
    return names


def _read_new(path: str, offset: int, wait_s: float) -> str | None:
    """The bytes appended to `path` after `offset`, once they stop growing (None when none come)."""
    deadline = time.monotonic() + wait_s
    last, quiet_since = -1, 0.0
    while True:
        try:
            size = os.stat(path).st_size
        except OSError:
            size = -1
        if size < offset:
            offset = 0  # truncated meanwhile (the rank restarted): its new dump is all there is
        now = time.monotonic()
        if size > offset:
            if size != last:
                last, quiet_since = size, now
            elif now - quiet_since >= DUMP_QUIET_S:
                break
        if now >= deadline:
            if size <= offset:
                return None
            break
        time.sleep(0.02)
    with open_regular(path) as f:
        f.seek(offset)
        return f.read(MAX_DUMP_BYTES).decode("utf-8", errors="replace")
