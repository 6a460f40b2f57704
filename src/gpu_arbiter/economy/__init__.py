"""Economy (E1-E7): prices, budgets, an append-only balanced ledger, chargeback and TCO.

Pure: nothing here reads a clock; only the explicit load/save functions touch files
(`PriceTable.from_yaml`, `TcoConfig.from_yaml`, `Ledger.to_jsonl` / `Ledger.from_jsonl`).
Imports only `gpu_arbiter.domain` and third-party libraries.
"""

from gpu_arbiter.economy.budget import DEFAULT_PERIOD_S, BudgetPolicy, Budgets
from gpu_arbiter.economy.chargeback import (
    ENDED_EARLIER,
    FAILURE_ABSORBED,
    LOST_WORK,
    RERUN,
    RUN,
    ChargeModel,
    is_preemptible,
)
from gpu_arbiter.economy.ledger import (
    CHARGE,
    GRANT,
    REFUND,
    REVENUE,
    Entry,
    Ledger,
    LedgerError,
    Posting,
    grants_account,
    team_account,
)
from gpu_arbiter.economy.prices import PriceTable
from gpu_arbiter.economy.report import TeamBill, render_bills, team_bills
from gpu_arbiter.economy.tco import TcoConfig, TcoOption, TcoResult, evaluate, render_tco

__all__ = [
    "CHARGE",
    "DEFAULT_PERIOD_S",
    "ENDED_EARLIER",
    "FAILURE_ABSORBED",
    "GRANT",
    "LOST_WORK",
    "REFUND",
    "RERUN",
    "REVENUE",
    "RUN",
    "BudgetPolicy",
    "Budgets",
    "ChargeModel",
    "Entry",
    "Ledger",
    "LedgerError",
    "Posting",
    "PriceTable",
    "TcoConfig",
    "TcoOption",
    "TcoResult",
    "TeamBill",
    "evaluate",
    "grants_account",
    "is_preemptible",
    "render_bills",
    "render_tco",
    "team_account",
    "team_bills",
]
