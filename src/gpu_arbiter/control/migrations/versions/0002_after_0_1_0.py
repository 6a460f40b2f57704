"""Everything the schema gained after release 0.1.0.

- teams.breaker_policy (what a tripped circuit breaker does to the team's jobs: stop | flag;
  "stop" for the teams already there, as for new ones) and teams.webhook_url (where the team
  is told; none for the teams already there).
- audit.subject is indexed: a job's page reads its audit rows by it.

Revision ID: 0002
Revises: 0001
"""

import sqlalchemy as sa
from alembic import op

revision = "0002"
down_revision = "0001"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("teams") as teams:
        teams.add_column(
            sa.Column("breaker_policy", sa.String(8), nullable=False, server_default="stop")
        )
        teams.add_column(sa.Column("webhook_url", sa.Text(), nullable=True))
    op.create_index("ix_audit_subject", "audit", ["subject"])


def downgrade() -> None:
    op.drop_index("ix_audit_subject", table_name="audit")
    with op.batch_alter_table("teams") as teams:
        teams.drop_column("webhook_url")
        teams.drop_column("breaker_policy")
