"""sidecar.rank.signalowner.SignalOwner: which signal triggers this rank, counting what comes (the
handler only sets the hot-path flag), folding signals into one request per step boundary, and
noticing when the job takes the signal or gives it back. Real signals, sent to this process."""

from __future__ import annotations

import logging
import os
import signal
import time

import pytest

from sidecar.rank.signalowner import SignalOwner
from support.rooms import rank_context

RT_FIRST_FREE = signal.SIGRTMIN + 3


@pytest.fixture(autouse=True)
def keep_dispositions():
    """Give SIGUSR1, SIGUSR2 and the first real-time signals back their handlers after each test."""
    signums = [signal.SIGUSR1, signal.SIGUSR2, *range(RT_FIRST_FREE, RT_FIRST_FREE + 3)]
    before = {signum: signal.getsignal(signum) for signum in signums}
    yield
    for signum, handler in before.items():
        signal.signal(signum, handler if handler is not None else signal.SIG_DFL)


@pytest.fixture(autouse=True)
def free_sigusr1():
    signal.signal(signal.SIGUSR1, signal.SIG_DFL)


def _send(owner: SignalOwner, signum: int, expect: int) -> None:
    """Signal this process and wait (on a deadline) for the handler to have counted `expect` signals."""
    os.kill(os.getpid(), signum)
    deadline = time.monotonic() + 5.0
    while owner.count < expect and time.monotonic() < deadline:
        time.sleep(0.001)  # the handler runs on the main thread between bytecodes
    assert owner.count == expect


def _job_handler(signum, frame):  # noqa: ANN001 - a signal handler's signature
    pass


def test_a_signal_is_counted_and_gives_the_next_step_boundary_work(tmp_path):
    ctx = rank_context(tmp_path)
    owner = SignalOwner(ctx, {})
    owner.start(frozenset())
    try:
        assert owner.trigger is not None and owner.trigger.signum == signal.SIGUSR1
        assert ctx.hot._boundary_work is False and owner.take() is None
        _send(owner, signal.SIGUSR1, 1)
        assert ctx.hot._boundary_work is True and owner.has_unhandled
        assert owner.take() == 1 and not owner.has_unhandled and owner.take() is None
        _send(owner, signal.SIGUSR1, 2)
        _send(owner, signal.SIGUSR1, 3)
        assert owner.take() == 3 and owner.num_coalesced == 1  # two signals before one boundary: one request
    finally:
        owner.stop()
    assert signal.getsignal(signal.SIGUSR1) == signal.SIG_IGN  # told safe to send: never kills the job after us


def test_a_signal_the_job_will_handle_is_never_taken_and_a_free_one_stands_in(tmp_path, caplog):
    ctx = rank_context(tmp_path)
    owner = SignalOwner(ctx, {int(signal.SIGUSR1): "cosmos-rl's checkpoint signal"})
    with caplog.at_level(logging.WARNING, logger="sidecar"):
        owner.start(frozenset())
    try:
        assert owner.trigger is not None and owner.trigger.signum == RT_FIRST_FREE
        assert signal.getsignal(signal.SIGUSR1) == signal.SIG_DFL
        assert "SIGUSR1 is the job's (cosmos-rl's checkpoint signal)" in caplog.text
        assert f"`kill -s {owner.trigger.name} {os.getpid()}` triggers this rank instead" in caplog.text
    finally:
        owner.stop()


def test_a_signal_named_by_the_user_that_the_job_handles_leaves_the_trigger_off(tmp_path, caplog):
    signal.signal(signal.SIGUSR2, _job_handler)
    ctx = rank_context(tmp_path, signal="SIGUSR2")
    owner = SignalOwner(ctx, {})
    with caplog.at_level(logging.WARNING, logger="sidecar"):
        owner.start(frozenset())
    assert owner.trigger is None and owner.check() is None
    assert signal.getsignal(signal.SIGUSR2) is _job_handler
    assert "takes no other signal in place of one you named" in caplog.text


def test_off_takes_nothing(tmp_path):
    ctx = rank_context(tmp_path, signal="off")
    owner = SignalOwner(ctx, {})
    owner.start(frozenset())
    assert owner.trigger is None and owner.check() is None
    assert signal.getsignal(signal.SIGUSR1) == signal.SIG_DFL


def test_a_signal_the_job_takes_later_is_its_own_until_it_gives_it_back(tmp_path):
    ctx = rank_context(tmp_path)
    owner = SignalOwner(ctx, {})
    owner.start(frozenset())
    try:
        assert owner.check() is owner.trigger
        signal.signal(signal.SIGUSR1, _job_handler)  # the job sets its own handler after ours
        assert owner.check() is None and not owner.reclaim_due
        signal.signal(signal.SIGUSR1, signal.SIG_DFL)  # ... and gives the signal back
        assert owner.check() is None and owner.reclaim_due
        assert ctx.hot._boundary_work is True  # the next step boundary takes it back (the main thread)
        assert owner.reclaim() is True and not owner.reclaim_due
        assert owner.check() is owner.trigger
        _send(owner, signal.SIGUSR1, 1)
    finally:
        owner.stop()
