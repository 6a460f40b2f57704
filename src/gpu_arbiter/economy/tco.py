"""E7 capacity and TCO: build a cluster or rent one, in money per GPU-hour and per useful GPU-hour.

Every option is compared on one year of the same demand: `gpus` GPUs of which `utilisation` of
the hours are used and `goodput` of the used hours produce kept progress, so

    useful GPU-hours/year = gpus × 8760 × utilisation × goodput        (the same for all options)
    cost per GPU-hour        = annual cost / GPU-hours paid for (owned or rented)
    cost per useful GPU-hour = annual cost / useful GPU-hours           (the figure to compare)

Build (straight-line depreciation, no resale value, no cost of capital):

    nodes        = ceil(gpus / gpus_per_node)
    compute      = (gpus × gpu_unit_price + nodes × node_base_price) / gpu_depreciation_years
    network      = gpus × network_capex_per_gpu / network_depreciation_years
    node peak kW = (gpus_per_node × gpu_power_w + node_overhead_w) / 1000
    racks        = ceil(nodes / floor(rack_power_kw / node peak kW))   (a node never spans racks)
    power        = IT peak kW × average_load × pue × 8760 h × electricity_price_per_kwh
    facility     = racks × facility_cost_per_rack_year
    ops          = ops_cost_per_year
    lead time    = lead_time_months × opportunity per month, spread over gpu_depreciation_years;
                   opportunity per month is `opportunity_cost_per_month` when set, else the
                   GPU-hours the cluster would have used in a month, rented on demand:
                   gpus × utilisation × 730 h × cloud_on_demand_per_gpu_hour

Rent: on-demand is elastic, so only the used hours are paid (gpus × 8760 × utilisation × price);
committed 1-year and 3-year capacity is paid for every hour (gpus × 8760 × price). Cloud prices
are taken as all-in and available without lead time; the staff that run Arbiter itself are
needed in every option and are left out of all of them.

The recommendation is the option with the lowest cost per useful GPU-hour.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator
from rich.table import Table

from gpu_arbiter.domain.config_files import first_error, read_yaml_mapping

HOURS_PER_YEAR = 8760.0
HOURS_PER_MONTH = HOURS_PER_YEAR / 12

_Pos = Annotated[float, Field(gt=0, allow_inf_nan=False)]
_NonNeg = Annotated[float, Field(ge=0, allow_inf_nan=False)]
_Share = Annotated[float, Field(gt=0, le=1, allow_inf_nan=False)]


class TcoConfig(BaseModel):
    """Inputs of the build-vs-rent model; money in `currency`, power in watts unless named kW."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = "cluster"
    currency: str = "USD"
    # cluster
    gpus: Annotated[int, Field(gt=0)]
    gpu_type: str = "H100"
    gpus_per_node: Annotated[int, Field(gt=0, le=64)] = 8
    # capex
    gpu_unit_price: _Pos
    node_base_price: _NonNeg = 0.0
    network_capex_per_gpu: _NonNeg = 0.0
    gpu_depreciation_years: _Pos = 3.0
    network_depreciation_years: _Pos = 5.0
    # power and facility
    gpu_power_w: _Pos
    node_overhead_w: _NonNeg = 0.0
    average_load: _Share = 0.8
    pue: Annotated[float, Field(ge=1, allow_inf_nan=False)] = 1.3
    electricity_price_per_kwh: _NonNeg
    rack_power_kw: _Pos
    facility_cost_per_rack_year: _NonNeg = 0.0
    ops_cost_per_year: _NonNeg = 0.0
    # demand
    utilisation: _Share = 0.8
    goodput: _Share = 0.9
    # cloud
    cloud_on_demand_per_gpu_hour: _Pos
    cloud_committed_1y_per_gpu_hour: _Pos
    cloud_committed_3y_per_gpu_hour: _Pos
    # procurement
    lead_time_months: _NonNeg = 0.0
    opportunity_cost_per_month: _NonNeg | None = None

    @model_validator(mode="after")
    def _a_node_fits_in_a_rack(self) -> TcoConfig:
        if self.rack_power_kw < self.node_peak_kw:
            raise ValueError(
                f"rack_power_kw ({self.rack_power_kw}) is below the peak of one node "
                f"({self.node_peak_kw:.2f} kW)"
            )
        return self

    @property
    def node_peak_kw(self) -> float:
        return (self.gpus_per_node * self.gpu_power_w + self.node_overhead_w) / 1000

    @classmethod
    def from_dict(cls, data: Any, source: str = "tco config") -> TcoConfig:
        try:
            return cls.model_validate(data)
        except ValidationError as e:
            raise first_error(source, e) from None

    @classmethod
    def from_yaml(cls, path: str | Path) -> TcoConfig:
        return cls.from_dict(read_yaml_mapping(path, "tco config"), source=f"tco config {path}")


@dataclass(frozen=True, slots=True)
class TcoOption:
    """One way to get the capacity: its yearly cost split into named parts."""

    name: str
    breakdown: dict[str, float]
    paid_gpu_hours: float
    useful_gpu_hours: float

    @property
    def annual_cost(self) -> float:
        return math.fsum(self.breakdown.values())

    @property
    def cost_per_gpu_hour(self) -> float:
        return self.annual_cost / self.paid_gpu_hours

    @property
    def cost_per_useful_gpu_hour(self) -> float:
        return self.annual_cost / self.useful_gpu_hours


@dataclass(frozen=True, slots=True)
class TcoResult:
    config: TcoConfig
    nodes: int
    racks: int
    it_peak_kw: float
    options: tuple[TcoOption, ...]

    @property
    def best(self) -> TcoOption:
        return min(self.options, key=lambda o: o.cost_per_useful_gpu_hour)

    @property
    def recommendation(self) -> str:
        ranked = sorted(self.options, key=lambda o: o.cost_per_useful_gpu_hour)
        best, runner_up = ranked[0], ranked[1]
        saving = 1 - best.cost_per_useful_gpu_hour / runner_up.cost_per_useful_gpu_hour
        cur = self.config.currency
        return (
            f"{best.name}: {best.cost_per_useful_gpu_hour:.2f} {cur} per useful GPU-hour, "
            f"{saving:.0%} below {runner_up.name} ({runner_up.cost_per_useful_gpu_hour:.2f})"
        )

    def to_dict(self) -> dict[str, Any]:
        return {
            "name": self.config.name,
            "currency": self.config.currency,
            "gpus": self.config.gpus,
            "gpu_type": self.config.gpu_type,
            "nodes": self.nodes,
            "racks": self.racks,
            "it_peak_kw": self.it_peak_kw,
            "options": [
                {
                    "name": o.name,
                    "annual_cost": o.annual_cost,
                    "breakdown": dict(o.breakdown),
                    "paid_gpu_hours": o.paid_gpu_hours,
                    "useful_gpu_hours": o.useful_gpu_hours,
                    "cost_per_gpu_hour": o.cost_per_gpu_hour,
                    "cost_per_useful_gpu_hour": o.cost_per_useful_gpu_hour,
                }
                for o in self.options
            ],
            "recommended": self.best.name,
            "recommendation": self.recommendation,
        }


def evaluate(cfg: TcoConfig) -> TcoResult:
    """Price every option for one year of `cfg`'s demand (formulas in the module docstring)."""
    hours = cfg.gpus * HOURS_PER_YEAR
    used = hours * cfg.utilisation
    useful = used * cfg.goodput
    nodes = math.ceil(cfg.gpus / cfg.gpus_per_node)
    nodes_per_rack = math.floor(cfg.rack_power_kw / cfg.node_peak_kw)
    racks = math.ceil(nodes / nodes_per_rack)
    it_peak_kw = (cfg.gpus * cfg.gpu_power_w + nodes * cfg.node_overhead_w) / 1000
    if cfg.opportunity_cost_per_month is not None:
        per_month = cfg.opportunity_cost_per_month
    else:
        per_month = used / 12 * cfg.cloud_on_demand_per_gpu_hour
    build = TcoOption(
        name="build",
        breakdown={
            "compute capex": (cfg.gpus * cfg.gpu_unit_price + nodes * cfg.node_base_price)
            / cfg.gpu_depreciation_years,
            "network capex": cfg.gpus * cfg.network_capex_per_gpu / cfg.network_depreciation_years,
            "power": it_peak_kw
            * cfg.average_load
            * cfg.pue
            * HOURS_PER_YEAR
            * cfg.electricity_price_per_kwh,
            "facility": racks * cfg.facility_cost_per_rack_year,
            "ops": cfg.ops_cost_per_year,
            "lead time": cfg.lead_time_months * per_month / cfg.gpu_depreciation_years,
        },
        paid_gpu_hours=hours,
        useful_gpu_hours=useful,
    )
    rent = [
        TcoOption(
            "rent on-demand", {"cloud": used * cfg.cloud_on_demand_per_gpu_hour}, used, useful
        ),
        TcoOption(
            "rent committed 1y",
            {"cloud": hours * cfg.cloud_committed_1y_per_gpu_hour},
            hours,
            useful,
        ),
        TcoOption(
            "rent committed 3y",
            {"cloud": hours * cfg.cloud_committed_3y_per_gpu_hour},
            hours,
            useful,
        ),
    ]
    return TcoResult(
        config=cfg, nodes=nodes, racks=racks, it_peak_kw=it_peak_kw, options=(build, *rent)
    )


def render_tco(result: TcoResult) -> Table:
    cfg = result.config
    cur = cfg.currency
    table = Table(
        title=f"{cfg.name}: {cfg.gpus} × {cfg.gpu_type}, {result.nodes} nodes, "
        f"{result.racks} racks, {result.it_peak_kw:,.0f} kW IT peak",
        caption=f"Recommended: {result.recommendation}",
    )
    table.add_column("option")
    table.add_column(f"annual cost ({cur})", justify="right")
    table.add_column("breakdown")
    table.add_column(f"{cur} / GPU-h", justify="right")
    table.add_column(f"{cur} / useful GPU-h", justify="right")
    for o in result.options:
        table.add_row(
            o.name,
            f"{o.annual_cost:,.0f}",
            "\n".join(f"{k}: {v:,.0f}" for k, v in o.breakdown.items()),
            f"{o.cost_per_gpu_hour:.2f}",
            f"{o.cost_per_useful_gpu_hour:.2f}",
        )
    return table
