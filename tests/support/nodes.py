"""Simulated nodes on one machine: each its own hostname and its own /dev/shm.

`SimNode(tmp_path, "node-a")` starts a holder process in new UTS and mount namespaces (as root,
through `unshare`), which sets the hostname and mounts a private tmpfs on /dev/shm; every rank
of that node runs in those namespaces (`node.program(...)`, through `nsenter`), so its ranks share a
/dev/shm that no other node sees, and `socket.gethostname()` names the node. The registry stays
a directory of this machine, which every node sees: the shared storage.

Where namespaces are not permitted, a node is the same machine with COSMOS_PROFILER_HOST and a
node dir of its own (`node.env`), and `namespaced` is False (the tests that need the namespaces
say so and skip).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
from pathlib import Path

from .launch import PYTHON, TRAIN
from .wait import wait_for


def namespaces_permitted() -> str | None:
    """None where simulated nodes get namespaces of their own; else why not."""
    if os.geteuid() != 0:
        return "needs root: a simulated node runs in its own UTS and mount namespaces (unshare)"
    if shutil.which("unshare") is None or shutil.which("nsenter") is None:
        return "unshare/nsenter (util-linux) are missing"
    probe = subprocess.run(["unshare", "--uts", "--mount", "true"], capture_output=True, text=True, timeout=30)
    if probe.returncode != 0:
        return f"unshare --uts --mount is not permitted here: {probe.stderr.strip()}"
    return None


class SimNode:
    def __init__(self, tmp_path: Path, host: str) -> None:
        self.host = host
        self.reason = namespaces_permitted()
        self.namespaced = self.reason is None
        self.holder: subprocess.Popen[bytes] | None = None
        self.env: dict[str, str] = {}
        if self.namespaced:
            script = f'hostname {host} && mount -t tmpfs -o mode=1777 tmpfs /dev/shm && echo up && exec sleep 1000000'
            self.holder = subprocess.Popen(["unshare", "--uts", "--mount", "--propagation", "private", "sh", "-c",
                                            script], stdout=subprocess.PIPE, start_new_session=True)
            assert self.holder.stdout is not None
            line = self.holder.stdout.readline()
            assert line.strip() == b"up", f"simulated node {host} did not come up"
            wait_for(lambda: self._hostname() == host, 30, what=f"node {host}'s hostname")
            self.env = {"XDG_RUNTIME_DIR": ""}  # the node dir defaults to this node's own /dev/shm
        else:
            self.env = {"COSMOS_PROFILER_HOST": host, "COSMOS_PROFILER_NODE_DIR": str(tmp_path / f"{host}-shm")}

    def _hostname(self) -> str:
        out = subprocess.run(self.enter(["hostname"]), capture_output=True, text=True, timeout=30)
        return out.stdout.strip()

    def enter(self, argv: list[str]) -> list[str]:
        """`argv` run on this node."""
        if self.holder is None:
            return argv
        return ["nsenter", "-t", str(self.holder.pid), "--uts", "--mount", *argv]

    def program(self, program: Path = TRAIN) -> list[str]:
        """The training program, run on this node (a `Spawner` program)."""
        return self.enter([PYTHON, str(program)])

    def shm(self, *parts: str) -> list[str]:
        """A `find` of this node's /dev/shm (what its ranks keep there)."""
        out = subprocess.run(self.enter(["find", "/dev/shm", *parts]), capture_output=True, text=True, timeout=30)
        return out.stdout.split()

    def close(self) -> None:
        if self.holder is None:
            return
        if self.holder.poll() is None:
            os.killpg(self.holder.pid, signal.SIGKILL)
            self.holder.wait(timeout=30)
        if self.holder.stdout is not None:
            self.holder.stdout.close()
