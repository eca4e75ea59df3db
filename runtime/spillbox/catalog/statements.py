"""Every statement the catalog runs, in SQLAlchemy Core over the tables of schema.py.

This module is imported only to compile a statement whose SQL is not cached yet
(database.Database.prepare): a process that finds every statement's SQL in its home's cache
never imports SQLAlchemy for a SQLite catalog. Callers name a statement by the name it has
here (database.Statement); a function here is a family of statements, built for the
catalog's dialect and the arguments the Statement carries.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from sqlalchemy import (
    Table,
    Text,
    and_,
    bindparam,
    case,
    func,
    insert,
    literal,
    or_,
    select,
    tuple_,
    union_all,
    update,
)
from sqlalchemy.dialects import sqlite
from sqlalchemy.sql.dml import Insert
from sqlalchemy.sql.elements import BindParameter

from spillbox.catalog.placements import LOST, PLACED, SWEPT
from spillbox.catalog.schema import (
    ACCESS_COLUMNS,
    ARTIFACT_COLUMNS,
    TASK_COLUMNS,
    access_log,
    artifacts,
    call_numbers,
    hosts,
    placements,
    tasks,
)

# Tasks and artifacts (catalog/__init__.py)

_KEY = (artifacts.c.task_id == bindparam("key_task")) & (
    artifacts.c.artifact_id == bindparam("key_artifact")
)
_LIVE = artifacts.c.state == "live"
_ARTIFACT_KEY = ("task_id", "artifact_id")
_REF: BindParameter[str] = bindparam("ref")
select_task = select(*TASK_COLUMNS).where(tasks.c.task_id == bindparam("task_id"))
select_task_for_update = select_task.with_for_update()
reopen_task = (
    update(tasks)
    .where(tasks.c.task_id == bindparam("key_task"))
    .values(state="open", closed_at=None, delete_after=None, retention=bindparam("retention"))
)
close_task = (
    update(tasks)
    .where(tasks.c.task_id == bindparam("key_task"), tasks.c.state != "deleted")
    .values(
        state="closed",
        closed_at=func.coalesce(tasks.c.closed_at, bindparam("at")),
        delete_after=bindparam("delete_after"),
    )
)
task_deleted = (
    update(tasks)
    .where(tasks.c.task_id == bindparam("key_task"))
    .values(state="deleted", deleted_at=bindparam("at"), deleted_by=bindparam("by"))
)
_IDENTICAL = and_(
    artifacts.c.sha256 == bindparam("sha256"),
    artifacts.c.bytes == bindparam("bytes"),
    _LIVE,
    # An appendable artifact's bytes change: another payload never points at them.
    artifacts.c.origin != "append",
)
select_identical = (
    select(*ARTIFACT_COLUMNS, _IDENTICAL.label("identical"))
    .where(
        artifacts.c.task_id == bindparam("task_id"),
        or_(_IDENTICAL, artifacts.c.artifact_id == _REF),
    )
    .order_by(artifacts.c.created_at)
)
"""The live artifacts holding these bytes (flagged identical), and the one of id "ref"
whatever it holds (tombstones too): both questions asked before a payload is stored, in
one round trip."""
insert_log = insert(access_log)
tombstone = (
    update(artifacts)
    .where(_KEY, _LIVE, artifacts.c.pinned == 0)
    .values(state="deleted", deleted_at=bindparam("at"), deleted_by=bindparam("by"))
)
touch = (
    update(artifacts)
    .where(_KEY)
    .values(
        last_access_at=bindparam("at"),
        expires_at=func.coalesce(bindparam("expires_at"), artifacts.c.expires_at),
    )
)
pin = update(artifacts).where(_KEY).values(pinned=bindparam("pinned"))
_LIST_ARTIFACTS = select(*ARTIFACT_COLUMNS).where(artifacts.c.task_id == bindparam("task_id"))
_ARTIFACT_ORDER = (artifacts.c.created_at, artifacts.c.artifact_id)
select_artifact = _LIST_ARTIFACTS.where(artifacts.c.artifact_id == _REF)
"""The task's artifact (or tombstone) of id "ref": whether the id is taken, and by what."""


def usage(dialect: str, other_than: bool) -> Any:
    """How many live artifacts a task has and their bytes; other_than: but the one of id
    "ref" (an artifact growing)."""
    counted = select(func.count(), func.coalesce(func.sum(artifacts.c.bytes), 0)).where(
        artifacts.c.task_id == bindparam("task_id"), _LIVE
    )
    return counted.where(artifacts.c.artifact_id != _REF) if other_than else counted


def list_artifacts(dialect: str, include_deleted: bool, named_in: bool, of_call: bool) -> Any:
    """A task's artifacts, oldest first: the live ones, or tombstones too; named_in: those
    whose id or file name occurs in the text given, found by the database (a task's other
    artifacts never cross to the caller); of_call: those of one call id."""
    listed = _LIST_ARTIFACTS if include_deleted else _LIST_ARTIFACTS.where(_LIVE)
    if named_in:
        text: BindParameter[str] = bindparam("text")
        position = func.instr if dialect == "sqlite" else func.strpos  # 1-based; 0: not there
        named = or_(
            position(text, artifacts.c.artifact_id) > 0, position(text, artifacts.c.name) > 0
        )
        listed = listed.where(named)
    if of_call:
        listed = listed.where(artifacts.c.call_id == bindparam("call_id"))
    return listed.order_by(*_ARTIFACT_ORDER)


_AS_CALL = or_(artifacts.c.origin == "call", artifacts.c.origin == "append") & (
    artifacts.c.call_id == _REF
)
_BY_REF = (
    _AS_CALL,
    artifacts.c.path == _REF,
    artifacts.c.artifact_id == _REF,
    artifacts.c.name == _REF,
    artifacts.c.name == bindparam("base"),
)
"""What a reference can be, in the order Catalog.find tries them."""
find = (
    _LIST_ARTIFACTS.where(or_(*_BY_REF))
    .order_by(
        case(*((match, rule) for rule, match in enumerate(_BY_REF))),  # the first rule it meets
        _LIVE.desc(),
        artifacts.c.created_at.desc(),
    )
    .limit(1)
)
select_log = (
    select(*ACCESS_COLUMNS)
    .where(access_log.c.task_id == bindparam("task_id"))
    .order_by(access_log.c.id)
)


def _on_host(task_id: Any) -> Any:
    """The task is placed on the host named by the "host" parameter (a cluster's)."""
    placed = select(placements.c.task_id).where(
        placements.c.host == bindparam("host"), placements.c.state == PLACED
    )
    return task_id.in_(placed)


def list_tasks(dialect: str, states: tuple[str, ...], on_host: bool) -> Any:
    """The tasks in these states; on_host: those placed on one host only."""
    # state = a OR state = b: plain parameters (IN (...) is expanded when executed, which
    # a statement compiled once for the driver cannot be).
    in_states = or_(*(tasks.c.state == state for state in states))
    where = (in_states, _on_host(tasks.c.task_id)) if on_host else (in_states,)
    return select(*TASK_COLUMNS).where(*where).order_by(tasks.c.task_id)


def upsert_task(dialect: str) -> Insert:
    return _upsert(dialect, tasks, ("task_id",))


def insert_artifact(dialect: str) -> Insert:
    return _insert_new(dialect, artifacts, _ARTIFACT_KEY)


def record_artifact(dialect: str, redacted: bool) -> Insert:
    """Postgres: an artifact's row, unless the task has one of its id, and the log lines of
    its offload (and, if redacted, of its redaction: detail "redacted") as one statement,
    one round trip where a transaction of the same takes four. It returns a row per log
    line written: none if the id was taken. (SQLite has no INSERT inside WITH, and its
    transaction costs no round trips: it runs insert_artifact and insert_log.)"""
    assert dialect == "postgresql", dialect
    returned = ("task_id", "artifact_id", "tool", "call_id", "created_at")
    added = (
        _insert_new(dialect, artifacts, _ARTIFACT_KEY)
        .values({column.name: bindparam(column.name, type_=column.type) for column in artifacts.c})
        .returning(*(artifacts.c[name] for name in returned))
        .cte("added")
    )

    def line(action: str, actor: Any, detail: Any) -> Any:
        values = (added.c.task_id, added.c.artifact_id, literal(action), added.c.created_at)
        return select(*values, actor, detail)

    lines = [line("offload", added.c.tool, added.c.call_id)]
    if redacted:
        lines.append(line("redact", literal("retention"), bindparam("redacted", type_=Text)))
    logged = ("task_id", "artifact_id", "action", "at", "actor", "detail")
    written: Insert = (
        insert(access_log)
        .from_select(logged, union_all(*lines) if redacted else lines[0])
        .returning(access_log.c.id)
    )
    return written


# Call ids (calls.py)

call_id_used = (
    select(artifacts.c.artifact_id)
    .where(artifacts.c.task_id == bindparam("task_id"), _AS_CALL)
    .limit(1)
)


def numbered_call(dialect: str) -> Insert:
    """INSERT a task's first numbers for a tool (1 to :last), or add :last to the last: the
    last number reserved either way (RETURNING, on SQLite as on Postgres)."""
    statement: Any = _insert(dialect, call_numbers)
    numbered: Insert = statement.on_conflict_do_update(
        index_elements=["task_id", "tool"],
        set_={"last": call_numbers.c.last + statement.excluded.last},
    ).returning(call_numbers.c.last)
    return numbered


# An artifact that grows in place (appends.py)

appendable = (
    select(*ARTIFACT_COLUMNS)
    .where(
        artifacts.c.task_id == bindparam("task_id"),
        _LIVE,
        artifacts.c.origin == "append",
        artifacts.c.call_id == bindparam("call_id"),
    )
    .order_by(artifacts.c.created_at.desc())
    .limit(1)
)
grow = (
    update(artifacts)
    .where(
        artifacts.c.task_id == bindparam("key_task"),
        artifacts.c.artifact_id == bindparam("key_artifact"),
        _LIVE,
        artifacts.c.bytes == bindparam("was_bytes"),
        artifacts.c.sha256 == bindparam("was_sha256"),
    )
    .values(
        bytes=bindparam("now_bytes"),
        sha256=bindparam("now_sha256"),
        tokens=bindparam("now_tokens"),
        tokens_exact=bindparam("now_exact"),
        redactions=bindparam("now_redactions"),
        last_access_at=bindparam("at"),
        expires_at=bindparam("expires_at"),
    )
)


# Collection's claims (claims.py)

_EXPIRED = (
    _LIVE,
    artifacts.c.pinned == 0,
    artifacts.c.expires_at.is_not(None),
    artifacts.c.expires_at <= bindparam("now"),
)


def _unclaimed(table: Table) -> Any:
    """A row no collector holds: never claimed, or its claim's lease ran out by "now"."""
    return or_(table.c.claimed_until.is_(None), table.c.claimed_until <= bindparam("now"))


claim_task = (
    update(tasks)
    .where(tasks.c.task_id == bindparam("key_task"), tasks.c.state == "closed", _unclaimed(tasks))
    .values(claimed_by=bindparam("holder"), claimed_until=bindparam("until"))
)
release_task = (
    update(tasks)
    .where(tasks.c.task_id == bindparam("key_task"), tasks.c.claimed_by == bindparam("holder"))
    .values(claimed_by=None, claimed_until=None)
)


def _expired_where(on_host: bool) -> tuple[Any, ...]:
    """Live, unpinned and past expiry (on_host: of the tasks placed on one host only)."""
    return (*_EXPIRED, _on_host(artifacts.c.task_id)) if on_host else _EXPIRED


def expired_rows(dialect: str, on_host: bool) -> Any:
    where = _expired_where(on_host)
    return select(*ARTIFACT_COLUMNS).where(*where).order_by(artifacts.c.expires_at)


def claim_expired(dialect: str, on_host: bool) -> Any:
    """Claim a batch of expired artifacts no other collector holds (on_host: of the tasks
    placed on one host only)."""
    return (
        update(artifacts)
        .where(
            tuple_(artifacts.c.task_id, artifacts.c.artifact_id).in_(
                select(artifacts.c.task_id, artifacts.c.artifact_id)
                .where(*_expired_where(on_host), _unclaimed(artifacts))
                .order_by(artifacts.c.expires_at)
                .limit(bindparam("limit"))
                .with_for_update(skip_locked=True)
            )
        )
        .values(claimed_by=bindparam("holder"), claimed_until=bindparam("until"))
        .returning(*ARTIFACT_COLUMNS)
    )


# Hosts and placements (placements.py)

_OPEN_ON_HOST = (
    select(func.count())
    .select_from(placements.outerjoin(tasks, tasks.c.task_id == placements.c.task_id))
    .where(
        placements.c.host == hosts.c.name,
        placements.c.epoch == hosts.c.epoch,
        placements.c.state == PLACED,
        or_(
            tasks.c.state == "open",
            and_(tasks.c.task_id.is_(None), placements.c.placed_at > bindparam("since")),
        ),
    )
    .scalar_subquery()
)
loads = (
    select(hosts.c.name, hosts.c.epoch, hosts.c.cap, _OPEN_ON_HOST.label("open"))
    .where(hosts.c.state == "up")
    .order_by(_OPEN_ON_HOST, hosts.c.name)
)
load_for_update = (
    select(hosts.c.name, hosts.c.epoch, hosts.c.cap, _OPEN_ON_HOST.label("open"))
    .where(hosts.c.name == bindparam("host"), hosts.c.epoch == bindparam("epoch"))
    .where(hosts.c.state == "up")
    .with_for_update(of=hosts)
)
placement = select(placements).where(placements.c.task_id == bindparam("task_id"))
_ON_EPOCH = and_(placements.c.host == bindparam("host"), placements.c.epoch == bindparam("epoch"))
_ENDED = and_(
    placements.c.host == bindparam("host"),
    placements.c.epoch != bindparam("epoch"),
    placements.c.state == PLACED,
)
ended_lost = update(placements).where(_ENDED).values(state=LOST)
epoch_lost = update(placements).where(_ON_EPOCH, placements.c.state == PLACED).values(state=LOST)
_LOST_TASKS = select(placements.c.task_id).where(placements.c.state == LOST)
host_lost = (
    update(hosts)
    .where(hosts.c.name == bindparam("host"), hosts.c.epoch == bindparam("epoch"))
    .values(state=LOST, lost_at=bindparam("at"))
)
tasks_lost = (
    update(tasks)
    .where(
        tasks.c.task_id.in_(_LOST_TASKS.where(placements.c.host == bindparam("host"))),
        # Plain parameters: IN (...) expands when executed, which a statement compiled once
        # for the driver cannot do.
        or_(tasks.c.state == "open", tasks.c.state == "closed"),
    )
    .values(state="deleted", deleted_at=bindparam("at"), deleted_by=bindparam("lost_by"))
)
artifacts_lost = (
    update(artifacts)
    .where(
        artifacts.c.task_id.in_(_LOST_TASKS.where(placements.c.host == bindparam("host"))),
        artifacts.c.state == "live",
    )
    .values(state="deleted", deleted_at=bindparam("at"), deleted_by=bindparam("lost_by"))
)
to_sweep = _LOST_TASKS.where(placements.c.host == bindparam("host"))
swept = (
    update(placements)
    .where(placements.c.task_id == bindparam("task_id"), placements.c.state == LOST)
    .values(state=SWEPT)
)


def upsert_host(dialect: str) -> Insert:
    return _upsert(dialect, hosts, ("name",))


def place(dialect: str) -> Insert:
    return _insert_new(dialect, placements, ("task_id",))


# INSERT ... ON CONFLICT, in each dialect's words


def _insert(dialect: str, table: Table) -> Insert:
    """The dialect's INSERT, which has ON CONFLICT."""
    if dialect == "sqlite":
        return sqlite.insert(table)
    # Imported for a Postgres catalog only: the dialect (with its asyncpg and asyncio
    # modules) is a third of sqlalchemy's import, which a SQLite catalog need not pay.
    from sqlalchemy.dialects import postgresql

    return postgresql.insert(table)


def _upsert(dialect: str, table: Table, keys: Sequence[str]) -> Insert:
    """INSERT a whole row, or replace every column of the row with these keys."""
    statement: Any = _insert(dialect, table)
    others = {c.name: statement.excluded[c.name] for c in table.columns if c.name not in keys}
    upsert: Insert = statement.on_conflict_do_update(index_elements=list(keys), set_=others)
    return upsert


def _insert_new(dialect: str, table: Table, keys: Sequence[str]) -> Insert:
    """INSERT a whole row, or nothing if a row with these keys exists (0 rows changed)."""
    statement: Any = _insert(dialect, table)
    insert_new: Insert = statement.on_conflict_do_nothing(index_elements=list(keys))
    return insert_new
