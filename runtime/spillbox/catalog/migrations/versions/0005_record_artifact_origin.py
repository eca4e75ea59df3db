"""Where each artifact came from: a tool call's result ("call", its call_id the model's id
for that call) or a file a script left ("file", its call_id the file's name), so that a
model's call id finds the result of its call, never an output file named like it.

Rows from before: the output files were the rows of a script's tool (sandbox_exec.<lang>)
other than its printed output (call id exec-<lang>)."""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = "0005"
down_revision = "0004"


def upgrade() -> None:
    op.add_column(
        "artifacts", sa.Column("origin", sa.Text(), nullable=False, server_default="call")
    )
    op.execute(
        "UPDATE artifacts SET origin = 'file' "
        "WHERE tool LIKE 'sandbox_exec.%' AND call_id NOT LIKE 'exec-%'"
    )
