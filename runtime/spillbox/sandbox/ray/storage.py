"""A task's storage on its cluster host: TaskStorage's operations, done on that host.

The offload path stages, publishes and removes payloads through these as it does on one
machine; the payload's bytes cross the network once, in stage(), to the host that keeps
them. The open hold, the quota lock and the temp file live on the host between calls.
stage() does not wait for the host: the payload's digest and size are known here, and
the offload path's catalog reads (is it a repeat, is its id taken) run while the host
writes it; its answer is taken when publishing needs it, or at the end.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from spillbox.digest import Digest
from spillbox.errors import StorageError
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
        self._found: frozenset[str] | None = None
        """The stems in the task's offload folder when the host first staged for this
        object (as TaskStorage.found_stems: names given since are the catalog's to tell)."""

    def found_stems(self) -> frozenset[str]:
        """The stems the host listed at this object's first payload (none before it)."""
        return self._found or frozenset()

    def take_published(self) -> list[str]:
        """None to tell: the host's own storage tells its sandbox what came (to_warm says
        when to ask it)."""
        return []

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
    def stage(
        self, data: bytes, want: tuple[str, str] | None = None, digest: Digest | None = None
    ) -> Iterator[Staged]:
        """One call: the bytes cross once, and the host links them under want ahead. Its
        answer is awaited only when needed (see the module's docstring); a failure there
        is raised from the block's end if nothing needed it sooner."""
        link = self.link
        assert link is not None, "a task placed nowhere has no storage to call"
        self._warm = True
        digest = Digest.of(data, digest)
        found = self._found
        if found is not None and want is not None and want[0] in found:
            want = None  # not free: the host need not try it
        asked = _Asked(
            link, link.ask("stage", self.task_id, data, want, found is None), data, digest, self
        )
        staged = _HostStaged(self, "", asked.sha256, len(data), asked=asked)
        try:
            yield staged
        except BaseException:
            if asked.ok():  # the host's failure, if it failed too, is not this one's cause
                link.end(asked.token, keep=_kept(staged))
            raise
        asked.wait()
        link.end(asked.token, keep=_kept(staged))

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


def _kept(staged: _HostStaged) -> str | None:
    """The name linked ahead, if publish() gave it out (the host keeps it at end())."""
    ahead = staged.asked.ahead if staged.asked is not None else None
    return ahead if ahead is not None and ahead in staged.published else None


class _Asked:
    """The host's answer to one stage(), taken once, when first needed."""

    def __init__(
        self, link: HostLink, asked: Any, data: bytes, digest: Digest, storage: HostStorage
    ) -> None:
        self._link = link
        self._storage = storage
        self._asked: Any = asked
        self._size = len(data)
        self.sha256 = digest.hexdigest()
        self._error: BaseException | None = None
        self.token = ""
        self.temp = ""
        self.ahead: str | None = None

    def wait(self) -> None:
        """Take the answer (once); the host's error, if it failed (every time asked)."""
        if self._asked is not None:
            asked, self._asked = self._asked, None
            try:
                token, temp, sha256, size, taken, ahead = self._link.answer(asked)
            except BaseException as e:
                self._error = e
                raise
            self._link.kept(token)
            if taken is not None:  # asked for at this storage object's first payload
                self._storage._found = frozenset(taken)
            self.token, self.temp, self.ahead = token, temp, ahead
            if (sha256, size) != (self.sha256, self._size):
                self._error = StorageError(
                    f"the payload staged on host {self._link.host!r} is not the one sent "
                    f"({size} bytes, sha256 {sha256[:12]}, for {self._size} bytes, "
                    f"{self.sha256[:12]}): nothing was stored"
                )
                self._link.end(token)
                raise self._error
        if self._error is not None:
            raise self._error

    def ok(self) -> bool:
        """Whether the host staged the payload (its answer taken now, if it was not)."""
        try:
            self.wait()
        except Exception:  # noqa: BLE001 - the caller raises its own error
            return False
        return True


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

    asked: _Asked | None = None
    """The host's answer: its temp file and the name it linked the payload under ahead,
    if it could (the stems its folder held go to the storage's found_stems)."""
    published: list[str] = field(default_factory=list)
    """What publish() gave out without a call (the name linked ahead)."""

    def publish(
        self, stem: str, extension: str, reserved: Callable[[str], bool] = lambda _: False
    ) -> StoredFile:
        storage, asked = self.storage, self.asked
        assert isinstance(storage, HostStorage) and asked is not None
        wanted = f"{stem}.{extension}"
        stem_reserved = reserved(stem)  # a catalog read: asked while the host stages
        asked.wait()
        if asked.ahead == wanted and not stem_reserved:
            self.published.append(wanted)
            return StoredFile(wanted, storage.offload / wanted, self.sha256, self.bytes)
        ahead_stem = None if asked.ahead is None else asked.ahead.rsplit(".", 1)[0]
        taken = storage.found_stems()
        n = 1
        while True:
            free = stem if n == 1 else f"{stem}-{n}"
            n += 1
            if free in taken or free == ahead_stem:
                continue
            if stem_reserved if free == stem else reserved(free):
                continue
            name = f"{free}.{extension}"
            path = storage._call("link", storage.task_id, asked.temp, name)
            if path is not None:
                return StoredFile(name, Path(str(path)), self.sha256, self.bytes)
