"""The schema of release 0.1.0 (commit 9b026ee), the last one made without migrations.

A database without alembic's version table but with Arbiter's tables was made by 0.1.0, so it
is stamped with this revision and upgraded from here. Nothing is created: a fresh database is
made whole from today's models and stamped at the head (`control.schema.migrate`).

Revision ID: 0001
Revises: (none)
"""

revision = "0001"
down_revision = None
branch_labels = None
depends_on = None


def upgrade() -> None:
    pass


def downgrade() -> None:
    raise NotImplementedError("0.1.0 is the oldest schema Arbiter knows")
