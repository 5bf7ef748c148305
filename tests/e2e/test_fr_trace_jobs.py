"""torch's fr_trace and our `profile hang` side by side, on the same dumps of real gloo jobs (torchrun,
the recorder's CPU path): a second process group, coalesced all_reduces, send/recv, a rank that
left (`fr2`), and a rank that never dumped (`fr3`: its recorder is off). The analysis on
hand-written dumps is tests/unit/test_hang_fr_trace.py's."""

from __future__ import annotations

import json
import pickle
import subprocess
from pathlib import Path

import pytest

from sidecar.common.recordscan import read_records
from support.launch import PYTHON, ROOT, Spawner, base_env, torchrun_cmd
from support.wait import wait_for

FR_JOB = ROOT / "tests" / "programs" / "fr_job.py"
FR_TRACE = "torch.distributed.flight_recorder.fr_trace"


def _hang(registry: Path, name: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([PYTHON, "-m", "sidecar", "profile", "hang", name, "--registry", str(registry), *args],
                          capture_output=True, text=True, timeout=180, env=base_env())


def _left_job(tmp_path_factory, name: str, nproc: int, *extra: str):
    """A job whose rank 1 left at step 5; the settled `profile hang --json` answer (ranks 0 and 2 wait)."""
    root = tmp_path_factory.mktemp(name)
    spawner = Spawner(root)
    registry = root / "registry"
    env = base_env(registry, COSMOS_PROFILER_OUTPUT_DIR=str(root / "out"), OMP_NUM_THREADS="1")
    proc = spawner(name, ["--leave-rank", "1", *extra], env, program=torchrun_cmd(nproc, name, str(FR_JOB)))
    try:
        wait_for(lambda: "HANGING" in proc.stdout(), timeout=120, what="rank 1 to leave")
        wait_for(lambda: len(r := read_records(registry, name)) == nproc and all(x.step == 5 for x in r),
                 timeout=60, what="every rank at step 5")

        last: list[dict] = []

        def settled():
            """The answer once the others wait in the all_reduce, and the same twice in a row: a loaded
            machine's first answers can still see a rank between its dump and the collective."""
            done = _hang(registry, name, "--json")
            assert done.returncode == 0, done.stdout + done.stderr
            answer = json.loads(done.stdout)
            waiting = [k for k in range(nproc) if k != 1 and (k != 2 or "--no-fr-rank" not in extra)]
            if not (answer["collective"] and answer["collective"]["waiting"] == waiting):
                return None
            verdict = (answer["suspects"], answer["collective"].get("behind"), answer["collective"].get("unknown"))
            stable = bool(last) and last[-1] == verdict
            last.append(verdict)
            return answer if stable else None

        answer = wait_for(settled, timeout=90, interval=0.5, what="the others waiting in the step's all_reduce")
    except BaseException:
        spawner.close()
        raise
    return spawner, registry, answer


@pytest.fixture(scope="module")
def fr2(tmp_path_factory):
    spawner, registry, answer = _left_job(tmp_path_factory, "fr2", 2)
    yield registry, answer
    spawner.close()


@pytest.fixture(scope="module")
def fr3(tmp_path_factory):
    spawner, registry, answer = _left_job(tmp_path_factory, "fr3", 3, "--no-fr-rank", "2")
    yield registry, answer
    spawner.close()


def _fr_trace(directory: str, *args: str) -> subprocess.CompletedProcess:
    """torch's own command, on our folder as it is."""
    return subprocess.run([PYTHON, "-m", FR_TRACE, directory, *args], capture_output=True, text=True, timeout=120,
                          env=base_env())


def test_fr_trace_reads_our_dumps_as_they_are_and_names_the_rank_that_left(fr2):
    _, answer = fr2
    theirs = answer["fr_trace"]
    directory = theirs["directories"]["cpu"]
    assert Path(directory).parent.name == answer["request_id"] and Path(directory).parents[1].name == "fr2_fr_trace"
    assert sorted(p.name for p in Path(directory).iterdir()) == ["rank_0", "rank_1"]
    assert theirs["commands"] == [f"python -m {FR_TRACE} {directory}"]
    done = _fr_trace(directory)
    assert done.returncode == 0, done.stderr
    seq = answer["collective"]["seq"]
    said = done.stdout + done.stderr
    assert f"Not all ranks joining collective, sequence number: {seq}" in said and "missing ranks: {1}" in said
    assert "group info: 0:default_pg" in said and "collective: gloo:all_reduce" in said
    # gloo leaves pg_config empty: the rank fills in the groups it used, and says so
    dump = pickle.loads((Path(directory) / "rank_0").read_bytes())
    assert {k: (v["desc"], v["ranks"]) for k, v in dump["pg_config"].items()} == {
        "0": ("default_pg", "[0, 1]"), "1": ("second", "[0, 1]")}
    assert "cosmos_profiler_pg_config" in dump and dump["entries"][-1]["frames"]  # torch's pickle keeps the stacks


def test_the_suspect_is_fr_traces_and_ours_agrees(fr2):
    registry, answer = fr2
    theirs = answer["fr_trace"]
    assert theirs["ran"] is True and theirs["reason"] == "" and theirs["ranks"] == {"cpu": [0, 1]}
    c = answer["collective"]
    assert answer["suspects"] == [1] and c["suspects_from"] == "fr_trace" and c["behind"] == [1]
    assert c["fr_trace"] == f"gloo:all_reduce seq {c['seq']}: rank 1 did not join it"
    (finding,) = theirs["findings"]  # everything before the hang matched across ranks
    assert (finding["process_group"], finding["seq"], finding["missing_ranks"]) == ("0", c["seq"], [1])
    # matched: the second group's all_reduce, two coalesced all_reduces, the barrier, the 5 steps' all_reduces
    assert theirs["matched"] == 9
    done = _hang(registry, "fr2", "--no-fr-trace", "--json")
    ours = json.loads(done.stdout)
    assert ours["fr_trace"] is None and ours["suspects"] == [1]
    assert ours["collective"]["suspects_from"] == "flight recorder positions" and ours["collective"]["fr_trace"] is None
    text = _hang(registry, "fr2").stdout
    assert text.startswith("Replica fr2: Rank 1 is the suspect.")
    assert f"  torch's fr_trace, pg 0 default_pg: gloo:all_reduce seq {c['seq']}: rank 1 did not join it." in text
    assert "(the suspects are fr_trace's; the positions, the wait and the stacks are ours)" in text
    assert f"  torch's analysis of these dumps: python -m {FR_TRACE} " in text


def test_what_gloo_records_coalesced_as_one_entry_and_no_point_to_point(fr2):
    _, answer = fr2
    rank0 = next(r for r in answer["ranks"] if r["rank"] == 0)
    entries = json.loads(Path(rank0["flight_recorder_path"]).read_text())["recorders"]["cpu"]["entries"]
    names = [(e["process_group"][1], e["profiling_name"], e["input_sizes"]) for e in entries]
    assert names[:4] == [("second", "gloo:all_reduce", [[4]]), ("default_pg", "gloo:all_reduce", [[2], [3]]),
                         ("default_pg", "gloo:all_reduce", [[2], [3]]), ("default_pg", "gloo:barrier", [])]
    assert not any(e["is_p2p"] for e in entries)  # send/recv and batch_isend_irecv: not on the CPU path


def test_a_rank_that_never_dumped_fr_trace_refuses_or_flags_nothing_ours_names_both(fr3):
    _, answer = fr3
    theirs, c = answer["fr_trace"], answer["collective"]
    directory = theirs["directories"]["cpu"]
    assert theirs["ran"] is True and theirs["ranks"] == {"cpu": [0, 1]} and theirs["findings"] == []
    assert theirs["commands"] == [f"python -m {FR_TRACE} {directory} --allow-incomplete-ranks"]
    refused = _fr_trace(directory)
    assert refused.returncode != 0 and "Missing dump files from ranks {2}" in refused.stderr
    assert answer["suspects"] == [1] and c["behind"] == [1] and c["unknown"] == [2], json.dumps(answer)[:3000]
    assert c["suspects_from"] == "flight recorder positions"
    assert c["fr_trace"] == (f"flags nothing at gloo:all_reduce seq {c['seq']} (it names a rank that did not join "
                             "only when every member sent a dump, and rank 2 sent none)")
    rank2 = next(r for r in answer["ranks"] if r["rank"] == 2)
    assert rank2["flight_recorder_error"].startswith("the flight recorder is off (TORCH_FR_BUFFER_SIZE=0")
