"""The sandbox seam: a small interface that every backend implements.

A backend owns where a task's payloads live and where its scripts run. "none" only
stores; "docker" also runs code mode in a hardened container per task. The backend is
chosen in one place (spillbox.sandbox.make_backend).
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TypeVar

from spillbox.sandbox.storage import StoredFile, TaskStorage, stored_task_ids
from spillbox.types import ExecRequest, RawExec

_T = TypeVar("_T")


class SandboxBackend(ABC):
    """Where a task's payloads live and its scripts run.

    >>> from spillbox.sandbox import make_backend
    >>> backend = make_backend("none", Path("/tmp/spillbox-doc"))
    >>> backend.kind
    'none'
    """

    kind: str
    languages: tuple[str, ...] = ()
    """The code-mode languages this backend runs; empty if it only stores."""

    def __init__(self, home: Path) -> None:
        self.home = home

    def storage(self, task_id: str) -> TaskStorage:
        return TaskStorage(self.home, task_id)

    def opening(self, task_id: str) -> TaskStorage:
        """The storage of a task being opened (a cluster places a new task first)."""
        return self.storage(task_id)

    @abstractmethod
    def create(self, storage: TaskStorage) -> None:
        """Prepare the task's storage; cheap, and the sandbox itself is not started yet."""

    def warm(self, storage: TaskStorage, published: Sequence[str] | None = None) -> None:
        """Start the task's sandbox in the background, so the first script need not wait;
        published: the payload files stored since the last warm, whose tables may load
        (None: not known, as on a cluster's host: the backend looks)."""
        return None  # a backend without a sandbox has nothing to start

    @abstractmethod
    def visible_path(self, stored: StoredFile) -> str:
        """The payload's path as the model (and its scripts) see it."""

    @abstractmethod
    def exec(self, storage: TaskStorage, request: ExecRequest) -> RawExec:
        """Run a script in the task's sandbox; with request.session, a python cell in the
        task's persistent Python session."""

    def read(self, storage: TaskStorage, name: str) -> bytes:
        return storage.read(name)

    def release(self, storage: TaskStorage) -> None:
        """Let go of what this process holds for the task (its sandbox stays)."""
        return None  # a backend that holds nothing per task has nothing to let go

    def stop_sandbox(self, storage: TaskStorage) -> None:
        """Stop what runs for the task (its storage stays): at the task's last close."""
        self.release(storage)

    def close(self) -> None:
        """Let go of everything this process holds (connections, engines)."""
        return None  # a backend without connections has nothing to let go

    @abstractmethod
    def destroy_sandbox(self, storage: TaskStorage) -> None:
        """Remove the task's sandbox (its container), keeping its storage."""

    def destroy(self, storage: TaskStorage) -> None:
        """Remove the task's sandbox and all its storage."""
        self.destroy_sandbox(storage)
        storage.destroy()

    def forget_derived(self, storage: TaskStorage, sha256: str, size: int, since: float) -> None:
        """Delete what may be derived from a payload with these bytes that exists since
        `since` (its creation, less the clock slack): every query-engine table of the task
        (rebuilt on demand from what is left), and the files of work/ that may hold it
        (TaskStorage.remove_derived)."""
        storage.clear_cache()
        storage.remove_derived(sha256, size, since)

    def sweep(
        self, unused: Callable[[str], AbstractContextManager[bool]], dry_run: bool
    ) -> list[str]:
        """Remove the sandboxes of this home whose task is unused: each is removed inside
        `with unused(task_id) as yes:` when yes. Returns what was (or would be) removed."""
        return []

    def collect(self, here: Callable[[], list[_T]], dry_run: bool) -> list[_T]:
        """Garbage collection of what this backend keeps: here() collects this home (a
        cluster's hosts each collect their own)."""
        return here()

    def alive(self) -> int:
        """How many sandboxes of this home run now (a backend without sandboxes runs none)."""
        return 0

    def list(self) -> list[str]:
        """The ids of the tasks this backend holds anything for."""
        return stored_task_ids(self.home)
