"""One file watcher on one directory, ours or one built on watchdog 7's InotifyFD.

    python -m benchmarks.programs.watchers --dir D --impl ours|watchdog --level raw|trigger|polling|none
        [--mode inotify|auto] [--busy] [--fds N]

--level raw: the inotify event for D/control reaches a Python function. Ours: a
thread waiting in `InotifyWatch.wait` (no timeout to speak of). watchdog: the
callback that `InotifyFD.get_instance()`'s thread calls for each event.

--level trigger: a `FileTrigger` (inotify mode, default safety interval) on
D/control delivers each new version. Ours as it is; watchdog: the same
`FileTrigger` with `InotifyWatch` replaced by `InotifyFDWatch` below, which is
what adopting InotifyFD behind today's interface would be. The trigger needs
its own thread either way (the safety stat, and settling waits for events
that InotifyFD's thread delivers), so InotifyFD's callback hands each event
to it through a pipe: one more thread between the kernel and the delivery.

--mode auto (trigger only): let the FileTrigger choose, as a rank does (polling on
a network or FUSE filesystem); the default forces inotify.

--level polling (watchdog only): watchdog's PollingObserver (1 s) on D, its
answer for filesystems where inotify sees nothing; a hit for any event on D/control.

--level none: no watcher (the idle baseline).
--busy: a thread spins in pure Python, holding the GIL as a busy training
thread does; every thread that must run to deliver an event waits for it.
--fds N: open N descriptors first, so the watcher's are numbered past FD_SETSIZE.

Prints `READY <pid> <inotify descriptor numbers> <mode>`, then `HIT <CLOCK_MONOTONIC ns>`
for each delivery (the time taken first), and exits when stdin closes.
"""

from __future__ import annotations

import argparse
import os
import resource
import select
import sys
import threading
import time
from pathlib import Path

from sidecar.rank.triggers.inotify import GONE, IN_Q_OVERFLOW, WATCH_MASK, InotifyWatch, _drain

CONTROL = "control"


def hit() -> None:
    stamp = time.monotonic_ns()
    sys.stdout.write(f"HIT {stamp}\n")
    sys.stdout.flush()


class InotifyFDWatch:
    """`InotifyWatch`'s interface (fd, gone, wait, close) on watchdog's shared InotifyFD thread."""

    def __init__(self, directory: str | os.PathLike[str]) -> None:
        from watchdog.observers.inotify_c import InotifyFD

        self.directory = os.fspath(directory)
        self.gone = False
        self._names: dict[str, int] = {}
        self._lock = threading.Lock()
        self._ready_r, self._ready_w = os.pipe()
        for fd in (self._ready_r, self._ready_w):
            os.set_blocking(fd, False)
        self._inotify = InotifyFD.get_instance()
        self._wd = self._inotify.add_callback(os.fsencode(self.directory), WATCH_MASK, self, id(self))
        self.fd = self._ready_r

    def fileno(self) -> int:
        return self.fd

    # InotifyFD's thread calls these.
    def on_event(self, event) -> None:
        with self._lock:
            if event.mask & GONE:
                self.gone = True
            if event.name:
                self._names[os.fsdecode(event.name)] = event.mask
        self._signal()

    def on_watch_deleted(self, wd: int) -> None:
        self.gone = True
        self._signal()

    def on_queue_overflow(self) -> None:
        with self._lock:
            self._names[""] = IN_Q_OVERFLOW
        self._signal()

    def _signal(self) -> None:
        try:
            os.write(self._ready_w, b"\0")
        except OSError:
            pass  # full: the reader is due anyway

    def wait(self, timeout: float, wake_fd: int) -> dict[str, int]:
        poller = select.poll()
        poller.register(self._ready_r, select.POLLIN)
        poller.register(wake_fd, select.POLLIN)
        ready = {fd for fd, _ in poller.poll(max(0.0, timeout) * 1000.0)}
        for fd in ready:
            _drain(fd)
        with self._lock:
            names, self._names = self._names, {}
        return names

    def close(self) -> None:
        if self.fd < 0:
            return
        self._inotify.remove_callbacks([(self._wd, id(self))])
        os.close(self._ready_r)
        os.close(self._ready_w)
        self.fd = -1


def start_raw(impl: str, directory: Path) -> None:
    if impl == "watchdog":
        from watchdog.observers.inotify_c import InotifyFD

        class Callback:
            def on_event(self, event) -> None:
                if event.name == CONTROL.encode():
                    hit()

            def on_watch_deleted(self, wd: int) -> None:
                pass

            def on_queue_overflow(self) -> None:
                pass

        InotifyFD.get_instance().add_callback(os.fsencode(directory), WATCH_MASK, Callback(), 1)
        return
    watch = InotifyWatch(directory)
    wake_r, _ = os.pipe()

    def loop() -> None:
        while True:
            if CONTROL in watch.wait(3600.0, wake_r):
                hit()

    threading.Thread(target=loop, name="raw-inotify", daemon=True).start()


def start_trigger(impl: str, directory: Path, mode: str):
    from sidecar.rank.triggers import file as file_trigger

    if impl == "watchdog":
        file_trigger.InotifyWatch = InotifyFDWatch
    trigger = file_trigger.FileTrigger(directory / CONTROL, on_file=lambda _: hit(), on_error=lambda _: hit(),
                                       mode=mode)
    trigger.start()
    if mode == "inotify" and trigger.mode != "inotify":
        raise SystemExit(f"the trigger runs as {trigger.mode}: {trigger.mode_reason}")
    return trigger


def start_polling(directory: Path):
    from watchdog.events import FileSystemEventHandler
    from watchdog.observers.polling import PollingObserver

    control = os.fspath(directory / CONTROL)

    class Handler(FileSystemEventHandler):
        def on_any_event(self, event) -> None:
            if control in (event.src_path, getattr(event, "dest_path", "")):
                hit()

    observer = PollingObserver(timeout=1.0)
    observer.schedule(Handler(), os.fspath(directory), recursive=False)
    observer.start()
    return observer


def inotify_fds() -> list[int]:
    found = []
    for name in os.listdir("/proc/self/fd"):
        try:
            if os.readlink(f"/proc/self/fd/{name}") == "anon_inode:inotify":
                found.append(int(name))
        except OSError:
            continue
    return sorted(found)


def spin() -> None:
    count = 0
    while True:
        count += 1


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--dir", required=True)
    p.add_argument("--impl", choices=("ours", "watchdog"), default="ours")
    p.add_argument("--level", choices=("raw", "trigger", "polling", "none"), required=True)
    p.add_argument("--mode", choices=("inotify", "auto"), default="inotify")
    p.add_argument("--busy", action="store_true")
    p.add_argument("--fds", type=int, default=0)
    args = p.parse_args()
    directory = Path(args.dir)
    directory.mkdir(parents=True, exist_ok=True)
    held = []
    if args.fds:
        soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
        want = args.fds + 256
        if soft < want:
            resource.setrlimit(resource.RLIMIT_NOFILE, (min(want, hard), hard))
        held = [os.open(os.devnull, os.O_RDONLY) for _ in range(args.fds)]
    trigger = observer = None
    if args.level == "raw":
        start_raw(args.impl, directory)
    elif args.level == "trigger":
        trigger = start_trigger(args.impl, directory, args.mode)
    elif args.level == "polling":
        observer = start_polling(directory)
    if args.busy:
        threading.Thread(target=spin, name="busy", daemon=True).start()
    mode = trigger.mode if trigger is not None else args.level
    print(f"READY {os.getpid()} {','.join(map(str, inotify_fds())) or '-'} {mode}", flush=True)
    sys.stdin.read()
    if trigger is not None:
        trigger.stop()
    if observer is not None:
        observer.stop()
    for fd in held:
        os.close(fd)
    sys.stdout.flush()
    os._exit(0)  # the busy thread and InotifyFD's thread are daemons; no need to wait for them


if __name__ == "__main__":
    sys.exit(main())
