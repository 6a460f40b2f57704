import json
from pathlib import Path

import pytest
import typer
from typer.testing import CliRunner

import gpu_arbiter
from gpu_arbiter.cli import bill, tco
from gpu_arbiter.domain import InvalidInput, JobSpec, Tier
from gpu_arbiter.economy import Budgets, ChargeModel, Ledger

EXAMPLE = Path(gpu_arbiter.__file__).parent / "examples" / "tco-h100-1024.yaml"
runner = CliRunner()


def _app() -> typer.Typer:
    app = typer.Typer()
    tco.register(app)
    bill.register(app)
    return app


@pytest.fixture
def results_dir(tmp_path: Path) -> Path:
    ledger = Ledger()
    Budgets(ledger, {"vision": 500.0}).open_period(0.0)
    ChargeModel().charge_segment(
        ledger,
        JobSpec(id="v1", team="vision", tier=Tier.CORE, gpus=8),
        gpu_type="H100",
        tier=Tier.CORE,
        gpus=8,
        start=0,
        end=3600,
        preemptible=False,
    )
    ledger.to_jsonl(tmp_path / "ledger.jsonl")
    return tmp_path


def test_tco_prints_a_table_with_every_option():
    result = runner.invoke(_app(), ["tco", "--config", str(EXAMPLE)], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    for name in ("build", "rent on-demand", "rent committed 1y", "rent committed 3y"):
        assert name in result.output
    assert "Recommended" in result.output


def test_tco_json_is_machine_readable():
    result = runner.invoke(_app(), ["tco", "--config", str(EXAMPLE), "--json"])
    assert result.exit_code == 0, result.output
    data = json.loads(result.output)
    assert data["gpus"] == 1024 and data["recommended"]


def test_tco_with_a_bad_config_raises_invalid_input_naming_the_field(tmp_path):
    bad = tmp_path / "tco.yaml"
    bad.write_text(EXAMPLE.read_text().replace("gpus: 1024", "gpus: -1"))
    result = runner.invoke(_app(), ["tco", "--config", str(bad)])
    assert isinstance(result.exception, InvalidInput)
    assert "gpus: Input should be greater than 0" in str(result.exception)


def test_bill_prints_per_team_bills_from_a_run_directory(results_dir):
    result = runner.invoke(_app(), ["bill", "--from-sim", str(results_dir)], env={"COLUMNS": "200"})
    assert result.exit_code == 0, result.output
    assert "vision" in result.output and "28.0" in result.output


def test_bill_json_uses_usage_file_for_useful_gpu_hours(results_dir):
    (results_dir / "usage.json").write_text(json.dumps({"useful_gpu_seconds": {"vision": 14400}}))
    result = runner.invoke(_app(), ["bill", "--from-sim", str(results_dir), "--json"])
    assert result.exit_code == 0, result.output
    [vision] = json.loads(result.output)
    assert vision["useful_gpu_hours"] == 4.0
    assert vision["credits_per_useful_gpu_hour"] == pytest.approx(7.0)
    assert vision["remaining_credits"] == pytest.approx(472.0)


def test_bill_money_follows_a_given_price_table(results_dir, tmp_path):
    prices = tmp_path / "prices.yaml"
    prices.write_text("credit_value: 0.5\ncurrency: EUR\n")
    result = runner.invoke(
        _app(), ["bill", "--from-sim", str(results_dir), "--prices", str(prices), "--json"]
    )
    [vision] = json.loads(result.output)
    assert (vision["money_spent"], vision["currency"]) == (pytest.approx(14.0), "EUR")


@pytest.mark.parametrize(
    ("usage", "message"),
    [
        ("{", "not readable JSON"),
        ('{"useful": {}}', "useful_gpu_seconds must be a mapping"),
        ('{"useful_gpu_seconds": {"vision": -1}}', "useful_gpu_seconds.vision must be >= 0"),
        ('{"useful_gpu_seconds": {"vision": "x"}}', "useful_gpu_seconds.vision must be a number"),
    ],
)
def test_bill_refuses_a_bad_usage_file(results_dir, usage, message):
    (results_dir / "usage.json").write_text(usage)
    result = runner.invoke(_app(), ["bill", "--from-sim", str(results_dir)])
    assert isinstance(result.exception, InvalidInput)
    assert message in str(result.exception)


def test_bill_without_a_ledger_raises_invalid_input(tmp_path):
    result = runner.invoke(_app(), ["bill", "--from-sim", str(tmp_path)])
    assert isinstance(result.exception, InvalidInput)
    assert "ledger.jsonl not found" in str(result.exception)
