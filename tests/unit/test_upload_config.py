"""Traces to S3 (`[train.ckpt] upload_s3`): the setting is read from the TOML and from a cosmos-rl
Config as cosmos-rl reads it, and without boto3 one line says uploads cannot happen. The uploads
themselves (moto's server, a torchrun job) are tests/e2e/test_upload.py's."""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest

from sidecar.common.config import JobConfig, job_config, load_config
from sidecar.common.exceptions import ConfigError
from sidecar.rank import upload
from support.s3 import BUCKET, PREFIX, upload_toml


# Proves: [train.ckpt] is read as cosmos-rl reads it, from the TOML and from a loaded Config
# (attribute access); what cosmos-rl refuses is a ConfigError naming the key; off means no target.
def test_train_ckpt_is_read_from_the_toml_and_from_a_cosmos_config(tmp_path):
    job = load_config(upload_toml(tmp_path / "a.toml", tmp_path, mode="final"))
    assert job.s3 == upload.S3Target(BUCKET, PREFIX, "final")
    assert job.s3.url("/o/profile_trace/r_3/2_trace.json.gz") == f"s3://{BUCKET}/{PREFIX}/profile_trace/r_3/2_trace.json.gz"
    (tmp_path / "off.toml").write_text('[train.ckpt]\nupload_s3 = false\ns3_bucket = "b"\n')
    assert load_config(tmp_path / "off.toml").s3 is None
    (tmp_path / "bad.toml").write_text('[train.ckpt]\nupload_s3 = true\ns3_bucket = "b"\n')
    with pytest.raises(ConfigError, match=r"bad.toml: train.ckpt.upload_s3 must be false, \"final\" or \"all\""):
        load_config(tmp_path / "bad.toml")
    (tmp_path / "nobucket.toml").write_text('[train.ckpt]\nupload_s3 = "all"\n')
    with pytest.raises(ConfigError, match="train.ckpt.s3_bucket must name a bucket"):
        load_config(tmp_path / "nobucket.toml")
    ckpt = SimpleNamespace(upload_s3="all", s3_bucket="b", s3_prefix="outputs")
    cosmos = SimpleNamespace(train=SimpleNamespace(output_dir=str(tmp_path / "o" / "20260101"), ckpt=ckpt),
                             profiler=SimpleNamespace(enable_profiler=True, enable_nsys=False,
                                                      sub_profiler_config=SimpleNamespace()))
    job, enabled = job_config(cosmos)
    assert enabled and job.s3 == upload.S3Target("b", "outputs", "all")
    assert job.s3.location == "s3://b/outputs/profile_trace/"


# Proves: where boto3 cannot be imported, a rank that is asked to upload says so once, at start,
# and its record says it; training and captures are untouched.
def test_without_boto3_one_line_says_uploads_cannot_happen(tmp_path, monkeypatch, caplog):
    from sidecar.rank.core import build_sidecar

    monkeypatch.setattr(upload, "boto3_missing", lambda: True)
    job = JobConfig(s3=upload.S3Target("b", "p"))
    sc = build_sidecar(output_dir=tmp_path / "o", replica="nob", rank=0, config=job, registry=tmp_path / "reg")
    with caplog.at_level(logging.WARNING, logger="sidecar"):
        sc.start()
        try:
            record = sc.record()
        finally:
            sc.close()
    assert record.upload_to == "s3://b/p/profile_trace/"
    assert record.upload_error and "boto3 is not installed" in record.upload_error
    assert [r.getMessage() for r in caplog.records if "boto3" in r.getMessage()] == [
        f"[Profiler] rank 0: {record.upload_error}"]
