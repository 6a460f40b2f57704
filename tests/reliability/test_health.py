"""F1: the health monitor cordons a node once, for the right reason, and leaves healthy ones."""

import pytest

from gpu_arbiter.domain import InvalidInput, NodeDown
from gpu_arbiter.reliability import HealthCause, HealthMonitor, HealthReport


def monitor_with(node: str = "n1", at: float = 0.0) -> HealthMonitor:
    m = HealthMonitor()
    m.heartbeat(node, at)
    return m


def test_a_healthy_node_gets_no_verdict():
    m = monitor_with()
    for t in range(0, 300, 10):
        m.heartbeat("n1", t)
        m.report("n1", t, HealthReport(xids=(13, 31, 43), temperature_c=75.0))
        assert m.check(t + 5) == []
    assert m.cordoned == frozenset()


def test_a_node_never_heard_from_does_not_fire():
    m = HealthMonitor()
    assert m.check(1e9) == []


@pytest.mark.parametrize(
    ("report", "cause", "words"),
    [
        (HealthReport(xids=(79,)), HealthCause.FATAL_XID, "XID 79 (GPU has fallen off the bus)"),
        (HealthReport(xids=(48, 13)), HealthCause.FATAL_XID, "XID 48"),
        (HealthReport(ecc_uncorrectable=2), HealthCause.ECC_UNCORRECTABLE, "2 uncorrectable"),
        (HealthReport(nvlink_down=1), HealthCause.NVLINK_DOWN, "1 NVLink link(s) down"),
        (HealthReport(temperature_c=95.0), HealthCause.OVERHEATING, "95 C (limit 90 C)"),
    ],
)
def test_each_fatal_finding_cordons_the_node_and_says_why(report, cause, words):
    m = monitor_with()
    m.report("n1", 10.0, report)
    [verdict] = m.check(11.0)
    assert verdict.node == "n1"
    assert verdict.at == 11.0
    assert verdict.causes == (cause,)
    assert words in verdict.reason
    assert m.cordoned == {"n1"}


def test_missed_heartbeats_cordon_only_after_the_timeout():
    m = monitor_with(at=100.0)
    assert m.check(130.0) == []  # silent for exactly the timeout: still fine
    [verdict] = m.check(130.5)
    assert verdict.causes == (HealthCause.MISSED_HEARTBEAT,)
    assert "silent for 30.5 s (timeout 30 s)" in verdict.reason


def test_a_health_report_counts_as_a_heartbeat():
    m = monitor_with(at=0.0)
    m.report("n1", 25.0, HealthReport())
    assert m.check(50.0) == []


def test_a_cordoned_node_is_reported_once_until_uncordoned():
    m = monitor_with()
    m.report("n1", 1.0, HealthReport(xids=(79,)))
    assert len(m.check(2.0)) == 1
    m.report("n1", 3.0, HealthReport(xids=(79,), ecc_uncorrectable=5))
    assert m.check(4.0) == []
    assert m.check(1000.0) == []  # silent too, still no second verdict


def test_an_uncordoned_node_starts_fresh_and_can_fail_again():
    m = monitor_with()
    m.report("n1", 1.0, HealthReport(ecc_uncorrectable=1))
    assert m.check(2.0)
    m.uncordon("n1", at=7200.0)
    assert m.cordoned == frozenset()
    assert m.check(7210.0) == []  # a fresh heartbeat window after repair
    m.report("n1", 7220.0, HealthReport(nvlink_down=2))
    [verdict] = m.check(7221.0)
    assert verdict.causes == (HealthCause.NVLINK_DOWN,)


def test_a_finding_is_kept_until_checked_even_if_the_next_report_is_clean():
    m = monitor_with()
    m.report("n1", 1.0, HealthReport(xids=(95,)))
    m.report("n1", 2.0, HealthReport())
    [verdict] = m.check(3.0)
    assert verdict.causes == (HealthCause.FATAL_XID,)


def test_several_findings_and_silence_are_reported_together_sorted_by_node():
    m = HealthMonitor(heartbeat_timeout_s=10)
    m.heartbeat("b", 0.0)
    m.report("a", 0.0, HealthReport(xids=(79,), temperature_c=99.0))
    verdicts = m.check(20.0)
    assert [v.node for v in verdicts] == ["a", "b"]
    assert set(verdicts[0].causes) == {
        HealthCause.FATAL_XID,
        HealthCause.OVERHEATING,
        HealthCause.MISSED_HEARTBEAT,
    }
    assert verdicts[1].causes == (HealthCause.MISSED_HEARTBEAT,)


def test_limits_and_fatal_xids_are_configurable():
    m = HealthMonitor(fatal_xids={13}, ecc_uncorrectable_limit=3, max_temperature_c=80.0)
    m.report("n1", 0.0, HealthReport(xids=(79,), ecc_uncorrectable=2, temperature_c=79.0))
    assert m.check(1.0) == []
    m.report("n1", 2.0, HealthReport(xids=(13,)))
    [verdict] = m.check(3.0)
    assert "XID 13 (listed as fatal)" in verdict.reason


def test_a_verdict_becomes_a_node_down_event():
    m = monitor_with()
    m.report("n1", 1.0, HealthReport(xids=(79,)))
    [verdict] = m.check(2.0)
    assert verdict.node_down() == NodeDown("n1", 2.0, verdict.reason)


def test_a_non_positive_heartbeat_timeout_is_refused():
    with pytest.raises(InvalidInput):
        HealthMonitor(heartbeat_timeout_s=0)
