"""A real capture for the tests that read one: two ranks of tests/programs/train.py as replica r1."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

from sidecar.registry import write_request

from .launch import Spawner
from .records import wait_record
from .traces import load_trace

RANKS = (0, 1)


def two_rank_capture(tmp: Path, requests: list[tuple[dict, tuple[int, ...]]],
                     step_sleep: dict[int, str] | None = None) -> SimpleNamespace:
    """Run ranks 0 and 1 of replica r1 under `tmp` (rank k sleeping `step_sleep[k]` seconds inside
    each step), write each request in turn and wait until each rank it names has saved it, stop both.

    Args:
        requests: (request, ranks that take it); request n becomes each of its ranks' capture n.
    Returns:
        registry, out; records, paths and docs (rank -> record, trace path, loaded trace) of the
        first request; captures: for each request, rank -> the record once that rank saved it.
    """
    registry, out = tmp / "registry", tmp / "out"
    spawner = Spawner(tmp)
    try:
        procs = [
            spawner.rank(registry, *(["--step-sleep", step_sleep[rank]] if step_sleep else []), name=f"rank{rank}",
                         output=out, env_extra={"RANK": str(rank), "WORLD_SIZE": str(len(RANKS))}, wait=False)
            for rank in RANKS
        ]
        for rank, proc in zip(RANKS, procs, strict=True):
            proc.wait_ready()
            proc.wait_idle(registry, "r1", rank)
        captures = []
        for n, (request, ranks) in enumerate(requests):
            write_request(registry, "r1", request)
            captures.append({
                rank: wait_record(registry, lambda r, n=n: r.get("state") == "idle" and (r.get("trace_path") or "")
                                  .endswith(f"/{n}_trace.json.gz"), "r1", rank, 90, what=f"rank {rank} capture {n}")
                for rank in ranks
            })
        for proc in procs:
            assert proc.stop() == 0
    finally:
        spawner.close()
    records = captures[0]
    paths = {rank: Path(rec["trace_path"]) for rank, rec in records.items()}
    return SimpleNamespace(registry=registry, out=out, records=records, paths=paths,
                           docs={rank: load_trace(path) for rank, path in paths.items()}, captures=captures)
