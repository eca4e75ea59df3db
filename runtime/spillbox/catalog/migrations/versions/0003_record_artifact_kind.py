"""Each artifact's shape kind as the profile found it, so that a reader pages it by its
shape rather than by guessing from its file extension (older rows: NULL)."""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0003"
down_revision = "0002"


def upgrade() -> None:
    op.add_column("artifacts", sa.Column("kind", sa.Text()))
