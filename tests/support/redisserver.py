"""A real redis-server for a test (Debian's package; bin/test installs it): bound to 127.0.0.1 on a
free port, no persistence (a restart comes back empty), killed at close. Never a system one."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
from pathlib import Path

from .launch import free_port
from .wait import wait_for

REDIS_SERVER = shutil.which("redis-server") or "/usr/bin/redis-server"


def redis_missing() -> str | None:
    """Why the Redis tests cannot run here, or None."""
    if not os.path.exists(REDIS_SERVER):
        return "redis-server is not installed (bin/test installs Debian's redis-server)"
    try:
        import redis  # noqa: F401
    except ImportError:
        return "the redis client is not installed (pip install '.[redis]')"
    return None


class RedisServer:
    """One redis-server process; `kill()` + `start()` is a restart on the same port, empty."""

    def __init__(self, tmp_path: Path, password: str | None = None) -> None:
        self.dir = tmp_path / "redis"
        self.dir.mkdir(exist_ok=True)
        self.port = free_port()
        self.password = password
        self.tls_cert: Path | None = None  # set by use_tls(): the server's self-signed certificate (its own CA)
        self.proc: subprocess.Popen[bytes] | None = None
        self.log = self.dir / "redis.log"

    @property
    def url(self) -> str:
        return f"{'rediss' if self.tls_cert else 'redis'}://127.0.0.1:{self.port}/0"

    def use_tls(self) -> Path:
        """Serve TLS only (rediss://), with a self-signed certificate for 127.0.0.1 made by openssl; returns
        the certificate, which a client trusts through SSL_CERT_FILE."""
        cert, key = self.dir / "cert.pem", self.dir / "key.pem"
        subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key), "-out",
                        str(cert), "-days", "1", "-subj", "/CN=127.0.0.1", "-addext", "subjectAltName=IP:127.0.0.1"],
                       check=True, capture_output=True, timeout=60)
        self.tls_cert, self._tls_key = cert, key
        return cert

    def start(self) -> RedisServer:
        cmd = [REDIS_SERVER, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
               "--dir", str(self.dir), "--logfile", str(self.log)]
        if self.password:
            cmd += ["--requirepass", self.password]
        if self.tls_cert is not None:
            cmd[1:3] = ["--port", "0", "--tls-port", str(self.port), "--tls-cert-file", str(self.tls_cert),
                        "--tls-key-file", str(self._tls_key), "--tls-auth-clients", "no"]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        wait_for(self._answers, 30.0, what=f"redis-server on port {self.port}")
        return self

    def _answers(self) -> bool:
        if self.proc is not None and self.proc.poll() is not None:
            raise AssertionError(f"redis-server exited ({self.proc.returncode}): {self._log_tail()}")
        try:
            s = socket.create_connection(("127.0.0.1", self.port), timeout=1.0)
        except OSError:
            return False
        try:
            if self.tls_cert is not None:
                import ssl

                s = ssl.create_default_context(cafile=str(self.tls_cert)).wrap_socket(s, server_hostname="127.0.0.1")
            s.sendall(b"PING\r\n")
            answer = s.recv(64)
        except OSError:
            return False
        finally:
            s.close()
        return answer.startswith((b"+PONG", b"-NOAUTH"))

    def _log_tail(self) -> str:
        try:
            return self.log.read_text(errors="replace")[-2000:]
        except OSError:
            return ""

    def client(self):  # type: ignore[no-untyped-def]
        import redis

        tls = {"ssl": True, "ssl_ca_certs": str(self.tls_cert)} if self.tls_cert is not None else {}
        return redis.Redis(host="127.0.0.1", port=self.port, password=self.password, socket_timeout=5, **tls)

    def kill(self) -> None:
        """SIGKILL, as a crash; the port is free again once it is gone."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGCONT)
            self.proc.kill()
            self.proc.wait(timeout=30)
        self.proc = None

    def pause(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGSTOP)

    def resume(self) -> None:
        assert self.proc is not None
        self.proc.send_signal(signal.SIGCONT)

    def close(self) -> None:
        self.kill()
