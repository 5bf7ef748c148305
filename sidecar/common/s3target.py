"""Where traces go on S3: cosmos-rl's `[train.ckpt]` values (`upload_s3`, `s3_bucket`, `s3_prefix`)
read into one `S3Target`. The shared floor: the config reads it on both sides, the rank's uploader
(`sidecar.rank.upload`) sends to it, and the CLI shows where a trace went. No boto3 here.
"""

from __future__ import annotations

import posixpath
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sidecar.common.exceptions import ConfigError
from sidecar.common.layout import TRACE_DIR

UPLOAD_MODES = ("final", "all")  # cosmos-rl's values of train.ckpt.upload_s3
DEFAULT_PREFIX = "outputs"  # cosmos-rl's train.ckpt.s3_prefix default


@dataclass(frozen=True)
class S3Target:
    """Where traces go: `train.ckpt.s3_bucket` and `s3_prefix`; `mode` is `upload_s3`."""

    bucket: str
    prefix: str = DEFAULT_PREFIX
    mode: str = "all"

    def key(self, trace_path: str | Path) -> str:
        """`<prefix>/profile_trace/<replica>_<rank>/<file>`: the path below the output root."""
        path = Path(trace_path)
        return posixpath.join(*[p for p in (self.prefix.strip("/"), TRACE_DIR, path.parent.name, path.name) if p])

    def url(self, trace_path: str | Path) -> str:
        return f"s3://{self.bucket}/{self.key(trace_path)}"

    @property
    def location(self) -> str:
        """`s3://<bucket>/<prefix>/profile_trace/`, what a rank record shows as `upload_to`."""
        return f"s3://{self.bucket}/" + posixpath.join(*[p for p in (self.prefix.strip("/"), TRACE_DIR) if p]) + "/"


def target_of(upload_s3: Any, bucket: Any, prefix: Any = DEFAULT_PREFIX) -> S3Target | None:
    """The target of cosmos-rl's three `train.ckpt` values; None when uploads are off.

    Raises:
        ConfigError: a value cosmos-rl would refuse too (naming the key).
    """
    if upload_s3 is None or upload_s3 is False or upload_s3 == "":
        return None
    if not isinstance(upload_s3, str) or upload_s3 not in UPLOAD_MODES:
        raise ConfigError(f'train.ckpt.upload_s3 must be false, "final" or "all" (as cosmos-rl reads it), '
                          f"got {upload_s3!r}")
    if not isinstance(bucket, str) or not bucket.strip():
        raise ConfigError(f"train.ckpt.s3_bucket must name a bucket when train.ckpt.upload_s3 is {upload_s3!r}, "
                          f"got {bucket!r}")
    if prefix is None:
        prefix = DEFAULT_PREFIX
    if not isinstance(prefix, str):
        raise ConfigError(f"train.ckpt.s3_prefix must be a string, got {prefix!r}")
    return S3Target(bucket=bucket.strip(), prefix=prefix, mode=upload_s3)


def target_from_toml(doc: dict[str, Any]) -> S3Target | None:
    """From a parsed TOML document's `[train.ckpt]` table (absent: None)."""
    train = doc.get("train")
    ckpt = train.get("ckpt") if isinstance(train, dict) else None
    if not isinstance(ckpt, dict):
        return None
    return target_of(ckpt.get("upload_s3", False), ckpt.get("s3_bucket"), ckpt.get("s3_prefix", DEFAULT_PREFIX))


def target_from_config(config: Any) -> S3Target | None:
    """From a loaded cosmos-rl `Config` (`config.train.ckpt`, read by attribute)."""
    ckpt = getattr(getattr(config, "train", None), "ckpt", None)
    if ckpt is None:
        return None
    return target_of(getattr(ckpt, "upload_s3", False), getattr(ckpt, "s3_bucket", None),
                     getattr(ckpt, "s3_prefix", DEFAULT_PREFIX))
