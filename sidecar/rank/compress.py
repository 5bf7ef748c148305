"""Gzip a finished trace JSON off the training thread's CPU and GIL.

`gzip_file(src, dst, name, level)` compresses the open file `src` into the open
file `dst`. By default a child interpreter does it (`python -I -S -c ...`, at
nice 19): it holds no lock of ours, so the training thread never waits on it,
and at low priority it takes only CPU that training leaves idle. Where no child
can be started (no interpreter at `sys.executable`, no fork left) the calling
thread compresses instead (zlib releases the GIL while it deflates).

The child writes through the file descriptors it inherits, so the caller opens
(and later fsyncs and renames) the files exactly as before; a write error in
the child comes back as the same OSError (errno, no file name). A child that is
killed, or runs past `timeout`, fails the save with a message saying so. The
child stops on its own when its parent is gone (it leaves the temp files for
the next start's cleanup, as a killed save always has), and `kill_all()` ends
every running child (the saver calls it when a save outlives its join).
"""

from __future__ import annotations

import gzip
import json
import logging
import os
import shutil
import signal
import subprocess
import sys
import threading
from typing import BinaryIO

from sidecar.common.envvars import GZIP_WRITERS

log = logging.getLogger("sidecar")

WRITERS = GZIP_WRITERS  # who gzips (`sidecar.common.envvars` lists them with the save writers)
WRITER_ENV = "COSMOS_PROFILER_SAVE_WRITER"
CHUNK = 1 << 20
CHILD_NICE = 19
TIMEOUT_S = 1800.0
CHILD_MARK = "# cosmos-profiler gzip writer"

# Run with `python -I -S -c CHILD SRC_FD DST_FD LEVEL PARENT_PID NAME`. Done: DONE on
# stderr, exit 0 (both are checked: with SIGCHLD ignored a killed child also "exits 0");
# on an OSError, its errno as JSON on stderr and exit 2; 3 when the parent died.
CHILD = CHILD_MARK + """
import gzip, json, os, signal, sys
signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C is the parent's to handle; it ends us
src, dst, level, parent = (int(a) for a in sys.argv[1:5])
try:
    os.nice(NICE)
except OSError:
    pass
try:
    with open(src, "rb", closefd=False) as fin, open(dst, "wb", closefd=False) as raw:
        with gzip.GzipFile(filename=sys.argv[5], mode="wb", fileobj=raw, compresslevel=level) as out:
            while True:
                chunk = fin.read(CHUNK)
                if not chunk:
                    break
                out.write(chunk)
                if os.getppid() != parent:
                    os._exit(3)
except OSError as exc:
    sys.stderr.write(json.dumps({"errno": exc.errno, "strerror": exc.strerror}))
    sys.exit(2)
sys.stderr.write("DONE")
""".replace("NICE", str(CHILD_NICE)).replace("CHUNK", str(CHUNK))

_children: set[subprocess.Popen] = set()
_lock = threading.Lock()


def default_writer() -> str:
    """COSMOS_PROFILER_SAVE_WRITER's value where it names one of SAVE_WRITERS, else `auto` (`sidecar.common.envvars`)."""
    from sidecar.common import envvars  # a bad value is said once, naming the variable

    return envvars.read(WRITER_ENV)


def gzip_file(src: BinaryIO, dst: BinaryIO, name: str, level: int, writer: str | None = None,
              timeout: float = TIMEOUT_S) -> str:
    """Compress `src` (read from its current offset) into `dst` as one gzip member.

    Args:
        name: the file name stored in the gzip header.
        writer: "thread" (this thread), else a child interpreter (None:
            `default_writer()`; "auto" and "fork" mean the child here).
    Returns:
        The writer that did the work ("thread" when no child could start).
    Raises:
        OSError: a read or write failed (the child's errno, as the thread's would be).
        RuntimeError: the child was killed, timed out or failed otherwise.
    """
    if (writer or default_writer()) != "thread":
        proc = _spawn(src, dst, name, level)
        if proc is not None:
            _wait(proc, timeout)
            return "process"
    with gzip.GzipFile(filename=name, mode="wb", fileobj=dst, compresslevel=level) as out:
        shutil.copyfileobj(src, out, CHUNK)
    return "thread"


def gzip_path(raw: os.PathLike[str] | str, gz_tmp: os.PathLike[str] | str, name: str, level: int,
              writer: str | None = None) -> None:
    """Compress the file `raw` into the new file `gz_tmp` (`gzip_file`), synced to disk and made
    0644: a saved trace's temp file, ready to be moved into place.

    Raises:
        OSError, RuntimeError: as `gzip_file`.
    """
    with open(raw, "rb") as src, open(gz_tmp, "wb") as out:
        gzip_file(src, out, name, level, writer)
        out.flush()
        os.fsync(out.fileno())
    os.chmod(gz_tmp, 0o644)


def running() -> list[subprocess.Popen]:
    """The writer children running now."""
    with _lock:
        return list(_children)


def kill_all() -> None:
    """SIGKILL every running writer child (their saves then fail and clean up)."""
    for proc in running():
        try:
            proc.kill()
        except OSError:
            pass


def _spawn(src: BinaryIO, dst: BinaryIO, name: str, level: int) -> subprocess.Popen | None:
    executable = sys.executable
    if not executable or not os.access(executable, os.X_OK):
        return None
    fds = (src.fileno(), dst.fileno())
    args = [executable, "-I", "-S", "-c", CHILD, str(fds[0]), str(fds[1]), str(level), str(os.getpid()), name]
    try:
        # No preexec_fn: CPython then uses vfork, so starting the child costs the same in a 100 GB process.
        proc = subprocess.Popen(args, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                pass_fds=fds, close_fds=True)
    except OSError as exc:
        log.warning("[Profiler] could not start the gzip writer process (%s); compressing on the saver thread",
                    exc.strerror or exc)
        return None
    with _lock:
        _children.add(proc)
    return proc


def _wait(proc: subprocess.Popen, timeout: float) -> None:
    try:
        try:
            _, err = proc.communicate(timeout=timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.communicate()
            raise RuntimeError(f"the gzip writer process (pid {proc.pid}) did not finish in {timeout:g} s; "
                               "it was killed") from None
    finally:
        with _lock:
            _children.discard(proc)
    code = proc.returncode
    text = err.decode(errors="replace").strip()
    if code == 0 and text.endswith("DONE"):
        return
    if code == 2:
        try:
            info = json.loads(text)
            num = int(info["errno"])
            raise OSError(num, info.get("strerror") or os.strerror(num))
        except (ValueError, KeyError, TypeError):
            pass
    if code < 0:
        try:
            how = f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            how = f"was killed by signal {-code}"
    elif code == 0:
        how = "ended before it had finished"
    else:
        how = f"exited with status {code}"
    detail = f": {text.splitlines()[-1]}" if text else ""
    raise RuntimeError(f"the gzip writer process (pid {proc.pid}) {how}{detail}")

