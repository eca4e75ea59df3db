"""Finding the stored copy of the same bytes without scanning every artifact of a task."""

from __future__ import annotations

from alembic import op

revision = "0002"
down_revision = "0001"


def upgrade() -> None:
    op.create_index("artifacts_by_digest", "artifacts", ["task_id", "sha256"])
