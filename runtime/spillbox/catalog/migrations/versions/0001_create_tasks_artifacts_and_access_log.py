"""Tasks, artifacts (rows stay as tombstones), and the access log.

The tables as spillbox's first SQLite catalog made them: timestamps are REAL in SQLite (as
they were) and double precision in Postgres (its REAL has 24 bits: whole minutes lost).
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0001"
down_revision = None

TIMESTAMP: sa.types.TypeEngine[float] = sa.Double().with_variant(sa.REAL(), "sqlite")
LOG_ID = sa.BigInteger().with_variant(sa.Integer(), "sqlite")


def upgrade() -> None:
    op.create_table(
        "tasks",
        sa.Column("task_id", sa.Text(), primary_key=True),
        sa.Column("created_at", TIMESTAMP, nullable=False),
        sa.Column("closed_at", TIMESTAMP),
        sa.Column("delete_after", TIMESTAMP),
        sa.Column("retention", sa.Text(), nullable=False),
        sa.Column("state", sa.Text(), nullable=False, server_default="open"),
        sa.Column("deleted_at", TIMESTAMP),
        sa.Column("deleted_by", sa.Text()),
        sa.CheckConstraint("state IN ('open', 'closed', 'deleted')", name="task_state"),
    )
    op.create_table(
        "artifacts",
        sa.Column("task_id", sa.Text(), sa.ForeignKey("tasks.task_id"), nullable=False),
        sa.Column("artifact_id", sa.Text(), nullable=False),
        sa.Column("call_id", sa.Text(), nullable=False),
        sa.Column("tool", sa.Text(), nullable=False),
        sa.Column("name", sa.Text(), nullable=False),
        sa.Column("path", sa.Text(), nullable=False),
        sa.Column("bytes", sa.Integer(), nullable=False),
        sa.Column("tokens", sa.Integer()),
        sa.Column("tokens_exact", sa.Integer()),
        sa.Column("sha256", sa.Text(), nullable=False),
        sa.Column("created_at", TIMESTAMP, nullable=False),
        sa.Column("last_access_at", TIMESTAMP, nullable=False),
        sa.Column("expires_at", TIMESTAMP),
        sa.Column("state", sa.Text(), nullable=False, server_default="live"),
        sa.Column("pinned", sa.Integer(), nullable=False, server_default=sa.text("0")),
        sa.Column("redactions", sa.Integer(), nullable=False, server_default=sa.text("0")),
        sa.Column("deleted_at", TIMESTAMP),
        sa.Column("deleted_by", sa.Text()),
        sa.PrimaryKeyConstraint("task_id", "artifact_id"),
        sa.CheckConstraint("state IN ('live', 'deleted')", name="artifact_state"),
    )
    op.create_index("artifacts_by_expiry", "artifacts", ["state", "expires_at"])
    op.create_index("artifacts_by_call", "artifacts", ["task_id", "call_id"])
    op.create_table(
        "access_log",
        sa.Column("id", LOG_ID, primary_key=True, autoincrement=True),
        sa.Column("task_id", sa.Text(), nullable=False),
        sa.Column("artifact_id", sa.Text()),
        sa.Column("action", sa.Text(), nullable=False),
        sa.Column("at", TIMESTAMP, nullable=False),
        sa.Column("actor", sa.Text(), nullable=False),
        sa.Column("detail", sa.Text(), nullable=False, server_default=""),
        sqlite_autoincrement=True,
    )
    op.create_index("access_log_by_task", "access_log", ["task_id", "id"])
