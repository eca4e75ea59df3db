"""Bringing a catalog's schema to the newest revision, once, whatever starts at the same time.

The migrations are Alembic revisions (migrations/versions/), one history for SQLite and
Postgres. They run inside one transaction that first takes a lock: Postgres's transaction
advisory lock, SQLite's write lock (BEGIN IMMEDIATE). A second process starting at the same
moment waits for the first, then finds the schema current and runs nothing.

A SQLite catalog from before Alembic recorded its migrations by name (or, earlier, by
number) in schema_migrations; it is adopted in place: stamped at the revision of the same
name, then upgraded like any other. schema_migrations stays, with one more row, so that a
spillbox from before refuses the catalog (a newer schema) rather than writing to it.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
import zlib
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING

from spillbox.catalog.database import Database, begin_write, merge_cache, sql_cache_path
from spillbox.errors import ConfigError, SpillboxError

if TYPE_CHECKING:
    from alembic.config import Config
    from alembic.script import ScriptDirectory
    from sqlalchemy import Connection

# Alembic (about 150 ms to import) and SQLAlchemy (160 ms) are imported only when a schema
# must change: a catalog already at the newest revision is opened with one plain query on
# the driver's connection (upgrade's first step).

MIGRATIONS_DIR = Path(__file__).with_name("migrations")
LOCK_KEY = zlib.crc32(b"spillbox catalog migrations")
"""The Postgres advisory lock that migrations run under (any constant; this one is named)."""
LEGACY_NAMES = (
    "create_tasks_artifacts_and_access_log",
    "index_artifacts_by_digest",
    "record_artifact_kind",
)
"""The migrations spillbox recorded in schema_migrations before Alembic, in order: the
revisions 0001, 0002 and 0003 (versions/0001_create_tasks_artifacts_and_access_log.py...)
do the same."""
MOVED_TO_ALEMBIC = "moved_to_alembic"
CHILD_URL_VARIABLE = "SPILLBOX_MIGRATE_URL"
"""The catalog url a migrating child gets (empty: the SQLite catalog in its home)."""
_PRIMING_TASK = "prime"
_PRIMING_LINES = 2_000
"""A result over the default per-call limit (counted a token per character): priming's
offload."""
CHILD_SECONDS = 600.0
"""How long a migrating child may take (it may wait for another process's migration)."""


@cache
def _config() -> Config:
    from alembic.config import Config

    config = Config()
    config.set_main_option("script_location", str(MIGRATIONS_DIR))
    return config


@cache
def _script() -> ScriptDirectory:
    from alembic.script import ScriptDirectory

    return ScriptDirectory.from_config(_config())


def head() -> str:
    """The newest revision this spillbox knows."""
    found = _script().get_current_head()
    assert found is not None
    return found


def known() -> frozenset[str]:
    return frozenset(script.revision for script in _script().walk_revisions())


def newest_file() -> str:
    """The revision of the newest file in versions/ (NNNN_name.py, numbered in order): the
    head, known without Alembic (test_catalog checks that Alembic agrees)."""
    return max(path.name[:4] for path in (MIGRATIONS_DIR / "versions").glob("[0-9]" * 4 + "_*.py"))


def current(connection: Connection) -> str | None:
    """The database's revision (None: no Alembic history yet)."""
    from alembic.runtime.migration import MigrationContext

    revision: str | None = MigrationContext.configure(connection).get_current_revision()
    return revision


def upgrade(db: Database, apart: tuple[Path, str | None] | None = None) -> bool:
    """Bring the schema to head under the migration lock; True if this call changed it.

    apart: the catalog's home and url, to migrate in a child process first (what a
    long-lived server asks: Alembic, Mako and SQLAlchemy's DDL, about 12 MB once imported,
    would stay in its memory for the rest of its life); what fails there is left to the
    migration here, which then says it in its own words."""
    if _recorded(db) == newest_file():
        return False
    if apart is not None and _upgraded_apart(*apart) and _recorded(db) == newest_file():
        return True
    from sqlalchemy import text

    where, engine = db.where, db.engine
    with engine.connect() as connection:
        found = current(connection)
        connection.rollback()
    if found == head():
        return False
    with engine.connect() as connection:
        with connection.begin():
            begin_write(connection)
            if connection.dialect.name == "postgresql":
                connection.execute(text("SELECT pg_advisory_xact_lock(:key)"), {"key": LOCK_KEY})
            found = current(connection)  # again: whoever held the lock may have migrated
            if found is None:
                found = _adopt_legacy(connection, where)
            if found == head():
                return False
            if found is not None and found not in known():
                raise _newer(where, found)
            from alembic import command

            config = _config()
            config.attributes["connection"] = connection
            try:
                command.upgrade(config, "head")
            finally:
                config.attributes.pop("connection", None)
    return True


def _upgraded_apart(home: Path, url: str | None) -> bool:
    """Whether a child process opened the catalog (migrating it) and exited cleanly. Its
    url goes by the environment, not the command line (which other users can read)."""
    env = {**os.environ, CHILD_URL_VARIABLE: url or ""}
    command = [sys.executable, "-m", "spillbox.catalog.migrate", str(home)]
    try:
        done = subprocess.run(command, env=env, capture_output=True, timeout=CHILD_SECONDS)
    except (OSError, subprocess.TimeoutExpired):
        return False
    return done.returncode == 0


def _recorded(db: Database) -> str | None:
    """The revision alembic_version records, read with plain SQL; None if there is none
    (a new or a pre-Alembic catalog), the table says something else than one revision, or
    it cannot be read (what failed fails again, with its own words, on the way to the
    upgrade)."""
    try:
        rows = db.rows("reading the schema version", "SELECT version_num FROM alembic_version")
    except SpillboxError:  # no such table yet
        return None
    return str(rows[0]["version_num"]) if len(rows) == 1 else None


def _adopt_legacy(connection: Connection, where: str) -> str | None:
    """Stamp a pre-Alembic catalog at the revision its records name; None if it has none."""
    from sqlalchemy import inspect, text

    if not inspect(connection).has_table("schema_migrations"):
        return None
    named = "name" in {c["name"] for c in inspect(connection).get_columns("schema_migrations")}
    rows = connection.execute(
        text(f"SELECT version, {'name' if named else 'NULL'} FROM schema_migrations")
    ).all()
    if not rows:
        return None
    names = []
    for version, name in rows:
        if name is None and 1 <= version <= len(LEGACY_NAMES):
            name = LEGACY_NAMES[version - 1]  # recorded by number, before names
        if name not in LEGACY_NAMES:
            raise _newer(where, str(name or version))
        names.append(name)
    revision = f"{max(LEGACY_NAMES.index(name) for name in names) + 1:04d}"
    from alembic import command

    config = _config()
    config.attributes["connection"] = connection
    try:
        command.stamp(config, revision)
    finally:
        config.attributes.pop("connection", None)
    marker: dict[str, object] = {"version": len(LEGACY_NAMES) + 1, "applied_at": time.time()}
    if named:
        marker["name"] = MOVED_TO_ALEMBIC
    columns = ", ".join(marker)
    values = ", ".join(f":{column}" for column in marker)
    connection.execute(text(f"INSERT INTO schema_migrations ({columns}) VALUES ({values})"), marker)
    return revision


def _newer(where: str, revision: str) -> ConfigError:
    return ConfigError(
        f"the catalog {where} has schema version {revision!r}, newer than this spillbox "
        f"knows ({head()!r}): upgrade spillbox"
    )


def _main(home: str) -> None:
    """A migrating child (see upgrade): open the catalog, which migrates it, and close it;
    then, for a SQLite catalog, compile the statements a session runs (_prime)."""
    from spillbox.catalog import Catalog

    url = os.environ.get(CHILD_URL_VARIABLE) or None
    catalog = Catalog(Path(home), url=url)
    catalog.close()
    if catalog.path is not None:
        try:
            _prime(catalog.path)
        except Exception as e:  # the migration stands; the server compiles as it goes
            print(f"spillbox: the statements were not compiled ahead: {e}", file=sys.stderr)


def _prime(catalog: Path) -> None:
    """Compile the statements a session runs into the SqlCache of the catalog at path, by
    running one (a task, an offload, a collection, a removal) on a scratch home: the
    server that asked for this child then finds them there and, like a CLI command in a
    used home, never imports SQLAlchemy (about 12 MB of its idle memory for good).
    Statements a session reaches otherwise are compiled where they are first run."""
    import tempfile

    from spillbox.harness import Harness  # the one part of spillbox that runs a session
    from spillbox.types import ToolResult

    scratch_home = tempfile.TemporaryDirectory(prefix="spillbox-prime-")
    with (
        scratch_home as scratch,
        Harness(
            sandbox="none", home=Path(scratch), environ={}, gc_interval=-1, counter=_Characters()
        ) as harness,
    ):
        with harness.task(_PRIMING_TASK) as task:
            call_id = task.next_call_id("tool")
            task.admit([ToolResult(call_id, "tool", "line\n" * _PRIMING_LINES)])
        harness.gc()
        harness.remove(_PRIMING_TASK)
        assert harness.catalog.path is not None
        merge_cache(sql_cache_path(catalog), sql_cache_path(harness.catalog.path))


class _Characters:
    """Priming's token counter, a token per character: what counts change is not which
    statements run, and tiktoken's encoding would take a third of the child's time."""

    name = "characters"
    max_token_chars = 1

    def count(self, text: str) -> int:
        return len(text)


if __name__ == "__main__":
    _main(sys.argv[1])
