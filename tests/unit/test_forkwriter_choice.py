"""The forked trace writer's choice: `auto` forks only where the fork costs under half of the write it
replaces and only on kernels that keep pinned pages for the parent, and the stop it weighs is timed."""

from __future__ import annotations

import pytest

from sidecar.rank import forkwriter
from support.training import driver_capture


def test_auto_forks_only_where_the_fork_costs_under_half_the_write_it_replaces(monkeypatch):
    monkeypatch.setattr(forkwriter, "_ms_per_pte_mb", 16.0)
    # the write is ~0.34x the stop; the fork must cost under half of that
    assert forkwriter.worth_forking(2.0, pte_mb=2.0)  # 100 MB trace, 1 GB process: 33 ms < 340 ms
    assert not forkwriter.worth_forking(0.01, pte_mb=2.0)  # a small trace: 33 ms > 1.7 ms
    assert not forkwriter.worth_forking(2.0, pte_mb=64.0)  # a 32 GB process: 1025 ms > 340 ms
    assert not forkwriter.worth_forking(None, pte_mb=0.1)  # no stop timed: never
    forkwriter._calibrate(took_ms=41.0, pte_mb=10.0)  # this process forks at 4 ms per MB
    assert forkwriter.estimated_fork_ms(64.0) == pytest.approx(1 + 64 * 4)


def test_auto_forks_only_on_kernels_that_keep_pinned_pages_for_the_parent():
    assert forkwriter.kernel_keeps_pinned_pages("5.9.0-1-amd64")
    assert forkwriter.kernel_keeps_pinned_pages("6.18.44-fc-v1147")
    assert not forkwriter.kernel_keeps_pinned_pages("5.4.0-150-generic")
    assert not forkwriter.kernel_keeps_pinned_pages("3.10.0-1160.el7.x86_64")
    assert not forkwriter.kernel_keeps_pinned_pages("unknown")


def test_the_stop_is_timed_for_auto(tmp_path):
    _, prof = driver_capture(record_shape=True)
    assert isinstance(prof.stop_s, float) and prof.stop_s > 0
