"""The harness and its tasks: the API agent code calls.

from spillbox import Harness, ToolResult

harness = Harness(sandbox="none", home=".spillbox")
with harness.task("t1") as task:
    admitted = task.admit([ToolResult(call_id="c1", tool="list_prs", content=payload)])
    print(admitted[0].text)
"""

from __future__ import annotations

import threading
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from types import TracebackType
from typing import TYPE_CHECKING

from spillbox import codemode
from spillbox.config import Policy, SandboxKind, Settings
from spillbox.gate import Offload, Reason, ToolResult, admit
from spillbox.notice import NoticeFacts, render
from spillbox.profile import Shape, profile
from spillbox.sandbox import SandboxBackend, make_backend
from spillbox.sandbox.storage import TaskStorage, safe_name
from spillbox.tokens import TokenCount, TokenCounter, default_counter

if TYPE_CHECKING:
    from spillbox.sandbox.docker import SandboxOptions


@dataclass(frozen=True)
class Artifact:
    """An offloaded payload, stored byte for byte in the task's sandbox."""

    id: str
    """Unique in the task: the file name's stem."""
    task_id: str
    call_id: str
    tool: str
    name: str
    """File name in the task's offload folder."""
    path: str
    """Where the model and its scripts find it (e.g. /sandbox/offload/c1.json)."""
    host_path: Path
    bytes: int
    sha256: str
    shape: Shape
    tokens: TokenCount | None


@dataclass(frozen=True)
class Admitted:
    """One result after the gate, in the order the results were given."""

    call_id: str
    tool: str
    text: str
    """What goes into the model's context: the result itself, or a notice."""
    offloaded: bool
    reason: Reason | None
    tokens: int | None
    """Tokens of the whole result (None for binary results)."""
    tokens_exact: bool | None
    inline_tokens: int
    """Tokens of text."""
    artifact: Artifact | None
    is_error: bool = False


class Harness:
    """Gates tool results into per-task sandboxes.

    >>> harness = Harness(sandbox="none", home="/tmp/spillbox-doc")
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
    ) -> None:
        settings = Settings.from_env(environ)
        if sandbox is not None:
            settings = replace(settings, sandbox=sandbox)
        if home is not None:
            settings = replace(settings, home=Path(home).expanduser())
        if policy is not None:
            settings = replace(settings, policy=policy)
        self.settings = settings
        self.policy = settings.policy
        self.counter = counter or default_counter(settings.policy.encoding)
        self.backend: SandboxBackend = make_backend(settings.sandbox, settings.home, options)

    def __enter__(self) -> Harness:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def close(self) -> None:
        """Let go of connections and engines; tasks and their sandboxes stay."""
        self.backend.close()

    def task(self, task_id: str) -> Task:
        """The task with this id: created on first use, re-attached after a restart."""
        return Task(self, task_id)

    def tasks(self) -> list[str]:
        """Ids of every task this harness's home or engine holds anything for."""
        return self.backend.list()

    def remove(self, task_id: str) -> None:
        """Delete a task: its sandbox and all its storage."""
        self.backend.destroy(self.backend.storage(task_id))


class Task:
    """One task: its storage, its sandbox, and the gate in front of them."""

    def __init__(self, harness: Harness, task_id: str) -> None:
        self.harness = harness
        self.id = task_id
        self.storage: TaskStorage = harness.backend.storage(task_id)
        self._lock = threading.Lock()
        self._exec_count = 0
        harness.backend.create(self.storage)

    def __enter__(self) -> Task:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    def admit(self, results: Sequence[ToolResult]) -> list[Admitted]:
        """Gate one step's results (parallel calls count as one aggregate)."""
        with self._lock:
            decisions = admit(results, self.harness.policy, self.harness.counter, self._offload)
        return [
            Admitted(
                call_id=d.result.call_id,
                tool=d.result.tool,
                text=d.text,
                offloaded=d.reason is not None,
                reason=d.reason,
                tokens=d.tokens.tokens if d.tokens else None,
                tokens_exact=d.tokens.exact if d.tokens else None,
                inline_tokens=d.inline_tokens,
                artifact=d.artifact if isinstance(d.artifact, Artifact) else None,
                is_error=d.result.is_error,
            )
            for d in decisions
        ]

    def exec(
        self,
        lang: codemode.Lang,
        code: str,
        timeout: float = codemode.DEFAULT_TIMEOUT,
        artifact: str | None = None,
    ) -> codemode.ExecResult:
        """Run a code-mode script in the task's sandbox; its output passes the gate.

        artifact (an id or file name) is what a jq filter runs over.
        """
        return codemode.run(self, lang, code, timeout, artifact)

    def artifacts(self) -> list[str]:
        """The file names of the task's payloads, oldest first."""
        return self.storage.names()

    def close(self, delete: bool = False) -> None:
        """End the task; with delete=True its sandbox and all its storage are removed.

        Without delete, the container stays (a restarted harness re-attaches to it by
        label) until its expiry label says it may be collected.
        """
        if delete:
            self.harness.remove(self.id)
        else:
            self.harness.backend.release(self.storage)

    def _offload(self, offload: Offload) -> tuple[Artifact, str]:
        backend, policy = self.harness.backend, self.harness.policy
        result = offload.result
        shape = profile(offload.data, offload.text)
        # The same bytes again (a tool repeating itself, a script printing an artifact
        # back) point to the stored copy: no duplicate, no offload-of-the-offload loop.
        stored = self.storage.find_identical(offload.data) or backend.put(
            self.storage, safe_name(result.call_id), shape.extension, offload.data
        )
        artifact = Artifact(
            id=stored.name.rsplit(".", 1)[0],
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
        text = offload.text or ""
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
            binary_head=offload.data[:16] if offload.text is None else b"",
            hints=codemode.hints(artifact, backend.languages),
            per_call_limit=policy.per_call_tokens,
            aggregate_limit=policy.aggregate_tokens,
        )
        notice = render(facts, self.harness.counter, policy.notice_max_tokens, policy.preview_chars)
        return artifact, notice
