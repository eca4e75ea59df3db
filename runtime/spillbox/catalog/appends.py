"""The catalog's side of an artifact that grows in place (Task.append: a task's history).

Such an artifact has origin "append" and one row, which each append updates: its size,
sha256 and tokens, conditionally on the size and sha256 the appender read, in the same
transaction as the access log's "append" entry that names the new sha256.

    row = appendable(catalog, "t1", "spillbox:history")     # None: nothing appended yet
    grow(catalog, row, replace(row, bytes=..., sha256=...), actor="spillbox_history")
"""

from __future__ import annotations

from spillbox.catalog import Catalog, _artifact, _log
from spillbox.catalog.database import Statement
from spillbox.types import ArtifactRow

_APPENDABLE = Statement("appendable")
_GROW = Statement("grow")


def appendable(catalog: Catalog, task_id: str, call_id: str) -> ArtifactRow | None:
    """The live artifact that Task.append grows under this call id, if there is one."""
    args = {"task_id": task_id, "call_id": call_id}
    rows = catalog.db.rows("finding an appendable artifact", _APPENDABLE, args)
    return _artifact(rows[0]) if rows else None


def grow(
    catalog: Catalog, was: ArtifactRow, now: ArtifactRow, actor: str, redacted: str | None = None
) -> bool:
    """Record that an appendable artifact grew from `was` to `now` (its size, sha256,
    tokens, redactions and expiry), and log the append with the new sha256 (and, as
    add_artifact does, what redaction replaced in the new bytes), in one transaction.

    False, writing nothing, unless the row is still live with was's size and sha256:
    deleted meanwhile, or grown by an appender that did not hold the task's append lock."""
    args = {
        "key_task": was.task_id,
        "key_artifact": was.artifact_id,
        "was_bytes": was.bytes,
        "was_sha256": was.sha256,
        "now_bytes": now.bytes,
        "now_sha256": now.sha256,
        "now_tokens": now.tokens,
        "now_exact": None if now.tokens_exact is None else int(now.tokens_exact),
        "now_redactions": now.redactions,
        "at": now.last_access_at,
        "expires_at": now.expires_at,
    }
    detail = f"{now.bytes - was.bytes} bytes appended at byte {was.bytes}; sha256 {now.sha256}"
    with catalog.db.transaction("appending to an artifact") as tx:
        if not tx.execute(_GROW, args):
            return False
        _log(tx, was.task_id, was.artifact_id, "append", actor, detail)
        if redacted is not None:
            _log(tx, was.task_id, was.artifact_id, "redact", "retention", redacted)
    return True
