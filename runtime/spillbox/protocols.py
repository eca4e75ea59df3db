"""What code mode, the tools, the adapters and the loop need of a task: a Protocol that
spillbox.harness.Task satisfies. Those modules type against it and never import the
harness, so the package's import graph has no cycle.

    def summarise(task: TaskHandle) -> int:
        return len(task.artifacts())
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path
from typing import Protocol

from spillbox.config import Policy
from spillbox.langs import Lang
from spillbox.retention import Retention
from spillbox.tokens import TokenCounter
from spillbox.types import Admitted, Artifact, ArtifactRow, ExecResult, Reason, ToolResult


class TaskHandle(Protocol):
    """One open task, as the layers above the harness use it."""

    id: str
    home: Path
    """The spillbox home the task lives in (its per-home secrets are there)."""
    counter: TokenCounter
    policy: Policy
    """The gate's policy."""
    languages: tuple[str, ...]
    """The code-mode languages the task's sandbox runs (none with sandbox="none")."""
    retention: Retention
    """The task's retention policy (whether it redacts what reaches the model)."""

    def admit(
        self, results: Sequence[ToolResult], remaining: int | None = None
    ) -> list[Admitted]: ...

    def offload(self, result: ToolResult, reason: Reason = "compaction") -> Admitted: ...

    def append(self, result: ToolResult, reason: Reason = "compaction") -> Admitted: ...

    def store_file(self, name: str, data: bytes, tool: str) -> Artifact: ...

    def exec(
        self,
        lang: Lang,
        code: str,
        timeout: float = ...,
        artifact: str | None = None,
        session: bool = False,
        reset_session: bool = False,
    ) -> ExecResult: ...

    def artifact(self, ref: str) -> ArtifactRow: ...

    def artifacts(
        self, include_deleted: bool = False, named_in: str | None = None, call_id: str | None = None
    ) -> list[ArtifactRow]: ...

    def read(self, ref: str | ArtifactRow, actor: str = "harness") -> bytes: ...

    def accessed(
        self, rows: Sequence[ArtifactRow], action: str, actor: str, detail: str = ""
    ) -> None: ...

    def redacted(self, text: str, source: str) -> str: ...

    def register_tools(self, names: Iterable[str]) -> None: ...

    def next_call_id(self, tool: str) -> str: ...

    def reserved_call_id(self, tool: str) -> str | None: ...


class ClosableTask(TaskHandle, Protocol):
    """A task its opener ends: close() applies its retention."""

    def close(self, delete: bool = False) -> None: ...


class SandboxFacts(Protocol):
    languages: tuple[str, ...]
    """The code-mode languages its sandboxes run (none with sandbox="none")."""


class TaskOpener(Protocol):
    """What opens tasks by id (spillbox.harness.Harness): a framework integration opens one
    per run through it, and never imports the harness."""

    @property
    def backend(self) -> SandboxFacts: ...

    def task(self, task_id: str, retention: Retention | None = None) -> ClosableTask: ...
