"""ledger.job_id and ledger.at are indexed: a restart sums the ledger instead of reading it
(control/books.py), and reads only the charges of running jobs (by job_id) and the current
budget period's entries (by at), so neither costs a scan of the whole history. Every row is
kept as it is: entries already written stay valid (one charge per minute of a run before this
release, one per run segment after it).

Revision ID: 0004
Revises: 0003
"""

from alembic import op

revision = "0004"
down_revision = "0003"
branch_labels = None
depends_on = None


def upgrade() -> None:
    op.create_index("ix_ledger_job_id", "ledger", ["job_id"])
    op.create_index("ix_ledger_at", "ledger", ["at"])


def downgrade() -> None:
    op.drop_index("ix_ledger_at", table_name="ledger")
    op.drop_index("ix_ledger_job_id", table_name="ledger")
