"""Captures on libkineto's on-demand path, answered in this process: no daemon, no stall at the save.

On this path kineto stops the capture, processes it and writes its JSON on its own threads; the
training thread pays for the step marks and the activation only (docs/ondemand.md).

- `Responder`: one thread per process, on the endpoint `ondemand_env.prepare()` bound before torch
  was imported. It reads kineto's polls (`kinetoipc`), answers only this process's own, and only
  while a config is offered; an offer kineto did not take in time is withdrawn (`Offer`).
- `OnDemandCapture`: one request on this path. Posted while the request is armed, aimed at the
  request's start step: the sidecar drives kineto's step count itself (`KinetoStepTracker`, torch's
  optimizer hook removed), so kineto's iteration N is training step N's, whatever the optimizers.
  At each step boundary it steps kineto and marks the step (`ProfilerStep#N`); at the window's
  first step it adds `distributedInfo` and our metadata.
- `export`: the saver thread's part: wait for kineto's file, read which steps it holds, gzip it into
  our name (`<n>_trace.json.gz`) in a child process, as the Python path does.

Where this path cannot serve (`unavailable`), the runner captures on the Python path.
"""

from __future__ import annotations

import logging
import math
import os
import re
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from sidecar.common.registry import unlink_quietly
from sidecar.common.request import ProfileRequest
from sidecar.rank import compress, kinetoipc, ondemand_env

log = logging.getLogger("sidecar")

REQUESTER = "cosmos_profiler"  # our name in KinetoStepTracker
OFFER_TTL_S = 60.0  # an offer nobody withdrew (its request went away) expires after this
TICK_S = 1.0  # the responder's housekeeping interval, run after a poll (kineto polls every second)
IDLE_WAKE_S = 10.0  # the responder's wait when no poll comes (a kineto that stopped polling)
STEPS_STOPPED_S = 10.0  # a window whose steps stood still this long is said to wait
FILE_WAIT_S = 120.0  # how long the saver waits for kineto's file after the window's last step
FILE_POLL_S = 0.05
LEAD_SECONDS = kinetoipc.POLL_INTERVAL_S + 1.0  # a poll's wait and a margin, before the window may start
MIN_LEAD_STEPS = 3
SCAN_CHUNK = 1 << 20
STEP_MARK = re.compile(rb'"ProfilerStep#(\d+)"')


# -- the responder ---------------------------------------------------------------------


@dataclass
class Offer:
    """A config offered to kineto's next poll."""

    config: str
    expires_at: float
    taken_at: float | None = None
    withdrawn: bool = False


class Responder:
    """Answers this process's kineto polls from `sock` (see the module docstring)."""

    def __init__(self, sock: socket.socket, pid: int) -> None:
        self._sock = sock
        self._pid = pid
        self._lock = threading.Lock()
        self._offer: Offer | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.num_polls = 0  # polls from this process
        self.num_foreign = 0  # polls from other processes (children that inherited the environment)
        self.num_bad = 0
        self.watchers: list[Callable[[], None]] = []  # called on the responder thread every TICK_S

    def start(self) -> Responder:
        if self._thread is None:
            self._thread = threading.Thread(target=self._loop, name="cosmos-profiler-kineto", daemon=True)
            self._thread.start()
        return self

    def stop(self) -> None:
        """For tests: end the thread (a process's responder otherwise serves until exit)."""
        self._stop.set()
        try:  # wake its wait on the socket (up to IDLE_WAKE_S) with an empty datagram, not a poll
            with socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM) as waker:
                waker.sendto(b"", self._sock.getsockname())
        except OSError:
            pass
        if self._thread is not None:
            self._thread.join(timeout=5.0)

    def offer(self, config: str, ttl: float = OFFER_TTL_S) -> Offer:
        """Offer `config` to the next poll that can take it (replacing an offer not taken)."""
        offer = Offer(config, time.monotonic() + ttl)
        with self._lock:
            if self._offer is not None and self._offer.taken_at is None:
                self._offer.withdrawn = True
            self._offer = offer
        return offer

    def withdraw(self, offer: Offer) -> bool:
        """Take `offer` back; False when kineto took it already."""
        with self._lock:
            if offer.taken_at is not None:
                return False
            offer.withdrawn = True
            if self._offer is offer:
                self._offer = None
            return True

    def answer(self, data: bytes) -> bytes | None:
        """The answer to one datagram, or None (not a poll of ours, or nothing to take). Marks the
        offer taken when it answers it."""
        try:
            poll = kinetoipc.decode_poll(data)
        except ValueError:
            self.num_bad += 1
            return None
        if poll.pid != self._pid:
            self.num_foreign += 1
            return None
        self.num_polls += 1
        with self._lock:
            offer = self._offer
            if offer is None or not poll.takes_activities:
                return None
            self._offer = None
            if offer.withdrawn or time.monotonic() > offer.expires_at:
                offer.withdrawn = True
                return None
            offer.taken_at = time.monotonic()
            return kinetoipc.encode_reply(offer.config)

    def _loop(self) -> None:
        sock = self._sock
        sock.settimeout(IDLE_WAKE_S)  # a poll a second wakes it: no timer of its own (idle CPU)
        next_tick = time.monotonic() + TICK_S
        while not self._stop.is_set():
            try:
                data, addr = sock.recvfrom(65536)
                reply = self.answer(data)
                if reply is not None and addr:
                    sock.sendto(reply, addr)
            except TimeoutError:
                pass
            except OSError:
                if self._stop.wait(TICK_S):
                    return
            except Exception:  # noqa: BLE001 - the responder must outlive anything
                log.exception("[Profiler] the kineto responder failed on one poll")
            if time.monotonic() >= next_tick:
                next_tick = time.monotonic() + TICK_S
                for watcher in list(self.watchers):
                    try:
                        watcher()
                    except Exception:  # noqa: BLE001
                        log.exception("[Profiler] an on-demand watcher failed")


_responder: Responder | None = None
_responder_lock = threading.Lock()


def responder() -> Responder | None:
    """This process's responder, started on first use; None where the environment was not prepared."""
    global _responder
    prepared = ondemand_env.prepared()
    if prepared is None:
        return None
    with _responder_lock:
        if _responder is None or _responder._pid != os.getpid():
            prepared.taken_over.set()  # the drain thread stops reading (ondemand_env)
            _responder = Responder(prepared.sock, prepared.pid).start()
        return _responder


def unavailable(request: ProfileRequest, begin_now: bool = False) -> str | None:
    """Why `request` cannot be captured on the on-demand path here (None: it can)."""
    why = ondemand_env.why_not()
    if why is not None:
        return why
    if begin_now:
        return "a capture begun by the job's own profiler call (cosmos-rl's start_dynamic)"
    if request.kind != "trace":
        return f"kind {request.kind!r}"
    if request.profile_memory:
        return "profile_memory: kineto gives no memory events on demand"
    r = responder()
    if r is None or r.num_polls == 0:
        return "kineto has not polled (a torch without the IPC fabric, or one that did not take the environment)"
    return None


# -- kineto's step count -----------------------------------------------------------------

_hook_removed = False


def take_step_count() -> None:
    """Drive kineto's step count ourselves: remove torch.profiler's optimizer post hook (it counts
    every optimizer's steps) and start our requester at the current count."""
    global _hook_removed
    import torch.optim.optimizer as optimizer
    import torch.profiler
    from torch.autograd.profiler import KinetoStepTracker

    if not _hook_removed:
        ours = getattr(torch.profiler, "_optimizer_post_hook", None)
        hooks = getattr(optimizer, "_global_optimizer_post_hooks", {})
        for key, hook in list(hooks.items()):
            if hook is ours:
                del hooks[key]
        _hook_removed = True
    KinetoStepTracker.init_step_count(REQUESTER)
    KinetoStepTracker._step_dict[REQUESTER] = KinetoStepTracker.current_step()


def lead_steps(rate: float | None) -> int:
    """Steps between posting a config and the first step it may start at: a poll's wait at `rate`."""
    if not rate or rate <= 0:
        return MIN_LEAD_STEPS + 2
    return max(MIN_LEAD_STEPS, math.ceil(rate * LEAD_SECONDS) + 1)


# -- one capture -------------------------------------------------------------------------


@dataclass
class OnDemandResult:
    """What the saver needs of a finished on-demand capture (`export`)."""

    request: ProfileRequest
    written: Path  # where kineto writes the file
    first_step: int  # the steps asked for: first_step .. first_step + num_steps - 1
    num_steps: int
    on_checked: Callable[[str | None], None] | None = None  # the steps check's verdict (None: as asked)
    found_steps: list[int] = field(default_factory=list)
    note: str | None = None  # what cut the window short, said with the steps check
    @property
    def kineto_tmp(self) -> Path:
        return self.written.with_name(self.written.name + ".tmp")


class OnDemandCapture:
    """One request on the on-demand path (see the module docstring). Training thread only, but for
    `stopped_for`, which the responder's watcher reads."""

    def __init__(self, responder: Responder, request: ProfileRequest, begin_step: int, directory: str) -> None:
        self.responder = responder
        self.request = request
        self.begin_step = begin_step  # where the schedule begins (wait, then warmup, then active)
        self.first_step = begin_step + request.wait_steps + request.warmup_steps
        self.end_step = self.first_step + request.active_steps  # the boundary that ends the window
        token = f"{os.getpid()}-{os.urandom(4).hex()}"
        self.log_file = os.path.join(directory, f"trace-{token}.json")
        self.written = Path(kinetoipc.log_file_written(self.log_file, os.getpid()))
        self.offer: Offer | None = None
        self.metadata: dict[str, Any] = {}
        self.distributed_info: dict[str, Any] = {}
        self.steps_off: str | None = None  # kineto's count moved by other than one a step
        self._count: int | None = None
        self._mark: Any = None
        self.last_step = begin_step
        self.last_step_at = time.monotonic()

    @property
    def taken(self) -> bool:
        return self.offer is not None and self.offer.taken_at is not None

    def post(self, step: int) -> None:
        """Offer the config at the boundary that began `step`, aimed at `first_step` (after `tick`)."""
        from torch.autograd.profiler import KinetoStepTracker

        take_step_count()
        self._count = KinetoStepTracker.current_step()
        request = self.request
        iteration = (self._count - 1) + (self.first_step - step)
        config = kinetoipc.ondemand_config(
            start_iteration=max(iteration, 0), warmup=request.warmup_steps, active=request.active_steps,
            log_file=self.log_file, trace_id=request.id, record_shapes=request.record_shape,
            with_stack=request.with_stack, with_modules=request.with_modules,
        )
        self.offer = self.responder.offer(config)

    def withdraw(self) -> bool:
        """Take the config back; False when kineto has it (its window will run)."""
        return self.offer is None or self.responder.withdraw(self.offer)

    def tick(self, step: int, mark: bool = True) -> bool:
        """The boundary that began `step`: end the last step's mark, step kineto, mark this step
        when it is in the window. Returns True at the boundary that ends the window."""
        from torch.autograd.profiler import KinetoStepTracker, record_function

        self.last_step, self.last_step_at = step, time.monotonic()
        self._end_mark()
        if self._count is None:
            return False  # not posted yet: kineto's count is not ours to move
        before = KinetoStepTracker.current_step()
        KinetoStepTracker.increment_step(REQUESTER)
        now = KinetoStepTracker.current_step()
        if before != self._count or now != before + 1:
            self.steps_off = self.steps_off or (f"kineto's step count moved by {before - self._count} outside the "
                                                f"sidecar's steps (another profiler's step()?)")
        self._count = now
        if step >= self.end_step:
            return True
        if self.first_step <= step and mark:
            if step == self.first_step:
                self._add_metadata()
            self._mark = record_function(f"ProfilerStep#{step}")
            self._mark.__enter__()
        return False

    def abort(self) -> None:
        self._end_mark()
        self.withdraw()

    def end_now(self) -> None:
        """Step kineto through the rest of the window at once (no marks): it ends and writes."""
        self._end_mark()
        at = self.last_step  # the last boundary kineto was stepped at: the next ones, until the window ends
        while not self.tick(at + 1, mark=False):
            at += 1

    def result(self, on_checked: Callable[[str | None], None] | None) -> OnDemandResult:
        return OnDemandResult(self.request, self.written, self.first_step, self.request.active_steps, on_checked)

    def stopped_for(self, now: float) -> float:
        """Seconds the training thread has not stepped while this window runs."""
        return now - self.last_step_at

    def _end_mark(self) -> None:
        mark, self._mark = self._mark, None
        if mark is not None:
            mark.__exit__(None, None, None)

    def _add_metadata(self) -> None:
        import json

        import torch

        for key, value in self.metadata.items():
            torch.autograd._add_metadata_json(key, json.dumps(value))
        try:
            dist_up = torch.distributed.is_available() and torch.distributed.is_initialized()
        except Exception:  # noqa: BLE001
            dist_up = False
        if self.distributed_info and not dist_up:
            torch.autograd._add_metadata_json("distributedInfo", json.dumps(self.distributed_info))


# -- the save (the saver thread) -----------------------------------------------------------


def wait_for_file(result: OnDemandResult, timeout: float = FILE_WAIT_S) -> Path:
    """Kineto's finished file, once it is there.

    Raises:
        OSError: it did not come within `timeout` (kineto's session was pre-empted, or its write failed).
    """
    deadline = time.monotonic() + timeout
    while True:
        if result.written.exists():
            return result.written
        if time.monotonic() > deadline:
            had_tmp = result.kineto_tmp.exists()
            unlink_quietly(result.kineto_tmp)
            why = ("its window started but kineto wrote nothing: another torch.profiler session pre-empted it"
                   if had_tmp else "kineto never started it")
            raise OSError(5, f"no on-demand trace {timeout:g} s after the window's last step ({why})",
                          os.fspath(result.written))
        time.sleep(FILE_POLL_S)


def scan_steps(path: Path) -> list[int]:
    """The `ProfilerStep#N` marks a trace holds, read a chunk at a time (the GIL is let go between
    chunks: a 100 MB trace never holds the training thread more than a chunk's scan)."""
    found: set[int] = set()
    tail = b""
    with open(path, "rb") as f:
        while chunk := f.read(SCAN_CHUNK):
            data = tail + chunk
            found.update(int(m.group(1)) for m in STEP_MARK.finditer(data))
            tail = data[-64:]
    return sorted(found)


def steps_verdict(found: list[int], first: int, num: int) -> str | None:
    """None when `found` are the steps asked for, else what differs."""
    asked = list(range(first, first + num))
    if found == asked:
        return None
    shown = f"{found[0]}..{found[-1]}" if len(found) > 3 else ", ".join(map(str, found)) or "none"
    return f"the trace holds steps {shown}, not the {num} asked for from step {first}"


def export(result: OnDemandResult, final_path: Path, gzip_level: int, place: Callable[[Path, Path], Path],
           writer: str | None, temp_token: str) -> Path:
    """Wait for kineto's file, check its steps, gzip it to `final_path` (`exporter.export`'s contract)."""
    gz_tmp = final_path.with_name(f".{final_path.name}{temp_token}")
    raw: Path | None = None
    try:
        raw = wait_for_file(result)
        result.found_steps = scan_steps(raw)
        verdict = steps_verdict(result.found_steps, result.first_step, result.num_steps)
        if result.note is not None:
            verdict = f"{result.note}: {verdict}" if verdict else result.note
        if result.on_checked is not None:
            result.on_checked(verdict)
        compress.gzip_path(raw, gz_tmp, final_path.stem, gzip_level, writer)
        return place(gz_tmp, final_path)
    finally:
        unlink_quietly(gz_tmp, *([raw] if raw is not None else []))
