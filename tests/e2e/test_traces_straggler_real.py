"""sidecar.traces.straggler on real torchrun gloo jobs with one chosen rank slowed down: the verdict
names the slowed rank."""

from __future__ import annotations

import json

import pytest

from support.capture import SLOW_EXTRA_S
from support.cli import invoke


@pytest.mark.parametrize("job", ["ddp2_slowed", "ddp4_slowed"])
def test_the_verdict_names_the_slowed_rank_of_a_torchrun_job(job, request):
    """A gloo DDP job where one chosen rank sleeps 50 ms more per step: every rank's step takes as long
    (so step times cannot tell), the others wait in gloo:all_reduce; `profile summary` names the slowed
    rank, from its collective wait, every time; with no rank slowed it says there is no straggler.
    (The old rule, 10% over the median step time, said "none" or named a waiting rank here.)"""
    taken = request.getfixturevalue(job)
    nproc = len(taken.paths[0])
    for n, slowed in enumerate(taken.slowed):
        args = ("profile", "summary", taken.replica, "--capture", str(n), "--registry", str(taken.registry))
        text = invoke(*args).stdout
        data = json.loads(invoke(*args, "--json").stdout)
        verdict = data["straggler"] or {"rank": None}  # (null: what the old rule said when it found none)
        assert verdict["rank"] == slowed, f"capture {n}, rank {slowed} slowed:\n{text}"
        assert verdict["basis"] == "collective_wait"
        ranks = {r["rank"]: r for r in data["ranks"]}
        assert sorted(ranks) == list(range(nproc))
        for r in ranks.values():
            assert r["num_collectives"] > 0
            assert r["compute_s"] + r["collective_wait_s"] == pytest.approx(r["step_s"])
            for step in r["steps"]:
                assert 0 < step["collective_wait_s"] < step["duration_s"]
                assert step["compute_s"] + step["collective_wait_s"] == pytest.approx(step["duration_s"])
        waits = {k: r["collective_wait_median_s"] for k, r in ranks.items()}
        if slowed is None:
            assert text.splitlines()[-1].startswith("no straggler: rank "), text
            assert verdict["gap_s"] < verdict["noise_s"]
            continue
        # the others wait for the slowed rank: most of its extra sleep, each of them
        assert waits[slowed] == min(waits.values())
        assert all(waits[k] - waits[slowed] > SLOW_EXTRA_S / 2 for k in ranks if k != slowed), waits
        assert verdict["gap_s"] >= verdict["noise_s"] >= 0.001
        last = text.splitlines()[-1]
        assert last.startswith(f"straggler: rank {slowed} (") and "the others wait for it" in last, text
        for k, r in ranks.items():  # both numbers of every rank, in the table
            row = f"{k:<4}  {r['step_s'] * 1000:.3f}"
            assert any(line.strip().startswith(row) and f"{r['compute_s'] * 1000:.3f}" in line
                       and f"{r['collective_wait_s'] * 1000:.3f}" in line for line in text.splitlines()), (row, text)
