"""The slowdown watch (sidecar.rank.slowdown): real 2-rank torchrun jobs (gloo) slowed while they run, and the detector."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest

from sidecar.common.config import SubProfilerConfig
from sidecar.common.exceptions import RequestError
from sidecar.common.recordscan import read_records
from sidecar.common.request import ProfileRequest, RankFilter, defaults_from_config, parse_request
from sidecar.rank.slowdown import MIN_STEPS, SlowdownWatch, StepTimes, fired_message
from support.launch import PYTHON, base_env, torchrun_cmd
from support.schema import check_command
from support.traces import load_trace, profiler_steps
from support.wait import wait_for

FIRED_RE = re.compile(r"step time (\d+\.\d)x the median \((\d+) ms vs (\d+) ms\) at step (\d+); capturing (\d+)-(\d+)")


# --- the detector ----------------------------------------------------------------------


def _feed(times: StepTimes, durations, excluded=()):
    t, fired = 0.0, []
    if times.steps_seen == 0:
        times.observe(t, False)
    else:
        t = times._last
    for i, d in enumerate(durations):
        t += d
        if times.observe(t, i in excluded) is not None:
            fired.append(i)
    return fired


def test_the_median_leaves_out_profiled_and_saved_steps():
    times = StepTimes(factor=2.5, consecutive=3)
    # 40 steps of 10 ms, of which 20 "profiled" at 1 s each: left out of the median, and never slow
    durations = [0.01] * 20 + [1.0] * 20 + [0.01] * 20
    assert _feed(times, durations, excluded=set(range(20, 40))) == []
    assert times.median == pytest.approx(0.01)
    assert times.steps_seen == 40


def test_k_consecutive_slow_steps_fire_and_fewer_do_not():
    times = StepTimes(factor=2.5, consecutive=3)
    assert _feed(times, [0.01] * MIN_STEPS * 2) == []
    assert _feed(times, [0.03, 0.03, 0.01, 0.03, 0.03, 0.01]) == []  # 2 in a row, twice
    assert _feed(times, [0.02, 0.03, 0.03, 0.03]) == [3]  # 2x is not slow; 3 at 3x in a row are


def test_a_watch_fires_once_then_is_spent_and_says_what_fired_it():
    request = ProfileRequest(id="w", kind="watch", factor=2.0, rank_filter=RankFilter(None), active_steps=2,
                             warmup_steps=1, wait_steps=0)
    watch = SlowdownWatch(request)
    t, step = 0.0, 0
    for _ in range(20):
        step, t = step + 1, t + 0.01
        assert not watch.on_step(step, t, False)
    fired = False
    for _ in range(3):
        step, t = step + 1, t + 0.05
        fired = watch.on_step(step, t, False)
    assert fired and watch.state == "firing" and watch.fire.step == step
    assert fired_message(watch.fire, 30, 31) == f"step time 5.0x the median (50 ms vs 10 ms) at step {step}; capturing 30-31"
    trace = ProfileRequest(id="w.slow-1", start_step=step + 3, active_steps=2, warmup_steps=1, wait_steps=0,
                           rank_filter=RankFilter(None), reason="step time ...")
    assert watch.is_ours(trace) and not watch.is_ours(ProfileRequest(id="other.slow-1"))
    watch.on_request(trace, step)
    assert watch.state == "fired" and watch.num_fired == 1
    for _ in range(10):  # slow on: the capture's steps pass, then the watch is spent
        step, t = step + 1, t + 0.05
        assert not watch.on_step(step, t, False)
    assert watch.state == "spent" and watch.is_done


def _fired_watch(request_id: str = "w") -> tuple[SlowdownWatch, int, float]:
    request = ProfileRequest(id=request_id, kind="watch", factor=2.0, rank_filter=RankFilter(None), active_steps=2,
                             warmup_steps=1, wait_steps=0)
    watch, t, step = SlowdownWatch(request), 0.0, 0
    for _ in range(20):
        step, t = step + 1, t + 0.01
        watch.on_step(step, t, False)
    return watch, step, t


def _other_ranks_capture(watch: SlowdownWatch, step: int) -> ProfileRequest:
    return ProfileRequest(id=f"{watch.id}.slow-1", start_step=step + 40, active_steps=2, warmup_steps=1,
                          wait_steps=0, rank_filter=RankFilter(None), reason="step time ... (rank 1 asked)")


def _place(tmp_path: Path, step: int):
    from sidecar.common import layout
    from sidecar.rank import slowdown

    layout.replica_dir(tmp_path, "rep").mkdir(parents=True)
    return slowdown.WatchPlace(tmp_path, "rep", 0, tmp_path / "traces", 0.0, lambda: step)


def test_the_other_ranks_capture_arriving_while_this_rank_asks_is_the_one_capture(tmp_path, monkeypatch):
    """Both ranks slow down together: rank 1 claims capture 1 and its request reaches rank 0 while rank 0's
    watch thread is between reading its fire and taking a claim. Rank 0 must not ask for a capture 2 (it would
    be refused on every rank, busy with capture 1)."""
    from sidecar.common import layout
    from sidecar.rank import slowdown

    watch, step, t = _fired_watch()
    for _ in range(3):
        step, t = step + 1, t + 0.05
        watch.on_step(step, t, False)
    assert watch.state == "firing"
    place = _place(tmp_path, step)
    layout.slowdown_claim_path(tmp_path, "rep", watch.id, 1).parent.mkdir(parents=True, exist_ok=True)
    layout.slowdown_claim_path(tmp_path, "rep", watch.id, 1).write_text("1\n")  # rank 1 won capture 1
    arrived = []

    def disk_check_meanwhile(path):  # the watcher thread delivers rank 1's request during the disk check
        if not arrived:
            arrived.append(True)
            watch.on_request(_other_ranks_capture(watch, step), step)
        return 50.0

    monkeypatch.setattr(slowdown, "free_pct", disk_check_meanwhile)
    assert slowdown.ask_for_capture(watch, place) is None
    assert arrived and watch.state == "fired" and watch.fired_request_id == f"{watch.id}.slow-1"
    assert not layout.slowdown_claim_path(tmp_path, "rep", watch.id, 2).exists()
    assert not layout.control_path(tmp_path, "rep").exists(), "a second capture was asked for"


def test_a_capture_arriving_while_the_training_thread_fires_wins(monkeypatch):
    """The watcher thread delivers the replica's capture while this rank's training thread is inside the step
    that completes its own run of slow steps (after it saw "watching"): the watch stays fired, it does not
    fire again."""
    from sidecar.rank import slowdown

    watch, step, t = _fired_watch()
    for _ in range(2):
        step, t = step + 1, t + 0.05
        assert not watch.on_step(step, t, False)
    real_fire = slowdown.Fire

    def fire_meanwhile(*args):
        watch.on_request(_other_ranks_capture(watch, step), step)
        return real_fire(*args)

    monkeypatch.setattr(slowdown, "Fire", fire_meanwhile)
    step, t = step + 1, t + 0.05
    assert not watch.on_step(step, t, False)
    assert watch.state == "fired" and watch.fire is None


def test_watch_fields_belong_to_watch_requests():
    defaults = defaults_from_config(SubProfilerConfig())
    parse = lambda text: parse_request(text.encode(), defaults, "x")  # noqa: E731
    watch = parse('{"kind": "watch", "factor": 3, "consecutive": 2, "repeat": 1, "baseline": false}')
    assert (watch.factor, watch.consecutive, watch.repeat, watch.baseline) == (3.0, 2, 1, False)
    assert watch.to_json()["factor"] == 3.0 and "factor" not in parse('{"kind": "trace"}').to_json()
    with pytest.raises(RequestError, match="needs a factor"):
        parse('{"kind": "watch"}')
    with pytest.raises(RequestError, match="factor must be a number above 1"):
        parse('{"kind": "watch", "factor": 1}')
    with pytest.raises(RequestError, match="'repeat' has meaning only in a watch request"):
        parse('{"kind": "trace", "repeat": 2}')


# --- real jobs -----------------------------------------------------------------------


def _cli(registry: Path, *args: str, timeout: float = 150) -> subprocess.CompletedProcess:
    return subprocess.run([PYTHON, "-m", "sidecar", *args, "--registry", str(registry)],
                          capture_output=True, text=True, timeout=timeout, env=base_env())


def _job(spawn, tmp_path: Path, registry: Path, name: str, slow_file: Path, *args: str, **env: str):
    cmd = torchrun_cmd(2, name)
    proc = spawn(name, ["--step-sleep", "0.02", "--slow-file", str(slow_file), *args],
                 base_env(registry, COSMOS_PROFILER_OUTPUT_DIR=str(tmp_path / "out"), OMP_NUM_THREADS="1", **env),
                 program=cmd)
    wait_for(lambda: len(read_records(registry, name)) == 2, timeout=120, what="2 rank records")
    return proc


def _slow(path: Path, gen: int, seconds: float, how: str = "") -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(f"{gen} 0 {seconds} {how}")
    tmp.replace(path)  # a new inode: the job reads it at its next step


def _recs(registry: Path, name: str) -> dict:
    return {r.rank: r for r in read_records(registry, name)}


def _traces(tmp_path: Path, name: str, rank: int) -> list[Path]:
    return sorted((tmp_path / "out" / "profile_trace" / f"{name}_{rank}").glob("*_trace.json.gz"))


def test_a_job_that_slows_down_leaves_one_aligned_capture_and_a_baseline(spawn, tmp_path, registry):
    name, slow_file = "slowjob", tmp_path / "slow"
    proc = _job(spawn, tmp_path, registry, name, slow_file)
    cli = subprocess.Popen([PYTHON, "-m", "sidecar", "profile", "set", name, "-rf", "all", "--on-slowdown", "2.5",
                            "-as", "2", "--wait", "--timeout", "150", "--registry", str(registry)],
                           stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=base_env())
    try:
        def baselined():
            recs = _recs(registry, name)
            return len(recs) == 2 and all(
                r.request_id and r.request_id.endswith(".baseline") and r.num_captures == 1 and r.state == "idle"
                and (r.slowdown or {}).get("median_s") for r in recs.values()) and recs
        recs = wait_for(baselined, timeout=120, what="a baseline capture and a median on both ranks")
        watch_id = recs[0].slowdown["id"]
        assert recs[1].slowdown["id"] == watch_id and recs[0].slowdown["state"] == "watching"
        slowed_at = max(r.step for r in _recs(registry, name).values())
        # rank 0 multiplies matrices for 80 ms more: both ranks slow down (the all-reduce waits)
        _slow(slow_file, 1, 0.08, "busy")
        out, err = cli.communicate(timeout=170)
    finally:
        cli.kill()
    assert cli.returncode == 0, out + err
    assert "Armed a slowdown watch on replica slowjob" in out and "Baseline:" in out and "Slowdown: capture" in out
    recs = _recs(registry, name)
    messages = {r.slowdown["message"] for r in recs.values()}
    assert len(messages) == 1, messages  # the first rank's request won; the other added none
    match = FIRED_RE.fullmatch(messages.pop())
    assert match and float(match[1]) >= 2.5 and int(match[4]) > slowed_at, recs[0].slowdown
    first, last = int(match[5]), int(match[6])
    assert last == first + 1 and first > int(match[4])
    for rank, rec in recs.items():
        assert rec.slowdown["num_fired"] == 1 and rec.request_id == f"{watch_id}.slow-1"
        assert rec.request["reason"] == match[0] and not rec.misaligned
        assert profiler_steps(load_trace(rec.trace_path)) == [first, last], rank
        assert f"rank {rank}: {rec.trace_path}" in out
    assert f"slowdown watch {watch_id} fired: {match[0]}" in proc.stderr()

    # Still slow, well past the capture: the watch is spent; no second capture.
    wait_for(lambda: min(r.step for r in _recs(registry, name).values()) > last + 20, timeout=60, what="more slow steps")
    recs = _recs(registry, name)
    assert all(r.slowdown["state"] == "spent" and r.num_captures == 2 for r in recs.values()), recs
    assert [len(_traces(tmp_path, name, k)) for k in (0, 1)] == [2, 2]

    # profile diff on the replica: the watch's baseline against its slow capture; the op that grew first.
    diff = _cli(registry, "profile", "diff", name, "--json")
    assert diff.returncode == 0, diff.stderr
    changed = json.loads(diff.stdout)
    assert (changed["base"]["name"], changed["new"]["name"]) == (f"{name}:0", f"{name}:1"), changed["base"]
    assert changed["ops"][0]["name"] == "aten::mm" and changed["ops"][0]["delta_s"] > 0.02, changed["ops"][:3]
    assert changed["mean_step_s"]["new"] > 2 * changed["mean_step_s"]["base"], changed["mean_step_s"]

    # Armed again, without a baseline: status shows it; cancel disarms it; slow steps then capture nothing.
    _slow(slow_file, 2, 0.0)
    wait_for(lambda: "SLOW 2 rank 1" in proc.stdout(), timeout=30, what="the job at full speed")
    armed = _cli(registry, "profile", "set", name, "-rf", "all", "--on-slowdown", "3", "--no-baseline",
                 "--consecutive", "4")
    assert armed.returncode == 0, armed.stderr
    # The record shows the median and the steps seen as of its last heartbeat (every 5 s, or on a change).
    wait_for(lambda: all((r.slowdown or {}).get("factor") == 3.0 and r.slowdown["steps_seen"] > 0
                         for r in _recs(registry, name).values()), timeout=30, what="the new watch on both ranks")
    status = _cli(registry, "profile", "status", name)
    assert status.returncode == 0, status.stderr
    assert "Slowdown watch:" in status.stdout and "3x, 4 in a row" in status.stdout, status.stdout
    assert "watching" in status.stdout and " ms" in status.stdout
    as_json = _cli(registry, "profile", "status", name, "--json")
    data = json.loads(as_json.stdout)
    check_command(data, "profile status")
    assert [(w["rank"], w["factor"], w["consecutive"], w["state"]) for w in data["slowdown"]] == [
        (0, 3.0, 4, "watching"), (1, 3.0, 4, "watching")]
    assert all(w["median_s"] > 0 and w["steps_seen"] > 0 for w in data["slowdown"]), [(w["median_s"], w["steps_seen"]) for w in data["slowdown"]]
    cancel = _cli(registry, "profile", "cancel", name)
    assert cancel.returncode == 0, cancel.stdout + cancel.stderr
    wait_for(lambda: all(r.slowdown["state"] == "cancelled" for r in _recs(registry, name).values()), timeout=30,
             what="the watch cancelled on both ranks")
    at = max(r.step for r in _recs(registry, name).values())
    _slow(slow_file, 3, 0.08)
    wait_for(lambda: min(r.step for r in _recs(registry, name).values()) > at + 25, timeout=60, what="slow steps")
    assert all(r.num_captures == 2 and r.slowdown["num_fired"] == 0 for r in _recs(registry, name).values())
    assert proc.stop(timeout=120) == 0


def test_the_always_on_watch_captures_at_most_once_per_interval(spawn, tmp_path, registry):
    name = "alwayson"
    # Slow phases of 1.5 s (100 ms steps) between fast ones of 2 s (20 ms): a slowdown every 3.5 s.
    proc = _job(spawn, tmp_path, registry, name, tmp_path / "none", "--speed-schedule", "0.1:1.5,0.02:2",
                COSMOS_PROFILER_SLOWDOWN_FACTOR="2.5", COSMOS_PROFILER_SLOWDOWN_MIN_INTERVAL_S="3600")
    def captured():
        recs = _recs(registry, name)
        return len(recs) == 2 and all(r.num_captures == 1 for r in recs.values()) and recs

    recs = wait_for(captured, timeout=120, what="the always-on watch's first capture")
    assert {r.slowdown["always_on"] for r in recs.values()} == {True}
    assert len({r.request_id for r in recs.values()}) == 1 and all(r.request["reason"] for r in recs.values())
    # The next slow phases are seen but not captured: the budget allows one capture an hour. (The rank that
    # asked for the capture was left "waiting" for a minute when its own watcher took the request before
    # the write returned: no slow phase was seen meanwhile.)
    wait_for(lambda: all("not captured, the last capture was" in (r.slowdown.get("note") or "")
                         for r in _recs(registry, name).values()), timeout=30, what="a slowdown the budget refused")
    assert all(r.num_captures == 1 and r.slowdown["num_fired"] == 1 for r in _recs(registry, name).values())
    assert proc.stop(timeout=120) == 0


def test_a_restart_keeps_the_always_on_budget(tmp_path, monkeypatch):
    import sidecar

    monkeypatch.setenv("COSMOS_PROFILER_SLOWDOWN_FACTOR", "3")
    where = {"output_dir": tmp_path / "out", "replica": "rs", "rank": 0, "registry": tmp_path / "reg"}
    with sidecar.install(**where) as sc:
        watch = sc.record().slowdown
        assert watch["always_on"] and watch["factor"] == 3.0 and watch["last_capture_at"] is None
        sc._watches.shown.last_capture_at = 1234.5  # as on_request sets it when a capture came
    with sidecar.install(**where) as sc:
        assert sc.record().slowdown["last_capture_at"] == 1234.5


def test_watch_options_need_on_slowdown(tmp_path):
    from support.cli import invoke

    result = invoke("profile", "set", "r1", "--repeat", "2", "--registry", str(tmp_path))
    assert result.exit_code == 2
    assert "--repeat is an option of the slowdown watch; give --on-slowdown FACTOR too" in result.output
