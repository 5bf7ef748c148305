"""A simulated fleet: N nodes of R ranks, each rank a light process running the real rank side.

    python -m benchmarks.programs.fleetsim --nodes N --ranks-per-node R --registry REG
        --output OUT --replica NAME --node-dir DIR --reports DIR [--node-agent on|off]
        [--pace STEPS_PER_S] [--namespaces auto|off]

One zygote imports `sidecar` (and the rank side `install()` loads) once, before any thread
exists, then forks one process per node; each node forks its ranks, so all of them share the
zygote's pages (1,024 ranks fit in a few GiB). No process here imports torch: `install()`
only asks whether torch could be found, and a rank that never captures never loads it. Each
rank reports at its end whether `torch` is in its `sys.modules`.

A node is what a real node would be to the ranks on it:

- its own host name and its own node-local directory: in new UTS and mount namespaces
  (`unshare(CLONE_NEWUTS | CLONE_NEWNS)`, mounts made private, `sethostname("node-<i>")`, a
  private tmpfs mounted on DIR, the same path on every node, as `/dev/shm` is), where the
  kernel permits it (root, or CAP_SYS_ADMIN); elsewhere `COSMOS_PROFILER_HOST=node-<i>` and
  DIR/node-<i>, and the zygote says why on its READY line;
- ranks `8i .. 8i+7` of a world of N*R, with RANK, LOCAL_RANK, WORLD_SIZE and
  LOCAL_WORLD_SIZE set, `COSMOS_PROFILER_WATCH=poll` (as on a network filesystem),
  `COSMOS_PROFILER_NODE_AGENT` from --node-agent and `COSMOS_PROFILER_NODE_DIR` at DIR; each
  calls the real `sidecar.install(...)` and then `sc.step()` at a steady pace (10 steps a
  second by default): training at rest.

Files under --reports (never under the registry, so they are not what the benchmark counts):
`node-<i>.json` once a node has forked its ranks ({"node", "pid", "ranks": [pids], "host",
"node_dir", "namespaces"}), and `rank-<k>.json` when a rank stops ({"rank", "node", "pid",
"host" (socket.gethostname()), "torch" (imported?), "steps"}).

The nodes named by --traced-nodes run under `strace -f --seccomp-bpf -e trace=%file -y -ttt`
(--strace-dir/node-<i>.txt): the zygote's fork of such a node execs strace, which starts the
node in a new interpreter (`--only-node`), so only these nodes pay for the tracer's stops and
the others run as they would.

The zygote prints `READY {json}` once every node is forked and waits for SIGTERM, which it
passes to the nodes, which pass it to their ranks.
"""

from __future__ import annotations

import argparse
import ctypes
import json
import os
import signal
import socket
import sys
import time

CLONE_NEWNS = 0x00020000
CLONE_NEWUTS = 0x04000000
MS_REC = 1 << 14
MS_PRIVATE = 1 << 18
STOP_GRACE_S = 10.0


def _libc_call(name: str, *args: object) -> None:
    libc = ctypes.CDLL(None, use_errno=True)
    if getattr(libc, name)(*args) != 0:
        err = ctypes.get_errno()
        raise OSError(err, f"{name}: {os.strerror(err)}")


def enter_node_namespaces(host: str, node_dir: str) -> None:
    """Make this process a node: its own host name and a private tmpfs on `node_dir`.

    Raises:
        OSError: the kernel refused one of the steps (the message names which).
    """
    _libc_call("unshare", CLONE_NEWUTS | CLONE_NEWNS)
    _libc_call("mount", b"none", b"/", None, MS_REC | MS_PRIVATE, None)  # nothing leaks back to the host
    socket.sethostname(host)
    os.makedirs(node_dir, exist_ok=True)
    _libc_call("mount", b"tmpfs", node_dir.encode(), b"tmpfs", 0, b"size=64m,mode=0700")


def probe_namespaces(node_dir: str) -> str:
    """'' when a forked child could enter a node's namespaces, else why not."""
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        why = ""
        try:
            enter_node_namespaces("node-probe", node_dir)
        except OSError as exc:
            why = str(exc)
        os.write(write, why.encode())
        os._exit(0)
    os.close(write)
    chunks = []
    while True:
        chunk = os.read(read, 4096)
        if not chunk:
            break
        chunks.append(chunk)
    os.close(read)
    os.waitpid(pid, 0)
    return b"".join(chunks).decode() or ""


def _write_json(path: str, data: dict) -> None:
    tmp = f"{path}.tmp"
    with open(tmp, "w") as f:
        json.dump(data, f)
    os.rename(tmp, path)


def run_rank(args: argparse.Namespace, node: int, local: int, node_dir: str) -> None:
    """One rank: the real install, then steps at a steady pace until SIGTERM."""
    rank = node * args.ranks_per_node + local
    os.environ.update({
        "RANK": str(rank), "LOCAL_RANK": str(local), "WORLD_SIZE": str(args.nodes * args.ranks_per_node),
        "LOCAL_WORLD_SIZE": str(args.ranks_per_node), "COSMOS_PROFILER_WATCH": "poll",
        "COSMOS_PROFILER_NODE_AGENT": args.node_agent, "COSMOS_PROFILER_NODE_DIR": node_dir,
    })
    stopping = []
    signal.signal(signal.SIGTERM, lambda signum, frame: stopping.append(signum))
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGTERM})  # blocked by the node until now
    import sidecar
    from sidecar.common.identity import host_name

    sc = sidecar.install(output_dir=args.output, replica=args.replica, rank=rank, registry=args.registry)
    period = 1.0 / args.pace
    steps = 0
    tick = time.monotonic()
    while not stopping:
        sc.step()
        steps += 1
        tick += period
        delay = tick - time.monotonic()
        if delay > 0:
            time.sleep(delay)
        else:
            tick = time.monotonic()  # behind (a loaded machine): keep the pace from here
    _write_json(os.path.join(args.reports, f"rank-{rank}.json"), {
        "rank": rank, "node": node, "pid": os.getpid(), "host": host_name(), "uts_host": socket.gethostname(),
        "torch": "torch" in sys.modules, "steps": steps,
    })


def _stop_children(children: list[int], targets: list[int] | None = None) -> None:
    """SIGTERM `targets` (default: the children), wait for the children, SIGKILL what is left."""
    for pid in children if targets is None else targets:
        try:
            os.kill(pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    deadline = time.monotonic() + STOP_GRACE_S
    left = set(children)
    while left and time.monotonic() < deadline:
        for pid in list(left):
            try:
                done, _ = os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                done = pid
            if done:
                left.discard(pid)
        time.sleep(0.05)
    for pid in left:
        try:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)
        except (ProcessLookupError, ChildProcessError):
            pass


def _fork(body: object, *args: object) -> int:
    pid = os.fork()
    if pid == 0:
        code = 0
        try:
            body(*args)  # type: ignore[operator]
        except BaseException:  # noqa: BLE001 - a child reports and exits, never returns to the fork's caller
            import traceback

            traceback.print_exc()
            code = 1
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    return pid


def _wait_for_term(children: list[int]) -> None:
    """With SIGTERM blocked (since before the forks): wait for it, then stop the children."""
    signal.sigwait({signal.SIGTERM})
    _stop_children(children)


def traced_node(args: argparse.Namespace, node: int, namespaces: bool) -> None:
    """Run node `node` in a new interpreter under strace (the kernel's count of its file syscalls,
    with only those stopping: --seccomp-bpf); it does not share the zygote's pages."""
    argv = ["strace", "-f", "--seccomp-bpf", "-qq", "-ttt", "-y", "-e", "trace=%file", "-o",
            os.path.join(args.strace_dir, f"node-{node}.txt"), sys.executable, "-m", "benchmarks.programs.fleetsim",
            "--only-node", str(node), "--namespaces", "auto" if namespaces else "off"]
    for name in ("nodes", "ranks_per_node", "registry", "output", "replica", "node_dir", "reports", "node_agent",
                 "pace"):
        argv += [f"--{name.replace('_', '-')}", str(getattr(args, name))]
    os.execvp("strace", argv)


def run_node(args: argparse.Namespace, node: int, namespaces: bool) -> None:
    """One node: its namespaces (or its host variable), then its ranks; waits for SIGTERM."""
    host = f"node-{node}"
    if namespaces:
        node_dir = args.node_dir
        enter_node_namespaces(host, node_dir)
    else:
        node_dir = os.path.join(args.node_dir, host)
        os.makedirs(node_dir, mode=0o700, exist_ok=True)
        os.environ["COSMOS_PROFILER_HOST"] = host
    children = [_fork(run_rank, args, node, local, node_dir) for local in range(args.ranks_per_node)]
    _write_json(os.path.join(args.reports, f"node-{node}.json"), {
        "node": node, "pid": os.getpid(), "ranks": children, "host": socket.gethostname(),
        "node_dir": node_dir, "namespaces": namespaces,
    })
    _wait_for_term(children)


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--nodes", type=int, required=True)
    p.add_argument("--ranks-per-node", type=int, default=8)
    p.add_argument("--registry", required=True)
    p.add_argument("--output", required=True)
    p.add_argument("--replica", required=True)
    p.add_argument("--node-dir", required=True, help="the node-local directory (a tmpfs per node where permitted)")
    p.add_argument("--reports", required=True)
    p.add_argument("--node-agent", choices=("on", "off"), default="off")
    p.add_argument("--pace", type=float, default=10.0, help="steps a second of every rank")
    p.add_argument("--namespaces", choices=("auto", "off"), default="auto")
    p.add_argument("--traced-nodes", default="", help="comma-separated node numbers to run under strace")
    p.add_argument("--strace-dir", default="", help="where strace writes node-<i>.txt")
    p.add_argument("--only-node", type=int, help=argparse.SUPPRESS)  # one node, in this interpreter (under strace)
    args = p.parse_args()

    import gc
    import importlib.metadata  # noqa: F401 - what install() loads lazily, imported here to be shared
    import logging

    import psutil  # noqa: F401

    import sidecar  # noqa: F401 - imported once, shared by every fork
    import sidecar.rank.core  # noqa: F401
    import sidecar.rank.fr_env  # noqa: F401

    logging.getLogger("sidecar").setLevel(logging.WARNING)
    assert "torch" not in sys.modules, "the zygote imported torch"
    gc.freeze()  # the forks' collections leave the zygote's objects (and their pages) alone
    signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM})  # nodes and ranks inherit it: sigwait, or unblock
    if args.only_node is not None:
        run_node(args, args.only_node, args.namespaces == "auto")
        return 0
    os.makedirs(args.node_dir, mode=0o700, exist_ok=True)
    os.makedirs(args.reports, exist_ok=True)
    why = "off by --namespaces off" if args.namespaces == "off" else probe_namespaces(args.node_dir)
    namespaces = not why
    traced = {int(i) for i in args.traced_nodes.split(",") if i.strip()}
    nodes = [_fork(traced_node if i in traced else run_node, args, i, namespaces) for i in range(args.nodes)]
    print("READY " + json.dumps({"pid": os.getpid(), "nodes": nodes, "namespaces": namespaces,
                                 "why_not": why}), flush=True)
    signal.sigwait({signal.SIGTERM})
    # A traced node's child is strace: the node itself (strace's child) is told to stop, strace follows it out.
    targets = []
    for i, pid in enumerate(nodes):
        try:
            with open(os.path.join(args.reports, f"node-{i}.json")) as f:
                targets.append(json.load(f)["pid"])
        except (OSError, ValueError, KeyError):
            targets.append(pid)
    _stop_children(nodes, targets)
    return 0


if __name__ == "__main__":
    sys.exit(main())
