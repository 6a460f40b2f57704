"""Why a queued job waits, from hand-made snapshots (no engine, no server)."""

from __future__ import annotations

from gpu_arbiter.web.reasons import ReasonFinder, reasons, usable
from gpu_arbiter.web.snapshot import NodeState, PendingJob, Snapshot, TeamState

W = 560.0  # an H100 at the normal power profile


def node(name: str, free: int, rack: str = "r0", gpus: int = 8, domain: int = 8, **kw) -> NodeState:
    mask = kw.pop("mask", (1 << free) - 1)
    return NodeState(name, rack, "H100", gpus, domain, kw.pop("state", "up"), "", mask)


def job(gpus: int, tier: int = 3, **kw) -> PendingJob:
    return PendingJob(
        id=kw.pop("id", "j"),
        team=kw.pop("team", "a"),
        tier=tier,
        requested_tier=kw.pop("requested_tier", tier),
        gpus=gpus,
        gpu_types=("H100",),
        tp=kw.pop("tp", 1),
        max_racks=kw.pop("max_racks", None),
        power_profile="normal",
        gpu_milli=1000,
        submitted_at=0.0,
        queued_since=0.0,
        **kw,
    )


def snap(*nodes: NodeState, headroom: float = 1e9, teams=()) -> Snapshot:
    return Snapshot(
        now=10.0,
        nodes=nodes,
        rack_headroom_w={n.rack: headroom for n in nodes},
        watts_per_gpu={("H100", "normal"): W, ("H100", "high"): 700.0},
        teams=tuple(teams),
    )


def why(s: Snapshot, j: PendingJob) -> str:
    return ReasonFinder(s).reason(j).code


def test_too_few_free_gpus_of_any_accepted_type_is_capacity():
    assert why(snap(node("a", 2), node("b", 1)), job(4)) == "capacity"


def test_enough_free_in_total_but_no_node_with_all_of_them_is_gang():
    r = ReasonFinder(snap(node("a", 3), node("b", 3))).reason(job(6))
    assert r.code == "gang" and "at most 3 free on one" in r.text


def test_tp_groups_that_do_not_fit_an_nvlink_domain_are_topology():
    # 4 free GPUs, two in each 4-GPU domain: a tp-4 job has no domain to sit in.
    n = node("a", 0, domain=4, mask=0b0011_0011)
    assert usable(n, 4) == 0 and usable(n, 2) == 4
    assert why(snap(n), job(4, tp=4)) == "topology"


def test_a_gang_capped_to_one_rack_is_topology_when_no_rack_holds_it():
    s = snap(node("a", 8, rack="r0"), node("b", 8, rack="r1"))
    assert why(s, job(12, max_racks=1)) == "topology"
    assert why(s, job(12)) == "reserved"


def test_free_gpus_in_racks_without_power_headroom_are_power():
    assert why(snap(node("a", 8), headroom=3 * W), job(4)) == "power"
    assert why(snap(node("a", 8), node("b", 8), headroom=3 * W), job(12)) == "power"


def test_a_job_that_fits_now_waits_behind_a_reservation():
    assert why(snap(node("a", 8)), job(4)) == "reserved"


def test_tier1_beyond_quota_and_pool_is_quota_whatever_is_free():
    assert why(snap(node("a", 8)), job(4, tier=1, tier1_quota_ok=False)) == "quota"


def test_a_team_out_of_credits_waits_for_its_budget_and_says_what_else_blocks():
    broke = TeamState("a", 1.0, {}, {}, 10.0, 0.0, 0.0, 0.0)
    s = snap(node("a", 3), node("b", 3), teams=[broke])
    r = ReasonFinder(s).reason(job(6, tier=3, requested_tier=1))
    assert r.code == "budget" and "split across nodes" in r.text
    # A job that asked for tier 3 anyway is not held back by the budget.
    assert why(s, job(6, tier=3)) == "gang"


def test_a_job_holding_gpus_for_tier2_victims_is_preempting():
    assert why(snap(node("a", 0)), job(8, tier=1, waiting_on=2)) == "preempting"


def test_failed_and_cordoned_nodes_offer_nothing():
    s = snap(node("a", 8, state="down"), node("b", 8, state="cordoned"))
    assert why(s, job(1)) == "capacity"


def test_the_type_a_job_came_closest_to_running_on_gives_the_reason():
    a100 = NodeState("x", "r0", "A100", 8, 8, "up", "", 0xFF)
    s = Snapshot(
        now=0.0,
        nodes=(node("a", 1), a100),
        rack_headroom_w={"r0": 1e9},
        watts_per_gpu={("H100", "normal"): W, ("A100", "normal"): 320.0},
    )
    j = PendingJob("j", "a", 3, 3, 4, ("H100", "A100"), 1, None, "normal", 1000, 0.0, 0.0)
    assert why(s, j) == "reserved"


def test_reasons_cover_every_queued_job():
    s = Snapshot(
        now=0.0,
        nodes=(node("a", 2),),
        rack_headroom_w={"r0": 1e9},
        watts_per_gpu={("H100", "normal"): W},
        pending=(job(1, id="j1"), job(4, id="j2")),
    )
    assert {k: r.code for k, r in reasons(s).items()} == {"j1": "reserved", "j2": "capacity"}
