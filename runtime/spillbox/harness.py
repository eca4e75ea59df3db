"""The harness and its tasks: the API agent code calls.

from spillbox import Harness, ToolResult

harness = Harness(sandbox="none", home=".spillbox")
with harness.task("t1") as task:
    admitted = task.admit([ToolResult(call_id="c1", tool="list_prs", content=payload)])
    print(admitted[0].text)
"""

from __future__ import annotations

import hashlib
import threading
import time
import weakref
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self

from spillbox import codemode, gc
from spillbox.catalog import Catalog
from spillbox.config import Policy, SandboxKind, Settings
from spillbox.errors import ConfigError, RetentionError
from spillbox.gate import Offload, PerCallLimit, admit
from spillbox.notice import Hint
from spillbox.offload import Destination, offload
from spillbox.redaction import Redaction, redact_payload
from spillbox.retention import Retention, close_deadline, expiry_after_access, policy_for
from spillbox.sandbox import SandboxBackend, make_backend
from spillbox.sandbox.storage import (
    CLOCK_SLACK_SECONDS,
    OpenHold,
    TaskStorage,
    unless_open,
    write_new,
)
from spillbox.tokens import TokenCounter, default_counter, total
from spillbox.tools import tool_hints
from spillbox.types import (
    Admitted,
    Artifact,
    ArtifactRow,
    ExecResult,
    Lang,
    Reason,
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
        catalog_url: str | None = None,
    ) -> None:
        settings = Settings.from_env(environ)
        overrides: dict[str, Any] = {
            "sandbox": sandbox,
            "home": None if home is None else Path(home).expanduser(),
            "policy": policy,
            "retention": retention,
            "gc_interval": gc_interval,
            "catalog_url": catalog_url,
        }
        settings = replace(settings, **{k: v for k, v in overrides.items() if v is not None})
        self.settings = settings
        self.policy = settings.policy
        self.counter = counter or default_counter(settings.policy.encoding)
        self.catalog = Catalog(settings.home, url=settings.catalog_url)
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
        row = self.catalog.known_task(task_id)
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
            held = self._holds.get(storage.task_id)
            if held is not None:
                self._holds[storage.task_id] = (held[0], held[1] + 1)
                return
        # Outside _holds_lock: this may wait for a collector deleting this very task, and
        # opening other tasks meanwhile must not wait with it.
        hold = OpenHold(storage, lambda: self.backend.create(storage))
        with self._holds_lock:
            held = self._holds.get(storage.task_id)
            if held is not None:  # another thread held it meanwhile: share theirs
                hold.release()
                hold, count = held
            else:
                count = 0
            self._holds[storage.task_id] = (hold, count + 1)

    def _holding(self, task_id: str) -> bool:
        with self._holds_lock:
            return task_id in self._holds

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
    """One task: its lifecycle, its storage and sandbox, and the gate in front of them.

    The offload path itself lives in spillbox.offload, code mode in spillbox.codemode and
    the retention decisions in spillbox.retention; a task applies them.
    """

    def __init__(
        self,
        harness: Harness,
        task_id: str,
        retention: Retention | None,
        open_task: bool = True,
    ) -> None:
        if not task_id:
            raise ConfigError("a task id must not be empty")
        bad = _not_text(task_id)
        if bad is not None:
            raise ConfigError(f"the task id {task_id!r} {bad}: give it as valid text")
        self.harness = harness
        self.id = task_id
        self.home = harness.settings.home
        self.counter = harness.counter
        self.policy = harness.policy
        self.languages = harness.backend.languages
        catalog = harness.catalog
        self.retention = policy_for(catalog.task(task_id), retention, harness.settings.retention)
        self.storage: TaskStorage = harness.backend.storage(task_id)
        self._lock = threading.Lock()
        self._redactions: dict[int, Redaction] = {}
        """What admit redacted in the step being gated, by result identity (under _lock)."""
        self.tools: frozenset[str] = frozenset()
        """spillbox's model-facing tools offered to the model: the notices' hints name them."""
        self._destination = Destination(
            task_id=task_id,
            storage=self.storage,
            catalog=catalog,
            policy=harness.policy,
            retention=self.retention,
            counter=harness.counter,
            visible_path=harness.backend.visible_path,
            hints=self._hints,
            evict=lambda row: harness.delete_artifact(row, by="quota"),
        )
        self._hold: weakref.finalize[..., Any] | None = None
        """Lets go of this object's share of the task's open hold (when closed or dropped)."""
        if open_task:
            # Held before the catalog says open, so a collector that finds the task closed
            # and no holder cannot remove its sandbox while it is being opened.
            harness._hold(self.storage)
            self._hold = weakref.finalize(self, harness._let_go, task_id)
            catalog.open_task(task_id, self.retention.to_json())

    def register_tools(self, names: Iterable[str]) -> None:
        """Say which of spillbox's tools the model is offered (Toolset.names): from now on
        the notices' hints name them, with ready-to-send arguments."""
        self.tools = frozenset(names)

    def admit(self, results: Sequence[ToolResult], remaining: int | None = None) -> list[Admitted]:
        """Gate one step's results (parallel calls count as one aggregate).

        remaining: the tokens a budget still has for tool results, for the policy's
        dynamic per-call limit (Policy.per_call_share); None: the fixed limit.

        Under a redacting policy every text result is redacted first, so a secret reaches
        neither the sandbox nor the model, inline or offloaded; the access log records each
        redaction (counts per kind, never a secret).

        A result the task cannot take (see _refusal) gets a one-line error in its place,
        reason "refused"; the step's other results are gated as if it were not there.
        """
        refused = {i: no for i, r in enumerate(results) if (no := self._refusal(r)) is not None}
        results = [r for i, r in enumerate(results) if i not in refused]
        redacted: dict[int, Redaction] = {}
        if self.retention.redact:
            results = [self._redacted(result, redacted) for result in results]
        with self._lock:
            self._redactions = redacted
            try:
                decisions = admit(results, self.policy, self.counter, self._offload, remaining)
            finally:
                self._redactions = {}
        for d in decisions:
            found = redacted.get(id(d.result))
            if d.artifact is None and found is not None and found.count:
                self.harness.catalog.log(
                    self.id, None, "redact", d.result.tool, found.audit_detail(d.result.call_id)
                )
        # Start the sandbox only now, while the model reads this step: a container start
        # competing for the cores would slow this step's offloads several times over.
        self.harness.backend.warm(self.storage)
        gated = iter(
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
        )
        return [
            next(gated) if i not in refused else refused[i]
            for i in range(len(results) + len(refused))
        ]

    def _refusal(self, result: ToolResult) -> Admitted | None:
        """A one-line error in place of a result the task cannot take: over the policy's
        max_result_bytes (counted before any copy is made), or with a call id or tool name
        that no catalog can hold (a lone surrogate, a NUL). None for a result the gate can
        take."""
        why = None
        for what, ident in (("call id", result.call_id), ("tool name", result.tool)):
            bad = _not_text(ident)
            if bad is not None:
                why = f"its {what} {ident!r} {bad}; call the tool again"
                break
        if why is None:
            cap, size = self.policy.max_result_bytes, result.size()
            if size <= cap:
                return None
            why = (
                f"it is {size} bytes, over the {cap}-byte cap on one result "
                "(Policy.max_result_bytes); ask the tool for less (a page, a filter, a limit)"
            )
        text = f"[spillbox] result refused, nothing was stored: {why}"
        return Admitted(
            call_id=result.call_id,
            tool=result.tool,
            text=text,
            offloaded=False,
            reason="refused",
            tokens=None,
            tokens_exact=None,
            inline_tokens=self.counter.count(text),
            artifact=None,
            is_error=True,
        )

    def offload(self, result: ToolResult, reason: Reason = "compaction") -> Admitted:
        """Store one result now, whatever its size, and return its notice (compaction)."""
        data, text = result.payload()
        tokens = None if text is None else total(self.counter, text)
        with self._lock:
            artifact, notice, notice_tokens = self._offload(
                Offload(result, data, text, reason, tokens, PerCallLimit.of(self.policy))
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

    def store_file(self, name: str, data: bytes, tool: str) -> Artifact:
        """Store a file a script left in /sandbox/outputs as an artifact of the task, byte
        for byte (redacted first if the policy says so), under its own name where that is
        plain, held to the retention policy and its quota like any offload."""
        result = ToolResult(call_id=name, tool=tool, content=data, file_name=name)
        refusal = self._refusal(result)
        if refusal is not None:
            raise ConfigError(refusal.text.removeprefix("[spillbox] "))
        payload, text = result.payload()
        request = Offload(result, payload, text, "output", None, PerCallLimit.of(self.policy))
        with self._lock:
            artifact, _, _ = self._offload(request)
        return artifact

    def exec(
        self,
        lang: Lang,
        code: str,
        timeout: float = codemode.DEFAULT_TIMEOUT,
        artifact: str | None = None,
        session: bool = False,
        reset_session: bool = False,
    ) -> ExecResult:
        """Run a code-mode script in the task's sandbox; its output passes the gate.

        artifact (an id, file name or call id) is what a jq filter runs over. session
        (python): run as a cell of the task's persistent session; reset_session: empty it
        first.
        """
        backend, storage = self.harness.backend, self.storage
        return codemode.run(
            self,
            lambda lang, code, timeout, call: backend.exec(storage, lang, code, timeout, call),
            lang,
            code,
            timeout,
            artifact,
            session,
            reset_session,
        )

    def artifacts(self, include_deleted: bool = False) -> list[ArtifactRow]:
        """The task's artifacts, oldest first (with tombstones if asked)."""
        return self.harness.catalog.artifacts(self.id, include_deleted)

    def artifact(self, ref: str) -> ArtifactRow:
        """A live artifact by call id, path, id or file name (in the order Catalog.find
        tries them); a clear error if gone."""
        row = self.harness.catalog.find(self.id, ref)
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

    def redacted(self, text: str, source: str) -> str:
        """text with its secrets replaced under a redacting policy (as it is under another),
        each replacement logged as what source returned: for what reaches the model around
        the gate (an MCP server's resources and prompts)."""
        if not self.retention.redact:
            return text
        redaction = redact_payload(text.encode("utf-8", "surrogatepass"))
        if not redaction.count:
            return text
        self.harness.catalog.log(self.id, None, "redact", source, redaction.audit_detail())
        return redaction.data.decode("utf-8", "surrogatepass")

    def accessed(self, row: ArtifactRow, action: str, actor: str, detail: str = "") -> None:
        """Log a read or query; with TTL counted from access, push the expiry back."""
        catalog = self.harness.catalog
        catalog.touch(self.id, row.artifact_id, expiry_after_access(self.retention, time.time()))
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
        write_new(target, data)
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
        its artifacts expire. The last close also stops the task's container (the task's
        storage stays; opened again, the task starts it, and a restarted harness finds it
        by label).
        """
        hold, self._hold = self._hold, None
        if hold is None and not delete:
            return  # opened by Harness.existing, or closed already: nothing to close
        if delete:
            self.harness.remove(self.id, by="manual")
            if hold is not None:
                hold()
            return
        if hold is not None:
            hold()
        if not self.harness._holding(self.id):  # no other Task object here has it open
            self.harness.backend.release(self.storage)
        with unless_open(self.storage) as last:
            if not last:
                return  # another process (or Task object) still has it open: it stays open
            if self.retention.keep_after_close == 0:
                self.harness.remove(self.id, by="keep_after_close")
            else:
                # Its storage stays under retention; nothing runs for a closed task.
                self.harness.backend.stop_sandbox(self.storage)
                deadline = close_deadline(self.retention, time.time())
                self.harness.catalog.close_task(self.id, deadline)

    def _offload(self, request: Offload) -> tuple[Artifact, str, int]:
        return offload(self._destination, request, self._redactions.get(id(request.result)))

    @staticmethod
    def _redacted(result: ToolResult, redacted: dict[int, Redaction]) -> ToolResult:
        """The result with its secrets replaced (as it was, if it is not text or has none);
        what was replaced is kept in `redacted`, by the returned result's identity."""
        data, text = result.payload()
        if text is None:
            return result
        redaction = redact_payload(data)
        if redaction.count:
            result = replace(result, content=redaction.data.decode("utf-8"))
        redacted[id(result)] = redaction
        return result

    def _hints(self, artifact: Artifact) -> list[Hint]:
        return tool_hints(codemode.hints(artifact, self.languages), artifact, self.tools)


def _not_text(ident: str) -> str | None:
    """What makes an id text no catalog can hold (a lone surrogate, or a NUL, which Postgres
    refuses), and where; None if it is valid text."""
    try:
        ident.encode("utf-8")
    except UnicodeEncodeError as e:
        return f"holds a lone surrogate at position {e.start} (not valid Unicode)"
    at = ident.find("\0")
    return None if at < 0 else f"holds a NUL character at position {at}"
