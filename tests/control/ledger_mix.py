"""A ledger with every kind of entry the live service writes, for tests that check what the
database sums of it against what the ledger says entry by entry: grants, "run" charges (one
grown while its job ran), a run that ended earlier than it was charged to, lost work the
cluster absorbed (a "lost-work" charge and its refund, and accrued seconds given back as
"failure-absorbed"), a re-run its team pays for, useful GPU-seconds on some charges, two GPU
types and three tiers, spread over two budget periods; and how to compare the bills of it."""

from __future__ import annotations

import pytest

from gpu_arbiter.domain import JobSpec
from gpu_arbiter.economy import ChargeModel, Ledger

DAY = 86_400.0


def mixed_ledger(first_seq: int, t0: float) -> Ledger:
    """The entries, numbered from `first_seq`, dated from `t0` over about 40 days."""
    book = Ledger.resume(first_seq, {})
    model = ChargeModel()
    for k, team in enumerate(("vision", "nlp", "infra")):
        book.grant(team, 500.0 + k, "p0", at=t0)
        book.grant(team, 400.0 + k, "p1", at=t0 + 31 * DAY)
    for k in range(12):
        team = ("vision", "nlp", "infra")[k % 3]
        gpu_type, tier = ("H100", "A100")[k % 2], 1 + k % 3
        spec = JobSpec(
            id=f"m{k}",
            team=team,
            gpus=1 + k % 4,
            tier=tier,
            checkpoint_interval_s=None if k % 4 == 1 else 600.0,
        )
        start = t0 + k * 3.1 * DAY + 17.25 * k
        terms = {"gpu_type": gpu_type, "tier": tier, "gpus": spec.gpus, "preemptible": tier == 3}
        if k % 4 == 0:  # a plain run, goodput known
            model.charge_segment(
                book, spec, start=start, end=start + 3600.5 * (k + 1),
                useful_gpu_seconds=spec.gpus * 3000.0 * (k + 1), **terms,
            )  # fmt: skip
            continue
        # Charged as it ran: a charge that grew, then closed.
        first = model.accrue(
            book, spec, None, start=start, end=start + 60, same_period=True, **terms
        )
        grown = model.accrue(
            book, spec, first, start=start + 60, end=start + 900, same_period=True, **terms
        )
        if k % 4 == 1:  # failed without checkpoints: a re-run charge after the accrued seconds
            model.close_segment(
                book, spec, [grown], start=start, end=start + 1300.0, lost_from=start, **terms
            )
        elif k % 4 == 2:  # failed with a checkpoint: lost work absorbed, accrued seconds given back
            model.close_segment(
                book, spec, [grown], start=start, end=start + 1200.0, lost_from=start + 300.0,
                **terms,
            )  # fmt: skip
        else:  # ended before it was last charged (learnt late): seconds refunded
            model.close_segment(book, spec, [grown], start=start, end=start + 700.0, **terms)
    return book


def assert_same_bills(got: list[dict], want: list[dict]) -> None:
    """Bills (`TeamBill.to_dict`) equal up to the order the database adds numbers in."""
    assert [b["team"] for b in got] == [b["team"] for b in want]
    for g, w in zip(got, want, strict=True):
        assert g.keys() == w.keys()
        for key, value in w.items():
            if key == "gpu_hours":
                assert [(h["gpu_type"], h["tier"]) for h in g[key]] == [
                    (h["gpu_type"], h["tier"]) for h in value
                ]
                assert [h["gpu_hours"] for h in g[key]] == pytest.approx(
                    [h["gpu_hours"] for h in value], rel=1e-12
                )
            elif isinstance(value, float):
                assert g[key] == pytest.approx(value, rel=1e-12, abs=1e-9), (w["team"], key)
            else:
                assert g[key] == value, (w["team"], key)
