"""The suite's own layout holds: a test that starts a process is under tests/e2e/ and marked `e2e`,
so `bin/test --fast` (`pytest -m "not e2e" tests/unit`) never starts one."""

from __future__ import annotations

import importlib
import os
import types

import pytest

from support import launch
from support.layout import (
    E2E_DIR,
    PROCESS_FIXTURES,
    TESTS,
    UNIT_DIR,
    ProcessStartInUnitTest,
    is_e2e,
    is_unit,
    process_starters,
)


def test_a_test_using_a_process_fixture_or_helper_is_named_and_a_plain_one_is_not():
    assert process_starters(["tmp_path", "spawn"], None) == ["fixture spawn"]
    assert process_starters(["tmp_path", "controller"], None) == []  # a thread in this process, not a process
    starts = types.ModuleType("fake_test_module")
    starts.Spawner = launch.Spawner
    starts.ROOT = launch.ROOT  # constants of support.launch start nothing
    assert process_starters(["capture"], starts) == ["fixture capture", "imports support.launch.Spawner"]
    plain = types.ModuleType("fake_test_module")
    plain.ROOT, plain.base_env = launch.ROOT, launch.base_env
    assert process_starters(["tmp_path"], plain) == []
    assert is_e2e(E2E_DIR / "test_x.py") and not is_e2e(UNIT_DIR / "test_x.py")
    assert is_unit(UNIT_DIR / "test_x.py") and not is_unit(TESTS / "test_x.py") and not is_e2e(TESTS / "test_x.py")


def test_every_collected_test_outside_e2e_starts_no_process_and_every_e2e_one_is_marked(request):
    # conftest.py fails the collection itself; this says so again, test by test, for this run's items.
    for item in request.session.items:
        assert is_e2e(item.path) or is_unit(item.path), item.nodeid
        if is_e2e(item.path):
            assert item.get_closest_marker("e2e"), item.nodeid
        else:
            assert item.get_closest_marker("e2e") is None, item.nodeid
            assert process_starters(item.fixturenames, item.module) == [], item.nodeid
            assert not set(item.fixturenames) & PROCESS_FIXTURES, item.nodeid


@pytest.mark.parametrize("start", [
    # (imported here: a unit test module that imports subprocess fails the collection)
    lambda: importlib.import_module("subprocess").run(["true"], check=False),
    lambda: os.fork(),
    lambda: os.system("true"),
], ids=["subprocess", "fork", "system"])
def test_a_unit_test_that_starts_a_process_fails(start, no_process_starts):
    with pytest.raises(ProcessStartInUnitTest, match="a unit test starts no process"):
        start()
    assert no_process_starts  # the fixture fails the test at teardown, even where the code caught the refusal
    no_process_starts.clear()
