"""The harness and its tasks: the API agent code calls.

from spillbox import Harness, ToolResult

harness = Harness(sandbox="none", home=".spillbox")
with harness.task("t1") as task:
    admitted = task.admit([ToolResult(call_id="c1", tool="list_prs", content=payload)])
    print(admitted[0].text)
"""

from __future__ import annotations

import functools
import threading
import time
import weakref
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING, Any, Self

from spillbox import codemode, gc, metrics
from spillbox.access import Access, TaskParts
from spillbox.admission import Admission, not_text
from spillbox.catalog import Catalog
from spillbox.catalog.calls import CallIds
from spillbox.config import Policy, SandboxKind, Settings
from spillbox.errors import ConfigError, RetentionError
from spillbox.langs import Lang
from spillbox.retention import Retention, close_deadline, policy_for
from spillbox.sandbox import SandboxBackend, make_backend
from spillbox.sandbox.storage import CLOCK_SLACK_SECONDS, Hold, TaskStorage
from spillbox.tokens import TokenCounter, default_counter
from spillbox.types import (
    Admitted,
    Artifact,
    ArtifactRow,
    ExecResult,
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
        cluster: str | None = None,
        metrics_listen: str | None = None,
        pool_size: int | None = None,
        *,
        long_lived: bool = False,
    ) -> None:
        """Every argument left out comes from the environment (Settings.from_env), then
        spillbox's defaults.

        pool_size: ready Docker sandboxes kept for new tasks (default SPILLBOX_POOL_SIZE,
        else 2; 0: none, each task starts its own container).
        cluster: a Ray cluster's address (or SPILLBOX_CLUSTER): tasks are kept by its
        spillbox hosts (spillbox[ray]; a Postgres catalog_url), not on this machine.
        long_lived: a server that runs for days (`spillbox mcp proxy`, `mcp serve`): a
        catalog whose schema is not the newest is migrated in a child process, so that
        this one never holds the migration's libraries (about 24 MB of its idle memory).
        """
        settings = Settings.from_env(environ)
        overrides: dict[str, Any] = {
            "sandbox": sandbox,
            "home": None if home is None else Path(home).expanduser(),
            "policy": policy,
            "retention": retention,
            "gc_interval": gc_interval,
            "catalog_url": catalog_url,
            "cluster": cluster,
            "metrics_listen": metrics_listen,
            "pool_size": pool_size,
        }
        settings = replace(settings, **{k: v for k, v in overrides.items() if v is not None})
        self.settings = settings
        self.policy = settings.policy
        self.counter = counter or default_counter(settings.policy.encoding)
        self.catalog = Catalog(settings.home, url=settings.catalog_url, migrate_apart=long_lived)
        self.backend: SandboxBackend = make_backend(
            settings.sandbox,
            settings.home,
            options,
            settings.pool_size,
            settings.cluster,
            self.catalog,
        )
        if settings.metrics_listen:
            metrics.serve(settings.metrics_listen)
        metrics.watch(self, self.backend.alive)
        self._holds: dict[str, tuple[Hold, int]] = {}
        """The open hold of each task this harness has open, with how many Task objects share it."""
        self._holds_lock = threading.Lock()
        self._stop = threading.Event()
        self._collector: threading.Thread | None = None
        if settings.gc_interval >= 0 and settings.cluster is None:  # hosts collect their own
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
        metrics.unwatch(self)
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

        Pinned artifacts (legal hold) stay with their storage; returns how many did. With
        none pinned, what scripts and the session made of the payloads goes with the
        sandbox and the storage, removed whole: nothing is forgotten in them first.
        """
        storage = self.backend.storage(task_id)
        rows = self.catalog.artifacts(task_id)
        held = sum(row.pinned for row in rows)
        for row in rows:
            if row.pinned:
                continue
            if held:  # the storage stays: what came of the payload is forgotten in it
                self.delete_artifact(row, by)
            else:
                self._drop(row, by)
        if held:
            self.backend.destroy_sandbox(storage)
            self.catalog.close_task(task_id, delete_after=None)
        else:
            self.backend.destroy(storage)
            if self.catalog.task(task_id) is not None:
                self.catalog.mark_task_deleted(task_id, by)
        return held

    def delete_artifact(self, row: ArtifactRow, by: str) -> None:
        """Delete an artifact everywhere: a tombstone row, the payload, then what the task's
        sandbox made of it."""
        if self._drop(row, by):
            storage = self.backend.storage(row.task_id)
            since = row.created_at - CLOCK_SLACK_SECONDS
            self.backend.forget_derived(storage, row.sha256, row.bytes, since)

    def _drop(self, row: ArtifactRow, by: str) -> bool:
        """Tombstone an artifact and remove its payload; False if someone else deleted it
        (or pinned it) in the meantime."""
        if row.pinned:
            raise RetentionError(
                f"artifact {row.artifact_id} of task {row.task_id} is pinned (legal hold): "
                f"unpin it first (spillbox unpin {row.task_id} {row.artifact_id})"
            )
        if not self.catalog.tombstone(row.task_id, row.artifact_id, by):
            return False
        self.backend.storage(row.task_id).remove(row.name)
        return True

    def gc(self, dry_run: bool = False) -> list[gc.Removal]:
        """Remove what retention says must go, and anything orphaned; idempotent."""
        return self.backend.collect(lambda: gc.collect(self, dry_run=dry_run), dry_run)

    def _hold(self, storage: TaskStorage) -> None:
        """Hold the task open (one shared lock per harness and task, counted)."""
        with self._holds_lock:
            held = self._holds.get(storage.task_id)
            if held is not None:
                self._holds[storage.task_id] = (held[0], held[1] + 1)
                return
        # Outside _holds_lock: this may wait for a collector deleting this very task, and
        # opening other tasks meanwhile must not wait with it.
        hold = storage.open_hold(lambda: self.backend.create(storage))
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
                self.gc()
            except Exception:  # noqa: BLE001 - a failed background sweep must not kill the harness
                pass  # the next sweep (or `spillbox gc`) tries again and reports
            if self.settings.gc_interval == 0 or self._stop.wait(self.settings.gc_interval):
                return


class Task(_ClosedOnExit):
    """One task: its lifecycle, its storage and sandbox, and the gate in front of them.

    What it lets in is spillbox.admission's, how its artifacts are reached spillbox.access's,
    code mode spillbox.codemode's and the retention decisions spillbox.retention's; a task
    holds them together for one task id.
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
        bad = not_text(task_id)
        if bad is not None:
            raise ConfigError(f"the task id {task_id!r} {bad}: give it as valid text")
        self.harness = harness
        self.id = task_id
        self.home = harness.settings.home
        self.counter = harness.counter
        self.policy = harness.policy
        self.languages = harness.backend.languages
        catalog, backend = harness.catalog, harness.backend
        self.retention = policy_for(catalog.task(task_id), retention, harness.settings.retention)
        self.storage: TaskStorage = (
            backend.opening(task_id) if open_task else backend.storage(task_id)
        )
        parts = TaskParts(task_id, catalog, backend, self.storage, self.retention)
        evict = functools.partial(harness.delete_artifact, by="quota")
        self._admission = Admission(parts, harness.policy, harness.counter, evict)
        self._access = Access(parts)
        self._call_ids = CallIds(catalog, task_id)
        self._hold: weakref.finalize[..., Any] | None = None
        """Lets go of this object's share of the task's open hold (when closed or dropped)."""
        if open_task:
            # Held before the catalog says open, so a collector that finds the task closed
            # and no holder cannot remove its sandbox while it is being opened.
            harness._hold(self.storage)
            self._hold = weakref.finalize(self, harness._let_go, task_id)
            catalog.open_task(task_id, self.retention.to_json())

    @property
    def tools(self) -> frozenset[str]:
        """spillbox's model-facing tools offered to the model: the notices' hints name them."""
        return self._admission.tools

    def register_tools(self, names: Iterable[str]) -> None:
        """Say which of spillbox's tools the model is offered (Toolset.names): from now on
        the notices' hints name them, with ready-to-send arguments."""
        self._admission.tools = frozenset(names)

    def next_call_id(self, tool: str) -> str:
        """An id for a call of tool that no process on this task gives out again (what an
        MCP proxy names the calls it gates with: git_log_1, git_log_2, ...), reserved from
        the catalog in blocks (a catalog write if this task's block for tool is used up).
        A name no catalog can hold is counted escaped: admit() refuses its result by the
        name."""
        return self._call_ids.next(_countable(tool))

    def reserved_call_id(self, tool: str) -> str | None:
        """next_call_id's answer where it needs no catalog access (one reserved already);
        None where it would."""
        return self._call_ids.ready(_countable(tool))

    def admit(self, results: Sequence[ToolResult], remaining: int | None = None) -> list[Admitted]:
        """Gate one step's results (parallel calls count as one aggregate).

        remaining: the tokens a budget still has for tool results, for the policy's
        dynamic per-call limit (Policy.per_call_share); None: the fixed limit.

        Under a redacting policy every text result is redacted first, so a secret reaches
        neither the sandbox nor the model, inline or offloaded; the access log records each
        redaction (counts per kind, never a secret).

        A result the task cannot take (over Policy.max_result_bytes, or a call id or tool
        name no catalog can hold) gets a one-line error in its place, reason "refused"; the
        step's other results are gated as if it were not there.
        """
        return self._admission.admit(results, remaining)

    def offload(self, result: ToolResult, reason: Reason = "compaction") -> Admitted:
        """Store one result now, whatever its size, and return its notice (compaction)."""
        return self._admission.offload(result, reason)

    def append(self, result: ToolResult, reason: Reason = "compaction") -> Admitted:
        """Append one result's payload to the task's artifact of its call id, in place (the
        first append stores it), and return the whole artifact's notice: for a payload
        that grows by whole lines, as the task's history does (spillbox.history)."""
        return self._admission.append(result, reason)

    def store_file(self, name: str, data: bytes, tool: str) -> Artifact:
        """Store a file a script left in /sandbox/outputs as an artifact of the task, byte
        for byte (redacted first if the policy says so), under its own name where that is
        plain, held to the retention policy and its quota like any offload."""
        return self._admission.store_file(name, data, tool)

    def redacted(self, text: str, source: str) -> str:
        """text with its secrets replaced under a redacting policy (as it is under another),
        each replacement logged as what source returned: for what reaches the model around
        the gate (an MCP server's resources and prompts)."""
        return self._admission.redacted(text, source)

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
        started = time.perf_counter()
        try:
            return codemode.run(
                self,
                lambda request: backend.exec(storage, request),
                lang,
                code,
                timeout,
                artifact,
                session,
                reset_session,
            )
        finally:
            metrics.executed(lang, time.perf_counter() - started)

    def artifacts(
        self, include_deleted: bool = False, named_in: str | None = None, call_id: str | None = None
    ) -> list[ArtifactRow]:
        """The task's artifacts, oldest first (with tombstones if asked); named_in: only
        those whose id or file name occurs in that text (a script that names them); call_id:
        only those of that call."""
        return self.harness.catalog.artifacts(self.id, include_deleted, named_in, call_id)

    def artifact(self, ref: str) -> ArtifactRow:
        """A live artifact by call id, path, id or file name; a clear error if gone (or
        lost with its host)."""
        return self._access.find(ref)

    def read(self, ref: str | ArtifactRow, actor: str = "harness") -> bytes:
        """The bytes of an artifact, by reference or as already looked up (logged as a read)."""
        return self._access.read(ref, actor)

    def accessed(
        self, rows: Sequence[ArtifactRow], action: str, actor: str, detail: str = ""
    ) -> None:
        """Log a read or query of each; with TTL counted from access, push their expiry
        back (one write however many)."""
        self._access.accessed(rows, action, actor, detail)

    def export(self, ref: str, dest: str | Path, actor: str = "harness") -> Path:
        """Copy an artifact out of the sandbox, if the policy allows; always logged."""
        return self._access.export(ref, dest, actor)

    def pin(self, ref: str, actor: str = "harness") -> ArtifactRow:
        """Put an artifact under legal hold: nothing deletes it until unpinned."""
        return self._access.pin(ref, True, actor)

    def unpin(self, ref: str, actor: str = "harness") -> ArtifactRow:
        return self._access.pin(ref, False, actor)

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
        with self.storage.unless_open() as last:
            if not last:
                return  # another process (or Task object) still has it open: it stays open
            if self.retention.keep_after_close == 0:
                self.harness.remove(self.id, by="keep_after_close")
            else:
                # Its storage stays under retention; nothing runs for a closed task.
                self.harness.backend.stop_sandbox(self.storage)
                deadline = close_deadline(self.retention, time.time())
                self.harness.catalog.close_task(self.id, deadline)


def _countable(tool: str) -> str:
    """tool as call ids count it: escaped where no catalog can hold it (a NUL, a lone
    surrogate)."""
    return tool if not_text(tool) is None else tool.encode("unicode_escape").decode("ascii")
