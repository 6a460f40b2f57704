"""ledger.reason, gpu_type, tier, gpu_seconds and useful_gpu_seconds: what a team's bill sums,
copied out of each entry's JSON, so `GET /v1/bill` has the database sum them per team
(control/bills.py) instead of reading the whole ledger on every request. Entries already
written get theirs from their JSON (a field an entry does not have stays empty). One index
holds every column the bills and the start-up sums read (ix_ledger_sums), so the database
sums it in order instead of reading and sorting rows that hold each entry's JSON.

Revision ID: 0006
Revises: 0005
"""

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"
branch_labels = None
depends_on = None

# The columns the sums read, in the index's order (grouping ones first); as the models had
# them at this revision.
SUMMED = (
    "team",
    "kind",
    "reason",
    "gpu_type",
    "tier",
    "credits",
    "gpu_seconds",
    "useful_gpu_seconds",
    "lost_gpu_seconds",
)
COLUMNS = {
    "reason": sa.Text(),
    "gpu_type": sa.String(32),
    "tier": sa.Integer(),
    "gpu_seconds": sa.Float(),
    "useful_gpu_seconds": sa.Float(),
}

# The ledger as this revision knows it (not the models, which move on).
ledger = sa.table("ledger", sa.column("entry", sa.JSON), *(sa.column(c) for c in COLUMNS))


def upgrade() -> None:
    for name, type_ in COLUMNS.items():
        op.add_column("ledger", sa.Column(name, type_, nullable=True))
    entry = ledger.c.entry
    op.execute(
        sa.update(ledger).values(
            reason=entry["reason"].as_string(),
            gpu_type=entry["gpu_type"].as_string(),
            tier=entry["tier"].as_integer(),
            gpu_seconds=entry["gpu_seconds"].as_float(),
            useful_gpu_seconds=entry["useful_gpu_seconds"].as_float(),
        )
    )
    op.create_index("ix_ledger_sums", "ledger", list(SUMMED))


def downgrade() -> None:
    op.drop_index("ix_ledger_sums", table_name="ledger")
    with op.batch_alter_table("ledger") as table:
        for name in reversed(COLUMNS):
            table.drop_column(name)
