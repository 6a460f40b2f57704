"""Alembic's environment: run the revisions on the connection `control.schema` hands over in
`config.attributes["connection"]`, in its transaction. SQLite gets batch mode, as it alters
a table by copying it."""

from alembic import context

from gpu_arbiter.control.store import Base

connection = context.config.attributes["connection"]
context.configure(
    connection=connection,
    target_metadata=Base.metadata,
    render_as_batch=connection.dialect.name == "sqlite",
)
with context.begin_transaction():
    context.run_migrations()
