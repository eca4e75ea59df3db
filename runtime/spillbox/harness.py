"""The harness and its tasks: the API agent code calls.

from spillbox import Harness, ToolResult

harness = Harness(sandbox="none", home=".spillbox")
with harness.task("t1") as task:
    admitted = task.admit([ToolResult(call_id="c1", tool="list_prs", content=payload)])
    print(admitted[0].text)
"""

from __future__ import annotations

import hashlib
import os
import tempfile
import threading
import time
import weakref
from collections.abc import Mapping, Sequence
from contextlib import nullcontext
from dataclasses import replace
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self

from spillbox import codemode, gc
from spillbox.catalog import ArtifactRow, Catalog
from spillbox.config import Policy, SandboxKind, Settings
from spillbox.errors import ConfigError, RetentionError
from spillbox.gate import Offload, admit
from spillbox.notice import NoticeFacts, render
from spillbox.profile import profile
from spillbox.retention import Retention, redact
from spillbox.sandbox import SandboxBackend, make_backend
from spillbox.sandbox.storage import (
    CLOCK_SLACK_SECONDS,
    OpenHold,
    Staged,
    StoredFile,
    TaskStorage,
    safe_name,
    unless_open,
)
from spillbox.tokens import TokenCounter, default_counter, total
from spillbox.tools import tool_hints
from spillbox.types import (
    Admitted,
    Artifact,
    ExecResult,
    Lang,
    Reason,
    Shape,
    TokenCount,
    ToolResult,
)

if TYPE_CHECKING:
    from spillbox.sandbox.docker import SandboxOptions


class _ClosedOnExit:
    """`with x:` closes x at the end of the block."""

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        raise NotImplementedError


class Harness(_ClosedOnExit):
    """Gates tool results into per-task sandboxes, under each task's retention policy.

    >>> harness = Harness(sandbox="none", home="/tmp/spillbox-doc", gc_interval=-1)
    >>> with harness.task("t1") as task:
    ...     task.admit([ToolResult(call_id="c1", tool="echo", content="hi")])[0].offloaded
    False
    """

    def __init__(
        self,
        sandbox: SandboxKind | None = None,
        home: str | Path | None = None,
        policy: Policy | None = None,
        counter: TokenCounter | None = None,
        environ: Mapping[str, str] | None = None,
        options: SandboxOptions | None = None,
        retention: Retention | None = None,
        gc_interval: float | None = None,
    ) -> None:
        settings = Settings.from_env(environ)
        overrides: dict[str, Any] = {
            "sandbox": sandbox,
            "home": None if home is None else Path(home).expanduser(),
            "policy": policy,
            "retention": retention,
            "gc_interval": gc_interval,
        }
        settings = replace(settings, **{k: v for k, v in overrides.items() if v is not None})
        self.settings = settings
        self.policy = settings.policy
        self.counter = counter or default_counter(settings.policy.encoding)
        self.catalog = Catalog(settings.home)
        self.backend: SandboxBackend = make_backend(settings.sandbox, settings.home, options)
        self._holds: dict[str, tuple[OpenHold, int]] = {}
        """The open hold of each task this harness has open, with how many Task objects share it."""
        self._holds_lock = threading.Lock()
        self._stop = threading.Event()
        self._collector: threading.Thread | None = None
        if settings.gc_interval >= 0:
            self._collector = threading.Thread(target=self._collect_periodically, daemon=True)
            self._collector.start()

    def close(self) -> None:
        """Let go of connections, engines, open holds and the collector; tasks and sandboxes
        stay (a task left open stays open in the catalog)."""
        self._stop.set()
        if self._collector is not None:
            self._collector.join()
        with self._holds_lock:
            holds, self._holds = self._holds, {}
        for hold, _ in holds.values():
            hold.release()
        self.backend.close()
        self.catalog.close()

    def task(self, task_id: str, retention: Retention | None = None) -> Task:
        """The task with this id: created on first use, re-attached after a restart.

        retention applies from now on; without it a known task keeps its stored policy
        and a new one gets the harness's default.
        """
        return Task(self, task_id, retention)

    def existing(self, task_id: str) -> Task:
        """A known task, for reading, exporting or pinning: neither reopened nor started."""
        row = self.catalog.task(task_id)
        if row is None or row.state == "deleted":
            raise ConfigError(f"no task {task_id!r}: see `spillbox tasks`")
        return Task(self, task_id, Retention.from_json(row.retention), open_task=False)

    def tasks(self) -> list[str]:
        """Ids of every task that is open or closed but not yet deleted."""
        return [row.task_id for row in self.catalog.tasks()]

    def remove(self, task_id: str, by: str = "manual") -> int:
        """Delete a task: its sandbox, its storage and its unpinned artifacts.

        Pinned artifacts (legal hold) stay with their storage; returns how many did.
        """
        storage = self.backend.storage(task_id)
        held = 0
        for row in self.catalog.artifacts(task_id):
            if row.pinned:
                held += 1
            else:
                self.delete_artifact(row, by)
        if held:
            self.backend.destroy_sandbox(storage)
            self.catalog.close_task(task_id, delete_after=None)
        else:
            self.backend.destroy(storage)
            if self.catalog.task(task_id) is not None:
                self.catalog.mark_task_deleted(task_id, by)
        return held

    def delete_artifact(self, row: ArtifactRow, by: str) -> None:
        """Delete an artifact everywhere: payload, derived copies, then a tombstone row."""
        if row.pinned:
            raise RetentionError(
                f"artifact {row.artifact_id} of task {row.task_id} is pinned (legal hold): "
                f"unpin it first (spillbox unpin {row.task_id} {row.artifact_id})"
            )
        if not self.catalog.tombstone(row.task_id, row.artifact_id, by):
            return  # already deleted by someone else, or pinned in the meantime
        storage = self.backend.storage(row.task_id)
        storage.remove(row.name)
        since = row.created_at - CLOCK_SLACK_SECONDS
        self.backend.forget_derived(storage, row.sha256, row.bytes, since)

    def gc(self, dry_run: bool = False) -> list[gc.Removal]:
        """Remove what retention says must go, and anything orphaned; idempotent."""
        return gc.collect(self, dry_run=dry_run)

    def _hold(self, storage: TaskStorage) -> None:
        """Hold the task open (one shared lock per harness and task, counted)."""
        with self._holds_lock:
            hold, count = self._holds.get(storage.task_id) or (None, 0)
            if hold is None:
                hold = OpenHold(storage, lambda: self.backend.create(storage))
            self._holds[storage.task_id] = (hold, count + 1)

    def _let_go(self, task_id: str) -> None:
        with self._holds_lock:
            hold, count = self._holds.pop(task_id, (None, 0))
            if hold is None:
                return  # the harness was closed: it let go of every hold
            if count > 1:
                self._holds[task_id] = (hold, count - 1)
            else:
                hold.release()

    def _collect_periodically(self) -> None:
        while True:
            try:
                gc.collect(self)
            except Exception:  # noqa: BLE001 - a failed background sweep must not kill the harness
                pass  # the next sweep (or `spillbox gc`) tries again and reports
            if self.settings.gc_interval == 0 or self._stop.wait(self.settings.gc_interval):
                return


class Task(_ClosedOnExit):
    """One task: its storage, its sandbox, its retention policy, and the gate in front."""

    def __init__(
        self,
        harness: Harness,
        task_id: str,
        retention: Retention | None,
        open_task: bool = True,
    ) -> None:
        if not task_id:
            raise ConfigError("a task id must not be empty")
        self.harness = harness
        self.id = task_id
        catalog = harness.catalog
        known = catalog.task(task_id)
        if retention is None:
            stored = known is not None and known.state != "deleted"
            retention = (
                Retention.from_json(known.retention)
                if known and stored
                else harness.settings.retention
            )
        self.retention = retention
        self.storage: TaskStorage = harness.backend.storage(task_id)
        self._lock = threading.Lock()
        self.tools: frozenset[str] = frozenset()
        """spillbox's model-facing tools registered on this task (see tools.Toolset)."""
        self._hold: weakref.finalize[..., Any] | None = None
        """Lets go of this object's share of the task's open hold (when closed or dropped)."""
        if open_task:
            # Held before the catalog says open, so a collector that finds the task closed
            # and no holder cannot remove its sandbox while it is being opened.
            harness._hold(self.storage)
            self._hold = weakref.finalize(self, harness._let_go, task_id)
            catalog.open_task(task_id, retention.to_json())

    def admit(self, results: Sequence[ToolResult]) -> list[Admitted]:
        """Gate one step's results (parallel calls count as one aggregate)."""
        with self._lock:
            decisions = admit(results, self.harness.policy, self.harness.counter, self._offload)
        # Start the sandbox only now, while the model reads this step: a container start
        # competing for the cores would slow this step's offloads several times over.
        self.harness.backend.warm(self.storage)
        return [
            Admitted(
                call_id=d.result.call_id,
                tool=d.result.tool,
                text=d.text,
                offloaded=d.artifact is not None,
                reason=d.reason,
                tokens=d.tokens.tokens if d.tokens else None,
                tokens_exact=d.tokens.exact if d.tokens else None,
                inline_tokens=d.inline_tokens,
                artifact=d.artifact,
                is_error=d.result.is_error,
            )
            for d in decisions
        ]

    def offload(self, result: ToolResult, reason: Reason = "compaction") -> Admitted:
        """Store one result now, whatever its size, and return its notice (compaction)."""
        data, text = result.payload()
        tokens = None if text is None else total(self.harness.counter, text)
        with self._lock:
            artifact, notice, notice_tokens = self._offload(
                Offload(result, data, text, reason, tokens)
            )
        return Admitted(
            call_id=result.call_id,
            tool=result.tool,
            text=notice,
            offloaded=True,
            reason=reason,
            tokens=tokens.tokens if tokens else None,
            tokens_exact=tokens.exact if tokens else None,
            inline_tokens=notice_tokens,
            artifact=artifact,
            is_error=result.is_error,
        )

    def exec(
        self,
        lang: Lang,
        code: str,
        timeout: float = codemode.DEFAULT_TIMEOUT,
        artifact: str | None = None,
    ) -> ExecResult:
        """Run a code-mode script in the task's sandbox; its output passes the gate.

        artifact (an id, file name or call id) is what a jq filter runs over.
        """
        return codemode.run(self, lang, code, timeout, artifact)

    def artifacts(self, include_deleted: bool = False) -> list[ArtifactRow]:
        """The task's artifacts, oldest first (with tombstones if asked)."""
        return self.harness.catalog.artifacts(self.id, include_deleted)

    def artifact(self, ref: str) -> ArtifactRow:
        """A live artifact by id, file name, path or call id; a clear error if gone."""
        name = ref.rsplit("/", 1)[-1]
        row = self.harness.catalog.find(self.id, name) or self.harness.catalog.find(self.id, ref)
        if row is None:
            raise ConfigError(
                f"task {self.id!r} has no artifact {ref!r}: "
                f"list them with `spillbox artifacts {self.id}`"
            )
        if row.state == "deleted":
            raise RetentionError(row.tombstone())
        return row

    def read(self, ref: str | ArtifactRow, actor: str = "harness") -> bytes:
        """The bytes of an artifact, by reference or as already looked up (logged as a read)."""
        row = self.artifact(ref) if isinstance(ref, str) else ref
        data = self.harness.backend.read(self.storage, row.name)
        self.accessed(row, "read", actor)
        return data

    def accessed(self, row: ArtifactRow, action: str, actor: str, detail: str = "") -> None:
        """Log a read or query; with TTL counted from access, push the expiry back."""
        expires = None
        if self.retention.ttl_from == "access" and self.retention.ttl is not None:
            expires = time.time() + self.retention.ttl
        catalog = self.harness.catalog
        catalog.touch(self.id, row.artifact_id, expires)
        catalog.log(
            self.id, row.artifact_id, "query" if action == "query" else "read", actor, detail
        )

    def export(self, ref: str, dest: str | Path, actor: str = "harness") -> Path:
        """Copy an artifact out of the sandbox, if the policy allows; always logged."""
        row = self.artifact(ref)
        target = Path(dest).expanduser()
        catalog = self.harness.catalog
        if self.retention.export != "allow":
            catalog.log(self.id, row.artifact_id, "export_denied", actor, str(target))
            raise RetentionError(
                f"export of {row.artifact_id} is denied by the retention policy of task {self.id}: "
                "open the task with --export allow to permit it"
            )
        if target.is_dir():
            target = target / row.name
        if target.exists() or target.is_symlink():
            raise ConfigError(f"{target} already exists: choose another destination")
        data = self.harness.backend.read(self.storage, row.name)
        if hashlib.sha256(data).hexdigest() != row.sha256:
            raise RetentionError(
                f"artifact {row.artifact_id} no longer matches its recorded sha256: not exported"
            )
        _write_new(target, data)
        catalog.log(self.id, row.artifact_id, "export", actor, str(target))
        return target

    def pin(self, ref: str, actor: str = "harness") -> ArtifactRow:
        """Put an artifact under legal hold: nothing deletes it until unpinned."""
        row = self.artifact(ref)
        self.harness.catalog.set_pinned(self.id, row.artifact_id, True, actor)
        return self.artifact(row.artifact_id)

    def unpin(self, ref: str, actor: str = "harness") -> ArtifactRow:
        row = self.artifact(ref)
        self.harness.catalog.set_pinned(self.id, row.artifact_id, False, actor)
        return self.artifact(row.artifact_id)

    def delete(self, ref: str, by: str = "manual") -> None:
        """Delete one artifact now (payload, derived copies); its row stays as a tombstone."""
        self.harness.delete_artifact(self.artifact(ref), by)

    def close(self, delete: bool = False) -> None:
        """End the task.

        delete=True removes it now: container, storage and unpinned artifacts, whoever else
        has it open. Otherwise, if another process (or Task object) still has the task open,
        it stays open for them; the last to close applies the policy's keep_after_close:
        0 deletes now, N seconds lets garbage collection delete it then, None keeps it until
        its artifacts expire. A restarted
        harness re-attaches to a kept task's container by label.
        """
        hold, self._hold = self._hold, None
        if hold is None and not delete:
            return  # opened by Harness.existing, or closed already: nothing to close
        if delete:
            self.harness.remove(self.id, by="manual")
            if hold is not None:
                hold()
            return
        self.harness.backend.release(self.storage)
        if hold is not None:
            hold()
        keep = self.retention.keep_after_close
        with unless_open(self.storage) as last:
            if not last:
                return  # another process (or Task object) still has it open: it stays open
            if keep == 0:
                self.harness.remove(self.id, by="keep_after_close")
            else:
                deadline = None if keep is None else time.time() + keep
                self.harness.catalog.close_task(self.id, deadline)

    def _make_room(self, size: int) -> None:
        """Enforce the quota before a new payload is stored: evict, or refuse."""
        policy = self.retention
        if policy.max_bytes is None and policy.max_artifacts is None:
            return
        if policy.max_bytes is not None and size > policy.max_bytes:
            raise RetentionError(
                f"a payload of {size} bytes is over task {self.id}'s quota of "
                f"{policy.max_bytes} bytes: raise --max-bytes"
            )
        live = self.artifacts()

        def over() -> bool:
            used = sum(row.bytes for row in live)
            too_many = policy.max_artifacts is not None and len(live) + 1 > policy.max_artifacts
            too_big = policy.max_bytes is not None and used + size > policy.max_bytes
            return too_many or too_big

        if not over():
            return
        if policy.on_quota == "refuse":
            raise RetentionError(
                f"task {self.id} is at its quota ({len(live)} artifacts, "
                f"{sum(r.bytes for r in live)} bytes): delete artifacts, or use --on-quota evict"
            )
        for row in [r for r in live if not r.pinned]:
            self.harness.delete_artifact(row, by="quota")
            live.remove(row)
            if not over():
                return
        raise RetentionError(
            f"task {self.id} is at its quota and every remaining artifact is pinned: "
            "unpin some, or raise --max-bytes / --max-artifacts"
        )

    def _publish(
        self,
        staged: Staged,
        result: ToolResult,
        shape: Shape,
        tokens: TokenCount | None,
        redactions: int,
    ) -> StoredFile:
        """Make room under the quota, make the payload visible and record it.

        With a quota the three hold the task's lock, so that harness processes filling one
        task at once cannot each find room for the same last slot.
        """
        policy = self.retention
        quota = policy.max_bytes is not None or policy.max_artifacts is not None
        with self.storage.locked() if quota else nullcontext():
            self._make_room(staged.bytes)
            stored = staged.publish(safe_name(result.call_id), shape.extension)
            now = time.time()
            row = ArtifactRow(
                task_id=self.id,
                artifact_id=stored.artifact_id,
                call_id=result.call_id,
                tool=result.tool,
                name=stored.name,
                path=self.harness.backend.visible_path(stored),
                bytes=stored.bytes,
                tokens=tokens.tokens if tokens else None,
                tokens_exact=tokens.exact if tokens else None,
                sha256=stored.sha256,
                created_at=now,
                last_access_at=now,
                expires_at=None if policy.ttl is None else now + policy.ttl,
                state="live",
                pinned=False,
                redactions=redactions,
                deleted_at=None,
                deleted_by=None,
            )
            try:
                self.harness.catalog.add_artifact(row)
            except BaseException:
                self.storage.remove(stored.name)  # no payload without its row
                raise
        return stored

    def _offload(self, offload: Offload) -> tuple[Artifact, str, int]:
        backend, policy, catalog = self.harness.backend, self.harness.policy, self.harness.catalog
        result, data, text = offload.result, offload.data, offload.text
        redactions = 0
        if self.retention.redact and text is not None:
            text, redactions = redact(text)
            if redactions:  # what is stored (and counted) is the redacted text
                data = text.encode("utf-8")
                offload = replace(offload, tokens=total(self.harness.counter, text))
        shape = profile(data, text)
        # The host writes the payload into the task's storage, never through the sandbox.
        with self.storage.stage(data) as staged:
            # The same bytes again (a tool repeating itself, a script printing an artifact
            # back) point to the stored copy: no duplicate, no offload-of-the-offload loop.
            same = catalog.identical(self.id, staged.sha256, len(data))
            if same is not None:
                stored = StoredFile(
                    same.name, self.storage.offload / same.name, staged.sha256, len(data)
                )
            else:
                stored = self._publish(staged, result, shape, offload.tokens, redactions)
        artifact = Artifact(
            id=stored.artifact_id,
            task_id=self.id,
            call_id=result.call_id,
            tool=result.tool,
            name=stored.name,
            path=backend.visible_path(stored),
            host_path=stored.host_path,
            bytes=stored.bytes,
            sha256=stored.sha256,
            shape=shape,
            tokens=offload.tokens,
        )
        text = text or ""
        span = 2 * policy.preview_chars
        facts = NoticeFacts(
            reason=offload.reason,
            tool=result.tool,
            call_id=result.call_id,
            path=artifact.path,
            size=artifact.bytes,
            tokens=offload.tokens,
            sha256=artifact.sha256,
            shape=shape,
            start=text[:span],
            end=text[-span:],
            length=len(text),
            binary_head=data[:16] if offload.text is None else b"",
            hints=tool_hints(codemode.hints(artifact, backend.languages), artifact, self.tools),
            per_call_limit=policy.per_call_tokens,
            aggregate_limit=policy.aggregate_tokens,
            redactions=redactions if self.retention.redact else None,
        )
        notice, notice_tokens = render(
            facts, self.harness.counter, policy.notice_max_tokens, policy.preview_chars
        )
        return artifact, notice, notice_tokens


def _write_new(target: Path, data: bytes) -> None:
    """Write a new file atomically; never replace one that appeared meanwhile."""
    try:
        fd, tmp = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.")
    except OSError as e:
        raise ConfigError(
            f"cannot export to {target}: {e.strerror}; choose a writable destination"
        ) from None
    try:
        with os.fdopen(fd, "wb") as out:
            out.write(data)
        os.link(tmp, target)
    except FileExistsError:
        raise ConfigError(f"{target} already exists: choose another destination") from None
    except OSError as e:
        raise ConfigError(f"cannot export to {target}: {e.strerror}; free space or retry") from None
    finally:
        os.unlink(tmp)
