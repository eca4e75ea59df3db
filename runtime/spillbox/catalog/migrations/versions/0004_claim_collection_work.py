"""Who is collecting an expired artifact or a task past its keep period, and until when:
several hosts share one catalog, and each deletion is claimed by one collector (a lease,
so a collector that dies lets go when it runs out)."""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0004"
down_revision = "0003"

TIMESTAMP: sa.types.TypeEngine[float] = sa.Double().with_variant(sa.REAL(), "sqlite")


def upgrade() -> None:
    for table in ("tasks", "artifacts"):
        op.add_column(table, sa.Column("claimed_by", sa.Text()))
        op.add_column(table, sa.Column("claimed_until", TIMESTAMP))
