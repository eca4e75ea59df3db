"""A task's storage on its cluster host: TaskStorage's operations, done on that host.

The offload path stages, publishes and removes payloads through these as it does on one
machine; the payload's bytes cross the network once, in stage(), to the host that keeps
them. The open hold, the quota lock and the temp file live on the host between calls.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from spillbox.sandbox.ray.link import HostLink
from spillbox.sandbox.storage import Staged, StoredFile, TaskStorage


class HostStorage(TaskStorage):
    """The folders of one task on the host that keeps it (paths are the host's)."""

    def __init__(self, task_id: str, link: HostLink | None, offload: str | None) -> None:
        self.task_id = task_id
        self.link = link
        """None: the task is placed nowhere yet (known nowhere, or never opened)."""
        self.name = task_id
        self.offload = Path(offload or "/nonexistent")
        self._warm = True
        """Whether a warm is worth a call: none went yet, or a payload came since the last."""

    def to_warm(self) -> bool:
        """Whether the task's sandbox is to be warmed now (see RayBackend.warm); each True
        answer is given once, until the next payload staged or appended."""
        warm, self._warm = self._warm, False
        return warm

    def _call(self, method: str, *args: object) -> Any:
        assert self.link is not None, "a task placed nowhere has no storage to call"
        return self.link.call(method, *args)

    def open_hold(self, prepare: Callable[[], None]) -> _HostHold:
        # The host prepares the task's folders itself, under the hold (prepare is ours).
        assert self.link is not None, "a task placed nowhere has no storage to call"
        token = str(self.link.take("hold", self.task_id))
        return _HostHold(self, token)

    @contextmanager
    def unless_open(self) -> Iterator[bool]:
        if self.link is None:
            yield True
            return
        token, nobody = self.link.take("unless_open", self.task_id)
        try:
            yield bool(nobody)
        finally:
            self.link.end(token, wait=True)

    def locked(self) -> AbstractContextManager[None]:
        return self._held_lock("quota")

    def appending(self) -> AbstractContextManager[None]:
        return self._held_lock("append")

    @contextmanager
    def _held_lock(self, which: str) -> Iterator[None]:
        assert self.link is not None, "a task placed nowhere has no storage to call"
        token = self.link.take("lock", self.task_id, which)
        try:
            yield
        finally:
            self.link.end(token, wait=True)

    @contextmanager
    def stage(self, data: bytes, want: tuple[str, str] | None = None) -> Iterator[Staged]:
        """One call: the bytes cross once, and the host links them under want ahead."""
        assert self.link is not None, "a task placed nowhere has no storage to call"
        self._warm = True
        token, temp, sha256, size, taken, ahead = self.link.take("stage", self.task_id, data, want)
        staged = _HostStaged(self, temp, sha256, size, frozenset(taken), ahead)
        try:
            yield staged
        finally:
            kept = ahead if ahead in staged.published else None
            self.link.end(token, keep=kept)

    def _storage(self, method: str, *args: object) -> Any:
        if self.link is None:
            return None
        return self._call("storage_call", self.task_id, method, *args)

    def ensure(self) -> None:
        self._storage("ensure")

    def read(self, name: str) -> bytes:
        return bytes(self._storage("read", name))

    def append(self, name: str, at: int, data: bytes) -> None:
        self._warm = True
        self._storage("append", name, at, data)

    def remove(self, name: str) -> None:
        self._storage("remove", name)

    def names(self) -> list[str]:
        return list(self._storage("names") or [])

    def destroy(self) -> None:
        self._storage("destroy")


class _HostHold:
    def __init__(self, storage: HostStorage, token: str) -> None:
        self._storage: HostStorage | None = storage
        self._token = token

    def release(self) -> None:
        storage, self._storage = self._storage, None
        if storage is not None and storage.link is not None:
            storage.link.end(self._token)


@dataclass(frozen=True)
class _HostStaged(Staged):
    """A payload staged on the host; publish() links it there, under a free name."""

    taken: frozenset[str] = frozenset()
    ahead: str | None = None
    """The name the host linked the payload under ahead, if it could."""
    published: list[str] = field(default_factory=list)
    """What publish() gave out without a call (the name linked ahead)."""

    def publish(
        self, stem: str, extension: str, reserved: Callable[[str], bool] = lambda _: False
    ) -> StoredFile:
        storage = self.storage
        assert isinstance(storage, HostStorage)
        wanted = f"{stem}.{extension}"
        if self.ahead == wanted and not reserved(stem):
            self.published.append(wanted)
            return StoredFile(wanted, storage.offload / wanted, self.sha256, self.bytes)
        ahead_stem = None if self.ahead is None else self.ahead.rsplit(".", 1)[0]
        n = 1
        while True:
            free = stem if n == 1 else f"{stem}-{n}"
            n += 1
            if free in self.taken or free == ahead_stem or reserved(free):
                continue
            name = f"{free}.{extension}"
            path = storage._call("link", storage.task_id, self.temp, name)
            if path is not None:
                return StoredFile(name, Path(str(path)), self.sha256, self.bytes)
