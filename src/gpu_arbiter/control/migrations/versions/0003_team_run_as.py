"""teams.run_as: the unix user the local backend runs the team's jobs as (none for the teams
already there: their jobs run as the server's user, or are refused as root).

Revision ID: 0003
Revises: 0002
"""

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table("teams") as teams:
        teams.add_column(sa.Column("run_as", sa.String(32), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table("teams") as teams:
        teams.drop_column("run_as")
