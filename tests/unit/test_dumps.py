"""sidecar.rank.dumps: one header for every dump, and one naming rule for the flight recorder file."""

from __future__ import annotations

import json
from pathlib import Path

import torch  # noqa: F401 - the flight recorder is read only in a process that imported torch

from sidecar.common.config import JobConfig
from sidecar.common.identity import RankIdentity
from sidecar.rank.context import RankContext
from sidecar.rank.dumps import dump_header, write_flight_recorder, write_stacks
from sidecar.rank.hotpath import HotPath
from sidecar.rank.saver import Saver

IDENTITY = RankIdentity(replica="r1", role="policy", rank=2, local_rank=2, world_size=4, host="h", pid=77)


def _saver(trace_dir: Path) -> Saver:
    ctx = RankContext(IDENTITY, JobConfig(), trace_dir, trace_dir, True, HotPath())
    ctx.trace_dir = trace_dir  # the dumps' own directory, not the layout's
    return Saver(ctx)


def test_the_header_heads_the_stacks_file_and_the_flight_recorder_alike(tmp_path):
    header = dump_header(IDENTITY, 12, "idle", "req-1", last_step_at=1_800_000_000.25)
    saver = _saver(tmp_path)
    stacks = write_stacks(saver, header)
    assert stacks.error == "" and stacks.path == tmp_path / "0_stacks.txt"
    first = stacks.path.read_text().splitlines()[0]
    assert " replica=r1 rank=2 host=h pid=77 step=12 state=idle request=req-1 last_step_at=1800000000.250 at=" in first
    dump = write_flight_recorder(saver, header, stacks, stall_step=12)
    meta = json.loads(dump.path.read_text())["cosmos_profiler"]
    assert {k: meta[k] for k in (*header, "stall_step")} == {**header, "stall_step": 12}
    assert dump.reason.startswith("no process group") and not dump.ok  # written, with the reason


def test_the_flight_recorder_takes_the_number_of_its_stacks_dump(tmp_path):
    saver = _saver(tmp_path)
    header = dump_header(IDENTITY, 3, "idle", "stacks-only")
    write_stacks(saver, header)
    write_stacks(saver, header)  # two "stacks" requests: 0_ and 1_stacks.txt, no flight recorder
    stacks = write_stacks(saver, dump_header(IDENTITY, 3, "idle", "a-hang"))
    assert stacks.path.name == "2_stacks.txt"
    assert write_flight_recorder(saver, header, stacks).path == tmp_path / "2_flight_recorder.json"


def test_a_flight_recorder_dumped_alone_takes_the_next_free_number_and_never_replaces_one(tmp_path):
    saver = _saver(tmp_path)
    header = dump_header(IDENTITY, 3, "idle", None)
    assert write_flight_recorder(saver, header).path == tmp_path / "0_flight_recorder.json"
    assert write_flight_recorder(saver, header).path == tmp_path / "1_flight_recorder.json"
    stacks = write_stacks(saver, header)
    assert stacks.path.name == "0_stacks.txt"  # its number is taken: the next free one
    assert write_flight_recorder(saver, header, stacks).path == tmp_path / "2_flight_recorder.json"


def test_a_stacks_dump_that_cannot_be_written_says_why_and_names_the_file_it_would_have_been(tmp_path):
    blocker = tmp_path / "a-file"
    blocker.write_text("")
    saver = _saver(blocker / "trace")
    stacks = write_stacks(saver, dump_header(IDENTITY, 3, "idle", "req"))
    assert stacks.path == blocker / "trace" / "0_stacks.txt" and stacks.error.startswith("Not a directory")
    dump = write_flight_recorder(saver, dump_header(IDENTITY, 3, "idle", "req"), stacks)
    assert dump.path is None and dump.reason.startswith("flight recorder not written: Not a directory")
