"""A task's history is appended to in place (origin "append"), one artifact per task: the
history copies recorded before (origin "call", each a whole copy under the call id
spillbox:history) become appendable, so the newest, which holds every turn, is the one
the next append grows. No column changes: origin is text."""

from __future__ import annotations

from alembic import op

revision = "0007"
down_revision = "0006"


def upgrade() -> None:
    op.execute(
        "UPDATE artifacts SET origin = 'append' "
        "WHERE tool = 'spillbox_history' AND call_id = 'spillbox:history' AND origin = 'call'"
    )
