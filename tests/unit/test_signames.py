"""Signal names both ways, as `kill -s` spells them (sidecar/common/signames.py); bash's own `kill`
agrees in tests/e2e/test_signames_bash.py."""

import signal

import pytest

from sidecar.common.signames import catchable_signal, parse_signal, signal_name


@pytest.mark.parametrize(
    ("text", "number"),
    [
        ("SIGUSR1", signal.SIGUSR1),
        ("usr1", signal.SIGUSR1),
        (" USR2 ", signal.SIGUSR2),
        ("SIGRTMIN", signal.SIGRTMIN),
        ("SIGRTMIN+3", signal.SIGRTMIN + 3),
        ("rtmin+3", signal.SIGRTMIN + 3),
        ("SIGRTMAX-1", signal.SIGRTMAX - 1),
        ("10", 10),
    ],
)
def test_parse_signal_takes_what_kill_takes(text, number):
    assert parse_signal(text) == number


@pytest.mark.parametrize("text", ["SIGNOPE", "", "RTMIN+99", "RTMAX+1", "0", "999"])
def test_parse_signal_refuses_what_names_no_signal(text):
    with pytest.raises(ValueError):
        parse_signal(text)


def test_signal_name_round_trips_every_signal():
    for number in range(1, signal.NSIG):
        name = signal_name(number)
        assert parse_signal(name) == number


@pytest.mark.parametrize("text", ["SIGKILL", "stop", "SIGSEGV", "SIGABRT"])
def test_catchable_signal_refuses_uncatchable_and_fault_signals(text):
    with pytest.raises(ValueError, match="sidecar.signal cannot be SIG"):
        catchable_signal(text, "sidecar.signal")


def test_catchable_signal_names_the_key():
    with pytest.raises(ValueError, match=r"^COSMOS_PROFILER_SIGNAL: 'SIGWHAT' names no signal"):
        catchable_signal("SIGWHAT", "COSMOS_PROFILER_SIGNAL")
    assert catchable_signal("rtmin+2", "k") == "SIGRTMIN+2"
