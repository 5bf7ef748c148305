"""10. File watching: our inotify reader against watchdog 7's InotifyFD, side by side.

Each watcher runs in a child (benchmarks/programs/watchers.py) on its own
directory. Two levels: "raw", the inotify event reaching a Python function
(ours: a thread waiting in `InotifyWatch.wait`; watchdog: the callback that
InotifyFD's one shared thread calls), and "trigger", a `FileTrigger` delivering
the new control file (ours as it is; watchdog: the same trigger on an adapter
that keeps `InotifyWatch`'s interface, which adopting InotifyFD would be).

1. Latency: the parent writes the control file as the CLI does (a temp file,
   then a rename; t0 is taken right before the rename) and reads the child's
   CLOCK_MONOTONIC stamp of the delivery. Ours and watchdog's children run in
   alternating blocks, the other one stopped (SIGSTOP), so a loaded machine
   weighs on both alike. Once with the child otherwise idle, once with a thread
   spinning in pure Python (holding the GIL as a busy training thread does).
2. Idle cost: all children at once, nothing happening; CPU time (scheduler ns
   accounting, as in idle_cpu) and voluntary context switches (wakeups) over
   back-to-back windows, less a child with no watcher.
3. Past FD_SETSIZE: each trigger starts after the child opened 1100
   descriptors; its inotify descriptor's number, and whether writes arrive.
4. Network filesystems: sshfs over a local sshd (tests/support/netfs.py), the
   watcher on one mount and the writer on another, as a rank and a login node:
   ours polls there (FileTrigger's auto mode); InotifyFD, and watchdog's
   PollingObserver (a different observer), on the same directory.

Ratios are watchdog / ours. Nothing here asserts a time: read the table.
"""

from __future__ import annotations

import json
import os
import random
import select
import signal
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

from benchmarks.common import PYTHON, Row, child_env, main, median, percentile
from benchmarks.idle_cpu import cpu_seconds

BENCH = "10 watchdog InotifyFD vs ours"
IMPLS = ("ours", "watchdog")
FDS_PAST_SETSIZE = 1100  # FD_SETSIZE is 1024
ADOPT_FACTOR = 1.2  # the rule: adopt InotifyFD within this factor of ours on latency and idle cost
HIT_TIMEOUT_S = 5.0


@dataclass
class Child:
    impl: str
    level: str
    directory: Path
    proc: subprocess.Popen
    write_dir: Path  # where the parent writes the control file: `directory`, or the same one through another mount
    inotify_fds: str = ""
    mode: str = ""
    buffer: bytes = b""
    latencies: list[float] = field(default_factory=list)
    missed: int = 0

    def readline(self, timeout: float) -> str | None:
        deadline = time.monotonic() + timeout
        fd = self.proc.stdout.fileno()
        while b"\n" not in self.buffer:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([fd], [], [], left)[0]:
                return None
            chunk = os.read(fd, 4096)
            if not chunk:
                raise RuntimeError(f"{self.impl} {self.level} child exited ({self.proc.wait()})")
            self.buffer += chunk
        line, self.buffer = self.buffer.split(b"\n", 1)
        return line.decode()

    def drain(self) -> None:
        while self.readline(0.0) is not None:
            pass

    def close(self) -> None:
        if self.proc.poll() is None:
            os.kill(self.proc.pid, signal.SIGCONT)
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


def start(base: Path, impl: str, level: str, busy: bool = False, fds: int = 0, args: tuple[str, ...] = (),
          directory: Path | None = None, write_dir: Path | None = None) -> Child:
    """A watcher child on `directory` (a new one under `base` by default)."""
    directory = directory or Path(tempfile.mkdtemp(prefix=f"{impl}-{level}-", dir=base))
    cmd = [PYTHON, "-m", "benchmarks.programs.watchers", "--dir", str(directory), "--impl", impl, "--level", level,
           *args]
    cmd += (["--busy"] if busy else []) + (["--fds", str(fds)] if fds else [])
    proc = subprocess.Popen(cmd, stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=child_env(),
                            start_new_session=True)
    child = Child(impl, level, directory, proc, write_dir or directory)
    line = child.readline(120.0)
    if line is None or not line.startswith("READY"):
        child.close()
        raise RuntimeError(f"{impl} {level} child did not start: {line!r}")
    child.inotify_fds, child.mode = line.split()[2:4]
    return child


def trial(child: Child, k: int, timeout: float = HIT_TIMEOUT_S) -> None:
    """One write as the CLI does it (registry.write_temp, then the rename); the latency to the child's stamp."""
    from sidecar.common.registry import write_temp

    path = child.write_dir / "control"
    tmp, _ = write_temp(path, (json.dumps({"id": f"bench-{k}", "active_steps": 1}) + "\n").encode())
    t0 = time.monotonic_ns()
    os.replace(tmp, path)
    line = child.readline(timeout)
    if line is None:
        child.missed += 1
        return
    child.latencies.append((int(line.split()[1]) - t0) / 1e6)
    time.sleep(random.uniform(0.002, 0.012))  # off any beat of the child's threads
    child.drain()


def measure_latency(base: Path, level: str, busy: bool, n: int, block: int) -> list[Child]:
    """`n` trials on each implementation, alternating blocks of `block`, the idle one stopped."""
    children = [start(base, impl, level, busy) for impl in IMPLS]
    try:
        for child in children:
            os.kill(child.proc.pid, signal.SIGSTOP)
        k = 0
        while any(len(c.latencies) + c.missed < n for c in children):
            for child in children:
                os.kill(child.proc.pid, signal.SIGCONT)
                time.sleep(0.1)
                for _ in range(min(block, n - len(child.latencies) - child.missed)):
                    trial(child, k)
                    k += 1
                os.kill(child.proc.pid, signal.SIGSTOP)
    finally:
        for child in children:
            child.close()
    return children


def wakeups(pid: int) -> int:
    """Voluntary context switches of all live threads of `pid`: how often they slept and woke."""
    total = 0
    for tid in os.listdir(f"/proc/{pid}/task"):
        try:
            with open(f"/proc/{pid}/task/{tid}/status") as f:
                for line in f:
                    if line.startswith("voluntary_ctxt_switches"):
                        total += int(line.split()[1])
        except OSError:
            continue
    return total


def measure_idle(base: Path, window: float, repeats: int) -> dict[str, tuple[list[float], list[float]]]:
    """{name: (CPU % of a core per window, wakeups per second per window)}, all children idle at once."""
    specs = {"baseline": ("ours", "none")}
    for level in ("raw", "trigger"):
        for impl in IMPLS:
            specs[f"{impl} {level}"] = (impl, level)
    children = {name: start(base, impl, level) for name, (impl, level) in specs.items()}
    try:
        time.sleep(2.0)
        out: dict[str, tuple[list[float], list[float]]] = {name: ([], []) for name in children}
        last = {name: (time.monotonic(), cpu_seconds(c.proc.pid), wakeups(c.proc.pid)) for name, c in children.items()}
        for _ in range(repeats):
            time.sleep(window)
            for name, child in children.items():
                t0, c0, w0 = last[name]
                t1, c1, w1 = time.monotonic(), cpu_seconds(child.proc.pid), wakeups(child.proc.pid)
                out[name][0].append((c1 - c0) / (t1 - t0) * 100.0)
                out[name][1].append((w1 - w0) / (t1 - t0))
                last[name] = (t1, c1, w1)
    finally:
        for child in children.values():
            child.close()
    return out


def _ratio(value: float, reference: float) -> float | None:
    return value / reference if reference > 0 else None


def latency_rows(level: str, busy: bool, children: list[Child], note: str) -> list[Row]:
    label = f"{level}, {'busy GIL thread' if busy else 'idle process'}"
    rows = []
    by_impl = {c.impl: c for c in children}
    for child in children:
        s = child.latencies
        rows.append(Row(BENCH, f"latency {label}: {child.impl}", median(s) if s else None, "ms",
                        delta=(f"p99 {percentile(s, 99):.2f}, max {max(s):.2f} ms; missed {child.missed}"
                               if s else f"missed {child.missed}"),
                        samples=s, spread_q=5, note=note, extra={"missed": child.missed}))
    ours, theirs = by_impl["ours"].latencies, by_impl["watchdog"].latencies
    if ours and theirs:
        p50 = _ratio(median(theirs), median(ours))
        p99 = _ratio(percentile(theirs, 99), percentile(ours, 99))
        rows.append(Row(BENCH, f"latency {label}: watchdog / ours", p50, "x",
                        delta=f"p99 {p99:.2f}x" if p99 is not None else "", target=f"p50 <= {ADOPT_FACTOR:g}x",
                        met=None if p50 is None else p50 <= ADOPT_FACTOR, note=note))
    return rows


def idle_rows(idle: dict[str, tuple[list[float], list[float]]], window: float, repeats: int) -> list[Row]:
    note = (f"All children idle at once, {repeats} back-to-back {window:g} s windows; CPU time of all threads "
            "(scheduler ns accounting) as % of one core, less the baseline child (no watcher); wakeups = voluntary "
            "context switches per second, less the baseline's. 'trigger' includes the FileTrigger's safety stat "
            "every 2 s (safety_interval), which the watchdog adapter keeps.")
    base_cpu, base_wake = median(idle["baseline"][0]), median(idle["baseline"][1])
    rows = [Row(BENCH, "idle: baseline child (no watcher)", base_cpu, "%", delta=f"{base_wake:.2f} wakeups/s",
                samples=idle["baseline"][0], note=note)]
    for level in ("raw", "trigger"):
        cost = {}
        for impl in IMPLS:
            cpu, wake = idle[f"{impl} {level}"]
            cost[impl] = (median(cpu) - base_cpu, median(wake) - base_wake)
            rows.append(Row(BENCH, f"idle {level}: {impl}", cost[impl][0], "%", baseline=base_cpu,
                            baseline_label="baseline child", delta=f"{cost[impl][1]:+.2f} wakeups/s above baseline",
                            samples=[c - base_cpu for c in cpu], note=note))
        ratio = _ratio(cost["watchdog"][0], cost["ours"][0])
        wake_ratio = _ratio(cost["watchdog"][1], cost["ours"][1])
        rows.append(Row(BENCH, f"idle {level}: watchdog / ours", ratio, "x",
                        delta=f"wakeups {wake_ratio:.2f}x" if wake_ratio is not None else "wakeups: ours ~0",
                        target=f"<= {ADOPT_FACTOR:g}x", met=None if ratio is None else ratio <= ADOPT_FACTOR,
                        note=note + " A ratio of two costs near the resolution is noise: read the wakeups too."))
    return rows


def fds_rows(base: Path, n: int) -> list[Row]:
    note = (f"The child opens {FDS_PAST_SETSIZE} descriptors, then starts the FileTrigger; select() cannot wait on a "
            "descriptor numbered >= FD_SETSIZE (1024), poll() can. Both use poll (ours in InotifyWatch.wait, "
            "watchdog in InotifyFD._check_inotify_fd).")
    rows = []
    for impl in IMPLS:
        child = start(base, impl, "trigger", fds=FDS_PAST_SETSIZE)
        try:
            for k in range(n):
                trial(child, k)
        finally:
            child.close()
        fds = [int(x) for x in child.inotify_fds.split(",") if x.isdigit()]
        works = bool(fds) and min(fds) >= 1024 and child.missed == 0
        rows.append(Row(BENCH, f"past FD_SETSIZE (trigger): {impl}", median(child.latencies) if child.latencies else None,
                        "ms", delta=f"inotify fd {child.inotify_fds}; {len(child.latencies)}/{n} delivered",
                        samples=child.latencies, target="fd >= 1024, all delivered", met=works, note=note))
    return rows


NETFS_NOTE = (
    "sshfs over a throwaway sshd on 127.0.0.1 (tests/support/netfs.py), two mounts of one export, as two machines "
    "mounting one NFS export: the watcher runs on mount 'rank', the parent writes through mount 'login' (t0 before "
    "its rename, which returns once the server has done it). Ours: FileTrigger in auto mode, which polls here "
    "(sidecar.common.registry.is_network_fs: fuse.sshfs), an open and fstat of the control file every poll_interval (1 s). "
    "watchdog: InotifyFD has no fallback and sees only writes made through this client's kernel; its answer is "
    "PollingObserver (1 s), a different observer (emitter and dispatcher threads, a stat snapshot of the directory "
    "through the client's attribute cache, which sshfs keeps for 20 s by default). A miss: no delivery within the "
    "timeout.")


def network_rows(base: Path, quick: bool) -> list[Row]:
    """The control file written through another client of a network filesystem."""
    try:
        from tests.support.netfs import NetFSUnavailable, SshfsServer
    except ImportError as exc:  # a tree without tests/
        return [Row(BENCH, "network filesystem", None, "", status=f"not measured: no tests/support ({exc})",
                    note=NETFS_NOTE)]
    cases = (  # (name, impl, level, args, writes, timeout per write)
        ("ours: FileTrigger auto (polls)", "ours", "trigger", ("--mode", "auto"), 5 if quick else 10, 5.0),
        ("watchdog: InotifyFD", "watchdog", "raw", (), 3 if quick else 5, 5.0),
        ("watchdog: PollingObserver 1 s", "watchdog", "polling", (), 2 if quick else 4, 30.0),
    )
    server = SshfsServer(base / "netfs")
    rows = []
    try:
        server.start()
        rank, login = server.mount("rank"), server.mount("login")
        for i, (name, impl, level, args, writes, timeout) in enumerate(cases):
            (rank / f"case{i}").mkdir()
            child = start(base, impl, level, args=args, directory=rank / f"case{i}", write_dir=login / f"case{i}")
            try:
                for k in range(writes):
                    trial(child, k, timeout)
            finally:
                child.close()
            s = child.latencies
            rows.append(Row(BENCH, f"network filesystem, remote write: {name}", median(s) if s else None, "ms",
                            delta=f"ran as {child.mode}; {len(s)}/{writes} delivered within {timeout:g} s",
                            samples=s, status="" if s else f"none of {writes} writes seen",
                            target="every write delivered", met=child.missed == 0, note=NETFS_NOTE))
    except NetFSUnavailable as exc:
        rows.append(Row(BENCH, "network filesystem", None, "", status=f"not measured: sshfs unavailable ({exc})",
                        note=NETFS_NOTE))
    finally:
        server.close()
    return rows


def missing_inotify_fd() -> str | None:
    """Why watchdog's InotifyFD cannot be measured here (watchdog 7 needs Python 3.11), or None."""
    try:
        from watchdog.observers.inotify_c import InotifyFD  # noqa: F401
    except Exception as exc:  # noqa: BLE001 - no watchdog, watchdog < 7, not Linux
        return f"not measured: no watchdog InotifyFD here (watchdog >= 7.1, Python >= 3.11): {exc}"
    return None


def run(quick: bool) -> list[Row]:
    why = missing_inotify_fd()
    if why:
        return [Row(BENCH, "watchdog InotifyFD vs ours", None, "", status=why)]
    random.seed(1)
    n = 60 if quick else 200
    block = 20 if quick else 25
    window, repeats = (5.0, 2) if quick else (10.0, 3)
    base = Path(tempfile.mkdtemp(prefix="bench-watchdog-"))
    note = ("The parent writes the control file as the CLI does (temp file, then rename; t0 right before the rename) "
            "and reads the child's CLOCK_MONOTONIC stamp of the delivery. 'raw': the event reaches a Python function "
            "(ours: the thread in InotifyWatch.wait; watchdog: InotifyFD's callback). 'trigger': FileTrigger delivers "
            "the new version (watchdog: behind an adapter with InotifyWatch's interface, one pipe hop from "
            "InotifyFD's thread to the trigger's). Ours and watchdog run in alternating blocks of "
            f"{block}, the other stopped. 'busy GIL thread': a pure-Python spin loop in the child.")
    rows: list[Row] = []
    for level in ("raw", "trigger"):
        for busy in (False, True):
            rows += latency_rows(level, busy, measure_latency(base, level, busy, n, block), note)
    rows += idle_rows(measure_idle(base, window, repeats), window, repeats)
    rows += fds_rows(base, 20)
    rows += network_rows(base, quick)
    return rows


if __name__ == "__main__":
    main(run)
