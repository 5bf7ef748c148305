"""Fixtures that start processes: training runs (`spawn`), real captures (`capture`, `ddp2_slowed`,
`ddp4_slowed`), moto's S3 server (`s3_server`), sshfs over sshd (`netfs`). Only the tests under
tests/e2e/ see them; tests/conftest.py marks those `e2e`."""

from __future__ import annotations

from pathlib import Path

import pytest

from support.capture import slowed_ddp_captures, two_rank_capture
from support.launch import Spawner
from support.redisserver import RedisServer, redis_missing
from support.s3 import S3Server
from support.s3 import missing as s3_missing


@pytest.fixture
def spawn(tmp_path: Path):
    """A `support.launch.Spawner`: start training subprocesses (`spawn(name, args, env)`,
    `spawn.rank(registry)`); every one is killed at teardown."""
    spawner = Spawner(tmp_path)
    yield spawner
    spawner.close()


@pytest.fixture
def redis_server(tmp_path: Path):
    """A `support.redisserver.RedisServer`, not yet started (a test may start it late, kill it and
    start it again empty); skips, saying why, where redis-server or the redis client is missing."""
    why = redis_missing()
    if why:
        pytest.skip(why)
    server = RedisServer(tmp_path)
    yield server
    server.close()


@pytest.fixture(scope="module")
def s3_server(tmp_path_factory):
    """moto's S3 server on 127.0.0.1 (`support.s3.S3Server`), shared by a module's tests; skips
    (saying why) where boto3 or moto is missing."""
    why = s3_missing()
    if why:
        pytest.skip(why)
    server = S3Server(tmp_path_factory.mktemp("moto") / "moto.log")
    yield server
    server.close()


@pytest.fixture
def netfs(tmp_path: Path):
    """A started `support.netfs.SshfsServer` (sshfs over a throwaway sshd on 127.0.0.1): call
    `.mount(name)` for each "machine". Skips, saying why, where FUSE or the
    programs are unavailable; unmounts and stops sshd at teardown."""
    from support.netfs import NetFSUnavailable, SshfsServer

    server = SshfsServer(tmp_path / "netfs")
    try:
        server.start()
    except NetFSUnavailable as exc:
        pytest.skip(f"no network filesystem here: {exc}")

    def mount(name: str) -> Path:
        try:
            return SshfsServer.mount(server, name)
        except NetFSUnavailable as exc:
            server.close()
            pytest.skip(f"no network filesystem here: {exc}")

    server.mount = mount  # type: ignore[method-assign]
    try:
        yield server
    finally:
        server.close()


CAPTURE_STEP_SLEEP = {0: "0.01", 1: "0.05"}  # rank 1 sleeps inside each ProfilerStep span: the straggler


@pytest.fixture(scope="session")
def capture(tmp_path_factory):
    """One real capture: two ranks of tests/programs/train.py profile 3 active steps.

    Shared by the tests/e2e/test_traces_*_real.py modules, which only read it (test_cli_analysis.py
    takes its own, with a second capture on rank 0). Its JSON is written by a forked child
    (writer `fork`), so our readers and HTA read what that path writes.
    """
    request = {"rank_filter": "all", "active_steps": 3, "wait_steps": 1, "warmup_steps": 1}
    return two_rank_capture(tmp_path_factory.mktemp("capture"), [(request, (0, 1))], step_sleep=CAPTURE_STEP_SLEEP,
                            env={"COSMOS_PROFILER_SAVE_WRITER": "fork"})


# What each capture of the slowed DDP jobs slows down: capture n slows rank plan[n] (None: no rank).
SLOWED_PLANS = {2: (1, 0, None), 4: (2, 3, None)}


@pytest.fixture(scope="session")
def ddp2_slowed(tmp_path_factory):
    """A real 2-rank gloo torchrun job, captured three times: rank 1 slowed, rank 0 slowed, none
    (`support.capture.slowed_ddp_captures`). Read by test_traces_straggler_real.py and test_traces_htmlreport_real.py."""
    return slowed_ddp_captures(tmp_path_factory.mktemp("ddp2"), 2, SLOWED_PLANS[2])


@pytest.fixture(scope="session")
def ddp4_slowed(tmp_path_factory):
    """The same with 4 ranks: rank 2 slowed, rank 3 slowed, none."""
    return slowed_ddp_captures(tmp_path_factory.mktemp("ddp4"), 4, SLOWED_PLANS[4])
