import json
import math

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from gpu_arbiter.domain import Allocation, InvalidInput, Job, JobSpec, Tier
from gpu_arbiter.economy import (
    FAILURE_ABSORBED,
    LOST_WORK,
    RERUN,
    RUN,
    ChargeModel,
    Ledger,
    PriceTable,
    is_preemptible,
)

HOUR = 3600.0
MODEL = ChargeModel()  # defaults: 20 % off for checkpoints at least hourly


def _spec(checkpoint_interval_s: float | None = None, **kw) -> JobSpec:
    return JobSpec(
        id="j1", team="vision", gpus=8, checkpoint_interval_s=checkpoint_interval_s, **kw
    )


def _net(ledger: Ledger, job_id: str = "j1") -> float:
    return math.fsum(e.credits if e.kind == "charge" else -e.credits for e in ledger.audit(job_id))


def test_segment_costs_price_times_gpu_hours():
    ledger = Ledger()
    [entry] = MODEL.charge_segment(
        ledger,
        _spec(),
        gpu_type="H100",
        tier=Tier.CORE,
        gpus=8,
        start=0.0,
        end=2 * HOUR,
        preemptible=False,
    )
    assert entry.reason == RUN
    assert entry.credits == pytest.approx(3.5 * 8 * 2)  # 3.5 credits/GPU-h × 16 GPU-h
    assert entry.gpu_seconds == 8 * 2 * HOUR


def test_frequent_checkpointing_earns_the_discount_and_rare_checkpointing_does_not():
    often, rarely = _spec(checkpoint_interval_s=1800), _spec(checkpoint_interval_s=2 * HOUR)
    assert MODEL.discount(often) == 0.2
    assert MODEL.discount(_spec(checkpoint_interval_s=HOUR)) == 0.2  # "at or above" the frequency
    assert MODEL.discount(rarely) == 0.0
    assert MODEL.discount(_spec()) == 0.0
    ledger = Ledger()
    [entry] = MODEL.charge_segment(
        ledger,
        often,
        gpu_type="H100",
        tier=Tier.CORE,
        gpus=8,
        start=0.0,
        end=HOUR,
        preemptible=False,
    )
    assert entry.credits == pytest.approx(3.5 * 8 * 0.8)
    assert (entry.price, entry.discount) == (3.5, 0.2)


def test_job_without_checkpointing_pays_lost_work_as_a_rerun_charge():
    ledger = Ledger()
    run, rerun = MODEL.charge_segment(
        ledger,
        _spec(),
        gpu_type="H100",
        tier=Tier.BUSINESS,
        gpus=8,
        start=0.0,
        end=3 * HOUR,
        preemptible=False,
        lost_from=0.0 + HOUR,
    )
    assert (run.reason, run.start, run.end) == (RUN, 0.0, HOUR)
    assert (rerun.reason, rerun.start, rerun.end) == (RERUN, HOUR, 3 * HOUR)
    assert rerun.credits == pytest.approx(2.8 * 8 * 2)
    assert _net(ledger) == pytest.approx(2.8 * 8 * 3)  # it paid for every second it held


def test_checkpointing_job_loses_nothing_to_a_failure_the_cluster_absorbs_it():
    ledger = Ledger()
    spec = _spec(checkpoint_interval_s=1800)
    run, lost, refund = MODEL.charge_segment(
        ledger,
        spec,
        gpu_type="H100",
        tier=Tier.BUSINESS,
        gpus=8,
        start=0.0,
        end=HOUR,
        preemptible=False,
        lost_from=1800.0,
    )
    assert (run.reason, lost.reason, refund.reason) == (RUN, LOST_WORK, FAILURE_ABSORBED)
    assert (lost.start, lost.end) == (1800.0, HOUR)  # the audit still shows the lost seconds
    assert refund.refund_of == lost.seq and refund.credits == lost.credits
    assert _net(ledger) == pytest.approx(2.8 * 8 * 0.5 * 0.8)  # only the kept half, discounted
    assert ledger.balance("cluster:revenue") == pytest.approx(_net(ledger))


def test_lost_from_before_the_segment_is_clamped_to_its_start():
    ledger = Ledger()
    [rerun] = MODEL.charge_segment(
        ledger,
        _spec(),
        gpu_type="H100",
        tier=Tier.CORE,
        gpus=8,
        start=HOUR,
        end=2 * HOUR,
        preemptible=False,
        lost_from=0.0,
    )
    assert (rerun.reason, rerun.start) == (RERUN, HOUR)


def test_fractional_gpu_pays_its_share_of_one_gpu():
    spec = JobSpec(id="small", team="nlp", gpus=1, gpu_milli=250)
    ledger = Ledger()
    [entry] = MODEL.charge_segment(
        ledger,
        spec,
        gpu_type="H100",
        tier=Tier.EXPLORATORY,
        gpus=1,
        start=0,
        end=HOUR,
        preemptible=True,
    )
    assert entry.gpus == 0.25
    assert entry.credits == pytest.approx(0.8 * 0.25)


def test_empty_segment_posts_nothing_and_a_backwards_one_is_refused():
    ledger = Ledger()
    args = dict(gpu_type="H100", tier=1, gpus=8, preemptible=False)
    assert MODEL.charge_segment(ledger, _spec(), start=5.0, end=5.0, **args) == []
    with pytest.raises(InvalidInput, match="need start <= end"):
        MODEL.charge_segment(ledger, _spec(), start=5.0, end=4.0, **args)
    assert len(ledger) == 0


def test_tier_three_and_borrowed_capacity_are_priced_as_preemptible():
    assert is_preemptible(Tier.EXPLORATORY, borrowed=False)
    assert is_preemptible(Tier.CORE, borrowed=True)
    assert not is_preemptible(Tier.BUSINESS, borrowed=False)


def test_burn_rate_sums_the_hourly_cost_of_each_teams_running_jobs():
    def running(job_id: str, team: str, tier: Tier, gpu_type: str, borrowed: bool) -> Job:
        spec = JobSpec(id=job_id, team=team, tier=tier, gpus=8)
        alloc = Allocation(gpu_type, ((0, tuple(range(8))),))
        return Job(spec=spec, tier=tier, allocation=alloc, borrowed=borrowed)

    jobs = [
        running("a", "vision", Tier.CORE, "H100", False),
        running("b", "vision", Tier.CORE, "A100", True),
        running("c", "nlp", Tier.EXPLORATORY, "H100", False),
        Job(spec=JobSpec(id="d", team="nlp"), tier=Tier.EXPLORATORY),  # pending: costs nothing
    ]
    rates = MODEL.burn_rates(jobs)
    assert rates["vision"] == pytest.approx(3.5 * 8 + 0.6 * 1.6 * 8)
    assert rates["nlp"] == pytest.approx(0.8 * 8)


def test_bad_charge_model_settings_are_refused():
    with pytest.raises(InvalidInput, match="checkpoint_discount"):
        ChargeModel(checkpoint_discount=1.0)
    with pytest.raises(InvalidInput, match="min_checkpoint_interval_s"):
        ChargeModel(min_checkpoint_interval_s=0)


_segment = st.fixed_dictionaries(
    {
        "gpu_type": st.sampled_from(["B200", "H200", "H100", "A100", "V100", "MI300X"]),
        "tier": st.sampled_from(list(Tier)),
        "gpus": st.integers(1, 64),
        "duration": st.floats(0, 5e5, allow_nan=False),
        "preemptible": st.booleans(),
        "lost_share": st.one_of(st.none(), st.floats(0, 1)),
    }
)


@settings(max_examples=200, deadline=None)
@given(
    checkpoint=st.one_of(st.none(), st.floats(1, 10_000)),
    milli=st.sampled_from([1000, 500, 125]),
    discount=st.floats(0, 0.9),
    segments=st.lists(_segment, min_size=1, max_size=8),
)
def test_a_jobs_net_charges_equal_price_times_gpu_seconds_it_pays_for(
    checkpoint, milli, discount, segments
):
    model = ChargeModel(PriceTable(), checkpoint_discount=discount)
    gpus = 1 if milli < 1000 else 8
    spec = JobSpec(id="j", team="t", gpus=gpus, gpu_milli=milli, checkpoint_interval_s=checkpoint)
    factor = 1 - discount if checkpoint is not None and checkpoint <= 3600 else 1.0
    ledger = Ledger()
    expected = []
    t = 0.0
    for seg in segments:
        n = seg["gpus"] if milli == 1000 else 1
        end = t + seg["duration"]
        lost_from = None if seg["lost_share"] is None else end - seg["lost_share"] * (end - t)
        model.charge_segment(
            ledger,
            spec,
            gpu_type=seg["gpu_type"],
            tier=seg["tier"],
            gpus=n,
            start=t,
            end=end,
            preemptible=seg["preemptible"],
            lost_from=lost_from,
        )
        paid_seconds = end - t
        if lost_from is not None and checkpoint is not None:
            paid_seconds = max(lost_from, t) - t  # the cluster absorbed the rest
        price = PriceTable().price(seg["gpu_type"], seg["tier"], seg["preemptible"])
        expected.append(price * n * milli / 1000 * paid_seconds / 3600 * factor)
        t = end
    assert _net(ledger, "j") == pytest.approx(math.fsum(expected), rel=1e-9, abs=1e-9)
    held = math.fsum(e.gpu_seconds for e in ledger.audit("j") if e.kind == "charge")
    assert held == pytest.approx(
        math.fsum(
            (s["gpus"] if milli == 1000 else 1) * milli / 1000 * s["duration"] for s in segments
        )
    )
    ledger.check_balanced()


def _accrue(ledger: Ledger, spec: JobSpec, cuts: list[float]) -> list:
    """Charge a running segment in pieces [cuts[0], cuts[1]), [cuts[1], cuts[2]), ..."""
    pieces = []
    for a, b in zip(cuts, cuts[1:], strict=False):
        pieces += MODEL.charge_segment(
            ledger, spec, gpu_type="H100", tier=1, gpus=8, start=a, end=b, preemptible=False
        )
    return pieces


def _close(ledger: Ledger, spec: JobSpec, accrued: list, end: float, lost_from=None) -> list:
    return MODEL.close_segment(
        ledger,
        spec,
        accrued,
        gpu_type="H100",
        tier=1,
        gpus=8,
        start=0.0,
        end=end,
        preemptible=False,
        lost_from=lost_from,
    )


@pytest.mark.parametrize("interval", [None, 600.0])
def test_a_segment_charged_while_it_ran_costs_what_one_charge_at_its_end_would(interval):
    """Accrued pieces plus the close post the same net credits as one charge at the end, lost
    work included: a job that checkpoints gets back the lost seconds already charged."""
    for lost_from in (None, 50.0, 150.0, 290.0):
        whole, live = Ledger(), Ledger()
        spec = _spec(interval)
        MODEL.charge_segment(
            whole,
            spec,
            gpu_type="H100",
            tier=1,
            gpus=8,
            start=0.0,
            end=300.0,
            preemptible=False,
            lost_from=lost_from,
        )
        accrued = _accrue(live, spec, [0.0, 60.0, 120.0, 180.0, 240.0])
        rest = _close(live, spec, accrued, 300.0, lost_from)
        assert _net(live) == pytest.approx(_net(whole))
        live.check_balanced()
        assert [e for e in rest if e.kind == "charge"][0].start == 240.0  # only the remainder
        for refund in (e for e in rest if e.kind == "refund"):
            charge = live.entries()[refund.refund_of]
            assert refund.reason == FAILURE_ABSORBED and interval is not None
            if charge.reason == LOST_WORK:
                continue  # the rest's own lost work, refunded whole
            assert charge.start <= refund.start < refund.end <= charge.end
            seconds = refund.end - refund.start
            assert refund.credits == pytest.approx(charge.credits * seconds / 60.0)


def test_seconds_charged_past_a_run_s_real_end_are_refunded_naming_them():
    """The driver learns late that the run ended at 100 s (it was down): what it charged for
    [100, 180) goes back, naming those seconds."""
    ledger = Ledger()
    spec = _spec()
    accrued = _accrue(ledger, spec, [0.0, 60.0, 120.0, 180.0])
    rest = _close(ledger, spec, accrued, 100.0)
    assert [(e.kind, e.reason, e.start, e.end) for e in rest] == [
        ("refund", "ended-earlier", 100.0, 120.0),
        ("refund", "ended-earlier", 120.0, 180.0),
    ]
    assert _net(ledger) == pytest.approx(3.5 * 8 * 100 / HOUR)


def test_a_refund_cannot_name_seconds_outside_its_charge():
    ledger = Ledger()
    [charge] = _accrue(ledger, _spec(), [0.0, 60.0])
    with pytest.raises(InvalidInput, match="not all in charge"):
        ledger.refund(charge, 0.1, "x", at=70.0, start=30.0, end=70.0)
    assert len(ledger) == 1
    refund = ledger.refund(charge, 0.1, "x", at=70.0, start=30.0, end=60.0)
    copy = Ledger.from_lines(json.dumps(e.to_json()) for e in ledger.entries())
    assert copy.entries()[-1] == refund
