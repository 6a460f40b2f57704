"""E2 price table: credits per GPU-hour by GPU type × tier × preemptible, and credits → money.

The scheme is a small matrix times a per-type multiplier, so a price can always be explained
in one sentence ("an H200 at tier 2, not preemptible: 1.2 × 2.8 = 3.36 credits/GPU-h")::

    price(gpu_type, tier, preemptible) = multiplier(gpu_type) × base[preemptible][tier]

`base` is given for the reference GPU (an H100, multiplier 1.0). Defaults, from SPEC E2 (on-demand
3.5, preemptible 0.8):

    tier   on_demand   preemptible
    1      3.50        1.60
    2      2.80        1.20
    3      2.10        0.80

On-demand is 3.5 for tier 1 and ×0.8, ×0.6 of it for tiers 2 and 3; preemptible is 0.8 for tier 3
and ×1.5, ×2 of it for tiers 2 and 1. Validation keeps the two rules of E2 true for any table:
within a column a higher priority (lower tier number) never costs less, and within a row
preemptible never costs more than on-demand. A job is priced as preemptible when its capacity
can be taken back at once: tier 3 always (S1), any tier on borrowed elastic capacity (S2).

Multipliers follow relative rental value, not raw speed (B200 > H200 > H100 > A100 > L40S > V100):
older types are cheaper per unit of work, which rewards jobs that accept them (S7). A type missing
from the table costs `default_multiplier` (1.0: priced as an H100) rather than being refused, so a
new GPU type can be added to a cluster before finance has priced it.

Money (E5 "in credits and in money"): one credit is worth `credit_value` of `currency`.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Annotated, Any

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from gpu_arbiter.domain import InvalidInput, Tier
from gpu_arbiter.domain.config_files import first_error, read_yaml_mapping

DEFAULT_ON_DEMAND: Mapping[int, float] = MappingProxyType({1: 3.5, 2: 2.8, 3: 2.1})
DEFAULT_PREEMPTIBLE: Mapping[int, float] = MappingProxyType({1: 1.6, 2: 1.2, 3: 0.8})
DEFAULT_GPU_MULTIPLIERS: Mapping[str, float] = MappingProxyType(
    {"B200": 1.6, "H200": 1.2, "H100": 1.0, "A100": 0.6, "L40S": 0.45, "V100": 0.25}
)

_Positive = Annotated[float, Field(gt=0, allow_inf_nan=False)]
_TIERS = (int(Tier.CORE), int(Tier.BUSINESS), int(Tier.EXPLORATORY))


class _PriceModel(BaseModel):
    """The YAML/dict form of a price table; every field has the table's default."""

    model_config = ConfigDict(extra="forbid")

    on_demand: dict[int, _Positive] = Field(default_factory=lambda: dict(DEFAULT_ON_DEMAND))
    preemptible: dict[int, _Positive] = Field(default_factory=lambda: dict(DEFAULT_PREEMPTIBLE))
    gpu_multipliers: dict[str, _Positive] = Field(
        default_factory=lambda: dict(DEFAULT_GPU_MULTIPLIERS)
    )
    default_multiplier: _Positive = 1.0
    credit_value: _Positive = 1.0  # a credit worth nothing would make every bill zero
    currency: Annotated[str, Field(pattern=r"^[A-Za-z][A-Za-z0-9 ._-]{0,15}$")] = "USD"

    @field_validator("on_demand", "preemptible")
    @classmethod
    def _one_rate_per_tier_higher_priority_costs_more(
        cls, rates: dict[int, float]
    ) -> dict[int, float]:
        if sorted(rates) != list(_TIERS):
            raise ValueError(f"needs exactly tiers 1, 2 and 3, got {sorted(rates)}")
        if not rates[1] >= rates[2] >= rates[3]:
            raise ValueError("a higher priority must not cost less (need tier 1 >= 2 >= 3)")
        return rates

    @model_validator(mode="after")
    def _preemptible_is_never_dearer(self) -> _PriceModel:
        for tier in _TIERS:
            if self.preemptible[tier] > self.on_demand[tier]:
                raise ValueError(
                    f"preemptible.{tier} ({self.preemptible[tier]}) must not exceed "
                    f"on_demand.{tier} ({self.on_demand[tier]})"
                )
        return self


@dataclass(frozen=True)
class PriceTable:
    """Credits per GPU-hour (E2). Immutable and validated on construction."""

    on_demand: Mapping[int, float] = field(default_factory=lambda: DEFAULT_ON_DEMAND)
    preemptible: Mapping[int, float] = field(default_factory=lambda: DEFAULT_PREEMPTIBLE)
    gpu_multipliers: Mapping[str, float] = field(default_factory=lambda: DEFAULT_GPU_MULTIPLIERS)
    default_multiplier: float = 1.0
    credit_value: float = 1.0
    currency: str = "USD"

    def __post_init__(self) -> None:
        try:
            model = _PriceModel(
                on_demand=dict(self.on_demand),
                preemptible=dict(self.preemptible),
                gpu_multipliers=dict(self.gpu_multipliers),
                default_multiplier=self.default_multiplier,
                credit_value=self.credit_value,
                currency=self.currency,
            )
        except ValidationError as e:
            raise first_error("price table", e) from None
        # Freeze private copies so a caller's dict changing later cannot change prices.
        object.__setattr__(self, "on_demand", MappingProxyType(model.on_demand))
        object.__setattr__(self, "preemptible", MappingProxyType(model.preemptible))
        object.__setattr__(self, "gpu_multipliers", MappingProxyType(model.gpu_multipliers))

    @classmethod
    def from_dict(cls, data: Any, source: str = "price table") -> PriceTable:
        """Build from a mapping (parsed YAML/JSON); unknown or bad fields raise `InvalidInput`."""
        try:
            model = _PriceModel.model_validate(data)
        except ValidationError as e:
            raise first_error(source, e) from None
        return cls(**model.model_dump())

    @classmethod
    def from_yaml(cls, path: str | Path) -> PriceTable:
        return cls.from_dict(read_yaml_mapping(path, "price table"), source=f"price table {path}")

    def multiplier(self, gpu_type: str) -> float:
        return self.gpu_multipliers.get(gpu_type, self.default_multiplier)

    def price(self, gpu_type: str, tier: Tier | int, preemptible: bool) -> float:
        """Credits per GPU-hour for one GPU of `gpu_type` held at `tier`."""
        try:
            base = (self.preemptible if preemptible else self.on_demand)[int(tier)]
        except KeyError:
            raise InvalidInput(f"price: tier must be 1, 2 or 3, got {tier!r}") from None
        return self.multiplier(gpu_type) * base

    def to_money(self, credits: float) -> float:
        """Credits in `currency` (E5)."""
        return credits * self.credit_value
