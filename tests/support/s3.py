"""moto's S3 server on 127.0.0.1, for the upload tests (tests/e2e/test_upload.py, tests/e2e/test_cosmos_rl.py).

`S3Server` runs `python -m moto.server` on a free loopback port in a subprocess of its own;
`client()` is a boto3 client for it. boto3 and moto come from bin/test (best effort, skipped
with COSMOS_SKIP_S3=1); `missing()` says why they cannot be used, for a skip.
"""

from __future__ import annotations

import subprocess
import sys
import urllib.request
from pathlib import Path
from typing import Any

from .launch import free_port
from .wait import wait_for

# What a job needs in its environment to reach the server: dummy credentials, and no look
# for instance credentials (AWS_ENDPOINT_URL is set per test).
CREDENTIALS = {"AWS_ACCESS_KEY_ID": "testing", "AWS_SECRET_ACCESS_KEY": "testing", "AWS_DEFAULT_REGION": "us-east-1",
               "AWS_EC2_METADATA_DISABLED": "true"}

BUCKET = "traces"
PREFIX = "runs/exp1"


def upload_toml(path: Path, output: Path, mode: str = "all", bucket: str = BUCKET) -> Path:
    """A job config (TOML) whose [train.ckpt] uploads traces to `bucket` under PREFIX (`mode`: "final", "all")."""
    path.write_text(f"""
[train]
output_dir = "{output}"
timestamp = "fixed"

[train.ckpt]
upload_s3 = "{mode}"
s3_bucket = "{bucket}"
s3_prefix = "{PREFIX}"

[profiler]
enable_profiler = true
""")
    return path


def missing() -> str | None:
    """Why the S3 tests cannot run here, or None."""
    try:
        import boto3  # noqa: F401
        import moto.server  # noqa: F401
    except ImportError as exc:
        return f"boto3 and moto[server] are needed for the S3 tests ({exc}); bin/test installs them (COSMOS_SKIP_S3 unset)"
    return None


class S3Server:
    """moto's S3 server on a free 127.0.0.1 port; `url` is its endpoint. close() kills it."""

    def __init__(self, log_path: Path, timeout: float = 60.0) -> None:
        port = free_port()
        self.url = f"http://127.0.0.1:{port}"
        self.log_path = log_path
        with open(log_path, "wb") as log_file:
            self.proc = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                                         stdout=log_file, stderr=subprocess.STDOUT, start_new_session=True)
        try:
            wait_for(self._up, timeout, interval=0.1, what="moto's S3 server")
        except BaseException:
            self.close()
            raise

    def _up(self) -> bool:
        if self.proc.poll() is not None:
            raise AssertionError(f"moto's server exited: {self.log_path.read_text()[-2000:]}")
        try:
            with urllib.request.urlopen(self.url + "/moto-api/", timeout=1):
                return True
        except OSError:
            return False

    def client(self) -> Any:
        import boto3

        return boto3.client("s3", endpoint_url=self.url, aws_access_key_id="testing",
                            aws_secret_access_key="testing", region_name="us-east-1")

    def close(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
        self.proc.wait(timeout=10)
