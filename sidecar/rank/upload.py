"""Each saved trace, copied to S3 off the training thread (`[train.ckpt] upload_s3`).

cosmos-rl 0.4.7 reads `train.ckpt.upload_s3` ("final" or "all"), `s3_bucket` and
`s3_prefix` (default "outputs"), and after every trace uploads the rank's whole trace
directory with `cosmos_rl.utils.s3_utils.upload_folder_to_s3` to `<s3_prefix>/<file>`:
every rank's `0_trace.json.gz` lands on one key, and each trace uploads the earlier
ones again. Here each trace is uploaded once, when it is final, to

    s3://<s3_bucket>/<s3_prefix>/profile_trace/<replica>_<rank>/<n>_trace.json.gz

(the local layout below the output root, as cosmos-rl keeps `<s3_prefix>/checkpoints/`).
Both values of `upload_s3` upload every trace, as 0.4.7 does.

The client is built as cosmos-rl's helper builds it (`boto3.client("s3", config=...)`,
so `AWS_ENDPOINT_URL`, `AWS_PROFILE`, the credential chain and the region resolve the
same way), with bounds it lacks: connect and read timeouts, three attempts, a deadline
per file. boto3 is cosmos-rl's own dependency (its `s3_utils` imports it), so nothing
new is needed next to it; elsewhere, without boto3, one line says uploads cannot happen.
cosmos-rl's `upload_file_to_s3` itself is not called: it returns None whether or not
the file went up, and retries for minutes without a timeout.

One thread per rank uploads, in order; boto3 is imported on it, never on the training
thread nor in the CLI. A failure is logged once per process and shown in the rank
record (`upload_error`); a success names the object (`trace_url`).
"""

from __future__ import annotations

import importlib.util
import logging
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from sidecar.common.s3target import S3Target
from sidecar.rank.threads import PathQueue

log = logging.getLogger("sidecar")

CONNECT_TIMEOUT_S = 5.0
READ_TIMEOUT_S = 30.0
MAX_ATTEMPTS = 3
DEADLINE_S = 300.0  # one file, every attempt included
CLOSE_WAIT_S = 30.0  # how long closing the sidecar (at exit) waits for uploads still running


def boto3_missing() -> bool:
    """Whether boto3 cannot be imported (found without importing it)."""
    try:
        return importlib.util.find_spec("boto3") is None
    except (ImportError, ValueError):
        return True


def make_client() -> Any:
    """An S3 client as cosmos-rl's `s3_utils` makes one, with timeouts and fewer attempts."""
    import boto3
    from botocore.config import Config

    return boto3.client("s3", config=Config(connect_timeout=CONNECT_TIMEOUT_S, read_timeout=READ_TIMEOUT_S,
                                            retries={"max_attempts": MAX_ATTEMPTS, "mode": "standard"}))


class DeadlinePassed(Exception):
    """Raised from the transfer's progress callback to end an upload past its deadline."""


class TraceUploader:
    """Uploads one rank's saved traces to `target`, in order, on a thread of its own.

    Args:
        target: the bucket and prefix.
        rank: for the log lines.
        on_done: called on the upload thread with (path, url, error): `url` once the
            object is in place, else `error` saying why not.
        log_once: the sidecar's `(key, level, message)` logger that logs a key once.
        client_factory: makes the S3 client (tests pass their own).
    """

    def __init__(self, target: S3Target, rank: int, on_done: Callable[[Path, str | None, str | None], None],
                 log_once: Callable[[str, int, str], None], client_factory: Callable[[], Any] = make_client,
                 deadline_s: float = DEADLINE_S) -> None:
        self.target = target
        self.rank = rank
        self.on_done = on_done
        self.log_once = log_once
        self.deadline_s = deadline_s
        self._client_factory = client_factory
        self._client: Any = None
        self._bucket_checked = False
        self._paths = PathQueue("cosmos-profiler-upload", self._upload)

    def check(self) -> str | None:
        """Why no upload can happen here (boto3 missing), logged once; None when they can."""
        if self._client_factory is make_client and boto3_missing():
            message = (f"train.ckpt.upload_s3 is {self.target.mode!r} but boto3 is not installed: traces stay "
                       f"on local disk only, not uploaded to {self.target.location} (pip install boto3)")
            self.log_once("upload", logging.WARNING, f"[Profiler] rank {self.rank}: {message}")
            return message
        return None

    def upload(self, path: Path) -> None:
        """Queue a saved trace; returns at once."""
        self._paths.put(path)

    def close(self, timeout: float = CLOSE_WAIT_S) -> bool:
        """Wait up to `timeout` for queued uploads, then stop. Returns whether all finished."""
        return self._paths.close(timeout, join_unfinished_s=0.5)

    def _upload(self, path: Path) -> None:
        url = self.target.url(path)
        deadline = time.monotonic() + self.deadline_s

        def progress(_num_bytes: int) -> None:
            if time.monotonic() > deadline:
                raise DeadlinePassed(f"not done within {self.deadline_s:g} s")

        try:
            if self.check() is not None:
                raise RuntimeError("boto3 is not installed")
            if self._client is None:
                self._client = self._client_factory()
            self._ensure_bucket()
            from boto3.s3.transfer import TransferConfig

            # One thread: the progress callback then runs here, and its exception ends the transfer.
            self._client.upload_file(str(path), self.target.bucket, self.target.key(path), Callback=progress,
                                     Config=TransferConfig(use_threads=False))
            if time.monotonic() > deadline:
                raise DeadlinePassed(f"not done within {self.deadline_s:g} s")
        except Exception as exc:  # noqa: BLE001 - reported, never raised
            message = f"uploading {path} to {url} failed: {_describe(exc)}"
            self.log_once("upload", logging.ERROR, f"[Profiler] rank {self.rank}: {message} (later upload "
                          "failures of this process are only in the rank record's upload_error)")
            self._done(path, None, message)
            return
        log.info("[Profiler] upload trace for rank: %d to %s", self.rank, url)
        self._done(path, url, None)

    def _ensure_bucket(self) -> None:
        """As cosmos-rl's helper: create the bucket when it does not exist (once per process)."""
        if self._bucket_checked:
            return
        from botocore.exceptions import ClientError

        try:
            self._client.head_bucket(Bucket=self.target.bucket)
        except ClientError as exc:
            code = str(exc.response.get("Error", {}).get("Code", ""))
            if code not in ("404", "NoSuchBucket", "NotFound"):
                raise
            log.info("[Profiler] bucket %s does not exist, creating it now.", self.target.bucket)
            self._client.create_bucket(Bucket=self.target.bucket)
        self._bucket_checked = True

    def _done(self, path: Path, url: str | None, error: str | None) -> None:
        try:
            self.on_done(path, url, error)
        except Exception:  # noqa: BLE001 - the listener's failure is not the upload's
            log.exception("[Profiler] rank %d: recording an upload failed", self.rank)


def _describe(exc: BaseException) -> str:
    text = str(exc).strip() or type(exc).__name__
    return text if isinstance(exc, DeadlinePassed) else f"{type(exc).__name__}: {text}"
