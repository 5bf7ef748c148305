"""A real network filesystem on 127.0.0.1, for tests and benchmarks: sshfs over a throwaway sshd.

    server = SshfsServer(tmp_path / "netfs")      # or the `netfs` fixture in conftest.py
    server.start()                                # sshd on a free loopback port, fresh keys
    a, b = server.mount("node-a"), server.mount("node-b")   # two separate mounts of one export
    (a / "x").write_text("hi"); (b / "x").read_text()
    server.close()                                # fusermount -u each mount, stop sshd

Each mount is its own sshfs client (its own SSH connection, FUSE connection and
caches), as two machines mounting one NFS export are, and shows up in
/proc/self/mounts as `fuse.sshfs`. Files written through one mount reach the
other through the server, subject to each client's caches, as on NFS: with
sshfs's defaults (kept unless `cache_seconds` is given) a client trusts the
attributes it has cached for a path for up to 20 s, so an lstat through one
mount can miss, for that long, a file replaced through the other.

Needs the `sshd` and `sshfs` programs (Debian: openssh-server, sshfs; bin/test
installs them where it can) and a usable /dev/fuse; `unavailable()` says what is
missing. Everything (host key, user key, config, logs) lives in the work
directory; sshd listens on 127.0.0.1 only and accepts only the throwaway key.
"""

from __future__ import annotations

import getpass
import os
import shutil
import signal
import socket
import subprocess
from pathlib import Path

from .wait import wait_for

SBIN = os.pathsep.join(["/usr/sbin", "/sbin", "/usr/local/sbin"])
START_TIMEOUT_S = 20.0
MOUNT_TIMEOUT_S = 30.0


class NetFSUnavailable(RuntimeError):
    """The network filesystem cannot be set up here; the message says why."""


def _which(name: str) -> str | None:
    return shutil.which(name) or shutil.which(name, path=SBIN)


def unavailable() -> str | None:
    """Why sshfs over a local sshd cannot run here, or None when it can be tried."""
    missing = [what for what, name in (("openssh-server", "sshd"), ("sshfs", "sshfs"), ("ssh-keygen", "ssh-keygen"))
               if _which(name) is None]
    if missing:
        return f"{', '.join(missing)} not installed (Debian: apt-get install sshfs openssh-server)"
    if not os.path.exists("/dev/fuse"):
        return "FUSE is unavailable: no /dev/fuse"
    if not os.access("/dev/fuse", os.R_OK | os.W_OK):
        return "FUSE is unavailable: /dev/fuse is not readable and writable by this user"
    if _fusermount() is None:
        return "fusermount is not installed (Debian: fuse3)"
    return None


def _fusermount() -> str | None:
    return _which("fusermount3") or _which("fusermount")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def mounted_type(path: Path) -> str | None:
    """The filesystem type mounted exactly at `path`, from /proc/self/mounts."""
    target = os.path.realpath(path)
    found = None
    with open("/proc/self/mounts", encoding="utf-8", errors="replace") as f:
        for line in f:
            parts = line.split()
            if len(parts) >= 3 and parts[1].encode().decode("unicode_escape") == target:
                found = parts[2]  # the last mount at a path is the visible one
    return found


class SshfsServer:
    """sshd on 127.0.0.1 serving `workdir/export`, mounted by sshfs as often as asked."""

    def __init__(self, workdir: Path, cache_seconds: float | None = None) -> None:
        self.workdir = Path(workdir)
        self.export = self.workdir / "export"
        self.cache_seconds = cache_seconds
        self.port = 0
        self.mounts: list[Path] = []
        self._sshd: subprocess.Popen | None = None
        self._key = self.workdir / "user_key"

    # -- lifecycle ------------------------------------------------------------

    def start(self) -> SshfsServer:
        """Generate keys, write sshd_config and start sshd (a few tries for a port race).

        Raises:
            NetFSUnavailable: a program is missing, or sshd does not come up.
        """
        reason = unavailable()
        if reason:
            raise NetFSUnavailable(reason)
        self.workdir.mkdir(parents=True, exist_ok=True)
        self.export.mkdir(exist_ok=True)
        for key in ("host_key", "user_key"):
            if not (self.workdir / key).exists():
                subprocess.run([_which("ssh-keygen"), "-q", "-t", "ed25519", "-N", "", "-C", "cosmos-netfs",
                                "-f", str(self.workdir / key)], check=True, capture_output=True, timeout=30)
        (self.workdir / "authorized_keys").write_bytes((self.workdir / "user_key.pub").read_bytes())
        if os.getuid() == 0:
            os.makedirs("/run/sshd", mode=0o755, exist_ok=True)  # sshd's privilege separation directory
        last = ""
        for _ in range(3):
            self.port = _free_port()
            config = self.workdir / "sshd_config"
            config.write_text(self._sshd_config())
            log = open(self.workdir / "sshd.log", "ab")
            self._sshd = subprocess.Popen([_which("sshd"), "-D", "-e", "-f", str(config)], stdout=log, stderr=log,
                                          stdin=subprocess.DEVNULL, start_new_session=True)
            log.close()
            if self._wait_listening():
                return self
            last = (self.workdir / "sshd.log").read_text(errors="replace")[-2000:]
            self._stop_sshd()
        raise NetFSUnavailable(f"sshd did not start on 127.0.0.1: {last.strip() or 'no output'}")

    def _sshd_config(self) -> str:
        w = self.workdir
        return "\n".join([
            "ListenAddress 127.0.0.1", f"Port {self.port}", f"HostKey {w / 'host_key'}",
            f"AuthorizedKeysFile {w / 'authorized_keys'}", f"PidFile {w / 'sshd.pid'}",
            "PubkeyAuthentication yes", "PasswordAuthentication no", "KbdInteractiveAuthentication no",
            "PermitRootLogin prohibit-password", "StrictModes no", "UsePAM no", "UseDNS no",
            "Subsystem sftp internal-sftp", "",
        ])

    def _wait_listening(self) -> bool:
        """Whether sshd answers with its banner within START_TIMEOUT_S (False: it exited or stayed silent)."""

        def answered() -> str | None:
            if self._sshd is None or self._sshd.poll() is not None:
                return "exited"
            try:
                with socket.create_connection(("127.0.0.1", self.port), timeout=1.0) as s:
                    if s.recv(4).startswith(b"SSH-"):
                        return "listening"
            except OSError:
                pass
            return None

        try:
            return wait_for(answered, START_TIMEOUT_S, interval=0.05, what="sshd's banner") == "listening"
        except AssertionError:  # silent all along: the caller tries another port
            return False

    def mount(self, name: str) -> Path:
        """Mount the export at `workdir/<name>` with a new sshfs client; returns the mountpoint.

        Raises:
            NetFSUnavailable: sshfs could not mount (no FUSE in this container, say).
        """
        mountpoint = self.workdir / name
        mountpoint.mkdir(exist_ok=True)
        options = [f"IdentityFile={self._key}", "StrictHostKeyChecking=no", "UserKnownHostsFile=/dev/null",
                   "BatchMode=yes", "LogLevel=ERROR", "ServerAliveInterval=5"]
        if self.cache_seconds is not None:
            t = self.cache_seconds
            options += [f"dcache_timeout={t:g}", f"attr_timeout={t:g}", f"entry_timeout={t:g}"]
        cmd = [_which("sshfs"), "-F", "/dev/null", "-p", str(self.port), "-o", ",".join(options),
               f"{getpass.getuser()}@127.0.0.1:{self.export}", str(mountpoint)]
        try:
            done = subprocess.run(cmd, capture_output=True, text=True, timeout=MOUNT_TIMEOUT_S,
                                  stdin=subprocess.DEVNULL)
        except subprocess.TimeoutExpired:
            self._unmount(mountpoint)
            raise NetFSUnavailable(f"sshfs did not mount {mountpoint} within {MOUNT_TIMEOUT_S:g}s") from None
        if done.returncode != 0 or mounted_type(mountpoint) != "fuse.sshfs":
            raise NetFSUnavailable(f"sshfs could not mount {mountpoint} (exit {done.returncode}): "
                                   f"{(done.stderr or done.stdout).strip() or 'no output'}")
        self.mounts.append(mountpoint)
        return mountpoint

    def close(self) -> None:
        """Unmount every mount (lazily if busy) and stop sshd. Idempotent."""
        for mountpoint in reversed(self.mounts):
            self._unmount(mountpoint)
        self.mounts.clear()
        self._stop_sshd()

    def _unmount(self, mountpoint: Path) -> None:
        fusermount = _fusermount()
        for lazy in ((), ("-z",)):
            if mounted_type(mountpoint) is None:
                return
            subprocess.run([fusermount, "-u", *lazy, str(mountpoint)], capture_output=True, timeout=30)

    def _stop_sshd(self) -> None:
        proc, self._sshd = self._sshd, None
        if proc is None or proc.poll() is not None:
            return
        try:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(timeout=10)
        except (ProcessLookupError, subprocess.TimeoutExpired):
            try:
                os.killpg(proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            proc.wait(timeout=10)

    def __enter__(self) -> SshfsServer:
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.close()
