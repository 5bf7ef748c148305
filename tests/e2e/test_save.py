"""The save path: kineto's JSON on the saver thread (or a forked child: test_forkwriter.py), the events
freed there, gzip in a child process.

- What a real training process saves is one complete gzip member holding a JSON object whose
  `traceEvents` obey the Chrome JSON trace format (what chrome://tracing and Perfetto's JSON
  importer read; Perfetto's trace processor itself cannot be fetched offline), with consecutive
  ProfilerStep spans, with and without with_stack (trace_only applies without it), and our own
  reader streams it. HTA reads a real capture in tests/e2e/test_traces_export_real.py.
- The gzip writer, child or thread, writes the same bytes' worth and fails with the same OSError.
- A stopped or killed writer child never stalls training; a killed one fails the save with a message
  saying so, leaves no file, and the next capture saves.
"""

from __future__ import annotations

import errno
import gzip
import json
import os
import signal
import threading
import zlib
from pathlib import Path

import psutil
import pytest

from sidecar.common.layout import SUMMARY_FILE_RE
from sidecar.common.registry import write_request
from sidecar.rank import compress
from sidecar.traces.reader import TraceReader
from support.capture import published_summaries
from support.records import record, wait_record
from support.traces import profiler_steps
from support.training import driver_capture
from support.wait import wait_for

# Perfetto's JSON importer (json_trace_parser) and chrome://tracing: the phases they know.
PHASES = set("BEXIiCbenstfPONDMRG")


def _read_gzip_member(path: Path) -> tuple[bytes, bytes]:
    """(the decompressed bytes, the name in the header); asserts one complete member, nothing after it."""
    data = path.read_bytes()
    assert data[:2] == b"\x1f\x8b"
    inflater = zlib.decompressobj(31)
    text = inflater.decompress(data) + inflater.flush()
    assert inflater.eof and inflater.unused_data == b"", "truncated gzip, or bytes after its member"
    flags = data[3]
    name = b""
    if flags & 0x08:  # FNAME: a zero-terminated name after the 10-byte header (no FEXTRA here)
        name = data[10:data.index(b"\0", 10)]
    return text, name


def assert_chrome_json_trace(doc: dict) -> None:
    """The rules chrome://tracing and Perfetto's JSON importer hold a JSON Object Format trace to."""
    assert isinstance(doc, dict) and isinstance(doc.get("traceEvents"), list) and doc["traceEvents"]
    for event in doc["traceEvents"]:
        assert isinstance(event, dict) and event.get("ph") in PHASES, event
        assert isinstance(event.get("pid"), (int, str)) and isinstance(event.get("tid", 0), (int, str)), event
        if event["ph"] != "M":
            assert isinstance(event.get("ts"), (int, float)) and not isinstance(event["ts"], bool), event
        if event["ph"] == "X":
            assert isinstance(event.get("dur"), (int, float)) and event["dur"] >= 0, event
            assert isinstance(event.get("name"), str), event


# Proves: a real training process saves, with and without with_stack, one complete gzip JSON trace that chrome://tracing/Perfetto's JSON rules accept, with consecutive ProfilerSteps, and our streaming reader reads it all; the same when a forked child writes the JSON.
@pytest.mark.parametrize("writer", ["auto", "fork"])
def test_saved_traces_are_complete_gzip_json_every_reader_takes(spawn, tmp_path, registry, writer):
    proc = spawn.rank(registry, env_extra={"COSMOS_PROFILER_SAVE_WRITER": writer})
    for n, with_stack in enumerate((False, True)):
        write_request(registry, "r1", {"id": f"s{n}", "wait_steps": 0, "warmup_steps": 1, "active_steps": 3,
                                       "record_shape": True, "with_stack": with_stack})
        rec = wait_record(registry, lambda r, n=n: r["state"] == "idle" and r.get("num_captures") == n + 1,
                          what=f"capture {n}")
        path = Path(rec["trace_path"])
        assert path.name == f"{n}_trace.json.gz" and rec["error"] is None
        text, name = _read_gzip_member(path)
        assert name == f"{n}_trace.json".encode()
        doc = json.loads(text)
        assert_chrome_json_trace(doc)
        start = rec["capture_start_step"]
        assert profiler_steps(doc) == [start + 1, start + 2, start + 3], (start, profiler_steps(doc))
        assert doc["cosmos_profiler"]["request_id"] == f"s{n}"
        with TraceReader(path) as reader:
            assert reader.header()["cosmos_profiler"]["request_id"] == f"s{n}"
            assert sum(1 for _ in reader.events()) == len(doc["traceEvents"])
        # Nothing else is left beside the traces but their summaries (a child writes each once its trace is saved).
        wait_for(lambda n=n: any(s["capture"] == n for s in published_summaries(registry, "r1", 0)), 90,
                 what=f"summary {n}")
        assert sorted(os.listdir(path.parent)) == sorted(f"{i}_{kind}" for i in range(n + 1)
                                                         for kind in ("trace.json.gz", "summary.json"))
    assert proc.stop() == 0


@pytest.mark.parametrize("writer", compress.WRITERS)
def test_both_writers_write_the_same_gzip(tmp_path, writer):
    data = b"".join(b'{"ph": "X", "name": "aten::mm", "ts": %d, "dur": 3},\n' % i for i in range(200_000))
    src, dst = tmp_path / "t.json", tmp_path / "t.json.gz"
    src.write_bytes(data)
    with open(src, "rb") as fin, open(dst, "wb") as fout:
        assert compress.gzip_file(fin, fout, "0_trace.json", 1, writer) == writer
    text, name = _read_gzip_member(dst)
    assert text == data and name == b"0_trace.json"
    assert compress.running() == []


@pytest.mark.parametrize("writer", compress.WRITERS)
def test_a_full_disk_fails_either_writer_with_the_same_oserror(tmp_path, writer):
    src = tmp_path / "t.json"
    src.write_bytes(os.urandom(1 << 20))  # incompressible: the first write reaches the device
    with open(src, "rb") as fin, open("/dev/full", "wb", buffering=0) as fout:
        with pytest.raises(OSError) as caught:
            compress.gzip_file(fin, fout, "t.json", 1, writer)
    assert caught.value.errno == errno.ENOSPC and caught.value.strerror == os.strerror(errno.ENOSPC)
    assert caught.value.filename is None


def _killed_while_blocked(tmp_path: Path) -> tuple[BaseException, int]:
    """Start the process writer on a source that never ends, kill_all(); (what the save raised, the child's pid)."""
    read_end, write_end = os.pipe()  # the child blocks reading it
    failure: list[BaseException] = []

    def save() -> None:
        with open(read_end, "rb") as fin, open(tmp_path / "t.gz", "wb") as fout:
            try:
                compress.gzip_file(fin, fout, "t.json", 1, "process")
            except BaseException as exc:  # noqa: BLE001 - handed to the test
                failure.append(exc)

    thread = threading.Thread(target=save)
    thread.start()
    try:
        (child,) = wait_for(compress.running, 30, what="the writer child")
        compress.kill_all()
        thread.join(30)
    finally:
        os.close(write_end)
    assert not thread.is_alive() and compress.running() == []
    return failure[0], child.pid


def test_kill_all_ends_a_running_child_and_its_save_says_how(tmp_path):
    failure, pid = _killed_while_blocked(tmp_path)
    assert isinstance(failure, RuntimeError)
    assert str(failure) == f"the gzip writer process (pid {pid}) was killed by SIGKILL"


# Proves: with SIGCHLD ignored (the kernel reaps the child; Popen then reports exit 0) a killed child still fails the save.
def test_a_killed_child_is_a_failure_even_with_sigchld_ignored(tmp_path):
    previous = signal.signal(signal.SIGCHLD, signal.SIG_IGN)
    try:
        failure, pid = _killed_while_blocked(tmp_path)
    finally:
        signal.signal(signal.SIGCHLD, previous)
    assert isinstance(failure, RuntimeError)
    assert str(failure) == f"the gzip writer process (pid {pid}) ended before it had finished"


def _writer_child(pid: int) -> psutil.Process | None:
    try:
        for child in psutil.Process(pid).children():
            if compress.CHILD_MARK in " ".join(child.cmdline()):
                return child
    except psutil.Error:
        pass
    return None


# Proves: a stopped writer child does not stall training; a killed one fails the save with its signal on the record, leaves no file or temp, and the next capture saves.
def test_a_stopped_or_killed_writer_child_never_stalls_training(spawn, tmp_path, registry):
    proc = spawn.rank(registry, "--width", "512", "--layers", "20", "--step-sleep", "0.001")
    trace_dir = tmp_path / "out" / "profile_trace" / "r1_0"
    big = {"wait_steps": 0, "warmup_steps": 0, "active_steps": 30, "with_stack": True, "record_shape": True}
    child = None
    for attempt in range(3):  # the save may finish before we see its child: ask again
        saved = record(registry).get("num_captures", 0)
        write_request(registry, "r1", {"id": f"big{attempt}", **big})
        # this attempt's save, not an earlier one's: a count above `saved` (it used to be above 0, so the
        # second attempt went on at once and wrote the third while the second was still busy)
        child = wait_for(lambda saved=saved: _writer_child(proc.pid) or record(registry).get("num_captures", 0) > saved
                         or None, 120, interval=0.001, what="the gzip writer child")
        if isinstance(child, psutil.Process):
            break
        wait_record(registry, lambda r, saved=saved: r["num_captures"] > saved and r["state"] == "idle",
                    what="the quick save to end")
    assert isinstance(child, psutil.Process), "every save finished before its writer child could be seen"
    saved_before = record(registry)["num_captures"]
    child.send_signal(signal.SIGSTOP)
    try:
        stopped_at = record(registry)
        wait_record(registry, lambda r: r["step"] >= stopped_at["step"] + 20, what="training to step on")
        assert record(registry)["state"] == "saving"
    finally:
        child.send_signal(signal.SIGKILL)
    rec = wait_record(registry, lambda r: r["state"] == "error", what="the killed save to fail")
    assert rec["error"].startswith("saving trace ") and rec["error"].endswith(
        f"failed: RuntimeError: the gzip writer process (pid {child.pid}) was killed by SIGKILL"), rec["error"]
    assert rec["num_captures"] == saved_before
    assert sorted(n for n in os.listdir(trace_dir) if not SUMMARY_FILE_RE.match(n)) == [
        f"{i}_trace.json.gz" for i in range(saved_before)]
    wait_record(registry, lambda r: r["step"] >= rec["step"] + 20, what="training to step on after the failure")

    write_request(registry, "r1", {"id": "after", "wait_steps": 0, "warmup_steps": 0, "active_steps": 1})
    rec = wait_record(registry, lambda r: r["state"] == "idle" and r["request_id"] == "after" and r["trace_path"])
    assert profiler_steps(json.loads(gzip.decompress(Path(rec["trace_path"]).read_bytes()))) == [
        rec["capture_start_step"]]
    assert proc.stop() == 0 and "Traceback" not in proc.stderr()


# Proves: the saver frees what the profiler collected right after writing it, instead of leaving it in a reference cycle for the cyclic GC to free on the training thread.
def test_export_frees_the_collected_events_on_the_saver_thread(tmp_path):
    from sidecar.rank.exporter import export

    kind, prof = driver_capture("free")
    assert prof.profiler.kineto_results is not None
    path = export((kind, prof), tmp_path / "0_trace.json.gz")
    assert prof.profiler.kineto_results is None
    assert profiler_steps(json.loads(gzip.decompress(path.read_bytes()))) == [5, 6]
