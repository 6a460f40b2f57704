"""Options, statistics and the shared pipeline, exercised through the simplest reader."""

from pathlib import Path

import pytest

from gpu_arbiter.domain import InvalidInput, Tier
from gpu_arbiter.traces.base import (
    DEFAULT_TEAMS,
    BadField,
    ReadStats,
    TraceOptions,
    as_int,
    as_time,
    unit_hash,
)
from gpu_arbiter.traces.tiresias import TIRESIAS_GPU, read_tiresias


def jobs(path: Path, **options: object) -> list:
    return list(read_tiresias(path, TraceOptions(**options)))  # type: ignore[arg-type]


def test_defaults_are_six_teams_and_a_15_35_50_tier_mix() -> None:
    opts = TraceOptions()
    assert opts.teams == DEFAULT_TEAMS == tuple(f"team-{c}" for c in "abcdef")
    assert opts.tier_mix == (0.15, 0.35, 0.50)
    assert (opts.walltime, opts.time_scale, opts.limit) == ("round-hour", 1.0, None)
    assert not opts.strict


@pytest.mark.parametrize(
    "bad",
    [
        {"teams": ()},
        {"teams": ("a", "a")},
        {"tier_mix": (0.5, 0.5, 0.5)},
        {"tier_mix": (-0.1, 0.6, 0.5)},
        {"tier_map": {"LS": 0}},
        {"walltime": "daily"},
        {"time_scale": 0.0},
        {"source_speed": -1.0},
        {"limit": 0},
    ],
)
def test_options_refuse_values_that_cannot_work(bad: dict) -> None:
    with pytest.raises(InvalidInput):
        TraceOptions(**bad)


def test_unit_hash_is_stable_and_depends_on_seed_salt_and_key() -> None:
    assert unit_hash(0, "team", "job-1") == unit_hash(0, "team", "job-1")
    values = {unit_hash(s, salt, k) for s in (0, 1) for salt in ("team", "tier") for k in "ab"}
    assert len(values) == 8 and all(0 <= v < 1 for v in values)


def test_summary_names_skip_reasons_and_the_first_bad_rows() -> None:
    stats = ReadStats(source="x.csv", rows=10, jobs=5)
    stats.skipped["cpu_only"] = 2
    for row in (3, 4, 5, 6, 7, 8):
        stats.add_bad(row, "num_gpu")
    assert stats.summary() == (
        "x.csv: 10 rows, 5 jobs, 2 skipped (cpu_only 2), 6 bad (num_gpu 6: rows 3, 4, 5, 6, 7, ...)"
    )
    assert ReadStats(source="y").summary() == "y: 0 rows, 0 jobs, 0 skipped, 0 bad"


def test_field_parsers_accept_whole_floats_and_iso_times() -> None:
    assert as_int("3.0", "n") == 3
    with pytest.raises(BadField, match="not a whole number"):
        as_int("3.5", "n")
    assert as_time("2020-06-09 18:41:01", "t") - as_time("2020-06-09 18:40:00", "t") == 61
    assert as_time("12.5", "t") == 12.5
    with pytest.raises(BadField, match="not a time"):
        as_time("June", "t")


def test_round_hour_walltime_rounds_the_observed_time_up_then_converts(traces_dir: Path) -> None:
    job = jobs(traces_dir / "60_job.csv")[0]  # 164 s on a P100
    assert job.walltime_s == pytest.approx(3600 * TIRESIAS_GPU.speed)
    assert job.duration_s == pytest.approx(164 * TIRESIAS_GPU.speed)


def test_exact_walltime_equals_the_duration_and_none_gives_no_estimate(traces_dir: Path) -> None:
    exact = jobs(traces_dir / "60_job.csv", walltime="exact")
    assert all(j.walltime_s == j.duration_s for j in exact)
    assert all(j.walltime_s is None for j in jobs(traces_dir / "60_job.csv", walltime="none"))


def test_time_scale_and_source_speed_change_the_clock(traces_dir: Path) -> None:
    job = jobs(traces_dir / "60_job.csv", time_scale=0.5, source_speed=1.0)[1]
    assert job.submit_s == 15  # submitted at 30 s
    assert job.duration_s == pytest.approx(147 * 0.5)


def test_limit_stops_reading_after_that_many_jobs(traces_dir: Path) -> None:
    stats = ReadStats(source="t")
    got = list(read_tiresias(traces_dir / "60_job.csv", TraceOptions(limit=5), stats))
    assert [j.id for j in got] == [f"tiresias-{k}" for k in range(5)]
    assert (stats.rows, stats.jobs) == (5, 5)


def test_submit_times_count_from_the_earliest_submit_in_any_order(tmp_path: Path) -> None:
    path = tmp_path / "jobs.csv"
    path.write_text("job_id,num_gpu,submit_time,duration\n1,1,500,60\n2,1,100,60\n3,1,300,60\n")
    assert [j.submit_s for j in jobs(path)] == [400, 0, 200]


def test_teams_and_tiers_are_fixed_by_the_seed(traces_dir: Path) -> None:
    first = [(j.team, j.tier) for j in jobs(traces_dir / "60_job.csv", seed=7)]
    again = [(j.team, j.tier) for j in jobs(traces_dir / "60_job.csv", seed=7)]
    other = [(j.team, j.tier) for j in jobs(traces_dir / "60_job.csv", seed=8)]
    assert first == again != other
    assert {team for team, _ in first} <= set(DEFAULT_TEAMS)


def test_tier_mix_decides_tiers_where_the_trace_has_none(traces_dir: Path) -> None:
    assert {j.tier for j in jobs(traces_dir / "60_job.csv", tier_mix=(1, 0, 0))} == {Tier.CORE}
    mixed = [j.tier for j in jobs(traces_dir / "60_job.csv")]
    assert set(mixed) == {Tier.CORE, Tier.BUSINESS, Tier.EXPLORATORY}


def test_custom_teams_and_a_named_field_with_a_tier_map(traces_dir: Path) -> None:
    got = jobs(
        traces_dir / "60_job.csv",
        teams=("red", "blue"),
        tier_field="model_name",
        tier_map={"vgg19": 1, "alexnet": 2},
    )
    assert {j.team for j in got} == {"red", "blue"}
    by_model = {j.id: j.tier for j in got}
    assert by_model["tiresias-0"] == Tier.CORE  # vgg19
    assert by_model["tiresias-15"] == Tier.BUSINESS  # alexnet


@pytest.mark.parametrize(
    "options, message",
    [
        ({"tier_field": "model_name"}, "tier_field 'model_name' needs a tier_map"),
        ({"tier_map": {"vgg19": 1}}, "a tier_map needs a tier_field .* 'auto'"),
        ({"tier_field": "mix", "tier_map": {"vgg19": 1}}, "a tier_map needs a tier_field"),
    ],
)
def test_a_tier_field_without_its_map_or_a_map_without_a_field_is_refused(
    traces_dir: Path, options: dict, message: str
) -> None:
    """Either way every job would silently be drawn from the mix."""
    with pytest.raises(InvalidInput, match=message):
        read_tiresias(traces_dir / "60_job.csv", TraceOptions(**options))


def test_the_read_counts_where_each_tier_came_from(traces_dir: Path) -> None:
    stats = ReadStats(source="60_job.csv")
    options = TraceOptions(tier_field="model_name", tier_map={"vgg19": 1, "nope": 2})
    assert len(list(read_tiresias(traces_dir / "60_job.csv", options, stats))) == 60
    assert stats.tiers == {"by model_name": 6, "drawn": 54}
    assert stats.summary().endswith("0 bad; tiers 6 by model_name, 54 drawn")


def test_describe_says_how_jobs_got_tiers_teams_and_estimates() -> None:
    assert TraceOptions().describe() == (
        "tiers by the format's tier field, else drawn 15% / 35% / 50% (tiers 1 / 2 / 3); "
        "teams the format's team field, else hashed; walltime estimates round-hour"
    )
    custom = TraceOptions(tier_field="qos", tier_map={"LS": 1}, team_field="hash", walltime="none")
    assert custom.describe() == (
        "tiers by qos (LS=1), else drawn 15% / 35% / 50% (tiers 1 / 2 / 3); teams hashed; "
        "walltime estimates none"
    )
    all_tier_3 = TraceOptions(tier_field="mix", tier_mix=(0, 0, 1))
    assert all_tier_3.describe().startswith("tiers drawn 0% / 0% / 100% (tiers 1 / 2 / 3); ")


def test_a_team_field_the_format_lacks_is_refused_before_reading(traces_dir: Path) -> None:
    with pytest.raises(InvalidInput, match="'vc' is not a field"):
        read_tiresias(traces_dir / "60_job.csv", TraceOptions(team_field="vc"))


def test_a_duplicate_job_id_is_a_bad_row(tmp_path: Path) -> None:
    path = tmp_path / "jobs.csv"
    path.write_text("job_id,num_gpu,submit_time,duration\n1,1,0,60\n1,2,5,60\n")
    stats = ReadStats(source="t")
    assert len(list(read_tiresias(path, None, stats))) == 1
    assert stats.bad_rows == {"id": [3]}
