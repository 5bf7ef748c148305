"""The start-step rule (sidecar.common.startstep): the pace a rank publishes (`thin`, `recent_rate`,
`ran_ahead`) and the start step planned from it (`plan_start`, `plan_start_step`, `step_rate`,
`projected_step`, `trigger_latency`), so that every selected rank sees a request before it reaches
the start step. Pure functions over numbers and hand-built records: no I/O, no clock."""

from __future__ import annotations

import dataclasses
import math

import pytest

from sidecar.common import startstep
from sidecar.common.records import RankRecord
from sidecar.common.startstep import RankPace


def _rank(now: float, **fields) -> RankRecord:
    return RankRecord(replica="r", role="p", **{"rank": 0, "step": 0, "started_at": now - 10, "heartbeat_at": now,
                                                "watch": "inotify", **fields})


# --- the pace a rank publishes ------------------------------------------------------


def test_thin_keeps_the_newest_and_older_samples_a_spacing_apart_oldest_first():
    samples = [(k * 0.1, k) for k in range(11)]  # every 0.1 s for a second
    assert startstep.thin(samples) == [samples[1], samples[4], samples[7], samples[10]]
    assert startstep.thin([]) == []
    assert startstep.thin([(5.0, 50)]) == [(5.0, 50)]


def test_thin_forgets_what_is_older_than_the_window():
    samples = [(0.0, 0), (0.3, 3), (0.6, 6), (3.4, 34)]
    assert startstep.thin(samples) == [(0.6, 6), (3.4, 34)]  # 0.3 is 3.1 s before the newest
    assert startstep.thin(samples, window=10.0) == samples


def test_recent_rate_is_the_fastest_pace_between_consecutive_samples():
    assert startstep.recent_rate([(0.0, 0), (1.0, 10), (2.0, 15)]) == 10.0
    assert startstep.recent_rate([(0.0, 0), (2.0, 5), (2.0, 99)]) == 2.5  # no time between two: no pace
    assert startstep.recent_rate([(0.0, 10), (1.0, 5)]) == 0.0  # a counter that went back is still, not negative
    assert startstep.recent_rate([(0.0, 0)]) is None
    assert startstep.recent_rate([]) is None


def test_ran_ahead_only_past_the_factor_and_the_steps_on_top():
    published = [(0.0, 0), (1.0, 10)]  # 10 steps/s
    # one second later the pace predicts step 20; ahead means more than 1.5 x 10 + 3 steps past step 10
    limit = 10 + startstep.AHEAD_FACTOR * 10 + startstep.AHEAD_MIN_STEPS
    assert not startstep.ran_ahead(published, (2.0, int(limit)))
    assert startstep.ran_ahead(published, (2.0, int(limit) + 1))
    assert not startstep.ran_ahead([(1.0, 10)], (2.0, 1000))  # no pace published yet: nothing to be ahead of


# --- the start step -----------------------------------------------------------------


def test_plan_start_is_the_latest_any_rank_needs_and_at_least_the_minimum_lead():
    fast = RankPace(rank=0, step=100.2, rate=10.0, latency_s=0.1)
    still = RankPace(rank=1, step=98.0, rate=0.0, latency_s=1.0)
    # current step: ceil(100.2) = 101; the fast rank runs 10 x (1.5 + 0.1) = 16 steps before it sees the request
    assert startstep.plan_start([fast, still], 1.5, 3) == (117, 16)
    assert startstep.plan_start([still], 1.5, 3) == (101, 3)  # a still rank: the minimum lead past its step


def test_step_rate_takes_the_faster_of_the_recent_pace_and_the_lifetime_average():
    now = 1000.0
    assert startstep.step_rate(_rank(now, step=50)) == 5.0  # no samples (an older sidecar): the average
    assert startstep.step_rate(_rank(now, step=50, started_at=now - 0.1)) is None  # too young to measure
    recent = [[now - 1.0, 40], [now, 50]]
    assert startstep.step_rate(_rank(now, step=50, recent_steps=recent)) == 10.0  # faster lately
    assert startstep.step_rate(_rank(now, step=500, recent_steps=recent)) == 50.0  # stood still, then stepped again


def test_projected_step_runs_the_pace_over_the_records_age_capped_at_three_heartbeats():
    now = 1000.0
    recent = [[now - 2.0, 90], [now - 1.0, 100]]  # 10 steps/s
    rec = _rank(now, step=100, started_at=now - 1000, heartbeat_at=now - 1.0, recent_steps=recent)
    assert startstep.projected_step(rec, now) == (pytest.approx(110.0), 10.0)
    old = dataclasses.replace(rec, heartbeat_at=now - 60.0)  # a record a minute old: at most 3 x 2 s of steps
    assert startstep.projected_step(old, now)[0] == pytest.approx(160.0)
    ahead = dataclasses.replace(rec, heartbeat_at=now + 5.0)  # stamped in the future: no steps projected
    assert startstep.projected_step(ahead, now)[0] == 100.0


def test_trigger_latency_of_a_polling_rank_includes_the_network_filesystems_cache():
    now = 1000.0
    assert startstep.trigger_latency(_rank(now, watch="poll", poll_interval=4.0)) == 4.0 + startstep.NETFS_CACHE_S
    assert startstep.trigger_latency(_rank(now, watch="inotify")) == startstep.INOTIFY_LATENCY_S


def test_plan_start_step_leads_by_the_recent_pace_and_each_ranks_trigger_delay():
    now = 1000.0
    lead_s = startstep.LEAD_SECONDS + startstep.INOTIFY_LATENCY_S
    # Records of an older sidecar (no samples): the lifetime average. fast: 200 steps/s,
    # 1 s since its heartbeat -> near step 2200; the lead is lead_s worth of its steps.
    fast = RankRecord(replica="r", role="p", rank=0, step=2000, started_at=now - 11, heartbeat_at=now - 1,
                      watch="inotify")
    slow = RankRecord(replica="r", role="p", rank=1, step=5, started_at=now - 10, heartbeat_at=now, watch="inotify")
    assert startstep.plan_start_step([fast, slow], now) == (2200 + round(200 * lead_s), round(200 * lead_s))
    # very slow training: the minimum lead
    assert startstep.plan_start_step([slow], now) == (5 + startstep.MIN_LEAD_STEPS, startstep.MIN_LEAD_STEPS)
    # a rank that polls its control file every 4 s (shared storage) gets 4 s more of its
    # steps, and the network filesystem's name cache on top
    polling = RankRecord(replica="r", role="p", rank=0, step=100, started_at=now - 10, heartbeat_at=now, watch="poll",
                         poll_interval=4.0)
    lead = round(10 * (startstep.LEAD_SECONDS + 4 + startstep.NETFS_CACHE_S))
    assert startstep.plan_start_step([polling], now) == (100 + lead, lead)
    assert startstep.plan_start_step([fast], now, lead_steps=7) == (2207, 7)


def test_plan_start_step_follows_a_job_that_sped_up():
    """Slow for 90 s, then 5x faster: the lifetime average (11 steps/s) is far below the
    recent pace (50 steps/s); the lead must come from the recent one, else ranks arm late."""
    now = 1000.0
    samples = [[now - 2.0 + 0.5 * k, 900 + 25 * k] for k in range(5)]  # 50 steps/s over the last 2 s
    sped_up = RankRecord(replica="r", role="p", rank=0, step=1000, started_at=now - 91, heartbeat_at=now,
                         watch="inotify", recent_steps=samples)
    start, lead = startstep.plan_start_step([sped_up], now)
    assert start - 1000 == lead == math.ceil(50 * (startstep.LEAD_SECONDS + startstep.INOTIFY_LATENCY_S)), (start, lead)
    # The ranks of one replica: the start is the latest any rank needs (the fast one, and the one that polls).
    polling = dataclasses.replace(sped_up, rank=1, step=990, watch="poll", poll_interval=2.0,
                                  recent_steps=[[now - 1.0, 980], [now, 990]])
    start2, _ = startstep.plan_start_step([sped_up, polling], now)
    assert start2 == max(start, 990 + math.ceil(10 * (startstep.LEAD_SECONDS + 2.0)))



# --- from node records ------------------------------------------------------------


@pytest.mark.parametrize("rate", [0.2, 1.0, 5.0, 20.0, 100.0, 1000.0])
@pytest.mark.parametrize("watch", ["inotify", "poll"])
@pytest.mark.parametrize("skew", [0.0, -3600.0, 86400.0], ids=["same-clock", "node-behind", "node-ahead"])
def test_a_start_step_planned_from_node_records_is_reached_only_after_the_request_is_seen(rate, watch, skew):
    """Through a node record (sidecar.common.noderecord): the pace anchor projected to the file's
    last tick (`expand`), then the CLI's projection to now (capped at three heartbeats) and its
    lead. Every rank, however far ahead of its anchor the node agent lets it run before it writes a
    new one, however long since the anchor and the tick, whatever the node's clock, is still before
    the start step when it sees the request."""
    from sidecar.common import noderecord
    from sidecar.common.noderecord import Pace

    fs_now = 1_800_000_000.0
    for interval in (1.0, 2.0, 5.0):
        for since_tick in (0.0, 0.5 * interval, interval):
            for since_anchor in (0.0, 0.3, 7.7, 60.0):
                mtime = fs_now - since_tick  # the file's last tick, on the filesystem's clock
                anchor = Pace(mtime - skew - since_anchor, 1000, rate)  # on the node's clock (the filesystem's - skew)
                record = RankRecord(replica="r", role="p", rank=0, host="n", started_at=anchor.t - 600,
                                    heartbeat_at=anchor.t, step=1000, watch=watch)
                data = noderecord.build("r", "n", {}, [noderecord.entry(record, anchor, True)], mtime - skew, skew,
                                        interval)
                (expanded,), problems = noderecord.expand(noderecord.parse_node_bytes(data), mtime)
                assert problems == []
                start, _ = startstep.plan_start_step([expanded], fs_now)
                seen = fs_now + startstep.trigger_latency(expanded)  # when the rank sees the request
                for ahead in (0.0, noderecord.ahead_slack(rate)):  # up to where the agent re-anchors
                    reached = anchor.at(seen - skew) + ahead
                    assert math.floor(reached) < start, (interval, since_tick, since_anchor, ahead, start, reached)


def test_a_node_records_pace_leaves_room_for_a_rank_ahead_of_its_anchor():
    from sidecar.common import noderecord
    from sidecar.common.noderecord import Pace

    record = RankRecord(replica="r", role="p", rank=0, started_at=0.0, heartbeat_at=5000.0, step=1000, watch="inotify")
    data = noderecord.build("r", "n", {}, [noderecord.entry(record, Pace(5000.0, 1000, 1.0), True)], 5000.0, 0.0, 2.0)
    (expanded,), _ = noderecord.expand(noderecord.parse_node_bytes(data), 5000.0)
    assert expanded.step == 1000 and expanded.step_slack == noderecord.MIN_DRIFT_STEPS
    assert startstep.projected_step(expanded, 5000.0) == (1000 + noderecord.MIN_DRIFT_STEPS, pytest.approx(1.0))
    assert _rank(100.0).step_slack == 0.0  # a rank's own record says where it is
