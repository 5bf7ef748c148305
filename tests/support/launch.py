"""The one way to start a training run in a test: `TrainProc`, one subprocess of a training program.

`Spawner` starts them and kills every one at close(): conftest's `spawn` fixture
yields one per test; `spawn.rank(registry)` is the usual case, tests/programs/train.py
as one rank that is ready for requests. `torchrun_cmd` gives the `program` that runs
a job under torchrun; `base_env` is the environment a run starts from (none of the
caller's sidecar, torchelastic or SLURM variables).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

from .records import wait_record
from .wait import wait_for

ROOT = Path(__file__).resolve().parents[2]
TRAIN = ROOT / "tests" / "programs" / "train.py"
DDP = ROOT / "tests" / "programs" / "ddp_train.py"
PYTHON = sys.executable


def free_port() -> int:
    """A 127.0.0.1 port nobody listens on (bound, then released): free for a
    rendezvous, closed to a client that tries to connect."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def torchrun_cmd(nproc: int, run_id: str | None, *target: str, nnodes: int = 1, endpoint: str | None = None) -> list[str]:
    """torchrun on this machine: a c10d rendezvous on a free loopback port (or
    `endpoint`), run id `run_id` (TORCHELASTIC_RUN_ID; None: no --rdzv-id, so
    torchrun sets it to "none"), running `target` (default: the DDP test job)."""
    return [
        PYTHON, "-m", "torch.distributed.run", "--nnodes", str(nnodes), "--nproc-per-node", str(nproc),
        "--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint or f"127.0.0.1:{free_port()}",
        *(["--rdzv-id", run_id] if run_id is not None else []),
        "--monitor-interval", "0.5", *(target or (str(DDP),)),
    ]


def base_env(registry: Path | None = None, **extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("COSMOS_PROFILER_", "TORCHELASTIC_", "SLURM_"))}
    for key in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):
        env.pop(key, None)
    env["PYTHONPATH"] = str(ROOT) + os.pathsep + env.get("PYTHONPATH", "")
    env["PYTHONUNBUFFERED"] = "1"
    if os.environ.get("SIDECAR_TEST_PATH") == "ondemand":
        # The suite on kineto's on-demand path: every training program starts as the startup hook makes it.
        env["COSMOS_PROFILER_SIDECAR"] = "1"
    if registry is not None:
        env["COSMOS_PROFILER_DIR"] = str(registry)
    env.update(extra)
    return env


class TrainProc:
    """One training subprocess; its stdout/stderr go to files under tmp_path."""

    def __init__(
        self, tmp_path: Path, name: str, args: list[str], env: dict[str, str], program: Path | list[str] = TRAIN,
        cwd: Path | None = None,
    ):
        self.name = name
        self.stop_file = tmp_path / f"{name}.stop"
        self.out_path = tmp_path / f"{name}.out"
        self.err_path = tmp_path / f"{name}.err"
        self._out = open(self.out_path, "wb")
        self._err = open(self.err_path, "wb")
        prefix = list(program) if isinstance(program, list) else [PYTHON, str(program)]
        cmd = [*prefix, *args, "--stop-file", str(self.stop_file)]
        self.proc = subprocess.Popen(cmd, stdout=self._out, stderr=self._err, env=env, start_new_session=True, cwd=cwd)

    @property
    def pid(self) -> int:
        return self.proc.pid

    def stdout(self) -> str:
        return self.out_path.read_text(errors="replace")

    def stderr(self) -> str:
        return self.err_path.read_text(errors="replace")

    def wait_ready(self, timeout: float = 60.0) -> None:
        def ready() -> bool:
            if self.proc.poll() is not None:
                raise AssertionError(f"{self.name} exited early ({self.proc.returncode}):\n{self.stderr()[-3000:]}")
            return "READY" in self.stdout()

        wait_for(ready, timeout, what=f"{self.name} to be ready")

    def wait_idle(self, registry: Path, replica: str, rank: int = 0, timeout: float = 60.0) -> dict:
        """Wait for this process's first idle rank record (its sidecar is up and takes requests); return it."""
        return wait_record(registry, lambda r: r.get("state") == "idle" and r.get("pid") == self.pid, replica, rank,
                           timeout, what=f"the first idle record of {replica} rank {rank}")

    def signal(self, signum: int = signal.SIGUSR1) -> None:
        os.kill(self.proc.pid, signum)

    def stop(self, timeout: float = 60.0) -> int:
        self.stop_file.touch()
        try:
            code = self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.kill()
            raise AssertionError(f"{self.name} did not stop within {timeout}s:\n{self.stderr()[-3000:]}") from None
        self._close_files()
        return code

    def kill(self) -> None:
        """SIGKILL the process and every descendant (torchrun puts its workers in
        sessions of their own, so killing our process group is not enough)."""
        if self.proc.poll() is None:
            import psutil

            try:
                victims = psutil.Process(self.proc.pid).children(recursive=True)
            except psutil.NoSuchProcess:
                victims = []
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            for child in victims:
                try:
                    child.kill()
                except psutil.NoSuchProcess:
                    pass
            psutil.wait_procs(victims, timeout=10)
            self.proc.wait(timeout=10)
        self._close_files()

    def _close_files(self) -> None:
        for f in (self._out, self._err):
            if not f.closed:
                f.close()



class Spawner:
    """Starts training subprocesses whose files lie under `tmp_path`; close() kills every one."""

    def __init__(self, tmp_path: Path) -> None:
        self.tmp_path = tmp_path
        self.procs: list[TrainProc] = []

    def __call__(self, name: str, args: list[str], env: dict[str, str], program: Path | list[str] = TRAIN,
                 cwd: Path | None = None) -> TrainProc:
        proc = TrainProc(self.tmp_path, name, args, env, program, cwd)
        self.procs.append(proc)
        return proc

    def rank(self, registry: Path, *args: str, replica: str = "r1", name: str | None = None,
             output: Path | None = None, env_extra: dict | None = None, wait: bool = True) -> TrainProc:
        """tests/programs/train.py as one rank of `replica` (RANK and WORLD_SIZE from `env_extra`),
        tracing into `output` (default <tmp_path>/out); `name` (default: the replica) names its files.
        With `wait`, return once it is ready and its sidecar has written its first idle record."""
        env = base_env(registry, **(env_extra or {}))
        out = output if output is not None else self.tmp_path / "out"
        proc = self(name or replica, ["--replica", replica, "--output", str(out), *args], env)
        if wait:
            proc.wait_ready()
            proc.wait_idle(registry, replica, int(env.get("RANK", 0)))
        return proc

    def close(self) -> None:
        for proc in self.procs:
            proc.kill()
