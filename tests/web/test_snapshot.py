"""The snapshot the dashboard copies from a real engine, as the control loop holds it."""

from __future__ import annotations

from gpu_arbiter.domain import JobSpec, Tier
from gpu_arbiter.web import snapshot
from tests.web.clusters import loop_over, spec, ten_thousand_gpu_loop


def test_snapshot_has_the_engines_free_gpus_holdings_and_queue():
    loop = loop_over(2, [spec("j1", "a", 1, 8), spec("j2", "b", 3, 4), spec("j3", "b", 3, 8)])
    loop.state.sched.node_down("n1", 1.0)  # j2 ran there and is queued again
    snap = snapshot.take(loop, 2.0)
    nodes = {n.name: n for n in snap.nodes}
    assert nodes["n1"].state == "cordoned" and nodes["n1"].reason == "swap"
    assert nodes["n0"].free_mask == 0
    assert [(h.job_id, h.tier, h.borrowed) for h in snap.holdings["n0"]] == [("j1", 1, False)]
    assert sorted(j.id for j in snap.pending) == ["j2", "j3"]
    # As the engine records it: j3 was tried in the cycle; j2 was queued again after it.
    assert {j.id: j.reason for j in snap.pending} == {"j2": "queued", "j3": "capacity"}
    team_a = next(t for t in snap.teams if t.name == "a")
    assert team_a.used == {"H100": 8} and team_a.remaining is None


def test_a_ten_thousand_gpu_engine_is_copied_whole():
    # What the copy costs the loop is measured by `make bench` (bench/dashboard_bench.py).
    loop = ten_thousand_gpu_loop()
    snap = snapshot.build(snapshot.copy(loop, 2.0))
    assert sum(n.gpus for n in snap.nodes) == 10_240
    assert len(snap.pending) + len(loop.state.sched.running) == 2000


def test_a_tier1_job_beyond_its_teams_quota_and_what_is_left_of_the_pool_says_quota():
    # Team a's guarantee is 8 GPUs of 24, so the pool is 16; a's tier-1 job holds 12 of it.
    loop = loop_over(3, [spec("j1", "a", 1, 20), spec("j2", "b", 1, 8)])
    snap = snapshot.take(loop, 2.0)
    assert [j.id for j in snap.pending] == ["j2"]
    assert snap.pending[0].reason == "quota"  # 8 more do not fit in the 4 left


def test_a_teams_use_counts_a_fractional_job_at_its_share():
    quarter = JobSpec(id="q", team="a", tier=Tier(2), gpus=1, duration_s=1e6, gpu_milli=250)
    loop = loop_over(1, [spec("j1", "a", 2, 4), quarter])
    team_a = next(t for t in snapshot.take(loop, 2.0).teams if t.name == "a")
    assert team_a.used == {"H100": 4.25}


def test_open_segments_count_only_what_the_loop_has_not_charged_yet():
    """The loop charges running segments as they run (up to `billed_to`); the dashboard adds
    only the rest to what the ledger says, or it counts those seconds twice."""
    from types import SimpleNamespace

    from gpu_arbiter.control.accounting import Segment

    loop = loop_over(1, [spec("j1", "a", 1, 8)])
    job = loop.state.sched.jobs["j1"].spec
    loop.state.live = {"j1": SimpleNamespace(spec=job)}
    loop.accounts.segs = {"j1": Segment(0.0, "H100", 8, 1, False, billed_to=3600.0)}
    snap = snapshot.take(loop, 5400.0)
    seg = snap.segments["j1"]
    rate = loop.accounts.charges.rate(job, "H100", 1, 8, False)
    assert seg.start == 3600.0 and seg.credits(0.0, 5400.0) == rate / 2
    team_a = next(t for t in snap.teams if t.name == "a")
    assert team_a.accrued_credits == rate / 2 and team_a.accrued_gpu_seconds == 8 * 1800
