"""Unit tests start no process: while one runs, every way the standard library starts one
(support.layout.STARTERS_PATCHED) is refused, and the test fails naming it, even where the code
under test caught the refusal and carried on."""

from __future__ import annotations

import importlib

import pytest

from support.layout import STARTERS_PATCHED, ProcessStartInUnitTest


@pytest.fixture(autouse=True)
def no_process_starts(monkeypatch):
    started: list[str] = []

    def refused(name: str):
        def start(*args, **kwargs):
            started.append(name)
            raise ProcessStartInUnitTest(f"{name}: a unit test starts no process (tests/e2e/ is for those)")
        return start

    for where in STARTERS_PATCHED:
        module, _, path = where.partition(":")
        *owners, attr = path.split(".")
        owner = importlib.import_module(module)
        for name in owners:
            owner = getattr(owner, name)
        monkeypatch.setattr(owner, attr, refused(where))
    yield started
    assert not started, f"this unit test started processes ({', '.join(started)}); move it to tests/e2e/"
