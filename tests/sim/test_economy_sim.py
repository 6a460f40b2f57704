"""The economy wired into the simulator and the engine: every run segment billed once, budgets
capping tiers at admission, and the bill of a real run from `arbiter bill --from-sim`."""

import dataclasses
import itertools
import json
import math
import os
import subprocess
import sys

import pytest
from typer.testing import CliRunner

from gpu_arbiter.cli.inputs import load_teams, with_budget
from gpu_arbiter.cli.main import app
from gpu_arbiter.domain import InvalidInput, JobState, Tier
from gpu_arbiter.domain.presets import small
from gpu_arbiter.economy import FAILURE_ABSORBED, GRANT, LOST_WORK, RERUN, RUN, ChargeModel
from gpu_arbiter.economy.ledger import CHARGE, REFUND, REVENUE, team_account
from gpu_arbiter.engine import Scheduler
from gpu_arbiter.sim import SimConfig, SimEconomy, Simulator
from gpu_arbiter.sim.faults import ReliabilityConfig
from gpu_arbiter.traces.synthetic import synthetic_teams, synthetic_workload
from tests.conftest import job

ARBITER = [sys.executable, "-m", "gpu_arbiter.cli"]


@pytest.fixture(scope="module", params=["reliable", "faulty"])
def run(request):
    """A whole run, once on a reliable cluster and once failing every few hours (F3)."""
    topo = small()
    faulty = request.param == "faulty"
    faults = ReliabilityConfig(seed=1, gpu_afr=50.0, node_afr=50.0, failures=faulty)
    cfg = SimConfig(reliability=faults)
    sim = Simulator(topo, synthetic_teams(topo), "arbiter", synthetic_workload(200, 5, topo), cfg)
    return sim, sim.run()


def test_ledger_balances_after_a_whole_simulation(run):
    _, result = run
    ledger = result.economy.ledger
    ledger.check_balanced()
    spent = math.fsum(b["credits"] for b in result.kpis["cost_by_team"].values())
    assert ledger.balance(REVENUE) == pytest.approx(spent)
    assert spent > 0


def test_every_job_pays_list_price_for_exactly_the_gpu_seconds_it_held(run):
    sim, result = run
    model = ChargeModel()
    ledger = result.economy.ledger
    for j in sim.sched.jobs.values():
        charges = [e for e in ledger.audit(j.id) if e.kind == CHARGE]
        share = j.spec.gpu_milli / 1000
        assert math.fsum(e.gpu_seconds for e in charges) == pytest.approx(j.busy_gpu_s * share)
        for e in charges:
            price = model.prices.price(e.gpu_type, e.tier, e.preemptible)
            expected = price * e.gpu_seconds / 3600 * (1 - model.discount(j.spec))
            assert e.credits == pytest.approx(expected)
            assert j.spec.tier <= e.tier <= Tier.EXPLORATORY
        spans = sorted((e.start, e.end) for e in charges)
        assert all(a_end <= b_start for (_, a_end), (b_start, _) in itertools.pairwise(spans))


def test_failed_work_is_paid_by_jobs_that_opted_out_of_checkpoints_and_refunded_to_the_rest(run):
    sim, result = run
    ledger = result.economy.ledger
    failed_work = {RERUN, LOST_WORK} & {e.reason for e in ledger.entries()}
    assert failed_work == ({RERUN, LOST_WORK} if result.kpis["faults"] else set())
    for j in sim.sched.jobs.values():
        entries = ledger.audit(j.id)
        reasons = {e.reason for e in entries}
        assert LOST_WORK not in reasons or j.spec.checkpoint_interval_s is not None
        assert RERUN not in reasons or j.spec.checkpoint_interval_s is None
        for e in entries:
            if e.reason == LOST_WORK:
                assert ledger.refunded(e) == pytest.approx(e.credits)
        if j.failure_demoted:
            assert max(e.tier for e in entries if e.kind == CHARGE) > j.spec.tier


def test_cost_kpis_sum_to_the_cluster_figure(run):
    _, result = run
    teams = result.kpis["cost_by_team"]
    spent = math.fsum(t["credits"] for t in teams.values())
    useful = math.fsum(t["useful_gpu_hours"] for t in teams.values())
    assert result.kpis["cost_per_useful_gpu_hour"] == pytest.approx(spent / useful)
    assert useful == pytest.approx(result.kpis["useful_gpu_hours"])
    for t in teams.values():
        assert t["credits_per_useful_gpu_hour"] == pytest.approx(
            t["credits"] / t["useful_gpu_hours"]
        )


def test_billing_off_leaves_no_ledger_and_no_cost_fields():
    topo = small()
    cfg = SimConfig(economy=None)
    result = Simulator(
        topo, synthetic_teams(topo), "fifo", synthetic_workload(30, 1, topo), cfg
    ).run()
    assert result.economy is None and "cost_by_team" not in result.kpis


def test_a_team_that_spent_its_tiny_budget_runs_new_work_at_tier_three():
    topo = small()
    teams = [
        dataclasses.replace(t, budget_per_period=1.0) if t.name == "research" else t
        for t in synthetic_teams(topo)
    ]
    sim = Simulator(topo, teams, "arbiter", synthetic_workload(300, 2, topo))
    result = sim.run()
    net, spent_at = 0.0, math.inf
    for e in result.economy.ledger.entries(team_account("research")):
        net += e.credits if e.kind != CHARGE else -e.credits
        if net <= 0 and e.kind == CHARGE:
            spent_at = min(spent_at, e.at)
    late = [
        j for j in sim.sched.jobs.values() if j.team == "research" and j.spec.submit_s > spent_at
    ]
    assert any(j.spec.tier < Tier.EXPLORATORY for j in late)
    assert all(j.tier == Tier.EXPLORATORY for j in late)
    others = [j for j in sim.sched.jobs.values() if j.team != "research" and j.spec.tier == 1]
    assert any(j.tier == Tier.CORE for j in others)


def _running(cluster, teams, spec, economy):
    sched = Scheduler(cluster, teams, "arbiter", budget=economy.budget_rule)
    economy.tick(0.0)
    sched.submit(spec, 0.0)
    sched.cycle(0.0)
    j = sched.jobs[spec.id]
    assert j.state == JobState.RUNNING
    economy.open(j, 0.0)
    return sched, j


def _fail(sched, economy, j, now):
    node = sched.cluster.nodes[j.allocation.nodes[0]].name
    economy.tick(now)
    assert sched.node_down(node, now) == [j.id]
    economy.close(j, now)


def test_failure_without_checkpointing_bills_a_rerun_at_the_tier_run_and_the_engine_demotes(
    cluster, teams
):
    economy = SimEconomy(teams)
    sched, j = _running(cluster, teams, job("nockpt", tier=1, gpus=8, duration=5000), economy)
    _fail(sched, economy, j, 1000.0)
    [charge] = economy.ledger.audit(j.id)
    assert (charge.reason, charge.tier, charge.start, charge.end) == (RERUN, Tier.CORE, 0, 1000)
    assert j.tier == Tier.BUSINESS and j.failure_demoted


def test_failure_of_a_checkpointing_job_bills_up_to_the_last_checkpoint_and_refunds_the_rest(
    cluster, teams
):
    economy = SimEconomy(teams)
    spec = job("ckpt", tier=1, gpus=8, duration=5000, checkpoint_interval_s=300)
    sched, j = _running(cluster, teams, spec, economy)
    _fail(sched, economy, j, 1000.0)
    run, lost, refund = economy.ledger.audit(j.id)
    assert (run.reason, run.start, run.end) == (RUN, 0, pytest.approx(900))
    assert run.useful_gpu_seconds == pytest.approx(8 * 900)
    assert (lost.reason, lost.end, refund.kind, refund.reason) == (
        LOST_WORK,
        1000,
        REFUND,
        FAILURE_ABSORBED,
    )
    assert refund.credits == lost.credits
    assert j.tier == Tier.CORE


def test_a_job_requeued_after_its_team_ran_out_of_budget_restarts_at_tier_three(cluster, teams):
    teams = with_budget(teams, 10.0)
    economy = SimEconomy(teams)
    spec = job("t2", tier=2, gpus=8, duration=50_000, checkpoint_interval_s=300)
    sched, j = _running(cluster, teams, spec, economy)
    earlier = job("earlier", tier=2, gpus=8)  # its 8 H100-hours cost far more than 10 credits
    args = dict(gpu_type="H100", tier=2, gpus=8, start=0.0, end=3600.0, preemptible=False)
    economy.model.charge_segment(economy.ledger, earlier, **args)
    assert economy.budgets.remaining("a", 3600.0) < 0
    _fail(sched, economy, j, 3600.0)
    assert j.tier == Tier.EXPLORATORY and not j.failure_demoted


def test_teams_file_sets_weights_quotas_and_budgets(tmp_path, cluster):
    path = tmp_path / "teams.yaml"
    path.write_text("teams:\n  a: {weight: 3, budget: 100}\n  b: {quota: {H100: 8}}\n")
    a, b = load_teams(path, cluster, [job("1", team="a"), job("2", team="b")])
    assert (a.weight, a.quota, a.budget_per_period) == (3.0, {"H100": 38}, 100.0)
    assert (b.quota, b.budget_per_period) == ({"H100": 8}, None)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("teams:\n  a: {budget: -1}\n", "teams.a.budget: Input should be greater than or equal"),
        ("teams:\n  a: {quota: {B200: 8}}\n", "unknown GPU type B200"),
        ("teams:\n  a: {colour: red}\n", "teams.a.colour: Extra inputs"),
        ("teams:\n  b: {}\n", "no entry for team(s) a"),
    ],
)
def test_teams_file_errors_name_what_is_wrong(tmp_path, cluster, text, message):
    path = tmp_path / "teams.yaml"
    path.write_text(text)
    with pytest.raises(InvalidInput, match=message.replace("(", r"\(").replace(")", r"\)")):
        load_teams(path, cluster, [job("1", team="a")])


def test_simulate_out_then_bill_from_sim_prints_every_team(tmp_path):
    out = tmp_path / "run"
    common = ["--workload", "synthetic:80", "--seed", "3", "--cluster", "small"]
    sim = subprocess.run(
        [*ARBITER, "simulate", *common, "--budget", "50", "--out", str(out), "--json"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert sim.returncode == 0, sim.stderr
    kpis = json.loads(sim.stdout)
    assert json.loads((out / "kpis.json").read_text()) == kpis
    assert kpis["cost_per_useful_gpu_hour"] > 0
    teams = set(kpis["cost_by_team"])
    assert teams == {t.name for t in synthetic_teams(small())}
    for cost in kpis["cost_by_team"].values():
        assert set(cost) == {
            "credits",
            "gpu_hours",
            "useful_gpu_hours",
            "credits_per_useful_gpu_hour",
        }
    env = {**os.environ, "COLUMNS": "250"}
    table = subprocess.run(
        [*ARBITER, "bill", "--from-sim", str(out)], capture_output=True, text=True, env=env
    )
    assert table.returncode == 0, table.stderr
    assert all(team in table.stdout for team in teams)
    as_json = CliRunner().invoke(app, ["bill", "--from-sim", str(out), "--json"])
    assert as_json.exit_code == 0, as_json.output
    bills = {b["team"]: b for b in json.loads(as_json.output)}
    assert set(bills) == teams
    for team, b in bills.items():
        assert b["credits_spent"] == pytest.approx(kpis["cost_by_team"][team]["credits"])
        assert b["credits_granted"] == 50.0


def test_simulate_refuses_a_negative_budget_naming_the_option():
    result = CliRunner().invoke(app, ["simulate", "--workload", "synthetic:5", "--budget", "-3"])
    assert isinstance(result.exception, InvalidInput)
    assert str(result.exception) == "--budget must be >= 0 credits, got -3.0"


def test_each_budget_period_is_granted_once_at_its_first_instant():
    """`SimEconomy.tick` grants a period's budgets at its first instant, and never again however
    many instants the period holds."""
    topo = small()
    teams = [dataclasses.replace(t, budget_per_period=5.0) for t in synthetic_teams(topo)]
    economy = SimEconomy(teams)
    period = economy.budgets.policy.period_s
    for now in (0.0, 1.0, period / 2, period - 1.0, period, period + 1.0, 3 * period):
        economy.tick(now)
    grants = [e for e in economy.ledger.entries() if e.kind == GRANT]
    assert sorted((e.team, e.period) for e in grants) == sorted(
        (t.name, p) for t in teams for p in ("p0", "p1", "p3")
    )
