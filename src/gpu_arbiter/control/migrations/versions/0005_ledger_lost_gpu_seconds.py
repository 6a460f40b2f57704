"""ledger.lost_gpu_seconds: the GPU-seconds each entry says a failure lost, so a restart sums
the lost GPU-hours in a column instead of reading every entry's JSON (control/books.py).
Entries already written get theirs from their JSON: a "lost-work" or "rerun" charge its
GPU-seconds; a "failure-absorbed" refund that names seconds [start, end) the GPUs of the charge
it refunds times those seconds (what the service counted for them as it ran); any other 0.

Revision ID: 0005
Revises: 0004
"""

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"
branch_labels = None
depends_on = None

# The ledger as this revision knows it (not the models, which move on).
ledger = sa.table(
    "ledger",
    sa.column("seq", sa.Integer),
    sa.column("kind", sa.String),
    sa.column("lost_gpu_seconds", sa.Float),
    sa.column("entry", sa.JSON),
)


def upgrade() -> None:
    op.add_column(
        "ledger", sa.Column("lost_gpu_seconds", sa.Float(), nullable=False, server_default="0")
    )
    entry = ledger.c.entry
    op.execute(
        sa.update(ledger)
        .where(
            ledger.c.kind == "charge",
            entry["reason"].as_string().in_(("lost-work", "rerun")),
        )
        .values(lost_gpu_seconds=sa.func.coalesce(entry["gpu_seconds"].as_float(), 0.0))
    )
    charge = ledger.alias("charge")
    gpus = (
        sa.select(charge.c.entry["gpus"].as_float())
        .where(charge.c.seq == entry["refund_of"].as_integer())
        .scalar_subquery()
    )
    op.execute(
        sa.update(ledger)
        .where(
            ledger.c.kind == "refund",
            entry["reason"].as_string() == "failure-absorbed",
            entry["start"].as_float().is_not(None),
        )
        .values(
            lost_gpu_seconds=sa.func.coalesce(
                gpus * (entry["end"].as_float() - entry["start"].as_float()), 0.0
            )
        )
    )


def downgrade() -> None:
    with op.batch_alter_table("ledger") as table:
        table.drop_column("lost_gpu_seconds")
