"""One file per schema revision, oldest first (alembic reads them; see `control.schema`)."""
