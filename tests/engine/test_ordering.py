"""The pending queue: groups in order, DRF turns within a tier, changes buffered during a walk."""

from gpu_arbiter.domain import Job, Tier
from gpu_arbiter.engine.ordering import PendingQueue
from tests.conftest import job


def queued(*specs) -> tuple[PendingQueue, dict[str, Job]]:
    q = PendingQueue(lambda j: (int(j.tier), j.team), lambda j: (j.spec.submit_s,))
    jobs = {}
    for seq, spec in enumerate(specs):
        jobs[spec.id] = Job(spec=spec, tier=Tier(spec.tier), seq=seq)
        q.add(jobs[spec.id])
    return q, jobs


def test_tiers_come_first_then_age_within_a_group():
    q, _ = queued(
        job("old3", tier=3, submit_s=0.0),
        job("new1", tier=1, submit_s=9.0),
        job("old1", tier=1, submit_s=1.0),
    )
    assert [j.id for j in q.in_group_order()] == ["old1", "new1", "old3"]


def test_within_a_tier_the_team_with_the_lowest_share_goes_next():
    q, _ = queued(*(job(f"a{i}", team="a") for i in range(3)), job("b0", team="b"))
    share = {"a": 0.1, "b": 0.5}
    assert [j.id for j in q.fair_by_tier(share.__getitem__)][:3] == ["a0", "a1", "a2"]


def test_a_teams_share_is_read_again_after_each_of_its_jobs():
    q, _ = queued(*(job(f"a{i}", team="a") for i in range(3)), job("b0", team="b"))
    share = {"a": 0.1, "b": 0.15}
    order = []
    for j in q.fair_by_tier(share.__getitem__):
        order.append(j.id)
        share[j.team] += 0.1  # given GPUs within the cycle
    assert order == ["a0", "b0", "a1", "a2"]


def test_changes_during_a_walk_are_applied_when_it_ends():
    q, jobs = queued(job("x"), job("y"))
    q.begin_walk()
    seen = []
    for j in q.in_group_order():
        seen.append(j.id)
        q.remove(j)
    q.end_walk()
    assert seen == ["x", "y"] and len(q) == 0


def test_pending_jobs_pinned_to_one_type_are_counted_per_type_and_tier():
    q, jobs = queued(
        job("p", tier=2, gpus=4, gpu_types={"H100": 1.0}),
        job("p3", tier=3, gpus=2, gpu_types={"H100": 1.0}),
        job("any", gpus=8),
    )
    assert [q.pinned_at_or_above("H100", tier) for tier in (1, 2, 3)] == [0, 4, 6]
    assert q.pinned_at_or_above("A100", 3) == 0
    jobs["p"].tier = Tier.EXPLORATORY  # changed while queued: it leaves the tier it joined at
    q.remove(jobs["p"])
    assert [q.pinned_at_or_above("H100", tier) for tier in (2, 3)] == [0, 2]


def test_the_fewest_gpus_a_pending_job_starts_on_follows_the_queue():
    q, jobs = queued(job("big", gpus=8), job("elastic", gpus=8, min_gpus=2), job("four", gpus=4))
    assert q.sizes == {8: 1, 2: 1, 4: 1} and q.smallest() == 2
    q.remove(jobs["elastic"])
    assert q.smallest() == 4
    q.remove(jobs["four"])
    q.add(jobs["elastic"])
    assert q.sizes == {8: 1, 2: 1} and q.smallest() == 2
