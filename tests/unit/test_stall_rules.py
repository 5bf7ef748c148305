"""The stall watch's rules (`[sidecar] stall_after_s`): a stall shows only once its report is done,
and the setting is read from the config and the environment."""

from __future__ import annotations

import pytest

from sidecar.common import envvars
from sidecar.common.config import SidecarSettings
from sidecar.common.exceptions import ConfigError
from support.wait import wait_for


# Proves: a record never says `stalled` before the stall's stacks are written: while on_stall runs, the watch
# shows no stall in progress and the previous stall (none here) as the record's `stall`; after, both.
def test_a_stall_shows_only_once_its_report_is_done():
    import threading

    from sidecar.rank.stall import StallWatch

    seen: list[tuple] = []
    done = threading.Event()

    def on_stall(stall):
        seen.append((watch.is_stalled, watch.shown))
        stall.details["stacks_path"] = "/somewhere/0_stacks.txt"
        stall.reported = True  # what StallReporter.on_stall does last, before it wakes the heartbeat
        done.set()

    watch = StallWatch(0.2, lambda: 7, on_stall, lambda stall, step: None, None)
    watch.start()
    try:
        wait_for(done.is_set, 30, what="the stall")
    finally:
        watch.stop()
    assert seen == [(False, None)]
    assert watch.is_stalled and watch.shown is watch.last and watch.shown.details["stacks_path"]


def test_stall_after_s_settings_and_env():
    assert SidecarSettings().stall_after_s == 0.0
    assert envvars.apply(SidecarSettings(), {"COSMOS_PROFILER_STALL_AFTER_S": "300"}).stall_after_s == 300.0
    with pytest.raises(ConfigError, match=r"sidecar.stall_after_s \(0 is off\) must be between 1.0 and 604800.0, "
                                          r"got 0.5"):
        SidecarSettings(stall_after_s=0.5)
    with pytest.raises(ConfigError, match=r"COSMOS_PROFILER_STALL_AFTER_S must be a number of seconds, got 'soon'"):
        envvars.apply(SidecarSettings(), {"COSMOS_PROFILER_STALL_AFTER_S": "soon"})
