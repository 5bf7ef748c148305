"""Traces to S3 (`[train.ckpt] upload_s3`, sidecar.rank.upload), against moto's S3 server on 127.0.0.1.

A real 2-rank torchrun job uploads each rank's trace to its own key, the bytes of the local
file; a dead endpoint (a closed port) costs training nothing: the steps go on during the
attempts, one log line, and the record says why. boto3 and moto come from bin/test (best
effort); without them these tests skip, saying so. How the setting is read:
tests/unit/test_upload_config.py."""

from __future__ import annotations

import gzip
import json
import subprocess
from pathlib import Path

import pytest

from sidecar.common.recordscan import read_records
from support.capture import published_summaries
from support.launch import DDP, PYTHON, base_env, free_port, torchrun_cmd
from support.s3 import BUCKET, CREDENTIALS, PREFIX, upload_toml
from support.s3 import missing as s3_missing
from support.traces import profiler_steps
from support.wait import wait_for

needs_s3 = pytest.mark.skipif(s3_missing() is not None, reason=str(s3_missing()))


def _cli(registry: Path, *args: str, timeout: float = 150) -> subprocess.CompletedProcess:
    return subprocess.run([PYTHON, "-m", "sidecar", *args, "--registry", str(registry)],
                          capture_output=True, text=True, timeout=timeout, env=base_env())


# Proves: a real 2-rank job with [train.ckpt] upload_s3 puts each rank's trace under its own key
# (<prefix>/profile_trace/<replica>_<rank>/0_trace.json.gz: 0.4.7 put both on <prefix>/0_trace.json.gz),
# byte for byte the local file, reached through AWS_ENDPOINT_URL as cosmos-rl's client would;
# `profile status`, `replica lsr` and `profile summary` (from the traces, and from the summaries the
# ranks published once the traces are out of reach) say where each trace went.
@needs_s3
def test_each_rank_uploads_its_trace_to_its_own_key(spawn, tmp_path, registry, s3_server):
    out = tmp_path / "out"
    config = upload_toml(tmp_path / "train.toml", out)
    cmd = torchrun_cmd(2, "s3job", "-m", "sidecar.run", "--config", str(config), "--registry", str(registry),
                       str(DDP), "--no-sidecar")
    env = base_env(registry, OMP_NUM_THREADS="1", AWS_ENDPOINT_URL=s3_server.url, **CREDENTIALS)
    proc = spawn("s3job", [], env, program=cmd)
    wait_for(lambda: len(r := read_records(registry, "s3job")) == 2 and all(x.step > 3 for x in r), timeout=120,
             what="both ranks counting steps")
    done = _cli(registry, "profile", "set", "s3job", "-rf", "all", "-as", "1", "--wait", "--timeout", "120")
    assert done.returncode == 0, done.stdout + done.stderr

    wait_for(lambda: all(r.trace_url for r in read_records(registry, "s3job")), 60, interval=0.1,
             what="both ranks' trace_url")
    status = json.loads(_cli(registry, "profile", "status", "s3job", "--json").stdout)
    ranks = {r["rank"]: r for r in status["ranks"]}
    client = s3_server.client()
    for k in (0, 1):
        local = Path(ranks[k]["trace_path"])
        key = f"{PREFIX}/profile_trace/s3job_{k}/{local.name}"
        assert ranks[k]["trace_url"] == f"s3://{BUCKET}/{key}"
        data = client.get_object(Bucket=BUCKET, Key=key)["Body"].read()
        assert data == local.read_bytes()
        assert profiler_steps(json.loads(gzip.decompress(data))) == [ranks[k]["capture_start_step"] + 2]
    keys = sorted(o["Key"] for o in client.list_objects_v2(Bucket=BUCKET)["Contents"])
    assert keys == [f"{PREFIX}/profile_trace/s3job_{k}/0_trace.json.gz" for k in (0, 1)]

    lsr = json.loads(_cli(registry, "replica", "lsr", "s3job", "--json").stdout)
    for r in lsr["ranks"]:
        assert r["upload_to"] == f"s3://{BUCKET}/{PREFIX}/profile_trace/"
        assert r["trace_url"] == ranks[r["rank"]]["trace_url"]
        assert "upload_error" not in r
    text = _cli(registry, "profile", "status", "s3job").stdout
    assert f"rank 1: s3://{BUCKET}/{PREFIX}/profile_trace/s3job_1/0_trace.json.gz" in text
    assert "UPLOAD" in _cli(registry, "replica", "lsr", "s3job").stdout

    # The analysis says where each trace went: read from the traces here, and from the summaries the
    # ranks published once the traces are out of reach (another machine's disk).
    wait_for(lambda: all(any(s.get("trace_url") for s in published_summaries(registry, "s3job", k)) for k in (0, 1)),
             60, interval=0.1, what="both ranks to publish their summary with its trace_url")
    trace_dir = Path(ranks[0]["trace_path"]).parents[1]  # <output>/profile_trace
    for hidden in (False, True):
        if hidden:
            trace_dir.rename(tmp_path / "elsewhere")
        try:
            summary = json.loads(_cli(registry, "profile", "summary", "s3job", "--json").stdout)
            text = _cli(registry, "profile", "summary", "s3job").stdout
        finally:
            if hidden:
                (tmp_path / "elsewhere").rename(trace_dir)
        assert summary["from_summaries"] == ([0, 1] if hidden else [])
        for r in summary["ranks"]:
            assert r["trace_url"] == ranks[r["rank"]]["trace_url"] and r["source"] == ("summary" if hidden else "trace")
            assert f"trace uploaded to {r['trace_url']}" in text
    assert proc.stop(timeout=120) == 0


# Proves: with the endpoint dead (a closed port), training steps on while the upload is tried
# (the outcome's history entry is at a later step than the save's), the failure is logged once
# for two traces, and the record and `profile status` say why.
@needs_s3
def test_a_dead_endpoint_costs_training_nothing(spawn, tmp_path, registry):
    config = upload_toml(tmp_path / "train.toml", tmp_path / "out")
    env = {"AWS_ENDPOINT_URL": f"http://127.0.0.1:{free_port()}", **CREDENTIALS}
    proc = spawn.rank(registry, "--config", str(config), replica="dead", env_extra=env)
    for n in (0, 1):  # a new request starts a new history: each capture's entries are looked at in turn
        done = _cli(registry, "profile", "set", "dead", "-as", "1", "--wait", "--timeout", "60")
        assert done.returncode == 0, done.stdout + done.stderr

        def outcome(n=n):
            record = read_records(registry, "dead")[0]
            entries = {h.get("saved") or h.get("upload"): h for h in record.history
                       if str(h.get("saved") or h.get("upload")).endswith(f"/{n}_trace.json.gz")}
            failed = [h for h in entries.values() if "upload_error" in h]
            return failed and (record, failed[0], [h for h in record.history if h.get("saved") == failed[0]["upload"]])

        record, failed, saved = wait_for(outcome, 90, interval=0.1, what=f"the upload outcome of trace {n}")
        assert failed["step"] > saved[0]["step"]  # the training thread stepped on while the upload was tried
        assert failed["upload_error"] == record.upload_error
    assert record.trace_url is None
    assert "Could not connect" in record.upload_error and "/dead_0/1_trace.json.gz" in record.upload_error
    status = json.loads(_cli(registry, "profile", "status", "dead", "--json").stdout)
    assert status["ranks"][0]["upload_error"] == record.upload_error
    assert "trace_url" not in status["ranks"][0]
    wait_for(lambda: read_records(registry, "dead")[0].step > record.step + 5, 30, what="steps after the failures")
    assert proc.stop() == 0
    assert proc.stderr().count("[Profiler] rank 0: uploading ") == 1, proc.stderr()
