"""A finished capture written to its file, off the training thread: the saver's writer.

`export` takes what `ProfilerDriver.take` handed over and writes it under temp names, then
moves it into place (the saver claims the file's number). Kineto's JSON write holds the GIL, so
where it pays (a large trace in a process that forks cheaply) a forked child writes it
(`sidecar.rank.forkwriter`). `export` then frees the collected events at once (on its own
thread, instead of whichever thread the cyclic GC next runs on, usually the training thread;
torch's free holds the GIL too), and a child process at nice 19 gzips the JSON at level 1
(`sidecar.rank.compress`), taking neither the GIL nor busy CPU. Torch itself is not imported
here: the profile's own methods write it.
"""

from __future__ import annotations

import errno
import os
from collections.abc import Callable
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sidecar.common.registry import TEMP_MARK, unlink_quietly
from sidecar.rank import compress, forkwriter, ondemand

if TYPE_CHECKING:
    from torch.profiler import profile

# Level 1: ~3x faster than the default 6 on trace JSON, files ~1.4x larger.
GZIP_LEVEL = 1


# Moves a finished temp file to its final name: (temp file, final path) -> where it went.
MoveIntoPlace = Callable[[Path, Path], Path]


def _replace(tmp: Path, final_path: Path) -> Path:
    os.replace(tmp, final_path)
    return final_path


def export(result: tuple[str, Any], final_path: Path, gzip_level: int = GZIP_LEVEL, place: MoveIntoPlace = _replace,
           writer: str | None = None) -> Path:
    """Write a result of `ProfilerDriver.take` to `final_path` via temp names.

    Runs off the training thread. `place(tmp, final_path)` moves the finished
    temp file to its name and returns where it went (default: a rename to
    `final_path`; the saver claims the next free number instead). `writer`
    (None: `compress.default_writer()`): "auto" (a forked child writes the
    JSON where that pays, see `sidecar.rank.forkwriter`, else this thread; a child
    interpreter gzips it), "fork" (the JSON always forked), "process" (the JSON
    on this thread, the gzip in a child interpreter) or "thread" (both on this
    thread).
    On failure no file exists under the final name, and the temp files are
    removed. Returns the path of the file.
    """
    kind, payload = result
    if kind == "memory":
        return _export_memory(payload, Path(final_path), place)
    if isinstance(payload, ondemand.OnDemandResult):  # kineto writes it on its threads; we wait and gzip
        return ondemand.export(payload, Path(final_path), gzip_level, place, writer, _temp_token())
    return _export_trace(payload, Path(final_path), gzip_level, place, writer)


def _temp_token() -> str:
    # pid and a random part: pids repeat on other hosts writing the same shared directory
    return f"{TEMP_MARK}{os.getpid()}-{os.urandom(4).hex()}"


def _export_memory(snapshot: Any, final_path: Path, place: MoveIntoPlace) -> Path:
    import pickle

    tmp = final_path.with_name(f".{final_path.name}{_temp_token()}")
    try:
        with open(tmp, "wb") as f:
            pickle.dump(snapshot, f)
            f.flush()
            os.fsync(f.fileno())
        os.chmod(tmp, 0o644)
        return place(tmp, final_path)
    finally:
        unlink_quietly(tmp)


def _export_trace(prof: profile, final_path: Path, gzip_level: int, place: MoveIntoPlace, writer: str | None) -> Path:
    writer = writer or compress.default_writer()
    token = _temp_token()
    raw_tmp = final_path.with_name(f".{final_path.stem}{token}")
    gz_tmp = final_path.with_name(f".{final_path.name}{token}")
    kineto_tmp = raw_tmp.with_name(raw_tmp.name + ".tmp")  # kineto writes here, then renames to raw_tmp
    try:
        # Kineto logs its own open/write failures and returns normally, leaving
        # no file (or an empty one). Create the temp ourselves so EACCES, EPERM,
        # ENOTDIR or EROFS surface here with their errno, and check what it wrote.
        os.close(os.open(raw_tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o600))
        try:
            if not (_forks(prof, writer) and forkwriter.write(prof, raw_tmp)):
                prof.export_chrome_trace(os.fspath(raw_tmp))
        finally:
            release_events(prof)  # a forked writer has exited by now: freeing them earlier copies their pages
        if os.path.getsize(raw_tmp) == 0:
            raise _kineto_write_error(final_path.parent, raw_tmp)
        compress.gzip_path(raw_tmp, gz_tmp, final_path.stem, gzip_level, writer)
        return place(gz_tmp, final_path)
    finally:
        unlink_quietly(raw_tmp, kineto_tmp, gz_tmp)


def _forks(prof: profile, writer: str) -> bool:
    """Whether a forked child writes this trace: always for "fork", where it pays for "auto"."""
    if writer not in forkwriter.MODES or not forkwriter.can_fork():
        return False
    if writer == "fork":
        return True
    return forkwriter.kernel_keeps_pinned_pages() and forkwriter.worth_forking(getattr(prof, "stop_s", None))


def release_events(prof: profile) -> None:
    """Free what the profiler collected, now and on this thread.

    A finished `profile` sits in a reference cycle, so without this its events
    (as costly to free as the stop was to collect them) go when the cyclic GC
    next runs, on whichever thread triggers it: mostly the training thread.
    Freeing them here releases the GIL (torch's destructor does).
    """
    inner = getattr(prof, "profiler", None)
    if inner is not None and getattr(inner, "kineto_results", None) is not None:
        inner.kineto_results = None


def _kineto_write_error(directory: Path, path: Path) -> OSError:
    """Why torch.profiler wrote nothing: kineto does not say, so look at the filesystem."""
    try:
        full = os.statvfs(directory).f_bavail == 0
    except OSError:
        full = False
    if full:
        return OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), os.fspath(path))
    return OSError(errno.EIO, "torch.profiler wrote no trace (its log above says why)", os.fspath(path))
