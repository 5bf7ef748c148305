"""Triggers in real processes: polling on a network filesystem (sshfs) sees a file replaced elsewhere,
a job's own SIGUSR1 stays the job's, and Lightning's SLURM requeue keeps SIGUSR1."""

from __future__ import annotations

import importlib.util
import os
import queue
import signal

import pytest

from sidecar.common.layout import control_path
from sidecar.common.registry import write_request
from sidecar.common.signames import parse_signal
from sidecar.rank.triggers.file import FileTrigger
from support.launch import PYTHON, ROOT, base_env
from support.records import wait_record
from support.wait import wait_for


# Proves: on a real network filesystem (two sshfs mounts of one export) the
# trigger picks polling, and its poll sees a control file replaced through the
# other mount well before that mount's attribute cache (sshfs: 20 s, for an
# lstat) would let it: the poll opens the file.
def test_polling_on_a_network_filesystem_sees_a_file_replaced_elsewhere(netfs):
    here, there = netfs.mount("here"), netfs.mount("there")
    got: queue.Queue = queue.Queue()
    trig = FileTrigger(control_path(here / "registry", "r1"), lambda control: got.put(control.data),
                       lambda exc: got.put(str(exc)), mode="auto", poll_interval=0.2)
    trig.start()
    try:
        assert (trig.mode, trig.mode_reason) == ("poll", "registry is on a fuse.sshfs filesystem")
        write_request(there / "registry", "r1", {"id": "first"})
        assert got.get(timeout=10) == b'{"id": "first"}\n'
        write_request(there / "registry", "r1", {"id": "second"})  # a new file, renamed in elsewhere
        assert got.get(timeout=10) == b'{"id": "second"}\n'
    finally:
        trig.stop()


LIGHTNING_JOB = ROOT / "tests" / "programs" / "lightning_job.py"

FAST_CONFIG = ("[sidecar]\nheartbeat_interval = 0.2\n[profiler]\nenable_profiler = true\n"
               "[profiler.sub_profiler_config]\nwait_steps = 0\nwarmup_steps = 0\nactive_steps = 1\n")


def test_a_jobs_own_sigusr1_stays_the_jobs_whether_set_before_install_or_after(spawn, registry, tmp_path):
    """Real processes: a handler that predates install() (the seed chained it: one SIGUSR1 made a trace
    *and* ran the job's checkpoint) and one set after sidecar.install (the seed kept advertising SIGUSR1)."""
    config = tmp_path / "fast.toml"
    config.write_text(FAST_CONFIG)
    release = tmp_path / "release-usr1"
    common = ("--config", str(config), "--step-sleep", "0.02")
    before = spawn.rank(registry, *common, "--user-usr1-at", "-1", replica="before", wait=False)
    after = spawn.rank(registry, *common, "--user-usr1-at", "150", "--user-usr1-release-file", str(release),
                       replica="after", wait=False)
    rtmin3 = parse_signal("SIGRTMIN+3")

    # Set before install(): never taken; the rank publishes the free signal it took instead.
    rec = wait_record(registry, lambda r: r.get("pid") == before.pid, "before")
    assert rec["signal"] == "SIGRTMIN+3", rec
    assert ("SIGUSR1 is the job's (a Python handler (main.<locals>.user_usr1)); the sidecar neither takes nor "
            f"chains it. `kill -s SIGRTMIN+3 {before.pid}` triggers this rank instead") in before.stderr()
    before.signal(signal.SIGUSR1)
    wait_for(lambda: "USER_USR1" in before.stdout(), what="the job's own SIGUSR1 handler")
    before.signal(rtmin3)
    rec = wait_record(registry, lambda r: r["num_captures"] == 1 and r["state"] == "idle", "before",
                      what="the capture SIGRTMIN+3 asked for")
    assert rec["num_signals"] == 1 and rec["history"][-1]["request_id"].startswith("signal-"), rec
    assert before.stdout().count("USER_USR1") == 1

    # Set after install(): SIGUSR1 was the trigger until then; the next heartbeat stops advertising it.
    first = wait_record(registry, lambda r: r.get("pid") == after.pid, "after")
    assert first["signal"] == "SIGUSR1" and "USER_USR1_SET" not in after.stdout(), first
    wait_for(lambda: "USER_USR1_SET" in after.stdout(), what="the job to set its SIGUSR1 handler")
    wait_record(registry, lambda r: r["signal"] is None, "after", what="the record to stop naming SIGUSR1")
    assert "the job set its own SIGUSR1 handler (main.<locals>.user_usr1) after the sidecar's" in after.stderr()
    after.signal(signal.SIGUSR1)
    wait_for(lambda: "USER_USR1\n" in after.stdout(), what="the job's SIGUSR1 handler")
    # Given back (SIG_DFL): taken again at a step boundary, and a SIGUSR1 captures (it kills no one).
    release.touch()
    wait_record(registry, lambda r: r["signal"] == "SIGUSR1", "after", what="SIGUSR1 taken back")
    after.signal(signal.SIGUSR1)
    rec = wait_record(registry, lambda r: r["num_captures"] == 1 and r["state"] == "idle", "after",
                      what="the capture SIGUSR1 asked for once given back")
    assert rec["num_signals"] == 1 and after.stdout().count("USER_USR1\n") == 1
    assert before.stop() == 0 and after.stop() == 0


def test_lightnings_slurm_requeue_keeps_sigusr1(spawn, registry, tmp_path):
    """Lightning installs its SLURM requeue handler only where SIGUSR1 has none: a sidecar installed
    first (`python -m sidecar.run`) took SIGUSR1 and the requeue silently never existed."""
    if not any(importlib.util.find_spec(name) for name in ("lightning", "pytorch_lightning")):
        pytest.skip("PyTorch Lightning is not installed (bin/test installs pytorch-lightning unless COSMOS_SKIP_FRAMEWORKS=1)")
    config = tmp_path / "fast.toml"
    config.write_text(FAST_CONFIG)
    fake_bin = tmp_path / "bin"  # a stand-in scontrol: never requeue a real job of this machine's SLURM
    fake_bin.mkdir()
    (fake_bin / "scontrol").write_text(f"#!/bin/sh\necho \"$@\" > {tmp_path / 'scontrol.args'}\n")
    (fake_bin / "scontrol").chmod(0o755)
    slurm = {"SLURM_JOB_ID": "4242", "SLURM_NTASKS": "1", "SLURM_NTASKS_PER_NODE": "1", "SLURM_JOB_NAME": "train",
             "SLURM_PROCID": "0", "SLURM_LOCALID": "0", "SLURM_NODEID": "0", "SLURM_NODELIST": "localhost",
             "PATH": f"{fake_bin}{os.pathsep}{os.environ['PATH']}"}
    out = tmp_path / "lightning"
    proc = spawn("lightning", [str(out)], base_env(registry, **slurm),
                 program=[PYTHON, "-m", "sidecar.run", "--config", str(config), str(LIGHTNING_JOB)])
    proc.wait_ready(timeout=180)
    assert "ENVIRONMENT SLURMEnvironment" in proc.stdout()
    rec = wait_record(registry, lambda r: r.get("pid") == proc.pid, "4242")
    assert rec["signal"] == "SIGRTMIN+3", rec
    assert "SIGUSR1 is the job's (a SLURM job's: --signal=USR1@T" in proc.stderr()

    proc.signal(signal.SIGUSR1)  # SLURM's pre-timeout signal: Lightning's checkpoint and requeue, no trace
    wait_for(lambda: (out / "hpc_ckpt_1.ckpt").exists() and (tmp_path / "scontrol.args").exists(),
             timeout=60, what="Lightning's SLURM checkpoint and requeue")
    assert (tmp_path / "scontrol.args").read_text().split() == ["requeue", "4242"]
    proc.signal(parse_signal(rec["signal"]))
    rec = wait_record(registry, lambda r: r["num_captures"] == 1 and r["state"] == "idle", "4242",
                      what="the capture the published signal asked for")
    assert rec["num_signals"] == 1, rec
    assert proc.stop(timeout=120) == 0
