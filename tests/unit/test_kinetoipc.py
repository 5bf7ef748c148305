"""kineto's on-demand protocol (sidecar.rank.kinetoipc) and the responder that answers it (sidecar.rank.ondemand),
over a real datagram socket pair."""

from __future__ import annotations

import os
import socket
import struct

import pytest

from sidecar.rank import kinetoipc
from sidecar.rank.kinetoipc import ACTIVITIES, EVENTS, Poll
from sidecar.rank.ondemand import Responder, scan_steps, steps_verdict


def test_a_poll_reads_back_as_kineto_wrote_it():
    poll = Poll(EVENTS | ACTIVITIES, 1234, (4242, 4241, 1))
    data = kinetoipc.encode_poll(poll)
    # kineto's layout: Metadata{size_t size; char type[32]} then LibkinetoRequest{int32 type, n; int64 jobid; int32 pids[n]}
    assert data[:8] == struct.pack("<Q", 16 + 12) and data[8:11] == b"req" and len(data) == 40 + 28
    back = kinetoipc.decode_poll(data)
    assert back == poll and back.pid == 4242 and back.takes_activities


def test_a_poll_without_the_activities_bit_takes_no_trace_config():
    assert not kinetoipc.decode_poll(kinetoipc.encode_poll(Poll(EVENTS, 0, (7,)))).takes_activities


@pytest.mark.parametrize(("data", "message"), [
    (b"short", "too short"),
    (struct.pack("<Q32s", 16, b"ctxt") + bytes(16), "not a poll"),
    (struct.pack("<Q32s", 99, b"req") + struct.pack("<iiq", 2, 0, 0), "does not match"),
    (struct.pack("<Q32s", 16, b"req") + struct.pack("<iiq", 2, 5, 0), "naming 5 pids"),
])
def test_a_malformed_datagram_is_refused_with_what_is_wrong(data, message):
    with pytest.raises(ValueError, match=message):
        kinetoipc.decode_poll(data)


def test_the_reply_is_metadata_then_the_config_text_without_a_nul():
    data = kinetoipc.encode_reply("A=1\nB=2\n")
    assert struct.unpack_from("<Q", data)[0] == 8 and data[8:12] == b"req\0" and data[40:] == b"A=1\nB=2\n"
    assert kinetoipc.decode_reply(data) == "A=1\nB=2\n"


def test_the_capture_config_names_the_window_and_never_memory():
    text = kinetoipc.ondemand_config(start_iteration=30, warmup=2, active=3, log_file="/tmp/x/t.json",
                                     trace_id="req-1", record_shapes=True, with_stack=True)
    lines = dict(line.split("=", 1) for line in text.splitlines())
    assert lines["PROFILE_START_ITERATION"] == "30" and lines["ACTIVITIES_WARMUP_ITERATIONS"] == "2"
    assert lines["ACTIVITIES_ITERATIONS"] == "3" and lines["ACTIVITIES_LOG_FILE"] == "/tmp/x/t.json"
    assert lines["REQUEST_TRACE_ID"] == "req-1" and lines["PROFILE_REPORT_INPUT_SHAPES"] == "true"
    assert lines["PROFILE_WITH_STACK"] == "true" and lines["PROFILE_WITH_MODULES"] == "false"
    assert "PROFILE_MEMORY" not in lines and "PROFILE_PROFILE_MEMORY" not in lines
    with pytest.raises(ValueError):
        kinetoipc.ondemand_config(start_iteration=1, warmup=0, active=1, log_file="a\nPROFILE_MEMORY=true", trace_id="x")


def test_the_base_config_keeps_the_users_lines_and_sets_the_poll_interval():
    user = "CUPTI_ACTIVITY_BUFFER_SIZE=4\nON_DEMAND_CONFIG_UPDATE_INTERVAL_SECS=5\n"
    assert kinetoipc.base_config(user) == "CUPTI_ACTIVITY_BUFFER_SIZE=4\nON_DEMAND_CONFIG_UPDATE_INTERVAL_SECS=1\n"
    assert kinetoipc.base_config(None) == "ON_DEMAND_CONFIG_UPDATE_INTERVAL_SECS=1\n"


def test_kineto_puts_the_pid_before_json():
    assert kinetoipc.log_file_written("/d/trace-1.json", 77) == "/d/trace-1_77.json"
    assert kinetoipc.log_file_written("/d/trace", 77) == "/d/trace"


# -- the responder --------------------------------------------------------------------------

@pytest.fixture
def sock():
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    yield s
    s.close()


def test_the_responder_answers_only_its_own_process_and_only_with_an_offer(sock):
    r = Responder(sock, pid=100)
    mine, child = Poll(EVENTS | ACTIVITIES, 0, (100, 1)), Poll(EVENTS | ACTIVITIES, 0, (200, 100, 1))
    assert r.answer(kinetoipc.encode_poll(mine)) is None  # nothing offered: no answer (a late one is misread)
    offer = r.offer("PROFILE_START_ITERATION=5\n")
    assert r.answer(kinetoipc.encode_poll(child)) is None and r.num_foreign == 1
    assert r.answer(kinetoipc.encode_poll(Poll(EVENTS, 0, (100,)))) is None  # kineto busy: cannot take it
    reply = r.answer(kinetoipc.encode_poll(mine))
    assert reply is not None and kinetoipc.decode_reply(reply) == "PROFILE_START_ITERATION=5\n"
    assert offer.taken_at is not None and not r.withdraw(offer)
    assert r.answer(kinetoipc.encode_poll(mine)) is None  # answered once
    assert r.answer(b"junk") is None and r.num_bad == 1


def test_an_offer_withdrawn_or_expired_is_never_sent(sock):
    r = Responder(sock, pid=100)
    poll = kinetoipc.encode_poll(Poll(ACTIVITIES, 0, (100,)))
    offer = r.offer("X=1\n")
    assert r.withdraw(offer) and r.answer(poll) is None
    expired = r.offer("X=2\n", ttl=-1.0)
    assert r.answer(poll) is None and expired.withdrawn and expired.taken_at is None


def test_the_responder_thread_answers_over_a_real_socket(tmp_path):
    server = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    server.bind(str(tmp_path / "dynolog"))
    client = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    client.bind(str(tmp_path / "client"))
    client.settimeout(30)
    r = Responder(server, pid=os.getpid()).start()
    try:
        r.offer("PROFILE_START_ITERATION=9\n")
        client.sendto(kinetoipc.encode_poll(Poll(ACTIVITIES, 0, (os.getpid(),))), str(tmp_path / "dynolog"))
        assert kinetoipc.decode_reply(client.recv(65536)) == "PROFILE_START_ITERATION=9\n"
    finally:
        r.stop()
        server.close()
        client.close()


def test_the_steps_of_a_trace_are_read_across_chunk_edges(tmp_path, monkeypatch):
    from sidecar.rank import ondemand

    monkeypatch.setattr(ondemand, "SCAN_CHUNK", 7)
    path = tmp_path / "t.json"
    path.write_bytes(b'{"traceEvents": [{"name": "ProfilerStep#12"}, {"name": "aten::mm"}, {"name": "ProfilerStep#13"}]}')
    assert scan_steps(path) == [12, 13]
    assert steps_verdict([12, 13], 12, 2) is None
    assert steps_verdict([14, 15], 12, 2) == "the trace holds steps 14, 15, not the 2 asked for from step 12"
    assert steps_verdict([], 12, 2) == "the trace holds steps none, not the 2 asked for from step 12"
