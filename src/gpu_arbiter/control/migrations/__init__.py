"""Alembic revisions of the control plane's schema, applied by `control.schema.migrate`."""
