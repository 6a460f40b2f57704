"""The live side of the breakers: `JobWatch` turns API reports into the breakers' samples, under
each team's policy, and rebuilds a job's state from its stored reports after a restart."""

from gpu_arbiter.control.schemas import Telemetry
from gpu_arbiter.control.watch import JobWatch
from gpu_arbiter.reliability import Action, Breaker


def io(share: float, step: int) -> Telemetry:
    return Telemetry(step=step, io_wait_share=share)


def test_an_io_stall_trips_after_fifteen_percent_for_its_window():
    watch = JobWatch()
    trips = [watch.observe("j", "t", 60.0 * i, io(0.3, i))[0] for i in range(12)]
    found = [t for t in trips if t is not None]
    assert len(found) == 1 and trips.index(found[0]) == 10  # 600 s after the first high one
    assert found[0].detection.breaker is Breaker.IO_STALL
    assert found[0].action is Action.STOP
    assert found[0].reason.startswith("circuit breaker: I/O stall: I/O wait above 15% for 600 s")


def test_a_team_policy_of_flag_flags_and_the_string_nan_is_a_nan():
    watch = JobWatch()
    watch.set_team("research", "flag", "https://hooks.example.com/x")
    trip, _ = watch.observe("j", "research", 0.0, Telemetry(step=9, grad_norm="nan"))
    assert trip is not None and trip.action is Action.FLAG
    assert trip.reason == "circuit breaker: gradient norm is NaN at step 9"
    assert watch.webhooks == {"research": "https://hooks.example.com/x"}
    watch.set_team("research", "stop", None)
    assert watch.webhooks == {}


def test_replaying_stored_reports_carries_a_window_on_across_a_restart():
    stored = [(60.0 * i, io(0.3, i).data()) for i in range(8)]  # 420 s of a stall, no trip
    fresh = JobWatch()
    assert fresh.observe("j", "t", 480.0, io(0.3, 8))[0] is None  # would start over
    rebuilt = JobWatch()
    rebuilt.replay("j", "t", stored)
    assert rebuilt.observe("j", "t", 600.0, io(0.3, 10))[0] is not None


def test_a_new_run_is_watched_afresh():
    watch = JobWatch()
    watch.replay("j", "t", [(60.0 * i, io(0.3, i).data()) for i in range(10)])
    watch.forget("j")
    assert watch.observe("j", "t", 600.0, io(0.3, 10))[0] is None


def test_step_times_with_their_nodes_find_a_straggler():
    watch = JobWatch()
    watch.straggler_config = type(watch.straggler_config)(factor=1.5, window_s=0)
    for rank in range(4):
        watch.observe("j", "t", 0.0, Telemetry(rank=rank, node="a", step_time_s=1.0))
    _, found = watch.observe("j", "t", 0.0, Telemetry(rank=4, node="b", step_time_s=3.0))
    assert found is not None and found.node == "b"
