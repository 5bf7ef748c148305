"""The heartbeat's publishing: a request handled on the watcher thread is published by
that thread once, with no second write handed to the heartbeat thread."""

from __future__ import annotations

import threading

import pytest

from sidecar.common.recordscan import read_records
from sidecar.common.registry import write_request
from sidecar.rank.core import build_sidecar
from sidecar.rank.heartbeat import Heartbeat
from support.wait import wait_for


def test_a_wake_inside_publishing_after_is_its_one_publish():
    published: list[str] = []
    heartbeat = Heartbeat(60.0, lambda: 0, lambda: published.append(threading.current_thread().name))
    with heartbeat.publishing_after():
        heartbeat.wake()
        assert published == [] and not heartbeat._worker.woken
    assert published == [threading.current_thread().name] and not heartbeat._worker.woken
    heartbeat.wake()  # outside it: the heartbeat thread's to publish
    assert heartbeat._worker.woken and len(published) == 1


@pytest.mark.parametrize("request_data", [{"id": "req-1", "active_steps": 1}, {"id": "bad", "active_steps": 0}],
                         ids=["armed", "refused"])
def test_the_watcher_publishes_a_request_itself_without_waking_the_heartbeat(env, monkeypatch, request_data):
    sc = build_sidecar(output_dir=env / "out", replica="hb", rank=0).start()
    try:
        handoffs: list[str] = []
        monkeypatch.setattr(sc._heartbeat._worker, "wake", lambda: handoffs.append(threading.current_thread().name))
        write_request(env / "reg", "hb", request_data)
        if request_data["id"] == "req-1":
            record = wait_for(lambda: (r := read_records(env / "reg", "hb")[0]).state == "armed" and r)
            assert record.request_id == "req-1"
        else:
            record = wait_for(lambda: (r := read_records(env / "reg", "hb")[0]).num_refused == 1 and r)
            assert "active_steps" in record.error
        # The watcher wrote that record after handling the request; no step ran, so nothing
        # else changed: any wake came from the handling, a second write of the same record.
        assert handoffs == []
    finally:
        sc.close()
