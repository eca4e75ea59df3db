"""The offload path: one result in, its stored payload and its notice out.

    redact -> profile -> stage -> de-duplicate -> publish (quota, link, catalog row) -> notice

`offload(destination, request)` is what the gate calls (as gate.admit's `offload`) for
each result it moves out of context. Everything it works with comes in as a Destination,
so the path reads, and is tested, without a harness:

    destination = Destination(task_id="t1", storage=..., catalog=..., ...)
    artifact, notice, notice_tokens = offload(destination, request)

`append(destination, request)` is the same path for an artifact that grows (a task's
history): redact -> append the new bytes in place (quota, file, catalog row) -> notice.
"""

from __future__ import annotations

import hashlib
import re
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, replace

from spillbox import metrics
from spillbox.catalog import Catalog, appends
from spillbox.config import Policy
from spillbox.errors import RetentionError, StorageError
from spillbox.gate import Offload
from spillbox.notice import Hint, NoticeFacts, render
from spillbox.profile import profile
from spillbox.redaction import Redaction, redact_payload
from spillbox.retention import Retention, expires_at, quota_evictions
from spillbox.sandbox.storage import Staged, StoredFile, TaskStorage, safe_name
from spillbox.tokens import TokenCounter, total
from spillbox.types import Artifact, ArtifactRow, Origin, Shape, TokenCount, text_of

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


OffloadPath = Callable[[Destination, Offload, Redaction | None], tuple[Artifact, str, int]]
"""offload or append: stores one request, returns (artifact, notice, notice tokens)."""


def offload(
    dest: Destination, request: Offload, redacted: Redaction | None = None
) -> tuple[Artifact, str, int]:
    """Store one result byte for byte (redacted first if the policy says so) and return
    its artifact, its notice and the notice's tokens.

    redacted: what redaction already replaced in this result (Task.admit redacts a step's
    results before the gate); None to redact here, as the policy says.
    """
    request, redaction = _redacted(dest, request, redacted)
    shape = profile(request.data, request.text)
    name = _file_name(request, shape)
    # The host writes the payload into the task's storage, never through the sandbox.
    with dest.storage.stage(request.data, want=name, digest=request.digest) as staged:
        # The same bytes again (a tool repeating itself, a script printing an artifact
        # back) point to the stored copy: no duplicate, no offload-of-the-offload loop.
        same, taken = dest.catalog.identical(dest.task_id, staged.sha256, staged.bytes, name[0])
        if same is not None:
            host_path = dest.storage.offload / same.name
            stored = StoredFile(same.name, host_path, same.sha256, same.bytes)
            # The same call again (a step replayed) gets the same notice as before; a repeat
            # under another call id is told which artifact holds its bytes.
            same_as = None if same.call_id == request.result.call_id else same.artifact_id
            return _stored(dest, request, stored, shape, redaction, 0, same_as=same_as)
        origin: Origin = "file" if request.reason == "output" else "call"
        stored = _publish(dest, staged, request, shape, redaction, origin, name, taken)
    return _stored(dest, request, stored, shape, redaction, stored.bytes)


def append(
    dest: Destination, request: Offload, redacted: Redaction | None = None
) -> tuple[Artifact, str, int]:
    """Append one result's payload to the task's appendable artifact of its call id (a new
    one, origin "append", if it has none live) and return the whole artifact, its notice
    and the notice's tokens.

    Only the new bytes are written: the file grows in place, and its catalog row's size,
    sha256 and tokens follow in one update, logged with the new sha256. Under the task's
    append lock, so that appends from several processes land one after another, none lost.
    """
    request, redaction = _redacted(dest, request, redacted)
    with dest.storage.appending():
        row = appends.appendable(dest.catalog, dest.task_id, request.result.call_id)
        grown = None if row is None else _grow(dest, row, request, redaction)
        if grown is None:  # the first append, or the artifact was deleted meanwhile: a new one
            whole, shape = request, profile(request.data, request.text)
            name = _file_name(request, shape)
            with dest.storage.stage(request.data, want=name) as staged:
                stored = _publish(dest, staged, request, shape, redaction, "append", name)
        else:
            stored, whole = grown
            shape = profile(whole.data, whole.text)
    return _stored(dest, whole, stored, shape, redaction, len(request.data))


def _redacted(
    dest: Destination, request: Offload, redacted: Redaction | None
) -> tuple[Offload, Redaction | None]:
    """The request with its payload redacted, if the policy says so and it was not yet."""
    if redacted is not None or not dest.retention.redact:
        return request, redacted
    # Text or not: a payload that is not UTF-8 or holds a NUL is scanned as its bytes,
    # so neither the store nor the notice's head_hex keeps a secret. Everything after
    # this point (stored bytes, shape, keys, previews, hints, token count) comes from
    # the redacted payload: the notice shows no secret.
    redaction = redact_payload(request.data)
    if redaction.count:
        text = None if request.text is None else text_of(redaction.data)
        tokens = None if text is None else total(dest.counter, text)
        request = replace(request, data=redaction.data, text=text, tokens=tokens)
    return request, redaction


def _grow(
    dest: Destination, row: ArtifactRow, request: Offload, redaction: Redaction | None
) -> tuple[StoredFile, Offload] | None:
    """Append request's bytes to row's payload under the task's append lock: the stored
    file and the request for the whole artifact, or None if the row was deleted meanwhile."""
    old = dest.storage.read(row.name)[: row.bytes]
    if len(old) != row.bytes or hashlib.sha256(old).hexdigest() != row.sha256:
        raise StorageError(
            f"artifact {row.artifact_id} of task {dest.task_id} no longer matches its recorded "
            "size and sha256: nothing was appended; delete it to start it again"
        )
    data = old + request.data
    text = None if request.text is None else text_of(data)
    tokens = request.tokens
    if tokens is not None and row.tokens is not None:
        # Every append ends a line: the encoders' pre-tokenisers split there, so the
        # tokens of the whole are the sum of the parts'.
        tokens = TokenCount(row.tokens + tokens.tokens, bool(row.tokens_exact) and tokens.exact)
    whole = replace(request, data=data, text=text, tokens=tokens)
    now = time.time()
    grown = replace(
        row,
        bytes=len(data),
        sha256=hashlib.sha256(data).hexdigest(),
        tokens=tokens.tokens if tokens else None,
        tokens_exact=tokens.exact if tokens else None,
        last_access_at=now,
        expires_at=expires_at(dest.retention, now),
        redactions=row.redactions + (redaction.count if redaction else 0),
    )
    stored = StoredFile(row.name, dest.storage.offload / row.name, grown.sha256, grown.bytes)
    if not request.data:
        return stored, whole  # nothing new: nothing to write or to log
    with _quota(dest, row.artifact_id, grown.bytes):
        try:
            dest.storage.append(row.name, row.bytes, request.data)
        except StorageError:
            if appends.appendable(dest.catalog, dest.task_id, row.call_id) == row:
                raise
            return None  # deleted meanwhile (retention, a quota): its turns went with it
        redacted = None if redaction is None or not redaction.count else redaction.audit_detail()
        if not appends.grow(dest.catalog, row, grown, row.tool, redacted):
            return None
    return stored, whole


@contextmanager
def _quota(dest: Destination, growing: str | None, size: int) -> Iterator[None]:
    """Room under the task's quota for a payload of `size` bytes, new or (growing: its
    artifact id) an artifact grown to that size: the other artifacts evicted, oldest first.

    Held until the block ends (the task's lock), so that harness processes filling one
    task at once cannot each find room for the same last slot."""
    policy = dest.retention
    if policy.max_bytes is None and policy.max_artifacts is None:
        yield
        return
    with dest.storage.locked():

        def others() -> list[ArtifactRow]:
            return [r for r in dest.catalog.artifacts(dest.task_id) if r.artifact_id != growing]

        usage = dest.catalog.usage(dest.task_id, other_than=growing)
        try:
            evictions = quota_evictions(policy, dest.task_id, usage, others, size)
        except RetentionError:
            metrics.quota_refused()
            raise
        for evicted in evictions:
            dest.evict(evicted)
        yield


def _stored(
    dest: Destination,
    request: Offload,
    stored: StoredFile,
    shape: Shape,
    redaction: Redaction | None,
    added: int,
    same_as: str | None = None,
) -> tuple[Artifact, str, int]:
    """The stored payload as an artifact, its notice and the notice's tokens; `added`: the
    bytes this offload stored; same_as: the earlier artifact that holds these very bytes
    (the result is not stored again, and has no artifact of its own)."""
    result = request.result
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
    redactions = redaction.count if redaction else 0
    notice, notice_tokens = _notice(dest, request, artifact, redactions, same_as)
    kept_out = request.tokens.tokens - notice_tokens if request.tokens else 0
    metrics.offloaded(request.reason, added, kept_out)
    return artifact, notice, notice_tokens


def _publish(
    dest: Destination,
    staged: Staged,
    request: Offload,
    shape: Shape,
    redaction: Redaction | None,
    origin: Origin,
    name: tuple[str, str],
    stem_taken: bool | None = None,
) -> StoredFile:
    """Make room under the quota, make the payload visible (as name's stem and extension,
    or the first free stem after it) and record it as from origin. stem_taken: whether
    the catalog had the stem's id already, if it was asked (Catalog.identical)."""

    stem, extension = name

    def taken(artifact_id: str) -> bool:
        if artifact_id == stem and stem_taken is not None:
            return stem_taken
        return dest.catalog.id_taken(dest.task_id, artifact_id)

    with _quota(dest, None, staged.bytes):
        refused: set[str] = set()
        while True:
            # An id the catalog knows, a tombstone's too, is never given again; one that
            # another process recorded after our check is refused by the insert: try on.
            stored = staged.publish(stem, extension, reserved=lambda s: s in refused or taken(s))
            try:
                if _record(dest, request, stored, shape, redaction, origin):
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
    origin: Origin,
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
        origin=origin,
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
    redactions: int,
    same_as: str | None,
) -> tuple[str, int]:
    policy, data, text = dest.policy, request.data, request.text or ""
    span = 2 * policy.preview_chars
    facts = NoticeFacts(
        reason=request.reason,
        tool=artifact.tool,
        call_id=artifact.call_id,
        same_as=same_as,
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
