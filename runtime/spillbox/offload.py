"""The offload path: one result in, its stored payload and its notice out.

    redact -> profile -> stage -> de-duplicate -> publish (quota, link, catalog row) -> notice

`offload(destination, request)` is what the gate calls (as gate.admit's `offload`) for
each result it moves out of context. Everything it works with comes in as a Destination,
so the path reads, and is tested, without a harness:

    destination = Destination(task_id="t1", storage=..., catalog=..., ...)
    artifact, notice, notice_tokens = offload(destination, request)
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass, replace

from spillbox.catalog import Catalog
from spillbox.config import Policy
from spillbox.gate import Offload
from spillbox.notice import Hint, NoticeFacts, render
from spillbox.profile import profile
from spillbox.redaction import Redaction, redact_payload
from spillbox.retention import Retention, expires_at, quota_evictions
from spillbox.sandbox.storage import Staged, StoredFile, TaskStorage, safe_name
from spillbox.tokens import TokenCounter, total
from spillbox.types import Artifact, ArtifactRow, Shape

_EXTENSION = re.compile(r"[A-Za-z0-9]{1,10}")
"""An output file's own extension, kept where it is this plain."""


@dataclass(frozen=True)
class Destination:
    """Where one task's payloads go, and the rules and helpers the path needs there."""

    task_id: str
    storage: TaskStorage
    catalog: Catalog
    policy: Policy
    """The gate's policy: limits the notice states, and the notice's own bounds."""
    retention: Retention
    counter: TokenCounter
    visible_path: Callable[[StoredFile], str]
    """The payload's path as the model and its scripts see it (the sandbox's)."""
    hints: Callable[[Artifact], list[Hint]]
    """Ready-to-run inspections of an artifact, in what the task really offers."""
    evict: Callable[[ArtifactRow], None]
    """Deletes an artifact everywhere (payload, derived copies): what a quota evicts."""


def offload(
    dest: Destination, request: Offload, redacted: Redaction | None = None
) -> tuple[Artifact, str, int]:
    """Store one result byte for byte (redacted first if the policy says so) and return
    its artifact, its notice and the notice's tokens.

    redacted: what redaction already replaced in this result (Task.admit redacts a step's
    results before the gate); None to redact here, as the policy says.
    """
    result, data, text = request.result, request.data, request.text
    redaction = redacted
    if redaction is None and dest.retention.redact:
        # Text or not: a payload that is not UTF-8 or holds a NUL is scanned as its bytes,
        # so neither the store nor the notice's head_hex keeps a secret. Everything after
        # this point (stored bytes, shape, keys, previews, hints, token count) comes from
        # the redacted payload: the notice shows no secret.
        redaction = redact_payload(data)
        if redaction.count:
            data = redaction.data
            if text is not None:
                text = data.decode("utf-8")
                request = replace(request, tokens=total(dest.counter, text))
    redactions = redaction.count if redaction else 0
    shape = profile(data, text)
    # The host writes the payload into the task's storage, never through the sandbox.
    with dest.storage.stage(data) as staged:
        # The same bytes again (a tool repeating itself, a script printing an artifact
        # back) point to the stored copy: no duplicate, no offload-of-the-offload loop.
        same = dest.catalog.identical(dest.task_id, staged.sha256, len(data))
        if same is not None:
            stored = StoredFile(
                same.name, dest.storage.offload / same.name, staged.sha256, len(data)
            )
        else:
            stored = _publish(dest, staged, request, shape, redaction)
    artifact = Artifact(
        id=stored.artifact_id,
        task_id=dest.task_id,
        call_id=result.call_id,
        tool=result.tool,
        name=stored.name,
        path=dest.visible_path(stored),
        host_path=stored.host_path,
        bytes=stored.bytes,
        sha256=stored.sha256,
        shape=shape,
        tokens=request.tokens,
    )
    notice, notice_tokens = _notice(dest, request, artifact, data, text or "", redactions)
    return artifact, notice, notice_tokens


def _publish(
    dest: Destination,
    staged: Staged,
    request: Offload,
    shape: Shape,
    redaction: Redaction | None,
) -> StoredFile:
    """Make room under the quota, make the payload visible and record it.

    With a quota the three hold the task's lock, so that harness processes filling one
    task at once cannot each find room for the same last slot.
    """
    policy = dest.retention
    quota = policy.max_bytes is not None or policy.max_artifacts is not None
    with dest.storage.locked() if quota else nullcontext():
        if quota:
            live = dest.catalog.artifacts(dest.task_id)
            for row in quota_evictions(policy, dest.task_id, live, staged.bytes):
                dest.evict(row)
        stem, extension = _file_name(request, shape)
        refused: set[str] = set()
        while True:
            # An id the catalog knows, a tombstone's too, is never given again; one that
            # another process recorded after our check is refused by the insert: try on.
            stored = staged.publish(
                stem,
                extension,
                reserved=lambda s: s in refused or dest.catalog.id_taken(dest.task_id, s),
            )
            try:
                if _record(dest, request, stored, shape, redaction):
                    return stored
            except BaseException:
                dest.storage.remove(stored.name)  # no payload without its row
                raise
            dest.storage.remove(stored.name)
            refused.add(stored.artifact_id)


def _record(
    dest: Destination,
    request: Offload,
    stored: StoredFile,
    shape: Shape,
    redaction: Redaction | None,
) -> bool:
    """Record the published payload as a new artifact; False if its id was taken."""
    result, tokens = request.result, request.tokens
    now = time.time()
    row = ArtifactRow(
        task_id=dest.task_id,
        artifact_id=stored.artifact_id,
        call_id=result.call_id,
        tool=result.tool,
        name=stored.name,
        path=dest.visible_path(stored),
        bytes=stored.bytes,
        tokens=tokens.tokens if tokens else None,
        tokens_exact=tokens.exact if tokens else None,
        sha256=stored.sha256,
        created_at=now,
        last_access_at=now,
        expires_at=expires_at(dest.retention, now),
        state="live",
        pinned=False,
        redactions=redaction.count if redaction else 0,
        deleted_at=None,
        deleted_by=None,
        kind=shape.kind,
        origin="file" if request.reason == "output" else "call",
    )
    redacted = None if redaction is None else redaction.audit_detail()
    return dest.catalog.add_artifact(row, redacted=redacted)


def _file_name(request: Offload, shape: Shape) -> tuple[str, str]:
    """The stored file's stem and extension: a result's file name keeps its own where they
    are plain (figure-1.png, big.json), else the call id's and the shape's."""
    name = request.result.file_name
    if name is None:
        return safe_name(request.result.call_id), shape.extension
    stem, dot, extension = name.rpartition(".")
    if not (dot and stem and _EXTENSION.fullmatch(extension)):
        stem, extension = name, shape.extension
    return safe_name(stem), extension.lower()


def _notice(
    dest: Destination,
    request: Offload,
    artifact: Artifact,
    data: bytes,
    text: str,
    redactions: int,
) -> tuple[str, int]:
    policy = dest.policy
    span = 2 * policy.preview_chars
    facts = NoticeFacts(
        reason=request.reason,
        tool=artifact.tool,
        call_id=artifact.call_id,
        path=artifact.path,
        size=artifact.bytes,
        tokens=request.tokens,
        sha256=artifact.sha256,
        shape=artifact.shape,
        start=text[:span],
        end=text[-span:],
        length=len(text),
        binary_head=data[:16] if request.text is None else b"",
        hints=dest.hints(artifact),
        per_call_limit=request.per_call.describe(),
        aggregate_limit=policy.aggregate_tokens,
        redactions=redactions if dest.retention.redact else None,
    )
    return render(facts, dest.counter, policy.notice_max_tokens, policy.preview_chars)
