"""The last call number given out per task and tool, so that the MCP proxies and servers
on one task (several processes) name each call once: git_log_1, git_log_2, ... across
all of them (Catalog.next_call_id)."""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0008"
down_revision = "0007"


def upgrade() -> None:
    op.create_table(
        "call_numbers",
        sa.Column("task_id", sa.Text(), primary_key=True),
        sa.Column("tool", sa.Text(), primary_key=True),
        sa.Column("last", sa.Integer(), nullable=False),
    )
