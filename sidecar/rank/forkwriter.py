"""Write a finished trace's JSON in a fork of this process, off its GIL, at nice 19.

Kineto writes a trace's JSON holding the GIL (about 1 s per 100 MB here), so on
the saver thread it still stops a Python training thread. A forked child has the
collected events in its copy of memory: it writes the JSON there and exits,
while the parent's saver thread only waits (no GIL). The parent frees the events
once the child is gone (freeing them while it runs would copy every page they
sit on) and gzips the JSON as before (`sidecar.rank.compress`).

A fork is not free. The kernel copies the page tables while the forking thread
holds the GIL: about 17 ms per GB of resident memory on the machine the
benchmarks run on, more with CUDA pinned memory. So by default (`auto`) a trace
is forked only when the fork is estimated to cost well under what the JSON write
would: the write takes about half as long as the profiler's stop did (measured:
0.34x to 0.5x), and the fork's cost is estimated from the page tables' size
(`VmPTE`), calibrated by every fork this process makes. `auto` also forks only
on Linux 5.9 or later, which copies pinned pages (RDMA buffers, say) for the
child instead of leaving the parent a copy-on-write page a device still writes.

The child never takes part in the parent's life: it ignores the signals the
parent handles, dies with the parent (PR_SET_PDEATHSIG), and leaves through
`os._exit`. It touches no CUDA: in a process that has initialised CUDA, kineto's
device properties (which its JSON writer reads lazily, through CUDA) are read
once in the parent, by saving an empty CPU-only trace, before the first fork.

Whatever goes wrong with the child (it cannot start, is killed, crashes, raises,
or writes nothing new for `stall_s`), the parent still holds the events: `write`
returns False and the caller writes the JSON on its own thread instead. Nothing
is lost; the first such failure is logged, once per process.
"""

from __future__ import annotations

import contextlib
import ctypes
import logging
import os
import re
import select
import signal
import threading
import time
import warnings
from pathlib import Path
from typing import Any

from sidecar.common import envvars

log = logging.getLogger("sidecar")

MODES = ("auto", "fork")
STALL_ENV = "COSMOS_PROFILER_FORK_STALL_S"
STALL_S = envvars.BY_NAME[STALL_ENV].default  # no byte written for this long: the child is wedged
TIMEOUT_S = 1800.0
CHILD_NICE = 19
# The JSON write takes at least this share of the stop (0.34x trace_only, ~0.5x with_stack);
# fork only when the fork is estimated to cost under half of the write it replaces.
WRITE_SHARE_OF_STOP = 0.34
FORK_SHARE_OF_WRITE = 0.5
# Parent-side fork cost per MB of page tables, before this process has forked once
# (8 to 16 ms per MB measured on a 2-core VM, 1 to 8 GB resident).
DEFAULT_MS_PER_PTE_MB = 16.0
PR_SET_PDEATHSIG = 1

_children: set[int] = set()
_lock = threading.Lock()
_ms_per_pte_mb = DEFAULT_MS_PER_PTE_MB
_warned: set[str] = set()
_cuda_warmed = False


def _find_prctl() -> Any:
    """libc's prctl, looked up here: the child must not dlopen (another thread may hold the loader's lock)."""
    try:
        return ctypes.CDLL(None, use_errno=True).prctl
    except (OSError, AttributeError):
        return None


_prctl = _find_prctl()


def page_table_mb() -> float:
    """This process's page tables in MB (`VmPTE`); 0.0 where /proc does not say."""
    try:
        with open("/proc/self/status", "rb") as f:
            for line in f:
                if line.startswith(b"VmPTE:"):
                    return int(line.split()[1]) / 1024
    except (OSError, ValueError, IndexError):
        pass
    return 0.0


def estimated_fork_ms(pte_mb: float | None = None) -> float:
    """What a fork would cost the forking thread now, in ms."""
    return 1.0 + (page_table_mb() if pte_mb is None else pte_mb) * _ms_per_pte_mb


def worth_forking(stop_s: float | None, pte_mb: float | None = None) -> bool:
    """`auto`'s rule: fork when the fork costs under half the JSON write it replaces."""
    if stop_s is None:
        return False
    write_ms = stop_s * 1000 * WRITE_SHARE_OF_STOP
    return estimated_fork_ms(pte_mb) < write_ms * FORK_SHARE_OF_WRITE


def kernel_keeps_pinned_pages(release: str | None = None) -> bool:
    """Whether this Linux copies pinned pages for a forked child (5.9 and later), so the
    parent keeps the pages an RDMA NIC (NCCL over InfiniBand) or a driver has pinned.
    Older kernels give the parent the copy on its next write, under the device's feet."""
    match = re.match(r"(\d+)\.(\d+)", release if release is not None else os.uname().release)
    return match is not None and (int(match.group(1)), int(match.group(2))) >= (5, 9)


def can_fork() -> bool:
    return hasattr(os, "fork") and hasattr(os, "waitpid") and os.path.exists("/proc/self/status")


def running() -> list[int]:
    """The pids of the writer children running now."""
    with _lock:
        return sorted(_children)


def kill_all() -> None:
    """SIGKILL every running writer child (their saves then fall back to the saver thread)."""
    for pid in running():
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)


def write(prof: Any, raw_tmp: Path, stall_s: float | None = None) -> bool:
    """Have a forked child write `prof`'s trace JSON to `raw_tmp` (what
    `prof.export_chrome_trace(raw_tmp)` does here).

    Runs on the saver thread. Returns True when the child wrote it, False when
    it could not (the caller then writes it itself: the events are intact).
    A kineto that writes nothing (it logs why) counts as written: the caller
    checks the file, as after its own write.
    """
    if stall_s is None:
        stall_s = _stall_s()
    _warm_cuda_device_properties()
    read_end, write_end = os.pipe()
    started = time.perf_counter()
    pte_mb = page_table_mb()
    try:
        with warnings.catch_warnings():
            # Python 3.12+ warns on forking a multi-threaded process; the child runs only this code.
            warnings.simplefilter("ignore", DeprecationWarning)
            pid = os.fork()
    except OSError as exc:
        os.close(read_end)
        os.close(write_end)
        _warn_once("fork", "[Profiler] could not fork a trace writer (%s); writing traces on the saver thread",
                   exc.strerror or exc)
        return False
    if pid == 0:  # pragma: no cover - the child; it reports through the pipe and its exit status
        _child(prof, raw_tmp, read_end, write_end)
    os.close(write_end)
    _calibrate((time.perf_counter() - started) * 1000, pte_mb)
    with _lock:
        _children.add(pid)
    try:
        report, how = _wait(pid, read_end, raw_tmp, stall_s)
    except Exception as exc:  # noqa: BLE001 - waiting went wrong here: end the child, write it ourselves
        with contextlib.suppress(OSError):
            os.kill(pid, signal.SIGKILL)
        with contextlib.suppress(ChildProcessError):
            os.waitpid(pid, 0)
        report, how = "", f"could not be followed ({type(exc).__name__}: {exc}); it was killed"
    finally:
        os.close(read_end)
        with _lock:
            _children.discard(pid)
    if report == "DONE":
        return True
    if report.startswith("failed:"):
        how = report
    _warn_once("child", "[Profiler] the forked trace writer (pid %d) %s; writing the trace on the saver thread",
               pid, how)
    return False


def _wait(pid: int, read_end: int, raw_tmp: Path, stall_s: float) -> tuple[str, str]:
    """Read the child's report until it closes the pipe; end it if it stalls. (report, how it ended)."""
    chunks: list[bytes] = []
    deadline = time.monotonic() + TIMEOUT_S
    progress, last_change = None, time.monotonic()
    killed = ""
    poller = select.poll()  # not select(): a training process may hold more than FD_SETSIZE descriptors
    poller.register(read_end, select.POLLIN)
    while True:
        if poller.poll(min(1.0, stall_s / 4) * 1000):
            data = os.read(read_end, 65536)
            if not data:
                break
            chunks.append(data)
            continue
        now = time.monotonic()
        seen = _progress(raw_tmp)
        if seen != progress:
            progress, last_change = seen, now
        elif not killed and now - last_change > stall_s:
            killed = f"wrote nothing for {stall_s:g} s; it was killed"
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        if not killed and now > deadline:
            killed = f"did not finish in {TIMEOUT_S:g} s; it was killed"
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
    status = None
    with contextlib.suppress(ChildProcessError):  # SIGCHLD ignored: the kernel reaped it
        _, status = os.waitpid(pid, 0)
    report = b"".join(chunks).decode(errors="replace").strip()
    if killed:
        return "", killed
    if status is not None and os.WIFSIGNALED(status):
        sig = os.WTERMSIG(status)
        try:
            sig_name = signal.Signals(sig).name
        except ValueError:
            sig_name = f"signal {sig}"
        return report, f"was killed by {sig_name}"
    if status is not None and os.WEXITSTATUS(status) != 0:
        return report, f"exited with status {os.WEXITSTATUS(status)}"
    return report, "ended before it had finished"


def _progress(raw_tmp: Path) -> tuple[int, int]:
    """Sizes that grow while the child writes: kineto's temp file, then the JSON it renames to."""
    sizes = []
    for path in (raw_tmp.with_name(raw_tmp.name + ".tmp"), raw_tmp):
        try:
            sizes.append(os.stat(path).st_size)
        except OSError:
            sizes.append(-1)
    return sizes[0], sizes[1]


def _child(prof: Any, raw_tmp: Path, read_end: int, write_end: int) -> None:
    """The forked child: write the JSON, report on `write_end`, leave through os._exit."""
    code = 3
    try:
        os.close(read_end)
        for sig in (signal.SIGINT, signal.SIGUSR1, signal.SIGUSR2, signal.SIGHUP):
            with contextlib.suppress(OSError, ValueError):
                signal.signal(sig, signal.SIG_IGN)
        if _prctl is not None:
            _prctl(PR_SET_PDEATHSIG, signal.SIGKILL)
        with contextlib.suppress(OSError):
            os.nice(CHILD_NICE)
        try:
            prof.export_chrome_trace(os.fspath(raw_tmp))
            os.write(write_end, b"DONE")
            code = 0
        except BaseException as exc:  # noqa: BLE001 - reported to the parent, which writes the trace itself
            with contextlib.suppress(OSError):
                os.write(write_end, f"failed: {type(exc).__name__}: {exc}".encode())
    finally:
        os._exit(code)


def _calibrate(took_ms: float, pte_mb: float) -> None:
    """Learn this process's fork cost per MB of page tables from the fork just made."""
    global _ms_per_pte_mb
    if pte_mb >= 1.0:
        _ms_per_pte_mb = max(1.0, (took_ms - 1.0) / pte_mb)


def _stall_s() -> float:
    return envvars.read(STALL_ENV)  # a bad value is said once, naming the variable


def _warn_once(key: str, message: str, *args: Any) -> None:
    if key not in _warned:
        _warned.add(key)
        log.warning(message, *args)


def _warm_cuda_device_properties() -> None:
    """In a CUDA process, have kineto read its device properties here, not in the child.

    Kineto's JSON writer reads them through CUDA the first time it writes a
    trace, and CUDA does not work in a forked child. Saving an empty CPU-only
    trace once makes kineto read and keep them in this process.
    """
    global _cuda_warmed
    if _cuda_warmed:
        return
    _cuda_warmed = True
    try:
        import torch

        if not torch.cuda.is_initialized():
            _cuda_warmed = False  # CUDA may come up later: check again next time
            return
        import tempfile

        from torch.profiler import ProfilerActivity, profile

        with profile(activities=[ProfilerActivity.CPU]) as empty:
            pass
        with tempfile.TemporaryDirectory(prefix="cosmos-profiler-") as tmp:
            empty.export_chrome_trace(os.path.join(tmp, "warm.json"))
    except Exception as exc:  # noqa: BLE001 - best effort; the child's trace may then lack them
        log.debug("[Profiler] reading kineto's device properties failed: %s", exc)
