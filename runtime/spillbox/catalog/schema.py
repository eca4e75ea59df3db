"""The catalog's tables as the newest migration leaves them, for building queries.

The migrations (migrations/versions/) are the history that makes a database this shape; a
test compares a migrated SQLite and Postgres database against these tables.
"""

from __future__ import annotations

from dataclasses import fields

from sqlalchemy import (
    REAL,
    BigInteger,
    Column,
    Double,
    ForeignKey,
    Index,
    Integer,
    MetaData,
    Table,
    Text,
    text,
)
from sqlalchemy.types import TypeEngine

from spillbox.types import AccessEntry, ArtifactRow, TaskRow

TIMESTAMP: TypeEngine[float] = Double().with_variant(REAL(), "sqlite")
"""Seconds since the epoch: REAL in SQLite, as the first catalogs had it; double precision
in Postgres."""

metadata = MetaData()

tasks = Table(
    "tasks",
    metadata,
    Column("task_id", Text, primary_key=True),
    Column("created_at", TIMESTAMP, nullable=False),
    Column("closed_at", TIMESTAMP),
    Column("delete_after", TIMESTAMP),
    Column("retention", Text, nullable=False),
    Column("state", Text, nullable=False, server_default="open"),
    Column("deleted_at", TIMESTAMP),
    Column("deleted_by", Text),
    Column("claimed_by", Text),
    Column("claimed_until", TIMESTAMP),
)

artifacts = Table(
    "artifacts",
    metadata,
    Column("task_id", Text, ForeignKey("tasks.task_id"), primary_key=True),
    Column("artifact_id", Text, primary_key=True),
    Column("call_id", Text, nullable=False),
    Column("tool", Text, nullable=False),
    Column("name", Text, nullable=False),
    Column("path", Text, nullable=False),
    Column("bytes", Integer, nullable=False),
    Column("tokens", Integer),
    Column("tokens_exact", Integer),
    Column("sha256", Text, nullable=False),
    Column("created_at", TIMESTAMP, nullable=False),
    Column("last_access_at", TIMESTAMP, nullable=False),
    Column("expires_at", TIMESTAMP),
    Column("state", Text, nullable=False, server_default="live"),
    Column("pinned", Integer, nullable=False, server_default=text("0")),
    Column("redactions", Integer, nullable=False, server_default=text("0")),
    Column("deleted_at", TIMESTAMP),
    Column("deleted_by", Text),
    Column("kind", Text),
    Column("origin", Text, nullable=False, server_default="call"),
    Column("claimed_by", Text),
    Column("claimed_until", TIMESTAMP),
    Index("artifacts_by_expiry", "state", "expires_at"),
    Index("artifacts_by_call", "task_id", "call_id"),
    Index("artifacts_by_digest", "task_id", "sha256"),
)

access_log = Table(
    "access_log",
    metadata,
    Column(
        "id", BigInteger().with_variant(Integer(), "sqlite"), primary_key=True, autoincrement=True
    ),
    Column("task_id", Text, nullable=False),
    Column("artifact_id", Text),
    Column("action", Text, nullable=False),
    Column("at", TIMESTAMP, nullable=False),
    Column("actor", Text, nullable=False),
    Column("detail", Text, nullable=False, server_default=""),
    Index("access_log_by_task", "task_id", "id"),
    sqlite_autoincrement=True,
)

hosts = Table(
    "hosts",
    metadata,
    Column("name", Text, primary_key=True),
    Column("epoch", Text, nullable=False),
    Column("node_id", Text, nullable=False),
    Column("cap", Integer, nullable=False),
    Column("state", Text, nullable=False, server_default="up"),
    Column("started_at", TIMESTAMP, nullable=False),
    Column("lost_at", TIMESTAMP),
)

placements = Table(
    "placements",
    metadata,
    Column("task_id", Text, primary_key=True),
    Column("host", Text, nullable=False),
    Column("epoch", Text, nullable=False),
    # placed; lost (its host's epoch ended); swept (the host, back, removed what it left)
    Column("state", Text, nullable=False, server_default="placed"),
    Column("placed_at", TIMESTAMP, nullable=False),
    Index("placements_by_host", "host", "epoch", "state"),
)

call_numbers = Table(
    "call_numbers",
    metadata,
    Column("task_id", Text, primary_key=True),
    Column("tool", Text, primary_key=True),
    Column("last", Integer, nullable=False),
)

TASK_COLUMNS = tuple(tasks.c[f.name] for f in fields(TaskRow))
ARTIFACT_COLUMNS = tuple(artifacts.c[f.name] for f in fields(ArtifactRow))
ACCESS_COLUMNS = tuple(access_log.c[f.name] for f in fields(AccessEntry))
"""What a row of each record type is read from (the claim columns are the collector's)."""
