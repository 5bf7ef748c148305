"""Real captures for the tests that read one: two ranks of tests/programs/train.py as replica r1
(`two_rank_capture`), and a torchrun DDP job with one rank slowed down (`slowed_ddp_captures`)."""

from __future__ import annotations

import json
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from types import SimpleNamespace

from sidecar.common.layout import carried_summaries_path
from sidecar.common.recordscan import read_records
from sidecar.common.registry import write_request

from .cli import run_cli
from .launch import Spawner, base_env, torchrun_cmd
from .records import wait_record
from .traces import load_trace
from .wait import wait_for

RANKS = (0, 1)


def published_summaries(registry: Path, replica: str, rank: int) -> list[dict]:
    """The summaries `rank` published beside its record (layout.carried_summaries_path); [] before its first."""
    try:
        return json.loads(carried_summaries_path(registry, replica, rank).read_text())["summaries"]
    except FileNotFoundError:
        return []


def two_rank_capture(tmp: Path, requests: list[tuple[dict, tuple[int, ...]]],
                     step_sleep: dict[int, str] | None = None, env: dict[str, str] | None = None,
                     args: Sequence[str] = (), before_request: Callable[[int], None] | None = None,
                     summaries: bool = False) -> SimpleNamespace:
    """Run ranks 0 and 1 of replica r1 under `tmp` (rank k sleeping `step_sleep[k]` seconds inside
    each step), write each request in turn and wait until each rank it names has saved it, stop both.

    Args:
        requests: (request, ranks that take it); request n becomes each of its ranks' capture n.
        env: more environment for both ranks.
        args: more arguments of tests/programs/train.py for both ranks.
        before_request: called with n before request n is written (to change the work between captures).
        summaries: also wait, after each request, until each rank published the summary of its trace
            (each record given then has those summaries under "summaries").
    Returns:
        registry, out; records, paths and docs (rank -> record, trace path, loaded trace) of the
        first request; captures: for each request, rank -> the record once that rank saved it.
    """
    registry, out = tmp / "registry", tmp / "out"
    spawner = Spawner(tmp)
    try:
        procs = [
            spawner.rank(registry, *(["--step-sleep", step_sleep[rank]] if step_sleep else []), *args, name=f"rank{rank}",
                         output=out, env_extra={"RANK": str(rank), "WORLD_SIZE": str(len(RANKS)), **(env or {})},
                         wait=False)
            for rank in RANKS
        ]
        for rank, proc in zip(RANKS, procs, strict=True):
            proc.wait_ready()
            proc.wait_idle(registry, "r1", rank)
        captures = []
        for n, (request, ranks) in enumerate(requests):
            if before_request is not None:
                before_request(n)
            write_request(registry, "r1", request)
            captures.append({
                rank: wait_record(registry, lambda r, n=n: r.get("state") == "idle" and (r.get("trace_path") or "")
                                  .endswith(f"/{n}_trace.json.gz"), "r1", rank, 90, what=f"rank {rank} capture {n}")
                for rank in ranks
            })
            if summaries:
                for rank in ranks:
                    wait_for(lambda rank=rank, n=n: any(s.get("capture") == n
                                                        for s in published_summaries(registry, "r1", rank)),
                             90, what=f"rank {rank} to publish the summary of capture {n}")
                captures[-1] = {rank: {**record, "summaries": published_summaries(registry, "r1", rank)}
                                for rank, record in captures[-1].items()}
        for proc in procs:
            assert proc.stop() == 0
    finally:
        spawner.close()
    records = captures[0]
    paths = {rank: Path(rec["trace_path"]) for rank, rec in records.items()}
    return SimpleNamespace(registry=registry, out=out, records=records, paths=paths,
                           docs={rank: load_trace(path) for rank, path in paths.items()}, captures=captures)


# Every rank sleeps STEP_SLEEP_S in each step and a slowed rank SLOW_EXTRA_S more. The noise bound
# (10% of a step of ~85 ms) must stay above the scheduling jitter of 4 ranks on 2 busy cores (a balanced
# job once showed a 5.3 ms gap with 45 ms steps) and well below the slowdown.
STEP_SLEEP_S = 0.08
SLOW_EXTRA_S = 0.05


def slowed_ddp_captures(tmp: Path, nproc: int, plan: Sequence[int | None], active_steps: int = 5) -> SimpleNamespace:
    """A real gloo DDP job under torchrun (tests/programs/ddp_train.py) of `nproc` ranks, replica
    `ddp<nproc>`, under `tmp`. For each entry of `plan` in turn: slow that rank down (None: no rank)
    by SLOW_EXTRA_S in each step, wait until every rank has applied it, and capture `active_steps`
    steps of every rank with `profile set -rf all --wait` (capture n is plan[n]); then stop the job.
    One job for several verdicts keeps the suite lean (a torchrun start costs seconds a rank).

    Returns:
        registry, out, replica, slowed (the plan), paths: for each capture, rank -> trace path.
    """
    registry, out, replica = tmp / "registry", tmp / "out", f"ddp{nproc}"
    slow_file = tmp / "slow"
    spawner = Spawner(tmp)
    paths = []
    try:
        env = base_env(registry, COSMOS_PROFILER_OUTPUT_DIR=str(out), OMP_NUM_THREADS="1")
        proc = spawner(replica, ["--slow-file", str(slow_file), "--step-sleep", str(STEP_SLEEP_S)], env,
                       program=torchrun_cmd(nproc, replica))
        wait_for(lambda: len(read_records(registry, replica)) == nproc, 120, what=f"{nproc} rank records")
        for gen, slowed in enumerate(plan, 1):
            staged = tmp / "slow.tmp"
            staged.write_text(f"{gen} {-1 if slowed is None else slowed} {SLOW_EXTRA_S}")
            os.replace(staged, slow_file)
            wait_for(lambda gen=gen: proc.stdout().count(f"SLOW {gen} rank ") == nproc, 60,
                     what=f"every rank to apply slow plan {gen} (rank {slowed})")
            code, stdout, stderr, _ = run_cli("profile", "set", replica, "-rf", "all", "-as", str(active_steps),
                                              "--wait", "--timeout", "120", "--json", "--registry", str(registry),
                                              timeout=150)
            assert code == 0, stdout + stderr
            paths.append({c["rank"]: Path(c["trace_path"]) for c in json.loads(stdout)["ranks"]})
        assert proc.stop(timeout=120) == 0, proc.stderr()[-3000:]
    finally:
        spawner.close()
    return SimpleNamespace(registry=registry, out=out, replica=replica, slowed=list(plan), paths=paths)
