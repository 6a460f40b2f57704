"""Where a gang goes (S3, S5, S6, S10): best fit, one rack when it fits, rack caps, NVLink
domains, power caps, data locality."""

from hypothesis import given, settings
from hypothesis import strategies as st

from gpu_arbiter.domain import Allocation
from gpu_arbiter.domain.presets import small
from gpu_arbiter.engine import EngineConfig, Scheduler
from gpu_arbiter.engine.capacity import CapacityIndex
from gpu_arbiter.engine.placement import (
    Request,
    gpus_to_mask,
    may_place_after,
    pick_gpus,
    place,
)
from gpu_arbiter.engine.preemption import Option, plan_preemption
from tests.conftest import job
from tests.engine.helpers import cluster, cycle, starts
from tests.engine.strategies import clusters


def commit(index: CapacityIndex, alloc: Allocation, w: float = 560.0) -> None:
    for node, gpus in alloc.slots:
        index.take(node, gpus_to_mask(gpus), w)


def test_best_fit_packs_a_small_job_onto_the_partly_used_node_and_keeps_whole_nodes_free():
    index = CapacityIndex(small())
    commit(index, place(index, Request("H100", 5)))
    alloc = place(index, Request("H100", 2))
    assert alloc.nodes == (0,)
    assert index.whole_free["H100"] == 7 * 8


def test_no_gpu_of_an_avoided_node_is_placed_whatever_the_size():
    index = CapacityIndex(small())
    commit(index, place(index, Request("H100", 5)))
    assert place(index, Request("H100", 2), avoid=0).nodes != (0,)  # best fit: node 0
    gang = place(index, Request("H100", 56), avoid=0)
    assert gang is not None and 0 not in gang.nodes
    assert place(index, Request("H100", 57), avoid=0) is None  # it needs node 0's 3 free GPUs
    assert place(index, Request("H100", 57)) is not None


def test_spread_puts_a_small_job_on_the_emptiest_node():
    index = CapacityIndex(small())
    commit(index, place(index, Request("H100", 5)))
    assert place(index, Request("H100", 2), "spread").nodes != (0,)


def test_a_16_gpu_gang_goes_into_one_rack_when_it_fits():
    index = CapacityIndex(small())  # 2 racks of 4 nodes × 8
    commit(index, place(index, Request("H100", 8)))  # rack r0000 now has 24 free
    alloc = place(index, Request("H100", 16))
    racks = {index.node_rack[n] for n in alloc.nodes}
    assert len(racks) == 1 and alloc.gpus == 16


def test_a_gang_goes_to_the_rack_with_the_least_spare_room_that_fits():
    index = CapacityIndex(small())
    commit(index, place(index, Request("H100", 16)))
    alloc = place(index, Request("H100", 16))
    assert {index.node_rack[n] for n in alloc.nodes} == {0}


def test_max_racks_is_honoured():
    c = cluster(*({"name": f"r{i}", "nodes": 2} for i in range(3)))
    index = CapacityIndex(c)
    for rack in range(3):  # one node of each rack busy: 8 free per rack
        commit(index, Allocation("H100", ((2 * rack, tuple(range(8))),)))
    assert place(index, Request("H100", 20, max_racks=2)) is None
    alloc = place(index, Request("H100", 20))
    assert alloc.gpus == 20 and len({index.node_rack[n] for n in alloc.nodes}) == 3


def test_tensor_parallel_groups_never_straddle_nvlink_domains():
    """Also found here: a job no larger than a domain was refused unless one domain alone had
    room for it, though only its tp groups need to stay inside a domain (S5)."""
    c = cluster({"name": "r0", "nodes": 1, "nvlink_domain": 4})
    index = CapacityIndex(c)
    commit(index, Allocation("H100", ((0, (0, 4)),)))  # one GPU busy in each domain
    assert place(index, Request("H100", 4, tp=4)) is None
    alloc = place(index, Request("H100", 4, tp=2))
    ((_, gpus),) = alloc.slots
    assert sorted(g // 4 for g in gpus) == [0, 0, 1, 1]


def test_a_group_fills_the_fullest_used_domain_that_fits_first():
    # domain 0 has GPUs 1-3 free, domain 1 is wholly free
    assert pick_gpus(0b11111110, 8, 4, 2, 2) == 0b110


def test_rack_power_caps_are_never_exceeded():
    # 2 nodes × 8 H100; 2 kW idle plus power for 12 GPUs at the normal profile (560 W).
    c = cluster({"name": "r0", "nodes": 2, "power_cap_kw": 2.0 + 12 * 0.56})
    index = CapacityIndex(c)
    commit(index, place(index, Request("H100", 8)))
    assert place(index, Request("H100", 8)) is None
    commit(index, place(index, Request("H100", 4)))
    assert place(index, Request("H100", 1)) is None
    assert index.rack_power[0] <= c.racks["r0"].power_cap_w


def test_a_high_power_gang_needs_more_headroom_than_a_normal_one():
    c = cluster({"name": "r0", "nodes": 1, "power_cap_kw": 1.0 + 8 * 0.56})
    index = CapacityIndex(c)
    assert place(index, Request("H100", 8, power_profile="high")) is None
    assert place(index, Request("H100", 8)) is not None


def test_high_power_starts_are_staggered_per_rack():
    sched = Scheduler(small(), config=EngineConfig(high_power_starts_per_rack=2))
    for i in range(3):
        sched.submit(job(f"hot{i}", gpus=8, power_profile="high", max_racks=1), 0.0)
    sched.submit(job("hot-big", gpus=32, power_profile="high"), 0.0)
    first = starts(cycle(sched, 0.0))
    racks = [sched.index.node_rack[n] for s in first.values() for n in s.allocation.nodes]
    assert all(racks.count(r) <= 8 for r in set(racks))
    per_rack: dict[int, int] = {}
    for s in first.values():
        for r in {sched.index.node_rack[n] for n in s.allocation.nodes}:
            per_rack[r] = per_rack.get(r, 0) + 1
    assert max(per_rack.values()) <= 2
    assert len(first) < 4
    assert set(starts(cycle(sched, 1.0))) | set(first) == {"hot0", "hot1", "hot2", "hot-big"}


def test_a_job_goes_to_the_racks_that_hold_its_data():
    c = cluster({"name": "r0", "nodes": 2}, {"name": "r1", "nodes": 2, "labels": ["eu"]})
    index = CapacityIndex(c)
    assert {index.node_rack[n] for n in place(index, Request("H100", 2, locality="eu")).nodes} == {
        1
    }
    assert {index.node_rack[n] for n in place(index, Request("H100", 12, locality="eu")).nodes} == {
        1
    }


def test_spread_places_a_gang_that_is_not_a_multiple_of_the_node_size():
    """Found by the completion property under FIFO: spread placement never put the remainder
    of a multi-node gang on a node with more free GPUs than the remainder, so a 12-GPU job
    could not start on an empty cluster of 8-GPU nodes."""
    index = CapacityIndex(small())
    alloc = place(index, Request("H100", 12), "spread")
    assert alloc is not None and alloc.gpus == 12


def test_a_gang_whose_power_room_is_not_a_whole_number_of_tp_groups_per_rack_still_fits():
    # Found by the completion property: each rack of pod p1 has power for 5 GPUs, i.e. two
    # tp-2 groups, so the two racks that seem to cover 10 GPUs hold 8; a third rack is needed.
    from gpu_arbiter.domain import GPU_CATALOG, Cluster, Node, Rack

    layout = [("r0", 2), ("r1", 2), ("r2", 2), ("r2", 2), ("r2", 2), ("r3", 4), ("r3", 4)]
    nodes = tuple(
        Node(name=f"n{i}", gpu_type="H100", gpus=g, rack=r, nvlink_domain=2, index=i)
        for i, (r, g) in enumerate(layout)
    )
    caps = {"r0": 2400.0, "r1": 2400.0, "r2": 5800.0, "r3": 4800.0}
    pods = {"r0": "p0", "r1": "p0", "r2": "p1", "r3": "p1"}
    racks = {r: Rack(name=r, pod=pods[r], power_cap_w=c) for r, c in caps.items()}
    c = Cluster(
        name="tp-power",
        nodes=nodes,
        racks=racks,
        gpu_types={"H100": GPU_CATALOG["H100"]},
        _by_name={n.name: n.index for n in nodes},
    )
    index = CapacityIndex(c)
    alloc = place(index, Request("H100", 10, 2))
    assert alloc is not None and alloc.gpus == 10
    assert all(len(gpus) % 2 == 0 for _, gpus in alloc.slots)


def test_no_gang_passes_the_test_where_no_freeing_could_place_it():
    index = CapacityIndex(small())  # 2 racks of 4 nodes x 8
    one_gpu = [Allocation("H100", ((node, (0,)),)) for node in range(8)]
    seven = [Allocation("H100", ((node, tuple(range(1, 8))),)) for node in range(8)]
    for alloc in one_gpu + seven:
        commit(index, alloc)
    # A GPU of every node stays busy: no node can hold 8, whatever else is freed.
    assert not may_place_after(index, Request("H100", 8), seven)
    assert may_place_after(index, Request("H100", 7), seven[:1])
    assert may_place_after(index, Request("H100", 8), seven[:1] + one_gpu[:1])
    # Two racks hold 56 of 64 GPUs in groups of 1, but only 48 in groups of 4 or 8 (7 -> 4).
    assert may_place_after(index, Request("H100", 56, tp=1), seven)
    assert not may_place_after(index, Request("H100", 52, tp=4), seven)
    assert not may_place_after(index, Request("H100", 29, max_racks=1), seven)


@settings(max_examples=150, deadline=None)
@given(data=st.data())
def test_whatever_some_of_the_busy_gpus_freed_can_place_passes_the_test_with_all_freed(data):
    """`may_place_after` is a necessary condition: where `place` finds the gang with any
    subset of the allocations released, or a preemption plan over them (in any order) does,
    the test on all of them passes."""
    c = data.draw(clusters()).cluster
    index = CapacityIndex(c)
    types = sorted(index.max_size)
    allocs: list[Allocation] = []
    for t in types:  # busy GPUs of each type, shared out among a few jobs
        jobs = data.draw(st.integers(1, 5))
        slots: list[dict[int, list[int]]] = [{} for _ in range(jobs)]
        for node in (n for n in c.nodes if n.gpu_type == t):
            for g in range(node.gpus):
                owner = data.draw(st.integers(-1, jobs - 1))  # -1: free
                if owner >= 0:
                    slots[owner].setdefault(node.index, []).append(g)
        allocs += [Allocation(t, tuple((n, tuple(g)) for n, g in s.items())) for s in slots if s]
    watts = {a: index.watts_per_gpu(a.gpu_type, "normal") for a in allocs}
    for a in allocs:
        commit(index, a, watts[a])
    t = data.draw(st.sampled_from(types))
    domain = min(n.domain_size for n in c.nodes if n.gpu_type == t)
    req = Request(
        t,
        data.draw(st.integers(1, index.type_total[t])),
        tp=data.draw(st.sampled_from(sorted({1, 2, domain} & set(range(1, domain + 1))))),
        max_racks=data.draw(st.sampled_from([None, 1, 2])),
    )
    strategy = data.draw(st.sampled_from(["pack", "spread"]))
    mine = [a for a in allocs if a.gpu_type == t]
    verdict = may_place_after(index, req, mine)
    order = data.draw(st.permutations(mine))
    options = [Option((), (), None, a, watts[a], True, ()) for a in order]
    if plan_preemption(index, req, options, strategy) is not None:
        assert verdict
    for a in data.draw(st.lists(st.sampled_from(mine), unique=True)) if mine else []:
        for node, gpus in a.slots:
            index.give(node, gpus_to_mask(gpus), watts[a])
    if place(index, req, strategy) is not None:
        assert verdict
