"""One poller per node, with real training processes on simulated nodes (tests/support/nodes.py:
each node its own hostname and /dev/shm; the registry a directory every node sees).

The node agent (sidecar.rank.nodeagent) is elected among a node's ranks, relays requests from
the shared control file through the node-local dir, and rolls the node's records up into one
node record, which the CLI reads. Each fault of issue 29 is one test: the agent SIGKILLed with a
request in flight and after relaying one, the agent's rank holding the GIL, the node dir removed,
two jobs of one user on one node, another user's job on the node, a node whose clock is skewed.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import stat
import subprocess
from pathlib import Path

import pytest

from sidecar.common import layout, noderecord
from sidecar.common.recordscan import read_records
from support.cli import run_cli
from support.clockshim import ENV_OFFSET, build_clock_shim
from support.launch import PYTHON, ROOT, base_env
from support.nodes import SimNode, namespaces_permitted
from support.traces import load_trace, profiler_steps
from support.wait import wait_for

# As on shared storage: the control file polled, one agent per node; a short heartbeat, so
# that a takeover (within two heartbeats) is quick.
HEARTBEAT_S = 1.0


def _config(tmp_path: Path, poll: float = 0.3) -> Path:
    path = tmp_path / f"node-agent-{poll}.toml"
    path.write_text(f'[profiler]\nenable_profiler = true\n[sidecar]\nheartbeat_interval = {HEARTBEAT_S}\nwatch = "poll"\npoll_interval = {poll}\n'
                    'node_agent = "on"\n')
    return path


@pytest.fixture
def make_node(tmp_path):
    made: list[SimNode] = []

    def make(host: str) -> SimNode:
        node = SimNode(tmp_path, host)
        made.append(node)
        return node

    yield make
    for node in made:
        node.close()


def _rank(spawn, node: SimNode, registry: Path, config: Path, replica: str, rank: int, world: int, local: int,
          *args: str, out: Path | None = None, env_extra: dict[str, str] | None = None):
    env = base_env(registry, RANK=str(rank), LOCAL_RANK=str(rank % local), WORLD_SIZE=str(world),
                   LOCAL_WORLD_SIZE=str(local), **node.env, **(env_extra or {}))
    output = out or registry.parent / "out"
    return spawn(f"{replica}-{rank}", ["--replica", replica, "--output", str(output), "--config", str(config),
                                        "--step-sleep", "0.02", *args], env, program=node.program())


def _ranks(registry: Path, replica: str) -> dict:
    return {r.rank: r for r in read_records(registry, replica)}


def _wait_ranks(registry: Path, replica: str, ranks: set[int], pred=lambda r: True, what: str = "", timeout=90.0):
    def check():
        got = _ranks(registry, replica)
        return got if ranks <= set(got) and all(pred(got[k]) for k in ranks) else None

    return wait_for(check, timeout, what=what or f"ranks {sorted(ranks)} of {replica}")


def _node_record(registry: Path, replica: str, host: str) -> dict:
    (path,) = (layout.nodes_dir(registry, replica)).glob(f"*/{host}.json")
    return json.loads(path.read_text())


def _agent_pid(registry: Path, replica: str, host: str) -> int:
    return _node_record(registry, replica, host)["agent"]["pid"]


def _stepping(r) -> bool:
    return r.state == "idle" and r.step > 0


def test_two_nodes_each_poll_once_relay_to_their_ranks_and_capture_aligned(tmp_path, spawn, make_node):
    registry, config = tmp_path / "reg", _config(tmp_path)
    nodes = [make_node("node-a"), make_node("node-b")]
    procs = {k: _rank(spawn, nodes[k // 2], registry, config, "job", k, 4, 2) for k in range(4)}
    ranks = _wait_ranks(registry, "job", set(range(4)), _stepping, "four stepping ranks")
    assert {k: r.host for k, r in ranks.items()} == {0: "node-a", 1: "node-a", 2: "node-b", 3: "node-b"}

    # The shared registry holds one record per node (no rank files), each written by one of its own ranks.
    replica_dir = layout.replica_dir(registry, "job")
    assert not list(replica_dir.glob("rank-*.json"))
    for node, members in (("node-a", {0, 1}), ("node-b", {2, 3})):
        record = _node_record(registry, "job", node)
        assert {e["rank"] for e in noderecord.node_entries(record)} == members
        assert record["agent"]["rank"] in members
    agents = [k for k, p in procs.items() if "is its node's agent" in p.stderr()]
    # One agent per node. Under a loaded machine an agent whose beat comes more than 1.5 heartbeats late
    # is taken over, as designed (within two heartbeats); then the one it replaced says it stepped down.
    for node in (0, 1):
        mine = [k for k in agents if k // 2 == node]
        assert mine, f"no agent on node {node}: agents {agents}"
        if len(mine) > 1:
            wait_for(lambda mine=mine: any("is no longer its node's agent" in procs[k].stderr() for k in mine),
                     30, what=f"one of node {node}'s agents {mine} to step down")
    if nodes[0].namespaced:  # each node's ranks keep their records in its own /dev/shm
        assert sorted(Path(p).name for p in nodes[0].shm("-name", "rank-*.json")) == ["rank-0.json", "rank-1.json"]

    code, out, err, _ = run_cli("profile", "set", "job", "-rf", "all", "-as", "2", "--wait", "--timeout", "120",
                                "--json", "--registry", str(registry), timeout=180)
    assert code == 0, err
    paths = {row["rank"]: row["trace_path"] for row in json.loads(out)["ranks"]}
    assert set(paths) == set(range(4))
    steps = {k: profiler_steps(load_trace(Path(p))) for k, p in paths.items()}
    assert len({tuple(s) for s in steps.values()}) == 1 and len(steps[0]) == 2, steps  # one window, every rank

    code, out, err, _ = run_cli("replica", "lsr", "job", "--json", "--registry", str(registry))
    assert code == 0, err
    rows = json.loads(out)["ranks"]
    assert [(row["rank"], row["host"], row["alive"]) for row in rows] == [
        (0, "node-a", True), (1, "node-a", True), (2, "node-b", True), (3, "node-b", True)]


def _new_agent(registry: Path, by_pid: dict[int, int], alive: set[int], what: str) -> int:
    """The rank that the node record names as the agent, once it is one of `alive`."""
    def check():
        rank = by_pid.get(_agent_pid(registry, "kill", "node-k"))
        return (rank,) if rank in alive else None  # a tuple: rank 0 is an answer too

    return wait_for(check, 30, what=what)[0]


def _armed_lines(proc, request_id: str) -> int:
    return proc.stderr().count(f"armed request {request_id}")


def test_the_agent_sigkilled_loses_no_request_and_runs_none_twice(tmp_path, spawn, make_node):
    # A slow poll: the request written just before the kill is still unread by the agent.
    registry, config = tmp_path / "reg", _config(tmp_path, poll=3.0)
    node = make_node("node-k")
    procs = {k: _rank(spawn, node, registry, config, "kill", k, 4, 4) for k in range(4)}
    _wait_ranks(registry, "kill", set(range(4)), _stepping, "four stepping ranks")
    by_pid = {p.pid: k for k, p in procs.items()}

    # 1. Killed with a request in flight: written, then the agent killed before it relays.
    first = by_pid[_agent_pid(registry, "kill", "node-k")]
    code, out, err, _ = run_cli("profile", "set", "kill", "-rf", "all", "-as", "2", "--no-wait", "--json",
                                "--registry", str(registry))
    os.kill(procs[first].pid, signal.SIGKILL)
    assert code == 0, err
    in_flight = json.loads(out)["request_id"]
    alive = set(range(4)) - {first}
    _wait_ranks(registry, "kill", alive, lambda r: r.num_captures == 1 and r.state == "idle",
                "every survivor to capture the request the killed agent had not relayed")
    second = _new_agent(registry, by_pid, alive, "a new agent among the survivors")

    # 2. Killed after relaying: the next agent must not relay it again.
    code, out, err, _ = run_cli("profile", "set", "kill", "-rf", "all", "-as", "2", "--start-step",
                                str(max(r.step for r in _ranks(registry, "kill").values() if r.pid != procs[first].pid)
                                    + 150),
                                "--no-wait", "--json", "--registry", str(registry))
    assert code == 0, err
    relayed = json.loads(out)["request_id"]
    wait_for(lambda: all(_armed_lines(procs[k], relayed) == 1 for k in alive), 60, what="the survivors armed")
    os.kill(procs[second].pid, signal.SIGKILL)
    alive -= {second}
    _wait_ranks(registry, "kill", alive, lambda r: r.num_captures == 2 and r.state == "idle",
                "the last survivors to capture the relayed request once")
    third = _new_agent(registry, by_pid, alive, "a third agent")
    assert third in alive
    for k in alive:
        assert _armed_lines(procs[k], relayed) == 1, procs[k].stderr()[-2000:]
        assert _armed_lines(procs[k], in_flight) == 1, procs[k].stderr()[-2000:]
        assert sorted(p.name for p in (tmp_path / "out" / "profile_trace" / f"kill_{k}").glob("*_trace.json.gz")) == [
            "0_trace.json.gz", "1_trace.json.gz"]


def test_an_agent_holding_the_gil_is_replaced_then_steps_down(tmp_path, spawn, make_node):
    registry, config = tmp_path / "reg", _config(tmp_path)
    node = make_node("node-g")
    gil = tmp_path / "hold-the-gil"
    first = _rank(spawn, node, registry, config, "gil", 0, 3, 3, "--gil-file", str(gil), "--gil-s", "20")
    _wait_ranks(registry, "gil", {0}, _stepping, "rank 0, the first rank and so the agent")
    others = {k: _rank(spawn, node, registry, config, "gil", k, 3, 3) for k in (1, 2)}
    _wait_ranks(registry, "gil", {0, 1, 2}, _stepping, "three stepping ranks")
    assert _agent_pid(registry, "gil", "node-g") == first.pid

    gil.touch()  # rank 0 holds the GIL for 20 s: its agent thread cannot run
    wait_for(lambda: not gil.exists(), 30, what="rank 0 to take the GIL")
    new = wait_for(lambda: (pid := _agent_pid(registry, "gil", "node-g")) != first.pid and pid, 30,
                   what="another rank to take over the agent's term")
    assert new in {p.pid for p in others.values()}
    code, out, err, _ = run_cli("profile", "set", "gil", "-rf", "1,2", "-as", "2", "--wait",
                                "--timeout", "60", "--json", "--registry", str(registry), timeout=120)
    assert code == 0, err
    assert {row["rank"] for row in json.loads(out)["ranks"]} == {1, 2}
    during = json.loads(out)["request_id"]

    # Back from its C call, rank 0 sees the later term and steps down; nothing is relayed twice.
    wait_for(lambda: "no longer its node's agent" in first.stderr(), 60, what="rank 0 to step down")
    _wait_ranks(registry, "gil", {0}, _stepping, "rank 0 stepping again")
    assert _agent_pid(registry, "gil", "node-g") == new
    for proc in others.values():
        assert _armed_lines(proc, during) == 1
    assert "Traceback" not in first.stderr()


def test_the_node_dir_removed_under_the_job_comes_back(tmp_path, spawn, make_node):
    registry, config = tmp_path / "reg", _config(tmp_path)
    node = make_node("node-r")
    procs = [_rank(spawn, node, registry, config, "gone", k, 2, 2) for k in range(2)]
    _wait_ranks(registry, "gone", {0, 1}, _stepping, "two stepping ranks")
    (job_dir,) = {Path(p).parent.parent for p in node.shm("-name", "rank-0.json")} if node.namespaced else \
        {p.parent.parent for p in Path(node.env["COSMOS_PROFILER_NODE_DIR"]).glob("*/records/rank-0.json")}
    # Removed as a tmpfs cleaner would: gone from its path at once (a rename), then deleted. A bare
    # `rm -rf` races the ranks, which write there again while it deletes ("Directory not empty").
    subprocess.run(node.enter(["sh", "-c", 'mv "$0" "$0.gone" && rm -rf "$0.gone"', str(job_dir)]), check=True,
                   timeout=30)

    code, out, err, _ = run_cli("profile", "set", "gone", "-rf", "all", "-as", "2", "--wait", "--timeout", "90",
                                "--json", "--registry", str(registry), timeout=150)
    assert code == 0, (out, err, [p.stderr()[-3000:] for p in procs])
    assert {row["rank"] for row in json.loads(out)["ranks"]} == {0, 1}
    wait_for(lambda: len(node.shm("-name", "rank-*.json")) == 2 if node.namespaced else
             len(list(job_dir.glob("records/rank-*.json"))) == 2, 30, what="the ranks' records back in the node dir")


def test_two_jobs_of_one_user_on_one_node_keep_apart(tmp_path, spawn, make_node):
    registry, config = tmp_path / "reg", _config(tmp_path)
    node = make_node("node-2")
    procs = {}
    for replica in ("left", "right"):
        for k in range(2):
            procs[replica, k] = _rank(spawn, node, registry, config, replica, k, 2, 2)
    for replica in ("left", "right"):
        _wait_ranks(registry, replica, {0, 1}, _stepping, f"{replica}'s ranks")
    assert _agent_pid(registry, "left", "node-2") in {procs["left", k].pid for k in range(2)}
    assert _agent_pid(registry, "right", "node-2") in {procs["right", k].pid for k in range(2)}

    code, out, err, _ = run_cli("profile", "set", "left", "-rf", "all", "-as", "2", "--wait", "--timeout", "90",
                                "--registry", str(registry), timeout=150)
    assert code == 0, err
    right = _ranks(registry, "right")
    assert [(r.num_requests, r.num_captures) for r in right.values()] == [(0, 0), (0, 0)]
    assert all("armed request" not in procs["right", k].stderr() for k in range(2))


NOBODY = 65534


def test_another_users_ranks_on_the_node_never_see_our_requests(tmp_path, spawn, make_node):
    if os.geteuid() != 0:
        pytest.skip("needs root: the other user's job runs as uid 65534")
    if shutil.which("setpriv") is None:
        pytest.skip("setpriv (util-linux) is missing: it runs the other user's job")
    node = make_node("node-u")
    config = _config(tmp_path)
    config.chmod(0o644)
    theirs = Path(f"/tmp/cosmos-node-agent-other-{os.getpid()}-{tmp_path.name}")  # a dir the other user can reach
    theirs.mkdir(mode=0o777)
    theirs.chmod(0o777)
    try:
        ours_reg, their_reg = tmp_path / "reg", theirs / "reg"
        for k in range(2):
            _rank(spawn, node, ours_reg, config, "same", k, 2, 2)
        shutil.copy(config, theirs / "job.toml")
        (theirs / "job.toml").chmod(0o644)
        setpriv = ["setpriv", f"--reuid={NOBODY}", f"--regid={NOBODY}", "--clear-groups"]
        env = base_env(their_reg, RANK="0", WORLD_SIZE="1", LOCAL_WORLD_SIZE="1", **node.env, HOME=str(theirs))
        if not node.namespaced:  # forced into our node dir: refused, and that user's rank is on its own
            env["COSMOS_PROFILER_NODE_DIR"] = node.env["COSMOS_PROFILER_NODE_DIR"]
        other = spawn("other", ["--replica", "same", "--output", str(theirs / "out"), "--config",
                                str(theirs / "job.toml"), "--step-sleep", "0.02"], env,
                      program=node.enter([*setpriv, PYTHON, str(ROOT / "tests" / "programs" / "train.py")]))
        _wait_ranks(ours_reg, "same", {0, 1}, _stepping, "our ranks")
        _wait_ranks(their_reg, "same", {0}, _stepping, "the other user's rank")

        if node.namespaced:  # each user's node dir is its own, 0700
            dirs = {Path(p) for p in node.shm("-maxdepth", "1", "-name", "cosmos-profiler-*")}
            owners = {}
            for d in dirs:
                st = os.stat(f"/proc/{node.holder.pid}/root{d}")
                owners[d.name] = (st.st_uid, stat.S_IMODE(st.st_mode))
            assert owners == {"cosmos-profiler-0": (0, 0o700), f"cosmos-profiler-{NOBODY}": (NOBODY, 0o700)}
        code, out, err, _ = run_cli("profile", "set", "same", "-rf", "all", "-as", "2", "--wait", "--timeout", "90",
                                    "--registry", str(ours_reg), timeout=150)
        assert code == 0, err
        (their_rank,) = _ranks(their_reg, "same").values()
        assert (their_rank.num_requests, their_rank.num_captures) == (0, 0)
        assert "armed request" not in other.stderr()
    finally:
        shutil.rmtree(theirs, ignore_errors=True)


def test_a_node_whose_clock_is_skewed_is_alive_and_captures_aligned(tmp_path, spawn, make_node):
    if reason := namespaces_permitted():
        pytest.skip(reason)
    built = build_clock_shim(tmp_path)
    if isinstance(built, str):
        pytest.skip(built)
    registry, config = tmp_path / "reg", _config(tmp_path)
    straight, skewed = make_node("node-ok"), make_node("node-late")
    for k in range(2):
        _rank(spawn, straight, registry, config, "skew", k, 4, 2)
    for k in (2, 3):
        _rank(spawn, skewed, registry, config, "skew", k, 4, 2, env_extra={"LD_PRELOAD": str(built),
                                                                           ENV_OFFSET: "-600"})
    ranks = _wait_ranks(registry, "skew", {0, 1, 2, 3}, _stepping, "four stepping ranks")
    assert abs(ranks[2].started_at - ranks[0].started_at + 600) < 120, "node-late's clock is not 10 minutes behind"
    late = _node_record(registry, "skew", "node-late")
    assert abs(late["clock_offset"] - 600) < 30, late["clock_offset"]  # measured by the agent's probe

    code, out, err, _ = run_cli("replica", "lsr", "skew", "--json", "--registry", str(registry))
    assert code == 0, err
    assert [row["alive"] for row in json.loads(out)["ranks"]] == [True] * 4
    code, out, err, _ = run_cli("profile", "set", "skew", "-rf", "all", "-as", "2", "--wait", "--timeout", "120",
                                "--json", "--registry", str(registry), timeout=180)
    assert code == 0, err
    paths = {row["rank"]: row["trace_path"] for row in json.loads(out)["ranks"]}
    steps = {tuple(profiler_steps(load_trace(Path(p)))) for p in paths.values()}
    assert len(steps) == 1, steps
