"""A redis:// registry with real parts: a real redis-server on 127.0.0.1 (support.redisserver), real
training processes, the CLI as a subprocess. The ranks meet in a node-local mirror; their node agent
carries the node record to Redis and takes requests pushed from it (sidecar.rank.storesync,
sidecar.rank.triggers.store); the CLI reads a local view of the store (sidecar.fleet.storeview).

Faults (issue 30, part 4): Redis down at launch, SIGKILLed mid-run and restarted empty, stalled for
2 s (SIGSTOP/SIGCONT), a wrong password. Each costs no step and one warning line, never a traceback.
"""

from __future__ import annotations

import json
from pathlib import Path

from support.cli import run_cli
from support.launch import base_env
from support.traces import load_trace, profiler_steps
from support.wait import wait_for

HEARTBEAT_S = 1.0
OUTAGE_LINE = "retrying with backoff (training goes on)"


def _config(tmp_path: Path) -> Path:
    path = tmp_path / "redis.toml"
    path.write_text(f"[profiler]\nenable_profiler = true\n[sidecar]\nheartbeat_interval = {HEARTBEAT_S}\n")
    return path


def _start(spawn, tmp_path: Path, url: str, replica: str = "rj", world: int = 2, **extra: str):
    """`world` ranks of one job on this node, registry `url`; returns the processes (not waited for)."""
    procs = []
    for rank in range(world):
        env = base_env(None, COSMOS_PROFILER_DIR=url, COSMOS_PROFILER_NODE_DIR=str(tmp_path / "node"),
                       RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(world), LOCAL_WORLD_SIZE=str(world),
                       **extra)
        procs.append(spawn(f"{replica}-{rank}", ["--replica", replica, "--output", str(tmp_path / "out"),
                                                 "--config", str(_config(tmp_path)), "--step-sleep", "0.02"], env))
    for proc in procs:
        proc.wait_ready()
    return procs


def _cli(url: str, *args: str, timeout: float = 120.0, **extra: str) -> tuple[int, str, str]:
    code, out, err, _ = run_cli(*args, timeout=timeout, env=base_env(None, COSMOS_PROFILER_DIR=url, **extra))
    assert "Traceback" not in err, err
    return code, out, err


def _ls(url: str, **extra: str) -> dict:
    code, out, err = _cli(url, "replica", "ls", "--json", **extra)
    assert code == 0, err
    return json.loads(out)


def _alive_ranks(url: str, replica: str) -> list[int]:
    code, out, err = _cli(url, "replica", "lsr", replica, "--json")
    if code != 0:
        return []
    return sorted(r["rank"] for r in json.loads(out)["ranks"] if r["alive"])


def _wait_listed(url: str, replica: str, ranks: list[int], timeout: float = 60.0) -> None:
    wait_for(lambda: _alive_ranks(url, replica) == ranks, timeout, interval=0.3,
             what=f"ranks {ranks} of {replica} alive in {url}", describe=lambda: json.dumps(_ls(url)))


def _local_steps(tmp_path: Path, replica: str, rank: int) -> int:
    """The step a rank's own record (in its node-local dir, off Redis) last said."""
    best = -1
    for path in (tmp_path / "node").glob(f"{replica}-*/records/rank-{rank}.json"):
        try:
            best = max(best, json.loads(path.read_text())["step"])
        except (OSError, ValueError, KeyError):
            continue
    return best


def _steps_advance(tmp_path: Path, replica: str, rank: int, by: int = 20) -> None:
    start = _local_steps(tmp_path, replica, rank)
    wait_for(lambda: _local_steps(tmp_path, replica, rank) >= start + by, 60.0, interval=0.1,
             what=f"rank {rank} of {replica} to run {by} steps")


def _set_wait(url: str, replica: str) -> dict:
    code, out, err = _cli(url, "profile", "set", replica, "--rank-filter", "all", "--wait", "--timeout", "90", "--json")
    assert code == 0, (out, err)
    return json.loads(out)


def _outage_lines(procs) -> list[str]:
    return [line for p in procs for line in p.stderr().splitlines() if OUTAGE_LINE in line]


def _no_traceback(procs) -> None:
    for proc in procs:
        assert "Traceback" not in proc.stderr(), proc.stderr()[-3000:]


def test_ls_lsr_set_status_through_redis(spawn, tmp_path, redis_server):
    """Two ranks of a node, one agent: ls/lsr list them from Redis, profile set --wait arms and saves
    both through a pushed request, and the node record's key expires with its writer gone."""
    redis_server.start()
    url = redis_server.url
    procs = _start(spawn, tmp_path, url)
    _wait_listed(url, "rj", [0, 1])
    (row,) = [r for r in _ls(url)["replicas"] if r["replica"] == "rj"]
    assert row["num_alive"] == 2 and row["num_ranks"] == 2 and len(row["ranks"]) == 2, row
    keys = sorted(k.decode() for k in redis_server.client().keys("cosmos-profiler:*"))
    assert any(k.startswith("cosmos-profiler:file:replicas/rj/nodes/") for k in keys), keys
    assert 0 < redis_server.client().ttl([k for k in keys if "/nodes/" in k][0]) <= 130

    answer = _set_wait(url, "rj")
    paths = {r["rank"]: r["trace_path"] for r in answer["ranks"]}
    assert set(paths) == {0, 1}, answer
    for path in paths.values():
        assert profiler_steps(load_trace(Path(path))), path
    starts = {r["capture_start_step"] for r in answer["ranks"]}
    assert len(starts) == 1, answer  # the same steps on both ranks: one request id, one start step
    assert answer["control_path"] == f"{url} cosmos-profiler:control:rj" and _ls(url)["registry"] == url, answer
    control = redis_server.client().hgetall("cosmos-profiler:control:rj")
    assert json.loads(control[b"data"])["id"] == answer["request"]["id"]

    code, out, err = _cli(url, "profile", "status", "rj", "--json", TMPDIR=str(tmp_path))
    assert code == 0, err
    status = json.loads(out)
    assert not list(tmp_path.glob("cosmos-profiler-view-*"))  # the CLI's local copy of the store is gone

    # cancel --wait through Redis: a capture armed far ahead ends on both ranks, and they say so
    step = max(r["step"] for r in status["ranks"])
    code, out, err = _cli(url, "profile", "set", "rj", "--rank-filter", "all", "--start-step", str(step + 5000),
                          "--json")
    assert code == 0, err
    far = json.loads(out)["request_id"]
    wait_for(lambda: all(r["state"] == "armed" and r["request_id"] == far for r in _lsr_ranks(url, "rj")), 60.0,
             interval=0.3, what="both ranks armed far ahead")
    code, out, err = _cli(url, "profile", "cancel", "rj", "--wait", "--json")
    assert code == 0, (out, err)
    wait_for(lambda: all(r["state"] == "idle" for r in _lsr_ranks(url, "rj")), 60.0, interval=0.3,
             what="both ranks idle after the cancel")
    assert {r["rank"]: r["trace_path"] for r in status["ranks"]} == paths, status
    _no_traceback(procs)
    assert _outage_lines(procs) == []


def test_killed_then_restarted_empty(spawn, tmp_path, redis_server):
    """SIGKILLed mid-run and restarted empty: training goes on, the agent reconnects and republishes,
    ls lists the ranks again, and a request then arms them; one warning line for the outage."""
    redis_server.start()
    url = redis_server.url
    procs = _start(spawn, tmp_path, url, replica="rk")
    _wait_listed(url, "rk", [0, 1])
    redis_server.kill()
    wait_for(lambda: _outage_lines(procs), 60.0, interval=0.1, what="the outage's warning line")
    _steps_advance(tmp_path, "rk", 0)
    redis_server.start()
    # Restarted empty (no dump loaded); the agents may have written again already (dbsize says nothing).
    assert redis_server.client().info("persistence")["rdb_last_load_keys_loaded"] == 0
    _wait_listed(url, "rk", [0, 1])
    answer = _set_wait(url, "rk")
    assert {r["rank"] for r in answer["ranks"] if r["trace_path"]} == {0, 1}, answer
    assert len(_outage_lines(procs)) == 1, _outage_lines(procs)
    _no_traceback(procs)


def test_down_at_launch(spawn, tmp_path, redis_server):
    """Redis down when the job starts: the ranks train, say so once, and appear when it comes up."""
    url = redis_server.url  # not started yet
    procs = _start(spawn, tmp_path, url, replica="rd", world=1)
    _steps_advance(tmp_path, "rd", 0)
    wait_for(lambda: _outage_lines(procs), 60.0, interval=0.1, what="the outage's warning line")
    code, out, err = _cli(url, "replica", "ls")
    assert code == 1 and "cannot be reached" in err and url in err, (out, err)
    redis_server.start()
    _wait_listed(url, "rd", [0])
    answer = _set_wait(url, "rd")
    assert answer["ranks"][0]["trace_path"], answer
    assert len(_outage_lines(procs)) == 1, _outage_lines(procs)
    _no_traceback(procs)


def test_stalled_two_seconds(spawn, tmp_path, redis_server):
    """SIGSTOP for 2 s: training never waits on Redis (steps go on while it is stopped), and a
    request after SIGCONT arms the rank."""
    redis_server.start()
    url = redis_server.url
    procs = _start(spawn, tmp_path, url, replica="rs", world=1)
    _wait_listed(url, "rs", [0])
    redis_server.pause()
    try:
        _steps_advance(tmp_path, "rs", 0)  # the 2 s: as long as the ranks take to run 20 steps, at least
        wait_for(lambda: _outage_lines(procs), 30.0, interval=0.1, what="the stall noticed by the agent")
    finally:
        redis_server.resume()
    answer = _set_wait(url, "rs")
    assert answer["ranks"][0]["trace_path"], answer
    assert len(_outage_lines(procs)) == 1, _outage_lines(procs)
    _no_traceback(procs)


def test_wrong_password(spawn, tmp_path, redis_server):
    """A server with a password: the ranks given a wrong one train on and say so once, naming the
    variable and never the password; the CLI refuses likewise; the right one works."""
    redis_server.password = "s3cret-right"
    redis_server.start()
    url = redis_server.url
    procs = _start(spawn, tmp_path, url, replica="rp", world=1, COSMOS_PROFILER_REDIS_PASSWORD="wrong-one")
    _steps_advance(tmp_path, "rp", 0)
    wait_for(lambda: _outage_lines(procs), 60.0, interval=0.1, what="the password's warning line")
    (line,) = _outage_lines(procs)
    assert "refused the password" in line and "COSMOS_PROFILER_REDIS_PASSWORD" in line, line
    assert "wrong-one" not in procs[0].stderr()
    code, out, err = _cli(url, "replica", "ls", COSMOS_PROFILER_REDIS_PASSWORD="wrong-two", TMPDIR=str(tmp_path))
    assert code == 1 and "refused the password" in err and "wrong-two" not in err + out, err
    assert not list(tmp_path.glob("cosmos-profiler-view-*"))
    pw_file = tmp_path / "pw"
    pw_file.write_text("s3cret-right\n")
    code, out, err = _cli(url, "replica", "ls", "--json", COSMOS_PROFILER_REDIS_PASSWORD_FILE=str(pw_file))
    assert code == 0 and json.loads(out)["replicas"] == [], (out, err)  # right password; the ranks' is wrong
    _no_traceback(procs)


def test_a_request_sent_while_a_node_was_cut_off(spawn, tmp_path, redis_server):
    """The node reaches Redis through a proxy the test cuts, while the CLI reaches it directly. A
    request sent while cut off is delivered once the node is back; one too old by then is not run,
    and the ranks' records say it expired."""
    from support.tcpproxy import TcpProxy

    redis_server.start()
    proxy = TcpProxy(redis_server.port)
    node_url, cli_url = f"redis://127.0.0.1:{proxy.port}/0", redis_server.url
    try:
        procs = _start(spawn, tmp_path, node_url, replica="rc", world=1)
        _wait_listed(cli_url, "rc", [0])
        proxy.cut()
        wait_for(lambda: _outage_lines(procs), 60.0, interval=0.1, what="the node cut off")
        code, out, err = _cli(cli_url, "profile", "set", "rc", "--json")
        assert code == 0, err
        sent = json.loads(out)["request_id"]
        _steps_advance(tmp_path, "rc", 0)  # still cut off: nothing arrived
        assert _lsr_rank(cli_url, "rc")["request_id"] != sent
        proxy.restore()
        wait_for(lambda: (r := _lsr_rank(cli_url, "rc"))["request_id"] == sent and r["trace_path"], 90.0,
                 interval=0.3, what="the request delivered after the node came back")

        proxy.cut()
        wait_for(lambda: len(_outage_lines(procs)) == 2, 60.0, interval=0.1, what="the node cut off again")
        client = redis_server.client()
        sec, _ = client.time()
        old = json.dumps({"id": "sent-long-ago", "rank_filter": [0]}).encode()
        client.hset("cosmos-profiler:control:rc", mapping={"data": old, "t": f"{sec - 600}.000000", "seq": 99})
        proxy.restore()
        expired = wait_for(lambda: "expired" in ((r := _lsr_rank(cli_url, "rc"))["error"] or "") and r, 90.0,
                           interval=0.3, what="the stale request reported as expired")
        assert "sent 600s ago" in expired["error"] or "sent 60" in expired["error"], expired
        assert expired["request_id"] == sent  # not run
        _no_traceback(procs)
    finally:
        proxy.close()


def _lsr_rank(url: str, replica: str, rank: int = 0) -> dict:
    code, out, err = _cli(url, "replica", "lsr", replica, "--json")
    assert code == 0, err
    return next(r for r in json.loads(out)["ranks"] if r["rank"] == rank)


def test_nodes_that_share_no_directory(spawn, tmp_path, redis_server):
    """Two simulated nodes (their own hostname and mount namespace, tests/support/nodes.py), each
    rank's node dir and traces on its own node's /dev/shm: no directory shared with the other node
    nor with the CLI. Redis alone carries the records and the requests."""
    from support.nodes import SimNode, namespaces_permitted

    why = namespaces_permitted()
    if why:
        import pytest

        pytest.skip(why)
    redis_server.start()
    url = redis_server.url
    nodes = [SimNode(tmp_path, "rnode-a"), SimNode(tmp_path, "rnode-b")]
    try:
        procs = []
        for rank, node in enumerate(nodes):
            env = base_env(None, COSMOS_PROFILER_DIR=url, RANK=str(rank), LOCAL_RANK="0", WORLD_SIZE="2",
                           LOCAL_WORLD_SIZE="1", **node.env)
            procs.append(spawn(f"rn-{rank}", ["--replica", "rn", "--output", "/dev/shm/out", "--config",
                                              str(_config(tmp_path)), "--step-sleep", "0.02"], env,
                               program=node.program()))
        for proc in procs:
            proc.wait_ready()
        _wait_listed(url, "rn", [0, 1])
        code, out, err = _cli(url, "replica", "lsr", "rn", "--json")
        assert {r["rank"]: r["host"] for r in json.loads(out)["ranks"]} == {0: "rnode-a", 1: "rnode-b"}, out
        answer = _set_wait(url, "rn")
        paths = {r["rank"]: r["trace_path"] for r in answer["ranks"]}
        assert set(paths) == {0, 1} and all(p.startswith("/dev/shm/out/profile_trace/rn_") for p in paths.values())
        for rank, node in enumerate(nodes):
            # the trace is on its node's /dev/shm, and on no other's, nor the CLI's
            assert paths[rank] in node.shm("-name", "*_trace.json.gz"), node.shm()
            assert paths[1 - rank] not in node.shm("-name", "*_trace.json.gz")
            assert not Path(paths[rank]).exists()
        # profile stacks: each rank's dump is on its own node's disk; a copy travels through Redis
        code, out, err = _cli(url, "profile", "stacks", "rn", "--json")
        assert code == 0, (out, err)
        answer = json.loads(out)
        assert sorted(r["rank"] for r in answer["ranks"] if r["phase"] == "saved") == [0, 1], answer["ranks"]
        assert all(r["stacks_path"].startswith("/dev/shm/out/") and not Path(r["stacks_path"]).exists()
                   for r in answer["ranks"]), answer["ranks"]
        frames = [f for g in answer["groups"] for f in g.get("main_stack", g.get("frames", []))]
        assert any("train.py" in f for f in frames), answer["groups"]
        _no_traceback(procs)
    finally:
        for proc in spawn.procs:
            proc.kill()
        for node in nodes:
            node.close()


def test_a_node_whose_clock_is_skewed(spawn, tmp_path, redis_server):
    """A node whose clock runs 10 minutes behind (an LD_PRELOAD shim) is alive through Redis and
    captures the same steps as a straight one: its agent measures the store's clock against its own,
    and the CLI places its times on that clock."""
    import pytest

    from support.clockshim import ENV_OFFSET, build_clock_shim
    from support.nodes import SimNode, namespaces_permitted

    if reason := namespaces_permitted():
        pytest.skip(reason)
    built = build_clock_shim(tmp_path)
    if isinstance(built, str):
        pytest.skip(built)
    redis_server.start()
    url = redis_server.url
    nodes = [SimNode(tmp_path, "rclock-ok"), SimNode(tmp_path, "rclock-late")]
    try:
        procs = []
        for rank, node in enumerate(nodes):
            skew = {"LD_PRELOAD": str(built), ENV_OFFSET: "-600"} if rank == 1 else {}
            env = base_env(None, COSMOS_PROFILER_DIR=url, RANK=str(rank), LOCAL_RANK="0", WORLD_SIZE="2",
                           LOCAL_WORLD_SIZE="1", **node.env, **skew)
            procs.append(spawn(f"rsk-{rank}", ["--replica", "rsk", "--output", str(tmp_path / "out"), "--config",
                                               str(_config(tmp_path)), "--step-sleep", "0.02"], env,
                               program=node.program()))
        for proc in procs:
            proc.wait_ready()
        _wait_listed(url, "rsk", [0, 1])
        client = redis_server.client()

        def late_offset():
            (key,) = client.keys("cosmos-profiler:file:replicas/rsk/nodes/*/rclock-late.json")
            return json.loads(client.hget(key, "data"))["clock_offset"]

        wait_for(lambda: abs(late_offset() - 600) < 30, 60, interval=0.3, what="the late node's offset measured")
        # The CLI's own clock 5 minutes ahead: it judges on the clock of the directory it reads (its view).
        ahead = {"LD_PRELOAD": str(built), ENV_OFFSET: "300"}
        code, out, err = _cli(url, "replica", "lsr", "rsk", "--json", **ahead)
        ranks = json.loads(out)["ranks"]
        assert [r["alive"] for r in ranks] == [True, True], ranks
        assert all(r["heartbeat_age_s"] is None or r["heartbeat_age_s"] < 60 for r in ranks), ranks
        local = {r["rank"]: r["step"] for r in ranks}
        assert all(abs(local[k] - _local_steps_on(nodes[k], "rsk", k)) < 500 for k in (0, 1)), (local, ranks)
        code, out, err = _cli(url, "profile", "set", "rsk", "--rank-filter", "all", "--wait", "--timeout", "90",
                              "--json", **ahead)
        assert code == 0, (out, err)
        answer = json.loads(out)
        steps = {tuple(profiler_steps(load_trace(Path(r["trace_path"])))) for r in answer["ranks"]}
        assert len(steps) == 1 and len(answer["ranks"]) == 2, answer
        _no_traceback(procs)
    finally:
        for proc in spawn.procs:
            proc.kill()
        for node in nodes:
            node.close()


def _local_steps_on(node, replica: str, rank: int) -> int:
    """The step a rank's own record says, in its node's /dev/shm (read on that node)."""
    import subprocess

    for path in node.shm("-path", f"*{replica}-*/records/rank-{rank}.json"):
        done = subprocess.run(node.enter(["cat", path]), capture_output=True, text=True, timeout=30)
        try:
            return int(json.loads(done.stdout)["step"])
        except (ValueError, KeyError):
            continue
    return -10**9


def _lsr_ranks(url: str, replica: str) -> list[dict]:
    code, out, err = _cli(url, "replica", "lsr", replica, "--json")
    assert code == 0, err
    return json.loads(out)["ranks"]


def test_rediss_tls(spawn, tmp_path, redis_server):
    """rediss:// to a server that speaks TLS only (a self-signed certificate the ranks and the CLI
    trust through SSL_CERT_FILE): ls and set --wait work; a CLI that does not trust it is refused
    with the reason, and no traceback."""
    import shutil

    import pytest

    if shutil.which("openssl") is None:
        pytest.skip("openssl is missing (it makes the test's certificate)")
    cert = redis_server.use_tls()
    redis_server.start()
    url = redis_server.url
    assert url.startswith("rediss://")
    procs = _start(spawn, tmp_path, url, replica="rt", world=1, SSL_CERT_FILE=str(cert))
    wait_for(lambda: _cli(url, "replica", "ls", "--json", SSL_CERT_FILE=str(cert))[0] == 0
             and [r["num_alive"] for r in json.loads(_cli(url, "replica", "ls", "--json",
                                                          SSL_CERT_FILE=str(cert))[1])["replicas"]] == [1],
             60, interval=0.3, what="the rank listed over TLS")
    code, out, err = _cli(url, "profile", "set", "rt", "--wait", "--timeout", "90", "--json", SSL_CERT_FILE=str(cert))
    assert code == 0, (out, err)
    assert json.loads(out)["ranks"][0]["trace_path"]
    code, out, err = _cli(url, "replica", "ls")  # the system's CAs only: the certificate is not trusted
    assert code == 1 and "cannot be reached" in err and "certificate" in err, err
    _no_traceback(procs)


def test_summaries_travel_through_redis(spawn, tmp_path, redis_server):
    """Issue 30's parts together: with no shared filesystem, `profile summary` of a replica whose traces
    are on the nodes' own disks reads the summaries the ranks published, carried through Redis."""
    redis_server.start()
    url = redis_server.url
    procs = _start(spawn, tmp_path, url)
    _wait_listed(url, "rj", [0, 1])
    _set_wait(url, "rj")
    keys = [f"cosmos-profiler:file:replicas/rj/summaries/000/rank-{k}.json" for k in (0, 1)]
    wait_for(lambda: all(redis_server.client().exists(k) for k in keys), 60.0, interval=0.2,
             what="both ranks' summaries carried to Redis")
    code, out, err = _cli(url, "profile", "summary", "rj", "--json")
    assert code == 0, err
    here = json.loads(out)
    assert here["from_summaries"] == [], here  # the traces are on this machine: read from them
    (tmp_path / "out").rename(tmp_path / "elsewhere")  # now on another machine's disk, as on a cloud node
    code, out, err = _cli(url, "profile", "summary", "rj", "--json")
    assert code == 0, err
    carried = json.loads(out)
    assert carried["from_summaries"] == [0, 1], carried
    assert [[s["step"] for s in r["steps"]] for r in carried["ranks"]] == [[s["step"] for s in r["steps"]] for r in here["ranks"]]
    assert [r["step_s"] for r in carried["ranks"]] == [r["step_s"] for r in here["ranks"]]
    assert [r["rank"] for r in carried["ranks"]] == [0, 1]
    _no_traceback(procs)
