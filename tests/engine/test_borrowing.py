"""`Borrowing` keeps who runs on borrowed capacity incrementally; it must always agree with
filling the quota from scratch in order of tier, then age (S2)."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from gpu_arbiter.domain import MILLI, Allocation, Job, Tier
from gpu_arbiter.engine.borrowing import Borrowing
from tests.conftest import job


def running(i: int, tier: int, gpus: int, milli: int = MILLI) -> Job:
    j = Job(spec=job(f"j{i}", tier=tier, gpus=gpus, gpu_milli=milli), tier=Tier(tier), seq=i)
    j.allocation = Allocation("H100", ((0, tuple(range(gpus))),))
    return j


def from_scratch(jobs: list[Job], limit: int) -> dict[str, bool]:
    room, out = limit, {}
    for j in sorted(jobs, key=lambda j: (j.tier, j.seq)):
        out[j.id] = j.milli_held > room
        room = max(0, room - j.milli_held)
    return out


def test_a_job_beyond_the_quota_borrows_and_stops_borrowing_when_room_frees():
    book = Borrowing(limit=8 * MILLI)
    a, b, c = running(1, 2, 6), running(2, 2, 4), running(3, 1, 2)
    for j in (a, b, c):
        book.add(j)
    assert [book.borrowed(j) for j in (a, b, c)] == [False, True, False]  # tier 1 first
    assert book.tier1_excess == 0
    book.remove(c)
    assert not book.borrowed(a) and book.borrowed(b)  # 6 + 4 > 8 still
    book.remove(a)
    assert not book.borrowed(b)


def test_a_fractional_job_counts_its_share_of_a_gpu():
    book = Borrowing(limit=1 * MILLI)
    quarters = [running(i, 2, 1, milli=250) for i in range(5)]
    for j in quarters:
        book.add(j)
    # Four quarter-GPU pods fill a one-GPU quota; counted whole, three would borrow.
    assert [book.borrowed(j) for j in quarters] == [False] * 4 + [True]


@settings(max_examples=200, deadline=None)
@given(
    limit=st.integers(0, 24 * MILLI),
    ops=st.lists(
        st.tuples(
            st.booleans(),
            st.integers(1, 3),
            st.integers(1, 8),
            st.sampled_from([MILLI, MILLI, 100, 250, 500]),
        ),
        max_size=40,
    ),
)
def test_incremental_flags_match_filling_the_quota_from_scratch(limit, ops):
    book = Borrowing(limit)
    live: list[Job] = []
    flags: dict[str, bool] = {}
    for i, (add, tier, gpus, milli) in enumerate(ops):
        if add or not live:
            j = running(i, tier, 1 if milli < MILLI else gpus, milli)
            live.append(j)
            changed = book.add(j)
        else:
            j = live.pop(gpus % len(live))
            changed = book.remove(j)
            flags.pop(j.id)
        for c in changed:
            flags[c.id] = book.borrowed(c)
        expected = from_scratch(live, limit)
        assert flags == expected  # the returned changes are all that changed
        t1 = sum(x.milli_held for x in live if x.tier == Tier.CORE)
        assert book.tier1_excess == max(0, t1 - limit)
