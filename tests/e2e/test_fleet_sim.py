"""The fleet simulator of `bin/bench --only fleet_scale` (benchmarks/fleet_scale.py), at its smallest:
2 nodes of 2 ranks, each node in its own UTS and mount namespaces (root only), the whole fleet
under strace, for a few seconds. What it reports is what the benchmark's rows are made of: the
kernel's lines parsed and attributed to each node and rank, each node's own host name, every rank
armed by `profile set -rf all`, and no torch in any rank."""

from __future__ import annotations

import json
import os
import shutil
import subprocess

import pytest

from support.launch import PYTHON, ROOT, base_env

NODES, RANKS_PER_NODE = 2, 2


@pytest.fixture(scope="module")
def kernel_tools(tmp_path_factory) -> None:
    """Skip, saying why, where strace cannot trace or the namespaces cannot be entered."""
    if shutil.which("strace") is None:
        pytest.skip("strace is not installed: the fleet's syscalls are counted by it")
    probe = subprocess.run(["strace", "-f", "--seccomp-bpf", "-qq", "-e", "trace=%file", "-o", os.devnull, "true"],
                           capture_output=True, text=True, timeout=30)
    if probe.returncode != 0:
        pytest.skip(f"strace cannot trace here: {probe.stderr.strip()[-300:]}")
    if os.geteuid() != 0:
        pytest.skip("needs root: each simulated node gets its own UTS and mount namespaces")
    where = tmp_path_factory.mktemp("nsprobe")
    probe = subprocess.run(["unshare", "--uts", "--mount", "--propagation", "private", "sh", "-c",
                            f'hostname node-probe && mount -t tmpfs tmpfs "{where}"'],
                           capture_output=True, text=True, timeout=30)
    if probe.returncode != 0:
        pytest.skip(f"UTS and mount namespaces are not permitted here: {probe.stderr.strip()[-300:]}")


def test_a_small_fleet_counted_by_the_kernel(tmp_path, kernel_tools):
    out = tmp_path / "trial.json"
    done = subprocess.run(
        [PYTHON, "-m", "benchmarks.fleet_scale", "--trial", "--nodes", str(NODES), "--ranks-per-node",
         str(RANKS_PER_NODE), "--mode", "off", "--window", "3", "--settle", "1", "--base", str(tmp_path / "fleet"),
         "--out", str(out)],
        cwd=ROOT, env=base_env(), capture_output=True, text=True, timeout=150)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    t = json.loads(out.read_text())
    num = NODES * RANKS_PER_NODE
    assert t["checks"] == [], t["checks"]
    assert t["namespaces"] is True, t["why_not"]

    # Each node saw its own host name, from inside its namespace, and one node-local path (its own tmpfs).
    assert [(n["node"], n["host"]) for n in t["node_reports"]] == [(i, f"node-{i}") for i in range(NODES)]
    assert {n["node_dir"] for n in t["node_reports"]} == {str(tmp_path / "fleet" / "nodelocal")}
    assert [(r["rank"], r["uts_host"], r["host"]) for r in t["rank_reports"]] == [
        (k, f"node-{k // RANKS_PER_NODE}", f"node-{k // RANKS_PER_NODE}") for k in range(num)]
    assert {int(k): h for k, h in t["record_hosts"].items()} == {k: f"node-{k // RANKS_PER_NODE}" for k in range(num)}
    assert not any(r["torch"] for r in t["rank_reports"])
    assert all(r["steps"] > 0 for r in t["rank_reports"])

    # The kernel's lines, parsed: every rank polled the shared control file in the window (poll 1 s,
    # window 3 s), each call attributed to its node and rank by thread id; nothing unattributed.
    s = t["syscalls"]
    assert s["lines"] > 0 and s["registry"] > 0 and s["unowned"] == 0
    assert s["by_call"].get("openat", 0) >= num
    assert sorted(int(n) for n in s["by_node"]) == list(range(NODES))
    assert sorted(int(k) for k in s["control_polls"]) == list(range(num))
    assert sum(s["by_node"].values()) == s["registry"] == sum(s["by_rank"].values())
    assert t["traced_nodes"] == list(range(NODES))
    control = f'"{tmp_path / "fleet" / "registry" / "control" / "fleet.json"}"'
    for i in range(NODES):
        assert control in (tmp_path / "fleet" / "strace" / f"node-{i}.txt").read_text()

    # From this machine: replica ls saw every rank alive, and profile set -rf all armed every rank, as
    # did the same request written in process; each was cancelled before a capture could start.
    assert t["cli_error"] == ""
    assert t["ls_alive"] == num
    assert t["armed"] == num and t["write_armed"] == num
    assert t["armed_ms"] > 0 and t["cancel_ms"] > 0 and t["write_cancel_ms"] > 0
