"""File and signal triggers, in process, with real files, inotify and signals. In real processes
(network filesystems, a job's own SIGUSR1): tests/e2e/test_triggers_jobs.py."""

from __future__ import annotations

import ctypes
import errno
import os
import queue
import shutil
import signal
import threading

import pytest

from sidecar.common.layout import control_path
from sidecar.common.registry import filesystem_type, is_network_fs, write_request
from sidecar.rank.triggers import file as trig_module
from sidecar.rank.triggers.file import FileTrigger, choose_mode
from sidecar.rank.triggers.signal import (
    FREE,
    FREE_SIGNAL_OFFSET,
    OURS,
    TAKEN,
    SignalTrigger,
    choose_signal,
    describe_handler,
)
from support.wait import wait_for


@pytest.fixture
def trigger_factory(tmp_path):
    made = []

    def make(mode: str, **kw):
        got: queue.Queue = queue.Queue()
        trig = FileTrigger(
            control_path(tmp_path, "r1"),
            lambda control: got.put(("file", control.data)),
            lambda exc: got.put(("error", str(exc))),
            mode=mode,
            **kw,
        )
        made.append(trig)
        return trig, got

    yield make
    for trig in made:
        trig.stop()


@pytest.mark.parametrize("mode", ["inotify", "poll"])
def test_each_new_version_is_delivered_once(trigger_factory, tmp_path, mode):
    ctl = control_path(tmp_path, "r1")
    ctl.parent.mkdir(parents=True)
    ctl.write_text("stale from an earlier run")
    trig, got = trigger_factory(mode, poll_interval=0.05, safety_interval=30)
    trig.start()
    assert trig.mode == mode
    write_request(tmp_path, "r1", {"id": "a"})
    assert got.get(timeout=5) == ("file", b'{"id": "a"}\n')
    os.utime(ctl, ns=(1, 1))  # same content, new mtime: a new request
    assert got.get(timeout=5)[0] == "file"
    with pytest.raises(queue.Empty):
        got.get(timeout=0.3)  # the baseline file was never delivered, nothing repeats


def test_inotify_delivers_without_waiting_for_the_safety_stat(trigger_factory, tmp_path):
    trig, got = trigger_factory("inotify", safety_interval=60)
    trig.start()
    control_path(tmp_path, "r1").touch()
    assert got.get(timeout=2)[0] == "file"


def test_unsafe_file_is_reported_not_read(trigger_factory, tmp_path):
    trig, got = trigger_factory("poll", poll_interval=0.05)
    trig.start()
    (tmp_path / "target").write_text("{}")
    control_path(tmp_path, "r1").symlink_to(tmp_path / "target")
    kind, message = got.get(timeout=5)
    assert kind == "error" and "symlink" in message


def _wait_watched_again(trig, directory) -> None:
    """Wait until the trigger's inotify watch is on `directory` as it is now (its inode), not on the one removed."""
    wait_for(lambda: trig._observer is not None and not trig._observer.gone
             and trig._watched_dir_inode == os.stat(directory).st_ino, 10, what="the watch to come back")


def test_control_dir_deleted_and_recreated_is_watched_again(trigger_factory, tmp_path):
    trig, got = trigger_factory("inotify", safety_interval=0.1)
    trig.start()
    shutil.rmtree(tmp_path / "control")
    (tmp_path / "control").mkdir(exist_ok=True)  # the watcher's safety look may have recreated it already
    _wait_watched_again(trig, tmp_path / "control")
    write_request(tmp_path, "r1", {"id": "again"})
    assert got.get(timeout=5) == ("file", b'{"id": "again"}\n')


def test_control_dir_deleted_is_watched_again_without_waiting_for_the_safety_look(trigger_factory, tmp_path):
    """inotify reports the watched directory's own removal: the watch comes back long before a 30 s safety look."""
    trig, got = trigger_factory("inotify", safety_interval=30)
    trig.start()
    shutil.rmtree(tmp_path / "control")
    (tmp_path / "control").mkdir(exist_ok=True)  # the watcher may have recreated it already
    _wait_watched_again(trig, tmp_path / "control")
    write_request(tmp_path, "r1", {"id": "back"})
    assert got.get(timeout=5) == ("file", b'{"id": "back"}\n')


def test_inotify_works_with_descriptors_past_fd_setsize(trigger_factory, tmp_path):
    """A training process may hold over 1024 descriptors (select's FD_SETSIZE): the watcher's are past it."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard != resource.RLIM_INFINITY and hard < 1200:
        pytest.skip(f"RLIMIT_NOFILE hard limit {hard} < 1200")
    resource.setrlimit(resource.RLIMIT_NOFILE, (max(soft, 1200), hard))
    fds = []
    try:
        while not fds or fds[-1] < 1030:
            fds.append(os.open(os.devnull, os.O_RDONLY))
        trig, got = trigger_factory("inotify", safety_interval=30)
        trig.start()
        assert trig.mode == "inotify" and trig._observer.fd > 1024
        write_request(tmp_path, "r1", {"id": "high"})
        assert got.get(timeout=5) == ("file", b'{"id": "high"}\n')
        trig.stop()
    finally:
        for fd in fds:
            os.close(fd)
        resource.setrlimit(resource.RLIMIT_NOFILE, (soft, hard))


def test_inotify_exhausted_falls_back_to_polling(trigger_factory, tmp_path, caplog):
    libc = ctypes.CDLL(None, use_errno=True)
    # The user's inotify instances are shared by all its processes: another one (a second suite) may
    # free one between the last refused inotify_init here and the trigger's. Then try again: the
    # state this test needs is "none left" at the trigger's start.
    for _ in range(50):
        fds = []
        try:
            while True:  # use up this user's inotify instances, for real
                fd = libc.inotify_init()
                if fd < 0:
                    assert ctypes.get_errno() in (errno.EMFILE, errno.ENFILE, errno.ENOSPC)
                    break
                fds.append(fd)
                assert len(fds) < 100000
            trig, got = trigger_factory("inotify", poll_interval=0.05)
            with caplog.at_level("WARNING", logger="sidecar"):
                trig.start()
        finally:
            for fd in fds:
                os.close(fd)
        if trig.mode == "poll":
            break
        trig.stop()
    assert trig.mode == "poll"
    assert "falling back to polling" in caplog.text
    control_path(tmp_path, "r1").touch()
    assert got.get(timeout=5)[0] == "file"


def test_network_filesystems_are_polled(tmp_path):
    mounts = tmp_path / "mounts"
    mounts.write_text(
        "/dev/vda / ext4 rw 0 0\n"
        "srv:/export /mnt/shared nfs4 rw 0 0\n"
        "lustre@tcp:/fs /lustre lustre rw 0 0\n"
        "sshfs /mnt/with\\040space fuse.sshfs rw 0 0\n"
    )
    assert filesystem_type("/mnt/shared/reg/control", str(mounts)) == "nfs4"
    assert filesystem_type("/lustre/x", str(mounts)) == "lustre"
    assert filesystem_type("/mnt/with space/x", str(mounts)) == "fuse.sshfs"
    assert filesystem_type("/mnt/sharedness", str(mounts)) == "ext4"
    assert all(is_network_fs(t) for t in ("nfs", "nfs4", "lustre", "gpfs", "cifs", "fuse.sshfs"))
    assert not any(is_network_fs(t) for t in ("ext4", "xfs", "tmpfs", None))
    assert choose_mode("poll", tmp_path) == ("poll", "forced by configuration")
    assert choose_mode("auto", tmp_path)[0] == "inotify"  # this machine's tmp is local


def _deliver(signum: int) -> None:
    """Send `signum` to this thread (the main one) and run its Python handler before returning:
    signal.raise_signal checks for pending signals on its way out, so there is nothing to wait for."""
    signal.raise_signal(signum)


def test_signal_trigger_never_takes_nor_chains_a_job_handler(caplog):
    seen = []
    job = signal.signal(signal.SIGUSR2, lambda s, f: seen.append("job"))
    try:
        trig = SignalTrigger(signal.SIGUSR2, lambda: seen.append("ours"))
        with caplog.at_level("WARNING", logger="sidecar"):
            assert not trig.start() and not trig.is_installed
        assert "SIGUSR2 is the job's (a Python handler (test_signal_trigger_never_takes_nor_chains" in caplog.text
        _deliver(signal.SIGUSR2)
        assert seen == ["job"]
        # The one the sidecar takes instead: the first free real-time signal from SIGRTMIN+3, never one
        # the job reserved; one the user named is never replaced.
        low = signal.SIGRTMIN + FREE_SIGNAL_OFFSET
        assert choose_signal(signal.SIGUSR2, False, {}) == (low, "a Python handler (" + describe_handler(
            signal.SIGUSR2) + ")")
        assert choose_signal(signal.SIGUSR2, False, {low: "cosmos-rl's"}, frozenset({low + 1}))[0] == low + 2
        assert choose_signal(signal.SIGUSR2, True, {})[0] is None
        assert choose_signal(signal.SIGUSR1, False, {signal.SIGUSR1: "cosmos-rl's checkpoint signal"}) == (
            low, "cosmos-rl's checkpoint signal")
    finally:
        signal.signal(signal.SIGUSR2, job)


def test_signal_trigger_gives_way_to_a_later_handler_and_takes_a_freed_signal_back(caplog):
    seen = []
    trig = SignalTrigger(signal.SIGUSR2, lambda: seen.append("ours"))
    try:
        assert trig.start() and trig.check() == OURS
        # A job handler set after ours that calls the one it replaced (as Lightning's does): ours stays quiet.
        ours = signal.getsignal(signal.SIGUSR2)
        signal.signal(signal.SIGUSR2, lambda s, f: (seen.append("job"), ours(s, f)))
        _deliver(signal.SIGUSR2)
        with caplog.at_level("WARNING", logger="sidecar"):
            assert trig.check() == TAKEN and not trig.is_installed
        assert seen == ["job"] and "the job set its own SIGUSR2 handler" in caplog.text
        signal.signal(signal.SIGUSR2, ours)  # given back as it was (cosmos-rl's release())
        assert trig.check() == OURS and trig.is_installed
        signal.signal(signal.SIGUSR2, lambda s, f: seen.append("job"))
        assert trig.check() == TAKEN
        signal.signal(signal.SIGUSR2, signal.SIG_IGN)  # given back as free
        assert trig.check() == FREE and trig.reclaim() and trig.check() == OURS
        _deliver(signal.SIGUSR2)
        assert seen == ["job", "ours"] and trig.num_received == 1
    finally:
        trig.stop()
    assert signal.getsignal(signal.SIGUSR2) == signal.SIG_IGN  # never the default action: it would kill


def test_signal_trigger_is_not_installed_off_the_main_thread(caplog):
    result = []
    trig = SignalTrigger(signal.SIGUSR2, lambda: None)
    t = threading.Thread(target=lambda: result.append(trig.start()))
    with caplog.at_level("WARNING", logger="sidecar"):
        t.start()
        t.join()
    assert result == [False] and not trig.is_installed
    assert "install the sidecar from the main thread" in caplog.text


def test_same_signature_new_content_is_still_delivered(tmp_path):
    """Coarse-clock kernels: two same-size writes in one tick keep mtime, size and inode.
    Driven without the watcher thread, so the order of events is exact."""
    ctl = control_path(tmp_path, "r1")
    ctl.parent.mkdir(parents=True)
    got = []
    trig = FileTrigger(ctl, lambda c: got.append(c.data), lambda e: got.append(e), mode="poll")
    ctl.write_bytes(b'{"id": "aaaa"}')
    trig._check(by_event=True)
    assert got == [b'{"id": "aaaa"}']
    before = os.stat(ctl)
    with open(ctl, "r+b") as f:  # same inode, same size
        f.write(b'{"id": "bbbb"}')
    os.utime(ctl, ns=(before.st_atime_ns, before.st_mtime_ns))  # same mtime
    trig._check(by_event=False)
    assert got == [b'{"id": "aaaa"}'], "a timed stat alone cannot see it"
    trig._check(by_event=True)
    assert got == [b'{"id": "aaaa"}', b'{"id": "bbbb"}'], "an event makes the content count"
    trig._check(by_event=True)
    assert len(got) == 2, "same content again is not a new request"


def test_reading_the_file_wakes_nothing(trigger_factory, tmp_path):
    """Our own reads raise inotify open/close events; they must not loop into more reads."""
    trig, got = trigger_factory("inotify", safety_interval=60)
    trig.start()
    write_request(tmp_path, "r1", {"id": "a"})
    assert got.get(timeout=5)[0] == "file"
    for _ in range(5):
        control_path(tmp_path, "r1").read_bytes()
    with pytest.raises(queue.Empty):
        got.get(timeout=0.5)
    assert trig.num_content_checks == 0


@pytest.mark.parametrize("how", ["touch a new file", "utime", "write and close", "rename in"])
def test_inotify_delivers_a_file_its_writer_is_done_with_without_settling(trigger_factory, tmp_path, how):
    """inotify says when the writer closed the file (or renamed it in, or only set its
    times): an empty or half-written version is then what the writer meant, delivered at once."""
    ctl = control_path(tmp_path, "r1")
    ctl.parent.mkdir(parents=True)
    if how == "utime":
        ctl.write_text("")
    trig, got = trigger_factory("inotify", safety_interval=30, settle_time=30)
    trig.start()
    expected = b""
    if how == "touch a new file":
        ctl.touch()
    elif how == "utime":
        os.utime(ctl)
    elif how == "write and close":
        ctl.write_text('{"id": ')
        expected = b'{"id": '
    else:
        write_request(tmp_path, "r1", {"id": "renamed"})
        expected = b'{"id": "renamed"}\n'
    assert got.get(timeout=5) == ("file", expected)  # not after the 30 s settle time
    # At most one read again per event of the writer's after the first look: a first look
    # between `write_text`'s create and its write sees the write, then the close.
    assert trig.num_settle_reads <= (2 if how == "write and close" else 1)


@pytest.mark.parametrize("mode", ["inotify", "poll"])
def test_a_truncate_then_a_write_50ms_later_is_delivered_once_whole(trigger_factory, tmp_path, mode):
    """`echo ... > file` truncates, then writes: the empty file seen in between is not a request."""
    ctl = control_path(tmp_path, "r1")
    ctl.parent.mkdir(parents=True)
    ctl.write_text('{"id": "earlier"}')
    trig, got = trigger_factory(mode, poll_interval=0.01, safety_interval=30, settle_time=0.5)
    trig.start()
    with open(ctl, "w") as f:  # truncate, as the shell's > does
        f.flush()
        threading.Event().wait(0.05)  # the writer's own pace: the input of this test
        f.write('{"id": "mine"}')
    assert got.get(timeout=5) == ("file", b'{"id": "mine"}')
    with pytest.raises(queue.Empty):
        got.get(timeout=0.6)
    assert trig.num_settle_reads >= 1
    assert trig.num_settle_reads < 20, "read again every SETTLE_POLL_S (20 ms), not in a busy loop"


def test_a_file_that_stays_empty_or_half_written_is_delivered_after_the_settle_time(trigger_factory, tmp_path):
    """Polling cannot tell a writer that is done from one between its truncate and its write."""
    trig, got = trigger_factory("poll", poll_interval=0.02, settle_time=0.2)
    trig.start()
    control_path(tmp_path, "r1").touch()
    assert got.get(timeout=5) == ("file", b"")  # stays empty: the rank's defaults
    reads = trig.num_settle_reads
    assert reads >= 5, "read again through the settle time before it counts as empty"
    control_path(tmp_path, "r1").write_text('{"id": ')
    assert got.get(timeout=5) == ("file", b'{"id": ')  # stays half-written: the sidecar reports it
    assert trig.num_settle_reads > reads


def test_a_touch_is_delivered_as_a_repeat_of_the_same_bytes(trigger_factory, tmp_path):
    seen = queue.Queue()
    trig = FileTrigger(control_path(tmp_path, "r1"), seen.put, lambda exc: seen.put(exc), mode="inotify",
                       safety_interval=30)
    try:
        trig.start()
        write_request(tmp_path, "r1", {"id": "a"})
        first = seen.get(timeout=5)
        assert first.repeat is False
        os.utime(control_path(tmp_path, "r1"), ns=(10**18, 10**18))  # touch: same bytes, new mtime
        again = seen.get(timeout=5)
        assert (again.data, again.repeat, again.mtime_ns) == (first.data, True, 10**18)
        write_request(tmp_path, "r1", {"id": "b"})
        assert seen.get(timeout=5).repeat is False
    finally:
        trig.stop()


def test_a_write_racing_the_read_is_not_taken_for_a_touch_later(tmp_path):
    """Bytes newer than the signature they were read under must not come back as a 'repeat'."""
    ctl = control_path(tmp_path, "r1")
    ctl.parent.mkdir(parents=True)
    got = []
    trig = FileTrigger(ctl, got.append, got.append, mode="poll")
    ctl.write_text('{"id": "a"}')
    real_read = trig_module.read_control
    writes = []

    def read_then_write(*args, **kwargs):  # the writer finishes (once) between our fstat and our next look
        control = real_read(*args, **kwargs)
        if not writes:
            writes.append(control.mtime_ns + 10**9)
            os.utime(ctl, ns=(writes[0], writes[0]))
        return control

    trig_module.read_control = read_then_write
    try:
        trig._check()
    finally:
        trig_module.read_control = real_read
    trig._check()
    assert [(c.data, c.repeat) for c in got] == [(b'{"id": "a"}', False)], "one version, delivered once"
