"""5. Registry scale: the CLI against large replicas, and many real watchers.

Listing: `replica ls` and `replica lsr NAME` (as subprocesses, interpreter
start included) against a registry holding one replica of 100, 1,000 and
10,000 simulated rank records (written directly; remote hosts with fresh
heartbeats, so the CLI decides liveness by heartbeat age, as it would for a
multi-node job seen from a login node), next to the same command on a
one-record registry; plus `lsr` of 1,000 same-host records, where the CLI
checks each pid and its create time.

`profile set NAME -rf all` on a replica of 1,000 simulated ranks.

Growth: `replica ls` and `profile status NAME` over 100, 1,000 and 10,000
records, on local disk and through an sshfs mount of a local sshd on
127.0.0.1 (tests/support/netfs.py; sshfs's default caching: attributes and
directory entries for 20 s, but every open, read and close goes to the
server), where the CLI reads the records on a pool of threads. And `profile set --wait`'s
poll over 1,000 records (`sidecar.common.recordscan.RecordReader`, in process): a poll
that finds nothing changed against one that reads every record.

Node records (issue 29: one node agent per node rolls its ranks' records up into one file,
`nodes/<shard>/<host>.json`): `replica ls` and `replica lsr` of 10,000 ranks written as
1,250 node records of 8 ranks (each with a pace anchor the CLI projects), next to the same
ranks as 10,000 rank files and to a one-record registry (the CLI's floor), interleaved in one
run, on local disk and through sshfs; reported as ratios.

Fan-out: a fleet of real sidecars (benchmarks/programs/fleet.py: forked
processes, no torch, polling the control file every 1 s, never stepping) and
one `profile set NAME -rf all --no-wait` from the CLI; the parent reads every
rank record until each shows the request armed, and reports the time from the
CLI's write (the control file's mtime) to the last rank.
"""

from __future__ import annotations

import compileall
import os
import resource
import subprocess
import tempfile
import time
from pathlib import Path

from benchmarks.common import (
    CLI_MODULE,
    PYTHON,
    ROOT,
    Row,
    child_env,
    cli_available,
    median,
    missing_row,
    python_start_wall,
    read_json,
    run_cli,
    stop_child,
    wait_for,
    wait_ready,
    write_fake_records,
    write_toml,
)
from benchmarks.common import main as bench_main
from sidecar.common.layout import control_path, record_path, replica_dir

BENCH = "5 registry scale"
SIM = "sim"
FLEET = "fleet"


def _walls(args: list[str], repeats: int) -> list[float]:
    return [run_cli(args)[0] * 1000 for _ in range(repeats)]


def _walls_cpu(args: list[str], repeats: int, tree: Path | None = None) -> tuple[list[float], list[float]]:
    """Wall and CPU (user + sys of the waited child, getrusage) milliseconds of each run:
    a loaded machine inflates CPU time far less than wall time. `tree`: as `run_cli`'s."""
    walls, cpus = [], []
    for _ in range(repeats):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        walls.append(run_cli(args, tree=tree)[0] * 1000)
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpus.append((after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime) * 1000)
    return walls, cpus


# The CLI as it was when issue 29 was filed (the parent of its first commit): "today" in the issue's
# "at least 5x faster than today at 10,000 ranks", run from `git archive` beside this checkout's.
BEFORE_ISSUE_29 = "67a467d^"


def before_tree(tmp: Path) -> tuple[Path | None, str]:
    """(a directory holding the `sidecar/` package of BEFORE_ISSUE_29, or None; why not)."""
    tree = tmp / "before-issue-29"
    if (tree / "sidecar").is_dir():
        return tree, ""
    tree.mkdir(parents=True, exist_ok=True)
    try:
        archive = subprocess.run(["git", "-C", str(ROOT), "archive", BEFORE_ISSUE_29, "sidecar"], capture_output=True,
                                 timeout=60, check=True).stdout
        subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, capture_output=True, timeout=60, check=True)
    except (OSError, subprocess.SubprocessError) as exc:
        return None, f"the CLI of {BEFORE_ISSUE_29} is not in this checkout's history ({exc})"
    compileall.compile_dir(tree / "sidecar", quiet=1)  # as benchmarks.run compiles this tree's
    return tree, ""


def listing_rows(tmp: Path, sizes: tuple[int, ...], repeats: int) -> list[Row]:
    one = tmp / "reg-1"
    write_fake_records(one, SIM, range(1))
    registries = {n: tmp / f"reg-{n}" for n in sizes}
    for n, root in registries.items():
        write_fake_records(root, SIM, range(n))
    same_host = tmp / "reg-same-host"
    write_fake_records(same_host, SIM, range(1000), same_host=True)

    note = ("CLI subprocess wall time (interpreter start included) against one replica of N simulated rank records "
            "(remote hosts, fresh heartbeats); baseline = the same command on a one-record registry; "
            "median of the repeats, interleaved.")
    results: dict[tuple[str, int | str], list[float]] = {}
    starts: list[float] = []
    for _ in range(repeats):
        starts += [w * 1000 for w in python_start_wall(1)]
        for cmd in ("ls", "lsr"):
            for n, root in [(1, one), *registries.items(), ("same-host", same_host)]:
                if cmd == "ls" and n == "same-host":
                    continue
                args = ["replica", cmd] + ([SIM] if cmd == "lsr" else []) + ["--registry", str(root)]
                results.setdefault((cmd, n), []).extend(_walls(args, 1))
    rows = []
    for cmd in ("ls", "lsr"):
        base = median(results[(cmd, 1)])
        for n in sizes:
            values = results[(cmd, n)]
            per_record = (median(values) - base) / n * 1000
            big = n == 10_000
            rows.append(Row(
                BENCH, f"replica {cmd}, {n:,} records", median(values), "ms", baseline=base,
                baseline_label="1 record", delta=f"{median(values) / base:.2f}x ({per_record:.0f} us/record)",
                samples=values, target="< 1 s" if big else "–", met=median(values) < 1000 if big else None,
                note=note))
    values = results[("lsr", "same-host")]
    base = median(results[("lsr", 1)])
    rows.append(Row(
        BENCH, "replica lsr, 1,000 same-host records (pid checks)", median(values), "ms", baseline=base,
        baseline_label="1 record", delta=f"{median(values) / base:.2f}x ({(median(values) - base) / 1000 * 1000:.0f} us/record)",
        samples=values, target="–",
        note="As above, but every record names a live process on this host, so the CLI checks its pid and create "
             "time (psutil) for each."))
    rows.append(Row(BENCH, "python -c pass (interpreter start)", median(starts), "ms", samples=starts,
                    note="The floor under every CLI row: a bare interpreter start in the same run."))
    return rows


def profile_set_rows(tmp: Path, repeats: int) -> list[Row]:
    root = tmp / "reg-set"
    write_fake_records(root, SIM, range(1000))
    one = tmp / "reg-set-1"
    write_fake_records(one, SIM, range(1))
    walls, base = [], []
    for _ in range(repeats):
        base += _walls(["profile", "set", SIM, "-rf", "all", "--no-wait", "--registry", str(one)], 1)
        walls += _walls(["profile", "set", SIM, "-rf", "all", "--no-wait", "--registry", str(root)], 1)
    return [Row(
        BENCH, "profile set -rf all, 1,000 simulated ranks", median(walls), "ms", baseline=median(base),
        baseline_label="1 rank", delta=f"{median(walls) / median(base):.2f}x", samples=walls, target="–",
        note="`profile set NAME -rf all --no-wait` (default start step: the replica's step plus a lead) against "
             "1,000 simulated records (they never arm, so every repeat is accepted); baseline = the same against one "
             "record; wall time of the CLI subprocess.")]


def fleet_trial(tmp: Path, num: int, trial: int) -> dict[str, float]:
    base = tmp / f"fleet-{trial}"
    base.mkdir()
    registry = base / "reg"
    config = write_toml(base / "job.toml", {"watch": "poll", "poll_interval": 1.0})
    log = open(base / "stdout", "wb")
    proc = subprocess.Popen(
        [PYTHON, "-m", "benchmarks.programs.fleet", "--num", str(num), "--registry", str(registry), "--output",
         str(base / "out"), "--replica", FLEET, "--config", str(config)],
        stdout=log, stderr=subprocess.STDOUT, env=child_env(), start_new_session=True,
    )
    try:
        wait_ready(proc, base / "stdout")
        paths = [record_path(registry, FLEET, k) for k in range(num)]

        def heartbeat_age(path: Path) -> float:
            """Seconds from the rank's start to its last heartbeat, as the CLI reads it: the
            newer of `heartbeat_at` and, for a record with `mtime_heartbeat`, its mtime."""
            r = read_json(path)
            if not r:
                return 0.0
            beat = r.get("heartbeat_at", 0)
            if r.get("mtime_heartbeat"):
                try:
                    beat = max(beat, os.stat(path).st_mtime)
                except OSError:
                    return 0.0
            return beat - r.get("started_at", 0)

        def all_published() -> bool:
            return all(heartbeat_age(p) > 0.6 for p in paths)

        wait_for(all_published, 120, interval=0.2, what=f"{num} fleet records")
        started = time.perf_counter()
        cli = subprocess.Popen([PYTHON, "-m", CLI_MODULE, "profile", "set", FLEET, "-rf", "all", "--no-wait",
                                "--registry", str(registry)], env=child_env(), stdout=subprocess.DEVNULL,
                               stderr=subprocess.PIPE)
        seen: dict[int, float] = {}
        armed_at: dict[int, float] = {}
        deadline = time.monotonic() + 60
        wall = None
        while len(seen) < num and time.monotonic() < deadline:
            for k, p in enumerate(paths):
                if k in seen:
                    continue
                rec = read_json(p)
                if rec and rec.get("request_id") and rec.get("state") == "armed":
                    seen[k] = time.time()
                    armed = [h["at"] for h in rec.get("history", []) if h.get("state") == "armed"]
                    if armed:
                        armed_at[k] = armed[-1]
            if wall is None and cli.poll() is not None:
                wall = (time.perf_counter() - started) * 1000
            time.sleep(0.002)
        _, err = cli.communicate(timeout=60)
        if wall is None:
            wall = (time.perf_counter() - started) * 1000
        if cli.returncode != 0:
            raise RuntimeError(f"profile set on the fleet failed: {err.decode()[-2000:]}")
        if len(seen) < num:
            raise RuntimeError(f"only {len(seen)} of {num} fleet ranks armed within 60 s")
        t0 = control_path(registry, FLEET).stat().st_mtime_ns / 1e9
        record_ms = sorted((t - t0) * 1000 for t in seen.values())
        armed_ms = sorted((t - t0) * 1000 for t in armed_at.values())
        return {"last_record_ms": record_ms[-1], "p50_record_ms": median(record_ms),
                "last_armed_ms": armed_ms[-1] if armed_ms else float("nan"),
                "p50_armed_ms": median(armed_ms) if armed_ms else float("nan"), "cli_wall_ms": wall}
    finally:
        if proc.poll() is None:
            proc.terminate()
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                pass
        stop_child(proc)
        log.close()


def fleet_rows(tmp: Path, num: int, repeats: int) -> list[Row]:
    trials = [fleet_trial(tmp, num, t) for t in range(repeats)]
    last = [t["last_record_ms"] for t in trials]
    note = (f"{num} real sidecars (forked processes, no torch, never stepping) polling the control file every 1 s; "
            "one `profile set fleet -rf all --no-wait` from the CLI; the parent reads every rank record until each "
            "shows the request armed. Value = from the CLI's write (control file mtime) to the last record armed; a "
            "fresh fleet per repeat (armed ranks would refuse a second request).")
    return [
        Row(BENCH, f"fan-out: {num} polling watchers (1 s), write -> last record armed", median(last), "ms",
            baseline=1000.0, baseline_label="poll interval",
            delta=f"p50 rank {median([t['p50_record_ms'] for t in trials]):.0f} ms; last armed in-process "
                  f"{median([t['last_armed_ms'] for t in trials]):.0f} ms",
            samples=last, target="< interval + 10 ms (1010 ms)", met=median(last) < 1010, note=note,
            extra={"trials": trials}),
        Row(BENCH, f"fan-out: CLI profile set -rf all on {num} live ranks (wall)",
            median([t["cli_wall_ms"] for t in trials]), "ms", samples=[t["cli_wall_ms"] for t in trials],
            target="–", note=note),
    ]


def write_fake_node_records(root: Path, replica: str, ranks: range, per_node: int = 8,
                            heartbeat_interval: float = 600.0) -> None:
    """The simulated ranks of `write_fake_records` (host node-<rank // 8>, remote, fresh), as a node
    agent would roll them up: one node record per host (sidecar.common.noderecord), each rank with
    a pace anchor (5 steps/s) that the CLI projects to the file's mtime."""
    from sidecar.common import noderecord
    from sidecar.common.layout import node_record_path
    from sidecar.common.records import RankRecord

    now = time.time()
    world = max(ranks) + 1
    for first in range(ranks.start, ranks.stop, per_node):
        host = f"node-{first // per_node}"
        entries = []
        for k in range(first, min(ranks.stop, first + per_node)):
            record = RankRecord(
                replica=replica, role="policy", rank=k, local_rank=k % per_node, world_size=world, host=host,
                pid=10_000 + k, started_at=now - 600, heartbeat_at=now, heartbeat_interval=heartbeat_interval,
                step=6000, watch="poll", version="bench", recent_steps=[[now - 0.5 - k / 1e4, 5998], [now - k / 1e4, 6000]],
                last_step_at=now - k / 1e4)
            # Each rank its own anchor: ranks of one node step apart by a little.
            entries.append(noderecord.entry(record, noderecord.Pace(now - k / 1e4, 6000, 5.0), True))
        path = node_record_path(root, replica, host, world, per_node)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(noderecord.build(replica, host, {"rank": first, "pid": 10_000 + first, "epoch": 1}, entries,
                                          now, 0.0, heartbeat_interval))


NODE_RANKS = 10_000


def node_rows(where: str, one: Path, files: Path, nodes: Path, repeats: int, before: Path | None = None,
              before_missing: str = "") -> list[Row]:
    """`replica ls` and `lsr` of NODE_RANKS ranks in node records against the same ranks in rank files
    (read by this CLI, and by the CLI before issue 29 from `before`, BEFORE_ISSUE_29's tree) and
    against a one-record registry, interleaved: the ratios, whole and above that floor."""
    rows: list[Row] = []
    note = (f"CLI subprocess wall time (interpreter start included) of {NODE_RANKS:,} simulated ranks (remote hosts, fresh "
            f"heartbeats) written as {NODE_RANKS // 8:,} node records of 8 ranks (nodes/<shard>/<host>.json, a pace anchor "
            f"each) against the same ranks as {NODE_RANKS:,} rank files, read by this CLI and by the CLI before issue 29 "
            f"({BEFORE_ISSUE_29}, its `sidecar/` from git archive: the issue's \"today\")"
            + (f" [{before_missing}]" if before is None else "")
            + ", and a one-record registry (the floor: interpreter start, imports, the clock probe), interleaved in one run, "
            + ("through sshfs on 127.0.0.1 (the CLI reading the files on 32 threads)" if where == "sshfs" else "on local disk")
            + ". Baseline: the CLI before issue 29 on the rank files; delta: that, and this CLI on the rank files, over "
            "node records, whole and above the floor; CPU: user+sys of the CLI (median).")
    cases: list[tuple[str, Path, Path | None]] = [("one", one, None), ("files", files, None), ("nodes", nodes, None)]
    if before is not None:
        cases.append(("before", files, before))
    for cmd in ("ls", "lsr"):
        runs: dict[str, tuple[list[float], list[float]]] = {label: ([], []) for label, _, _ in cases}
        for _ in range(repeats):
            for label, root, tree in cases:
                args = ["replica", cmd, *([SIM] if cmd == "lsr" else []), "--registry", str(root)]
                walls, cpus = _walls_cpu(args, 1, tree)
                runs[label][0].extend(walls)
                runs[label][1].extend(cpus)
        floor, by_files, by_nodes = (median(runs[k][0]) for k in ("one", "files", "nodes"))
        by_before = median(runs["before"][0]) if before is not None else None
        baseline = by_before if by_before is not None else by_files

        delta = (f"{by_before / by_nodes:.2f}x faster than before ({_above(by_before, by_nodes, floor):.1f}x above the "
                 f"{floor:.0f} ms floor); " if by_before is not None else "")
        rows.append(Row(
            BENCH, f"{where}: replica {cmd}, {NODE_RANKS:,} ranks in node records", by_nodes, "ms", baseline=baseline,
            baseline_label=(f"{NODE_RANKS:,} rank files, the CLI before issue 29" if by_before is not None
                            else f"{NODE_RANKS:,} rank files"),
            delta=delta + f"{by_files / by_nodes:.2f}x than this CLI on the rank files ({_above(by_files, by_nodes, floor):.1f}x above the "
            f"floor); CPU {median(runs['nodes'][1]):.0f} vs {median(runs['files'][1]):.0f} ms",
            samples=runs["nodes"][0], target=">= 5x faster than before", met=baseline / by_nodes >= 5.0, note=note,
            extra={"floor_ms": runs["one"][0], "files_ms": runs["files"][0], "cpu_ms": runs["nodes"][1],
                   "files_cpu_ms": runs["files"][1], "before_ms": runs["before"][0] if before is not None else None}))
    return rows


def _above(slower: float, faster: float, floor: float) -> float:
    """How many times faster above the floor: (slower - floor) / (faster - floor)."""
    return (slower - floor) / max(faster - floor, 1e-3)


GROWTH_TARGETS = {"local": (500.0, "< 0.5 s"), "sshfs": (3000.0, "< 3 s")}


def _growth_case(rows: list[Row], where: str, roots: dict[int, Path], repeats: int, starts: list[float]) -> None:
    note = (f"CLI subprocess wall time (interpreter start included; `python -c pass` = {median(starts):.0f} ms) over one "
            "replica of N simulated records (remote hosts, fresh heartbeats)"
            + ("; through sshfs on 127.0.0.1 (sshfs's default caches; every open, read and close is a round trip), "
               "the CLI reading the records on 32 threads" if where == "sshfs" else " on local disk") + ". Delta: the ratio to "
            "the 100-record row and the time per record above it: how the cost grows; CPU: the CLI process's user+sys time "
            "(getrusage of the waited child, median).")
    for cmd in (["replica", "ls"], ["profile", "status", SIM]):
        name = " ".join(cmd[:2])
        runs = {n: _walls_cpu([*cmd, "--registry", str(root)], repeats) for n, root in roots.items()}
        values = {n: walls for n, (walls, _) in runs.items()}
        small = min(values)
        for n, walls in values.items():
            big = n == 10_000
            limit, target = GROWTH_TARGETS[where]
            per = (median(walls) - median(values[small])) / max(n - small, 1) * 1000
            rows.append(Row(
                BENCH, f"{where}: {name}, {n:,} records", median(walls), "ms", baseline=median(values[small]),
                baseline_label=f"{small:,} records", delta=f"{median(walls) / median(values[small]):.2f}x"
                + (f" ({per:.0f} us/record)" if n != small else "") + f"; CPU {median(runs[n][1]):.0f} ms",
                samples=walls, target=target if big else "–", met=median(walls) < limit if big else None, note=note,
                extra={"cpu_ms": runs[n][1]}))


def growth_rows(tmp: Path, sizes: tuple[int, ...], repeats: int) -> list[Row]:
    starts = [w * 1000 for w in python_start_wall(3)]
    rows: list[Row] = []
    local = {n: tmp / f"reg-{n}" for n in sizes}
    for n, root in local.items():
        if not root.exists():
            write_fake_records(root, SIM, range(n))
    _growth_case(rows, "local", local, repeats, starts)
    nodes, one = tmp / f"node-{NODE_RANKS}", tmp / "reg-1"
    write_fake_node_records(nodes, SIM, range(NODE_RANKS))
    if not one.exists():
        write_fake_records(one, SIM, range(1))
    if NODE_RANKS in local:
        rows += node_rows("local", one, local[NODE_RANKS], nodes, repeats, *before_tree(tmp))
    try:
        from tests.support.netfs import NetFSUnavailable, SshfsServer
    except ImportError as exc:  # a tree without tests/
        return rows + [missing_row(BENCH, "sshfs: replica ls / profile status", "< 3 s", status=f"no tests/support ({exc})")]
    server = SshfsServer(tmp / "netfs")
    try:
        server.start()
        for n in sizes:
            write_fake_records(server.export / f"reg-{n}", SIM, range(n))
        write_fake_node_records(server.export / f"node-{NODE_RANKS}", SIM, range(NODE_RANKS))
        write_fake_records(server.export / "reg-1", SIM, range(1))
        mount = server.mount("client")
        _growth_case(rows, "sshfs", {n: mount / f"reg-{n}" for n in sizes}, repeats, starts)
        if NODE_RANKS in sizes:
            rows += node_rows("sshfs", mount / "reg-1", mount / f"reg-{NODE_RANKS}", mount / f"node-{NODE_RANKS}", repeats,
                              *before_tree(tmp))
    except NetFSUnavailable as exc:
        rows.append(missing_row(BENCH, "sshfs: replica ls / profile status", "< 3 s", status=f"sshfs unavailable: {exc}"))
    finally:
        server.close()
    return rows


def follow_rows(tmp: Path, num: int, repeats: int) -> list[Row]:
    """One poll of `profile set --wait` over `num` records: nothing changed, ten changed, or a full read."""
    try:
        from sidecar.common.recordscan import RecordReader, scan_records
    except ImportError:
        try:  # a sidecar from before the scans had a module of their own
            from sidecar.common.records import RecordReader, scan_records
        except ImportError:  # a sidecar from before the incremental reader
            return [missing_row(BENCH, f"--wait poll, {num:,} records, none changed", status="no RecordReader")]
    root = tmp / f"reg-follow-{num}"
    write_fake_records(root, SIM, range(num))
    then = time.time() - 60
    for path in replica_dir(root, SIM).iterdir():
        os.utime(path, (then, then))  # records the ranks wrote a while ago
    reader = RecordReader(root, SIM, parallel=False)
    reader.scan()
    full, unchanged, ten = [], [], []
    for _ in range(repeats):
        t0 = time.perf_counter()
        scan_records(root, SIM, parallel=False)
        full.append((time.perf_counter() - t0) * 1000)
        t0 = time.perf_counter()
        reader.scan()
        unchanged.append((time.perf_counter() - t0) * 1000)
        for k in range(10):
            path = record_path(root, SIM, k)
            os.utime(path, (then + 1, then + 1))
        t0 = time.perf_counter()
        reader.scan()
        ten.append((time.perf_counter() - t0) * 1000)
        for k in range(10):
            os.utime(record_path(root, SIM, k), (then, then))
        reader.scan()
    note = (f"`profile set --wait` polls its replica's records every 0.1 s. In process, {num:,} local records: one "
            "poll of a RecordReader (one scandir, one lstat per file, reading only the files whose stat changed) "
            "against reading and checking every record (what each poll did before).")
    return [
        Row(BENCH, f"--wait poll, {num:,} records, none changed", median(unchanged), "ms", baseline=median(full),
            baseline_label="every record read", delta=f"{median(full) / median(unchanged):.1f}x less",
            samples=unchanged, target="–", note=note),
        Row(BENCH, f"--wait poll, {num:,} records, 10 changed", median(ten), "ms", baseline=median(full),
            baseline_label="every record read", delta=f"{median(full) / median(ten):.1f}x less", samples=ten,
            target="–", note=note),
    ]


def run(quick: bool) -> list[Row]:
    tmp = Path(tempfile.mkdtemp(prefix="bench-registry-"))
    sizes = (100, 1000, 10_000)
    if not cli_available():
        rows = [missing_row(BENCH, f"replica {cmd}, {n:,} records", "< 1 s" if n == 10_000 else "–")
                for cmd in ("ls", "lsr") for n in sizes]
        rows.append(missing_row(BENCH, "profile set -rf all, 1,000 simulated ranks"))
        rows.append(missing_row(BENCH, "fan-out: polling watchers, write -> last record armed"))
        return rows
    rows = listing_rows(tmp, sizes, repeats=3 if quick else 7)
    rows += growth_rows(tmp, sizes, repeats=3 if quick else 5)
    rows += follow_rows(tmp, 1000, repeats=5 if quick else 20)
    rows += profile_set_rows(tmp, repeats=3 if quick else 7)
    rows += fleet_rows(tmp, num=50 if quick else 200, repeats=1 if quick else 3)
    return rows


if __name__ == "__main__":
    bench_main(run)
