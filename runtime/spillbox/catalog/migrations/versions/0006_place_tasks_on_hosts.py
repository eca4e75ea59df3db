"""Which spillbox host (a node of a Ray cluster) keeps each task, and which hosts there are:
a task's payloads and sandbox live on one host, and any harness process finds that host
here. A host that starts again gets a new epoch; what the old epoch kept is lost: its
tasks and artifacts become tombstones deleted by "host lost" (catalog.placements)."""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0006"
down_revision = "0005"

TIMESTAMP: sa.types.TypeEngine[float] = sa.Double().with_variant(sa.REAL(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "hosts",
        sa.Column("name", sa.Text(), primary_key=True),
        sa.Column("epoch", sa.Text(), nullable=False),
        sa.Column("node_id", sa.Text(), nullable=False),
        sa.Column("cap", sa.Integer(), nullable=False),
        sa.Column("state", sa.Text(), nullable=False, server_default="up"),
        sa.Column("started_at", TIMESTAMP, nullable=False),
        sa.Column("lost_at", TIMESTAMP),
    )
    op.create_table(
        "placements",
        sa.Column("task_id", sa.Text(), primary_key=True),
        sa.Column("host", sa.Text(), nullable=False),
        sa.Column("epoch", sa.Text(), nullable=False),
        sa.Column("state", sa.Text(), nullable=False, server_default="placed"),
        sa.Column("placed_at", TIMESTAMP, nullable=False),
    )
    op.create_index("placements_by_host", "placements", ["host", "epoch", "state"])
