"""11. Fleet scale: what a fleet of training ranks costs the shared registry, before and after the node agent.

A simulated fleet (benchmarks/programs/fleetsim.py): N nodes of 8 ranks, each rank a light
forked process running the real rank side (`sidecar.install()`, `sc.step()` 10 times a
second, no torch), each node with its own host name and its own node-local tmpfs (UTS and
mount namespaces where the kernel permits), polling as on a network filesystem
(`COSMOS_PROFILER_WATCH=poll`, default intervals: poll 1 s, heartbeat 5 s). The same fleet
runs twice in one sitting, the node agent off (every rank polls the control file and
rewrites its own record: before) and on (one rank per node polls and writes one node record:
after, where this tree has `sidecar.rank.nodeagent`).

Per fleet, at rest (every record up, then a settle of a few heartbeats, no request):

- path syscalls on the shared registry, counted by the kernel: the whole fleet runs under
  `strace -f --seccomp-bpf -e trace=%file -y -ttt` (only the file syscalls stop; each line
  names its paths, descriptors decoded), and a syscall counts when a path it names (a path
  argument, or a directory or file descriptor's path) lies under the registry; per second,
  per node and per rank, over the rest window; also the node-local and all file syscalls;
- CPU per node: the CPU time of the node's processes (its ranks and all their threads, the
  scheduler's ns accounting in /proc/<pid>/task/<tid>/schedstat) over the same window, as %
  of one core;

then, from this machine as a login node would (its own host name, so every rank is remote and
alive by its record's age):

- `replica ls` wall time (the CLI as a subprocess, interpreter start included);
- `profile set fleet -rf all --no-wait --start-step S` until every rank's record shows the
  request armed (records read with `sidecar.common.recordscan.read_records`), S ten minutes
  of steps ahead so that no capture starts (a capture would import torch), then
  `profile cancel` until none is armed.

Each rank reports at its end whether torch was imported and what host name it saw; the
rows' notes say so. `python -m benchmarks.fleet_scale --trial ...` runs one fleet and writes
what it measured as JSON (tests/e2e/test_fleet_sim.py).
"""

from __future__ import annotations

import argparse
import contextlib
import importlib.util
import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from benchmarks.common import CLI_MODULE, PYTHON, Row, child_env, median, missing_row, wait_for, wait_ready
from benchmarks.common import main as bench_main

BENCH = "11 fleet scale"
REPLICA = "fleet"
RANKS_PER_NODE = 8
PACE = 10.0  # steps a second
SIZES = {False: (64, 256, 1024), True: (16, 64)}  # ranks; --quick: the second
WINDOW_S = {False: 20.0, True: 6.0}
SETTLE_S = {False: 12.0, True: 6.0}  # after every record is up: two heartbeats and the agents' election
LS_REPEATS = {False: 3, True: 2}
TRACE_NODES = {False: 16, True: 8}  # nodes under strace; the others' CPU is what strace did not touch
INOTIFY_LIMIT = "/proc/sys/fs/inotify/max_user_instances"
INOTIFY_HEADROOM = 256  # for the other processes of this user on the machine
LEAD_S = 600.0  # the start step's distance ahead: no capture starts before the cancel


# --- what this machine permits -------------------------------------------------------


def strace_missing() -> str:
    """'' when `strace -f --seccomp-bpf` can trace a child here, else why not."""
    if shutil.which("strace") is None:
        return "strace is not installed"
    try:
        done = subprocess.run(["strace", "-f", "--seccomp-bpf", "-qq", "-e", "trace=%file", "-o", os.devnull, "true"],
                              capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired) as exc:
        return f"strace could not run: {exc}"
    return "" if done.returncode == 0 else f"strace cannot trace here: {done.stderr.strip()[-300:]}"


def has_node_agent() -> bool:
    return importlib.util.find_spec("sidecar.rank.nodeagent") is not None


@contextlib.contextmanager
def inotify_instances(needed: int) -> Iterator[str]:
    """Room for `needed` inotify instances of this user while the fleet runs; yields what was done.

    A real node's 8 ranks take 8 of its user's instances (fs.inotify.max_user_instances, 128 by
    default); the simulated nodes share one kernel and one user, so 1,024 ranks would run out and
    fall back to polling their node-local directory (the node agent's ranks watch it). As root the
    limit is raised for the run and put back after; elsewhere the fallbacks are counted (`fallbacks`).
    """
    knob = Path(INOTIFY_LIMIT)
    try:
        old = int(knob.read_text())
    except (OSError, ValueError):
        yield "fs.inotify.max_user_instances unreadable"
        return
    if old >= needed:
        yield f"fs.inotify.max_user_instances {old}"
        return
    try:
        knob.write_text(str(needed))
    except OSError as exc:
        yield f"fs.inotify.max_user_instances {old}, could not raise it ({exc.strerror})"
        return
    try:
        yield f"fs.inotify.max_user_instances raised from {old} to {needed} for the run"
    finally:
        knob.write_text(str(old))


def fallbacks(log: Path) -> int:
    """Ranks whose inotify could not start (they poll instead), from the fleet's log."""
    try:
        return log.read_text(errors="replace").count("inotify cannot start")
    except OSError:
        return 0


# --- counting the kernel's lines -------------------------------------------------------


def _under(text: str, root: str) -> bool:
    return any(root + end in text for end in ('/', '"', '>'))


def _lines(paths: list[Path]) -> Iterator[str]:
    for path in paths:
        with open(path, errors="replace") as f:
            yield from f


def count_syscalls(traces: list[Path], t0: float, t1: float, registry: str, node_dir: str,
                   owner: dict[int, tuple[int, int]]) -> dict[str, Any]:
    """Count the file syscalls strace saw between t0 and t1.

    Args:
        traces: strace's outputs (`-f -ttt -y`: `TID EPOCH call(args) = result`), one per traced node.
        owner: thread id -> (node, rank), rank -1 for a node's own process.

    Returns:
        counts of syscalls naming a path under `registry`: in all, by node, by rank, by call,
        the polls of the control file by rank; and of those under `node_dir`, and of all.
    """
    control = f"{registry}/control/"
    registry_calls: Counter[str] = Counter()
    by_node: Counter[int] = Counter()
    by_rank: Counter[int] = Counter()
    control_polls: Counter[int] = Counter()
    num_registry = num_local = num_all = num_lines = unowned = 0
    for line in _lines(traces):
        parts = line.split(None, 2)
        if len(parts) < 3:
            continue
        num_lines += 1
        try:
            tid, at = int(parts[0]), float(parts[1])
        except ValueError:
            continue
        rest = parts[2]
        if not t0 <= at <= t1 or rest.startswith(("<...", "---", "+++")):
            continue  # the tail of a call counted at its start, a signal, an exit
        paren = rest.find("(")
        if paren <= 0:
            continue
        name = rest[:paren]
        cut = rest.rfind(") = ")
        args = rest[paren:cut] if cut > 0 else rest[paren:].split(" <unfinished", 1)[0]
        num_all += 1
        if _under(args, node_dir):
            num_local += 1
        if not _under(args, registry):
            continue
        num_registry += 1
        registry_calls[name] += 1
        node, rank = owner.get(tid, (-1, -1))
        if node < 0:
            unowned += 1
            continue
        by_node[node] += 1
        if rank >= 0:
            by_rank[rank] += 1
            if name in ("openat", "open") and control in args:
                control_polls[rank] += 1
    return {"registry": num_registry, "node_local": num_local, "all": num_all, "lines": num_lines,
            "unowned": unowned, "by_call": dict(registry_calls), "by_node": dict(by_node), "by_rank": dict(by_rank),
            "control_polls": dict(control_polls)}


# --- the processes of a node -----------------------------------------------------------


def _tasks(pid: int) -> list[int]:
    try:
        return [int(t) for t in os.listdir(f"/proc/{pid}/task")]
    except OSError:
        return []


def _cpu_s(pid: int) -> float:
    """CPU seconds of a process's live threads: the scheduler's ns accounting (schedstat), which
    the 10 ms ticks of utime + stime in /proc/<pid>/stat would round away over a window."""
    total = 0
    for tid in _tasks(pid):
        try:
            with open(f"/proc/{pid}/task/{tid}/schedstat") as f:
                total += int(f.read().split()[0])
        except (OSError, IndexError, ValueError):
            pass
    return total / 1e9


def _pss_mib(pids: list[int]) -> float:
    """The fleet's memory: the proportional set size of its processes (shared pages split among them)."""
    total = 0
    for pid in pids:
        try:
            with open(f"/proc/{pid}/smaps_rollup") as f:
                total += sum(int(line.split()[1]) for line in f if line.startswith("Pss:"))
        except (OSError, ValueError, IndexError):
            pass
    return total / 1024


def _owners(nodes: list[dict[str, Any]], ranks_per_node: int) -> dict[int, tuple[int, int]]:
    owner: dict[int, tuple[int, int]] = {}
    for info in nodes:
        for tid in _tasks(info["pid"]):
            owner[tid] = (info["node"], -1)
        for local, pid in enumerate(info["ranks"]):
            for tid in _tasks(pid):
                owner[tid] = (info["node"], info["node"] * ranks_per_node + local)
    return owner


def _node_cpu_s(nodes: list[dict[str, Any]]) -> dict[int, float]:
    return {info["node"]: sum(_cpu_s(pid) for pid in [info["pid"], *info["ranks"]]) for info in nodes}


# --- the CLI, from this machine ---------------------------------------------------------


def _cli(args: list[str], timeout: float = 300.0) -> tuple[float, subprocess.CompletedProcess]:
    t0 = time.perf_counter()
    done = subprocess.run([PYTHON, "-m", CLI_MODULE, *args], env=child_env(), capture_output=True, text=True,
                          timeout=timeout)
    wall = time.perf_counter() - t0
    if done.returncode != 0:
        raise RuntimeError(f"cosmos-profiler {' '.join(args)} failed ({done.returncode}): "
                           f"{(done.stdout + done.stderr).strip()[-2000:]}")
    return wall, done


def _records(registry: Path) -> list[Any]:
    """Every rank's record as the CLI reads it: rank files and node records (`read_records`)."""
    from sidecar.common.recordscan import read_records

    return read_records(registry, REPLICA)


def _armed(records: list[Any], request_id: str) -> int:
    return sum(1 for r in records if r.request_id == request_id and r.state == "armed")


def _until_armed(registry: Path, num: int, request_id: str, started: float) -> tuple[float, int]:
    """Milliseconds from `started` until every rank's record shows `request_id` armed; how many did."""
    wait_for(lambda: _armed(_records(registry), request_id) >= num or None, 120 + num * 0.1, interval=0.1,
             what=f"{num} ranks armed")
    return (time.time() - started) * 1000, _armed(_records(registry), request_id)


def _until_disarmed(registry: Path, num: int, started: float) -> float:
    wait_for(lambda: not any(r.state == "armed" for r in _records(registry)), 120 + num * 0.1, interval=0.1,
             what="every rank disarmed")
    return (time.time() - started) * 1000


def _start_step(registry: Path) -> int:
    return max(r.step for r in _records(registry)) + int(LEAD_S * PACE)


def operate(registry: Path, num: int, ls_repeats: int) -> dict[str, Any]:
    """`replica ls`; `profile set -rf all` until every rank is armed, then `profile cancel`; the same
    request written in process through `write_request` (what the CLI writes with), then its cancel.

    A CLI that cannot see the ranks (one that does not read node records yet) leaves `cli_error`."""
    from sidecar.common.registry import write_request
    from sidecar.common.request import ControlRequest, parse_rank_filter

    out: dict[str, Any] = {"cli_error": ""}
    out["ls_ms"] = [_cli(["replica", "ls", "--registry", str(registry)])[0] * 1000 for _ in range(ls_repeats)]
    listing = json.loads(_cli(["replica", "ls", "--json", "--registry", str(registry)])[1].stdout)
    mine = [r for r in listing["replicas"] if r["replica"] == REPLICA]
    out["ls_alive"] = mine[0]["num_alive"] if mine else 0
    if out["ls_alive"] < num:
        out["cli_error"] = f"replica ls saw {out['ls_alive']} of {num} ranks alive"
    else:
        started = time.time()
        try:
            wall, done = _cli(["profile", "set", REPLICA, "-rf", "all", "--no-wait", "--start-step",
                               str(_start_step(registry)), "--json", "--registry", str(registry)])
        except RuntimeError as exc:
            out["cli_error"] = str(exc)
        else:
            out["set_cli_ms"] = wall * 1000
            out["armed_ms"], out["armed"] = _until_armed(registry, num, json.loads(done.stdout)["request_id"], started)
            started = time.time()
            _cli(["profile", "cancel", REPLICA, "--no-wait", "--json", "--registry", str(registry)])
            out["cancel_ms"] = _until_disarmed(registry, num, started)

    everyone = parse_rank_filter("all")
    request_id = f"bench-{os.urandom(3).hex()}"
    request = ControlRequest(id=request_id, rank_filter=everyone, start_step=_start_step(registry))
    started = time.time()
    write_request(registry, REPLICA, request)
    out["write_armed_ms"], out["write_armed"] = _until_armed(registry, num, request_id, started)
    started = time.time()
    write_request(registry, REPLICA, ControlRequest(id=f"{request_id}-cancel", kind="cancel", rank_filter=everyone))
    out["write_cancel_ms"] = _until_disarmed(registry, num, started)
    return out


# --- one fleet ------------------------------------------------------------------------------


def traced_nodes(num_nodes: int, most: int) -> list[int]:
    """Which nodes run under strace: all of them up to `most`, else `most` spread evenly."""
    if num_nodes <= most:
        return list(range(num_nodes))
    return [i * num_nodes // most for i in range(most)]


def trial(base: Path, num_nodes: int, mode: str, *, ranks_per_node: int = RANKS_PER_NODE, window: float = 20.0,
          settle: float = 12.0, ls_repeats: int = 3, trace_nodes: int = 16, ops: bool = True) -> dict[str, Any]:
    """Start a fleet, measure it at rest (the syscalls of its traced nodes, every node's CPU), then
    from the CLI (`ops`), stop it; return what was measured.

    At most `trace_nodes` nodes run under strace: a traced process waits for the tracer at every
    file syscall, node-local ones too, and one tracer on a loaded machine falls behind a whole
    fleet (1,024 ranks of the node agent took minutes to come up). A node's count does not depend
    on the others' (the fleet's size reaches it only through WORLD_SIZE, which every node has),
    so the fleet's rate is the traced nodes' mean times the number of nodes; CPU is read on the
    nodes that are not traced."""
    with inotify_instances(num_nodes * ranks_per_node + INOTIFY_HEADROOM) as inotify:
        result = _trial(base, num_nodes, mode, ranks_per_node=ranks_per_node, window=window, settle=settle,
                        ls_repeats=ls_repeats, traced=traced_nodes(num_nodes, trace_nodes), ops=ops)
    result["inotify"] = inotify
    result["inotify_fallbacks"] = fallbacks(base / "stdout")
    return result


def _trial(base: Path, num_nodes: int, mode: str, *, ranks_per_node: int, window: float, settle: float,
           ls_repeats: int, traced: list[int], ops: bool) -> dict[str, Any]:
    base.mkdir(parents=True)
    registry, node_dir, reports, strace_dir = base / "registry", base / "nodelocal", base / "reports", base / "strace"
    strace_dir.mkdir()
    num = num_nodes * ranks_per_node
    cmd = [PYTHON, "-m", "benchmarks.programs.fleetsim", "--nodes", str(num_nodes), "--ranks-per-node",
           str(ranks_per_node), "--registry", str(registry), "--output", str(base / "out"), "--replica", REPLICA,
           "--node-dir", str(node_dir), "--reports", str(reports), "--node-agent", mode, "--pace", str(PACE),
           "--traced-nodes", ",".join(map(str, traced)), "--strace-dir", str(strace_dir)]
    log_path = base / "stdout"
    result: dict[str, Any] = {"mode": mode, "nodes": num_nodes, "ranks": num, "ranks_per_node": ranks_per_node,
                              "window_s": window, "base": str(base), "traced_nodes": traced}
    with open(log_path, "wb") as log:
        proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, env=child_env(), cwd=base,
                                start_new_session=True)
    zygote = 0
    nodes: list[dict[str, Any]] = []
    try:
        ready = json.loads(wait_ready(proc, log_path, timeout=120 + num * 0.2).split(" ", 1)[1])
        zygote = ready["pid"]
        result["namespaces"], result["why_not"] = ready["namespaces"], ready["why_not"]
        wait_for(lambda: len(list(reports.glob("node-*.json"))) >= num_nodes, 120, interval=0.1,
                 what=f"{num_nodes} nodes forked")
        nodes = sorted((json.loads(p.read_text()) for p in reports.glob("node-*.json")), key=lambda n: n["node"])
        t_up = time.monotonic()
        wait_for(lambda: len(_records(registry)) >= num or None, 120 + num * 0.3, interval=0.5,
                 what=f"{num} rank records")
        result["up_s"] = time.monotonic() - t_up
        time.sleep(settle)
        owner = _owners(nodes, ranks_per_node)
        cpu0, t0 = _node_cpu_s(nodes), time.time()
        time.sleep(window)
        cpu1, t1 = _node_cpu_s(nodes), time.time()
        owner.update(_owners(nodes, ranks_per_node))
        result["t0"], result["t1"] = t0, t1
        span = t1 - t0
        result["cpu_pct_by_node"] = {i: (cpu1[i] - cpu0[i]) / span * 100 for i in cpu0}
        result["pss_mib"] = _pss_mib([zygote, *(pid for n in nodes for pid in [n["pid"], *n["ranks"]])])
        records = _records(registry)
        result["record_hosts"] = {r.rank: r.host for r in records}
        if ops:
            result.update(operate(registry, num, ls_repeats))
    finally:
        if zygote:
            try:
                os.kill(zygote, signal.SIGTERM)
            except ProcessLookupError:
                pass
        try:
            proc.wait(timeout=60)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(timeout=30)
    result["node_reports"] = nodes
    result["rank_reports"] = sorted((json.loads(p.read_text()) for p in reports.glob("rank-*.json")),
                                    key=lambda r: r["rank"])
    result["strace_files"] = [str(strace_dir / f"node-{i}.txt") for i in traced]
    result["syscalls"] = count_syscalls([Path(f) for f in result["strace_files"]], result["t0"], result["t1"],
                                        str(registry), str(node_dir), owner)
    return result


def checks(t: dict[str, Any], operated: bool = True) -> list[str]:
    """What a fleet got wrong, each in a line: hosts, torch, reports, and (`operated`) ranks armed."""
    wrong = list(t.get("traced_checks", []))
    rpn = t["ranks_per_node"]
    bad_hosts = {k: h for k, h in t["record_hosts"].items() if h != f"node-{int(k) // rpn}"}
    if bad_hosts:
        wrong.append(f"records with another node's host: {dict(list(bad_hosts.items())[:5])}")
    if len(t["record_hosts"]) != t["ranks"]:
        wrong.append(f"{len(t['record_hosts'])} of {t['ranks']} rank records")
    if len(t["rank_reports"]) != t["ranks"]:
        wrong.append(f"{len(t['rank_reports'])} of {t['ranks']} ranks reported at their end")
    torch = [r["rank"] for r in t["rank_reports"] if r["torch"]]
    if torch:
        wrong.append(f"torch imported in ranks {torch[:10]}")
    if operated and "write_armed" not in t:
        wrong.append("no request was written")
    for key in ("armed", "write_armed"):
        if key in t and t[key] != t["ranks"]:
            wrong.append(f"{t[key]} of {t['ranks']} ranks armed ({key})")
    return wrong


# --- rows -------------------------------------------------------------------------------------


def _per_node(t: dict[str, Any]) -> float:
    """Shared-registry path syscalls a second of one node: the traced nodes' mean."""
    return t["syscalls"]["registry"] / (t["t1"] - t["t0"]) / len(t["traced_nodes"])


def _rate(t: dict[str, Any]) -> float:
    """The fleet's: every node at the traced nodes' mean (all nodes traced up to TRACE_NODES)."""
    return _per_node(t) * t["nodes"]


def _per_rank(t: dict[str, Any]) -> float:
    return _per_node(t) / t["ranks_per_node"]


def _cpu_node(t: dict[str, Any]) -> float:
    """CPU % of a core of the median node that strace did not slow (of every node, where all were traced)."""
    quiet = [v for i, v in t["cpu_pct_by_node"].items() if int(i) not in t["traced_nodes"]]
    return median(quiet or list(t["cpu_pct_by_node"].values()))


def _cli_ok(t: dict[str, Any]) -> bool:
    return not t.get("cli_error")


def size_rows(before: dict[str, Any], after: dict[str, Any] | None, why_no_after: str) -> list[Row]:
    """Four rows per size; `after` None: not measured (`why_no_after`)."""
    num, nodes = before["ranks"], before["nodes"]
    label = f"{num:,} ranks ({nodes} nodes x {before['ranks_per_node']})"
    where = ("own UTS + mount namespaces, a tmpfs node dir each" if before["namespaces"]
             else f"no namespaces ({before['why_not']}): COSMOS_PROFILER_HOST and a dir per node")
    faults = checks(before) + (checks(after) if after else [])
    cli_note = "".join(f" The CLI in the {name} fleet: {t['cli_error']}." for name, t in (("before", before),
                                                                                         ("after", after))
                       if t and not _cli_ok(t))
    inotify = before.get("inotify", "")
    spilled = before.get("inotify_fallbacks", 0) + (after.get("inotify_fallbacks", 0) if after else 0)
    note = (f"Simulated fleet of {label}: light forked ranks running the real rank side at {PACE:g} steps/s, no torch, "
            f"{where}; poll 1 s, heartbeat 5 s; {inotify}"
            + (f" ({spilled} ranks could not start inotify and polled their node dir)" if spilled else "")
            + f". Before = node agent off, after = on, same run. Syscalls: {len(before['traced_nodes'])} of {nodes} "
            "nodes ran under strace -f --seccomp-bpf -e trace=%file -y, counted in the window, the fleet's rate = their "
            "mean x nodes; CPU: the median node not traced. "
            + ("Checks: every record shows its node's host, no rank imported torch, every rank armed."
               if not faults else "CHECKS FAILED: " + "; ".join(faults))
            + ("" if after else f" After: not measured ({why_no_after}).") + cli_note)

    def pair(case: str, pick: Any, unit: str, delta: Any, usable: Any = lambda t: True,
             extra: dict[str, Any] | None = None) -> Row:
        b = pick(before) if usable(before) else None
        a = pick(after) if after and usable(after) else None
        if a is None or b is None:
            shown, why = (a, "after only") if b is None else (b, "before only")
            return Row(BENCH, f"{label}: {case}" + (" [after]" if b is None else " [before]"), shown, unit,
                       delta=why, target="–", note=note, extra=extra or {})
        return Row(BENCH, f"{label}: {case}", a, unit, baseline=b, baseline_label="node agent off",
                   delta=delta(a, b), target="–", note=note, extra=extra or {})

    rows = [
        pair("shared-registry path syscalls/s at rest", _rate, "/s",
             lambda a, b: (f"{b / a:.1f}x fewer" if a else "none after") + f"; per node {_per_node(after):.2f} vs "
                          f"{_per_node(before):.2f}/s, per rank {_per_rank(after):.3f} vs {_per_rank(before):.3f}/s",
             extra={"before": _syscall_extra(before), "after": _syscall_extra(after) if after else None}),
        pair("CPU per node (8 ranks stepping) at rest", _cpu_node, "%",
             lambda a, b: f"{a / b:.2f}x (% of a core, median node)"),
        pair("request written -> every rank armed", lambda t: t["write_armed_ms"], "ms", lambda a, b: f"{a / b:.2f}x"),
        pair("profile set -rf all (CLI) until every rank armed", lambda t: t["armed_ms"], "ms",
             lambda a, b: f"{a / b:.2f}x; CLI alone {after['set_cli_ms']:.0f} vs {before['set_cli_ms']:.0f} ms",
             usable=_cli_ok),
        pair("replica ls (wall)", lambda t: median(t["ls_ms"]), "ms", lambda a, b: f"{a / b:.2f}x", usable=_cli_ok),
    ]
    if after is None:
        rows[0].delta = f"before only: per node {_per_node(before):.2f}/s, per rank {_per_rank(before):.3f}/s"
    return rows


def _syscall_extra(t: dict[str, Any]) -> dict[str, Any]:
    s, span = t["syscalls"], t["t1"] - t["t0"]
    keys = ("armed_ms", "cancel_ms", "set_cli_ms", "write_armed_ms", "write_cancel_ms", "ls_ms", "ls_alive", "up_s",
            "pss_mib", "cli_error", "cpu_pct_by_node", "traced_nodes", "inotify", "inotify_fallbacks")
    return {"per_s": s["registry"] / span, "node_local_per_s": s["node_local"] / span, "all_file_per_s": s["all"] / span,
            "by_call_per_s": {k: v / span for k, v in sorted(s["by_call"].items())},
            "per_node_per_s": _per_node(t), "max_node_per_s": max(s["by_node"].values(), default=0) / span,
            "unowned": s["unowned"],
            **{k: t[k] for k in keys if k in t}}


def measure(tmp: Path, num: int, mode: str, quick: bool) -> dict[str, Any]:
    """One fleet size in one mode."""
    t = trial(tmp / f"{num}-{mode}", num // RANKS_PER_NODE, mode, window=WINDOW_S[quick], settle=SETTLE_S[quick],
              ls_repeats=LS_REPEATS[quick], trace_nodes=TRACE_NODES[quick])
    print(json.dumps({k: v for k, v in t.items() if k not in ("node_reports", "rank_reports", "record_hosts")},
                     default=str), file=sys.stderr, flush=True)
    return t


def run(quick: bool) -> list[Row]:
    why = strace_missing()
    if why:
        return [missing_row(BENCH, "shared-registry path syscalls/s at rest", status=why)]
    why_no_after = "" if has_node_agent() else "this tree has no node agent (sidecar/rank/nodeagent.py)"
    tmp = Path(tempfile.mkdtemp(prefix="bench-fleet-"))
    rows: list[Row] = []
    for num in SIZES[quick]:
        try:
            before = measure(tmp, num, "off", quick)
            after = None if why_no_after else measure(tmp, num, "on", quick)
        except Exception as exc:  # noqa: BLE001 - one size failing leaves the others' rows
            import traceback

            traceback.print_exc()
            rows.append(Row(BENCH, "FAILED", None, "", status=f"{num:,} ranks: failed",
                            note=f"{num:,} ranks: {type(exc).__name__}: {exc}"))
            continue
        finally:
            for path in tmp.glob(f"{num}-*"):
                shutil.rmtree(path, ignore_errors=True)
        rows += size_rows(before, after, why_no_after)
    shutil.rmtree(tmp, ignore_errors=True)
    return rows


def trial_main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.fleet_scale --trial")
    p.add_argument("--trial", action="store_true")
    p.add_argument("--nodes", type=int, default=2)
    p.add_argument("--ranks-per-node", type=int, default=2)
    p.add_argument("--mode", choices=("on", "off"), default="off")
    p.add_argument("--window", type=float, default=3.0)
    p.add_argument("--settle", type=float, default=1.0)
    p.add_argument("--base", required=True, help="a directory to create for the fleet's files")
    p.add_argument("--out", required=True, help="write what was measured here (JSON)")
    args = p.parse_args(argv)
    t = trial(Path(args.base), args.nodes, args.mode, ranks_per_node=args.ranks_per_node, window=args.window,
              settle=args.settle, ls_repeats=1)
    t["checks"] = checks(t)
    Path(args.out).write_text(json.dumps(t, indent=1, default=str))
    return 0


if __name__ == "__main__":
    if "--trial" in sys.argv[1:]:
        sys.exit(trial_main(sys.argv[1:]))
    bench_main(run)
