"""A small real training loop with the sidecar installed, driven by the tests.

    python tests/programs/train.py --replica r1 --output OUT --steps 400 --stop-file F

Runs until --steps steps are done or --stop-file exists. Prints READY <pid>
once the sidecar is installed, and DONE <steps> at the end.
"""

from __future__ import annotations

import argparse
import ctypes
import itertools
import os
import signal
import sys
import time

if os.environ.get("COSMOS_PROFILER_SIDECAR", "").strip() not in ("", "0"):
    # What the installed startup hook (.pth) does at interpreter start, before torch is imported:
    # kineto's on-demand environment (sidecar.rank.ondemand_env). The tests' venv has no .pth.
    sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "sitehook"))
    import _cosmos_profiler_startup  # noqa: F401

import torch  # noqa: E402


def stuck_in_a_long_call() -> None:
    print("HANGING", flush=True)
    time.sleep(3600)


def held_the_gil(seconds: float) -> None:
    """A C call that holds the GIL and never checks for signals (the training thread "stuck in C"):
    for `seconds` (libc's sleep called through ctypes.PyDLL, which keeps the GIL), or practically
    forever (a sum over 10**12 ones)."""
    print("HOLDING", flush=True)
    if seconds:
        ctypes.PyDLL(None).sleep(int(seconds))
    else:
        sum(itertools.repeat(1, 10**12))


def paused(seconds: float, until_file: str | None = None) -> None:
    print("PAUSED", flush=True)
    if until_file is None:
        time.sleep(seconds)
        return
    deadline = time.monotonic() + seconds
    while not os.path.exists(until_file) and time.monotonic() < deadline:
        time.sleep(0.01)  # the pause itself: released by the test once it has seen what it needs


class WorkFile:
    """--work-file: how much extra work each step does, changed while the job runs."""

    BASE = 8

    def __init__(self, path: str | None, rank: int) -> None:
        self.path, self.rank, self.seen, self.current = path, rank, None, self.BASE

    def size(self) -> int:
        try:
            st = os.stat(self.path)
        except (FileNotFoundError, TypeError):
            return self.current
        if (st.st_ino, st.st_mtime_ns) != self.seen:
            self.seen = (st.st_ino, st.st_mtime_ns)
            with open(self.path) as f:
                parts = f.read().split()
            ranks = {int(k) for k in parts[1].split(",")} if len(parts) > 1 else {self.rank}
            self.current = int(parts[0]) if self.rank in ranks else self.BASE
            print(f"WORK {self.current}", flush=True)
        return self.current


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--replica")
    p.add_argument("--rank", type=int)
    p.add_argument("--role", default="policy")
    p.add_argument("--output")
    p.add_argument("--registry")
    p.add_argument("--config")
    p.add_argument("--steps", type=int, default=100000)
    p.add_argument("--step-sleep", type=float, default=0.01)
    p.add_argument("--stop-file")
    p.add_argument("--width", type=int, default=64)
    p.add_argument("--layers", type=int, default=1, help="hidden Linear+ReLU layers (more ops: bigger traces)")
    p.add_argument("--umask", help="set this umask (octal) before anything is written")
    p.add_argument("--no-sidecar", action="store_true")
    p.add_argument("--hang-at", type=int, default=-1, help="block the main thread at this step")
    p.add_argument("--user-profiler-at", type=int, default=-1, help="run the user's own torch.profiler from this step")
    p.add_argument("--user-profiler-stop-file", help="stop the user's profiler once this file exists")
    p.add_argument("--user-profiler-trace", help="export the user's profile to this Chrome trace when it stops")
    p.add_argument("--gil-at", type=int, default=-1, help="hold the GIL in a C call at this step")
    p.add_argument("--gil-s", type=float, default=0.0, help="for this many whole seconds (default: practically forever)")
    p.add_argument("--gil-file", help="hold the GIL (for --gil-s) at the first step after this file exists")
    p.add_argument("--pause-at", type=int, default=-1, help="stop stepping (a Python sleep) at this step")
    p.add_argument("--pause-s", type=float, default=3600.0)
    p.add_argument("--pause-until-file", help="end the pause once this file exists (at most --pause-s)")
    p.add_argument("--work-file", help="a file 'N [RANK,...]': from the step after it appears, each step (of those "
                                        "ranks; default all) multiplies two NxN matrices instead of 8x8 (aten::mm "
                                        "grows) and adds an 8x8 cumsum (aten::cumsum appears); read whenever it changes")
    p.add_argument("--user-usr2", choices=("python", "faulthandler"),
                   help="install the user's own SIGUSR2 handler before the sidecar")
    p.add_argument("--user-usr1-at", type=int, default=None,
                   help="install the user's own SIGUSR1 handler at this step (-1: before the sidecar)")
    p.add_argument("--user-usr1-release-file", help="once this file exists, give SIGUSR1 back (SIG_DFL)")
    p.add_argument("--linger-file", help="after closing the sidecar (DONE), go on (the job's own work after "
                                         "training: a checkpoint) until this file exists, then print LINGERED")
    args = p.parse_args()

    def user_usr1(signum, frame):
        print("USER_USR1", flush=True)

    if args.user_usr1_at == -1:
        signal.signal(signal.SIGUSR1, user_usr1)
    if args.user_usr2 == "python":
        signal.signal(signal.SIGUSR2, lambda signum, frame: print("USER_USR2", flush=True))
    elif args.user_usr2 == "faulthandler":
        import faulthandler

        faulthandler.register(signal.SIGUSR2, file=sys.stdout, all_threads=False, chain=False)
    if args.umask is not None:
        os.umask(int(args.umask, 8))

    torch.manual_seed(0)
    torch.set_num_threads(1)
    hidden = []
    for _ in range(args.layers):
        hidden += [torch.nn.Linear(args.width, args.width), torch.nn.ReLU()]
    model = torch.nn.Sequential(*hidden, torch.nn.Linear(args.width, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(16, args.width), torch.randn(16, 1)

    work = WorkFile(args.work_file, args.rank if args.rank is not None else int(os.environ.get("RANK", "0")))

    sc = None
    if not args.no_sidecar:
        import sidecar

        sc = sidecar.install(
            output_dir=args.output, replica=args.replica, rank=args.rank, role=args.role,
            config=args.config, registry=args.registry,
        )
    print(f"READY {os.getpid()}", flush=True)

    user_prof = None
    user_steps = 0

    def stop_user_profiler() -> None:
        user_prof.stop()
        n = len(user_prof.key_averages())
        if args.user_profiler_trace:
            user_prof.export_chrome_trace(args.user_profiler_trace)
        print(f"USER_PROFILE_OK {n} {user_steps}", flush=True)

    step = 0
    while step < args.steps:
        if args.stop_file and os.path.exists(args.stop_file):
            break
        if step == args.hang_at:
            stuck_in_a_long_call()
        if step == args.gil_at or (args.gil_file and os.path.exists(args.gil_file)):
            if args.gil_file:
                os.unlink(args.gil_file)
            held_the_gil(args.gil_s)
            print("RELEASED", flush=True)
        if step == args.user_usr1_at:
            signal.signal(signal.SIGUSR1, user_usr1)
            print("USER_USR1_SET", flush=True)
        if args.user_usr1_release_file and os.path.exists(args.user_usr1_release_file) \
                and signal.getsignal(signal.SIGUSR1) is user_usr1:
            signal.signal(signal.SIGUSR1, signal.SIG_DFL)
            print("USER_USR1_RELEASED", flush=True)
        if step == args.pause_at:
            paused(args.pause_s, args.pause_until_file)
            print("RESUMED", flush=True)
        if step == args.user_profiler_at:
            user_prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU])
            user_prof.start()
        if user_prof is not None and args.user_profiler_stop_file and os.path.exists(args.user_profiler_stop_file):
            stop_user_profiler()
            user_prof = None
        opt.zero_grad()
        loss = torch.nn.functional.mse_loss(model(x), y)
        if args.work_file:
            size = work.size()
            m = torch.ones(size, size)
            loss = loss + torch.mm(m, m).mean() * 0.0
            if size != WorkFile.BASE:
                # a small one (8x8): it appears, and never outweighs the grown matmul, even where the
                # machine's load stretches it (cumsum over all N rows took a third of the matmul's time)
                loss = loss + torch.cumsum(torch.ones(WorkFile.BASE, WorkFile.BASE), 0).mean() * 0.0
        loss.backward()
        opt.step()
        if user_prof is not None:
            user_steps += 1
        if sc is not None:
            sc.step()
        step += 1
        if args.step_sleep:
            time.sleep(args.step_sleep)
    if user_prof is not None:
        stop_user_profiler()
    if sc is not None:
        sc.close()
    print(f"DONE {step}", flush=True)
    if args.linger_file:
        while not os.path.exists(args.linger_file):
            time.sleep(0.05)
        print("LINGERED", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
