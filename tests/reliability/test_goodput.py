"""F4: goodput never exceeds utilisation; MTTR is the mean outage length."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from gpu_arbiter.domain import InvalidInput
from gpu_arbiter.reliability import GoodputLedger, GoodputTotals, MttrTracker, RunSegment


def test_useful_and_lost_time_are_kept_per_job_and_in_total():
    ledger = GoodputLedger()
    ledger.hold("a", 800.0)
    ledger.settle("a", useful_gpu_s=700.0, lost_gpu_s=80.0)
    ledger.hold("b", 200.0)
    ledger.settle("b", 200.0, 0.0)
    assert ledger.job("a") == GoodputTotals(800.0, 700.0, 80.0)
    assert ledger.job("a").other_gpu_s == 20.0
    assert ledger.job("unknown") == GoodputTotals()
    totals = ledger.totals
    assert totals == GoodputTotals(1000.0, 900.0, 80.0)
    assert totals.ratio == 0.9
    assert totals.utilisation(2000.0) == 0.5
    assert totals.goodput(2000.0) == 0.45


def test_closing_a_failed_segment_records_held_useful_and_lost_time():
    ledger = GoodputLedger()
    seg = RunSegment(started_at=0.0, rate=1.0, progress_at_start=0.0, checkpoint_interval_s=600.0)
    outcome = ledger.close("a", gpus=8, segment=seg, ended_at=1500.0)
    assert outcome.kept_s == 1200.0
    assert ledger.job("a") == GoodputTotals(8 * 1500.0, 8 * 1200.0, 8 * 300.0)
    restart = RunSegment(1500.0, 1.0, outcome.kept_s, 600.0, restore_s=60.0)
    ledger.close("a", 8, restart, 2000.0, saved=True)
    assert ledger.job("a") == GoodputTotals(8 * 2000.0, 8 * 1640.0, 8 * 300.0)
    assert ledger.job("a").other_gpu_s == 8 * 60.0  # the restore


def test_nothing_held_means_a_zero_ratio():
    assert GoodputTotals().ratio == 0.0


def test_settling_more_than_was_held_is_refused():
    ledger = GoodputLedger()
    ledger.hold("a", 10.0)
    with pytest.raises(InvalidInput):
        ledger.settle("a", 5.0, 5.5)
    with pytest.raises(InvalidInput):
        ledger.hold("a", -1.0)
    with pytest.raises(InvalidInput):
        ledger.totals.goodput(0.0)


def test_rounding_in_piecewise_holdings_does_not_refuse_settling_all_of_it():
    ledger = GoodputLedger()
    for _ in range(10):
        ledger.hold("a", 8 * 0.1)
    ledger.settle("a", 0.0, 8 * 1.0)  # 8 * 1.0 is a hair above the sum of the ten pieces
    assert ledger.job("a").useful_gpu_s == 0.0
    assert ledger.job("a").lost_gpu_s == ledger.job("a").held_gpu_s


run = st.tuples(
    st.integers(1, 512),  # GPUs
    st.floats(1e-3, 1e5),  # run length
    st.none() | st.floats(1, 1e4),  # checkpoint interval
    st.floats(0, 600),  # restore time
    st.booleans(),  # ends with a save (True) or a failure
)


@given(runs=st.lists(run, min_size=1, max_size=20), capacity=st.floats(1e9, 1e12))
def test_goodput_never_exceeds_utilisation(runs, capacity):
    ledger = GoodputLedger()
    t = 0.0
    for i, (gpus, length, interval, restore, saved) in enumerate(runs):
        seg = RunSegment(t, 1.0, 0.0, interval, restore_s=restore)
        ledger.close(f"j{i % 3}", gpus, seg, t + length, saved)
        t += length
    for totals in [ledger.totals] + [ledger.job(f"j{i}") for i in range(3)]:
        assert 0 <= totals.useful_gpu_s <= totals.held_gpu_s
        assert totals.useful_gpu_s + totals.lost_gpu_s <= totals.held_gpu_s
    assert ledger.totals.goodput(capacity) <= ledger.totals.utilisation(capacity)


def test_mttr_is_the_mean_time_from_fault_to_recovery():
    mttr = MttrTracker()
    assert mttr.mttr_s is None
    mttr.fault("n1", 100.0)
    mttr.fault("n1", 150.0)  # still down: the outage began at 100
    mttr.fault("n2", 200.0)
    assert mttr.down == {"n1", "n2"}
    assert mttr.recovered("n1", 400.0) == 300.0
    assert mttr.recovered("n2", 300.0) == 100.0
    assert mttr.recovered("n3", 300.0) is None
    assert (mttr.count, mttr.mttr_s, mttr.durations) == (2, 200.0, (300.0, 100.0))
    assert mttr.down == frozenset()


def test_recovery_before_the_fault_is_refused():
    mttr = MttrTracker()
    mttr.fault("j", 10.0)
    with pytest.raises(InvalidInput):
        mttr.recovered("j", 5.0)
