"""Drop ix_ledger_team: ix_ledger_sums (0006) begins with `team`, so it answers every query
by team the single-column index did, and each ledger insert kept one index too many.

Revision ID: 0007
Revises: 0006
"""

from alembic import op

revision = "0007"
down_revision = "0006"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.drop_index("ix_ledger_team", table_name="ledger")


def downgrade() -> None:
    op.create_index("ix_ledger_team", "ledger", ["team"])
