"""Alembic's environment: runs the revisions on the connection spillbox passes in.

spillbox opens the transaction and takes the migration lock itself (spillbox.catalog.
migrate), so the revisions run inside it: nothing here connects or commits.
"""

from __future__ import annotations

from alembic import context

context.configure(connection=context.config.attributes["connection"])
with context.begin_transaction():
    context.run_migrations()
