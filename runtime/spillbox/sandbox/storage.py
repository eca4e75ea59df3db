"""A task's storage on the host: payload files written atomically under safe names.

Layout under the spillbox home:

    tasks/<task>/offload/<artifact>.<ext>   payloads, byte for byte (read-only in the sandbox)
    tasks/<task>/work/                      scratch for scripts (writable in the sandbox)
    tasks/<task>/cache/                     derived copies (query engine tables)
    tasks/<task>/.incoming/                 temp files; linked into offload/ when complete
    tasks/<task>/quota.lock                 held while a quota decision is made and recorded
    tasks/<task>/append.lock                held while an appendable payload grows (Task.append)
    locks/<task>.open                       held (shared) by every process that has the task open;
                                            outside the task's folder, so deleting the folder
                                            never deletes the lock that guards it

Any id is safe: names are derived so that no id (long, with slashes, '..', unicode) can
leave the task's folder or exceed a filename limit, and no two ids share a name.
"""

from __future__ import annotations

import errno
import fcntl
import hashlib
import os
import re
import shutil
import stat
import tempfile
import threading
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from spillbox.digest import Digest
from spillbox.errors import ConfigError, StorageError

_SAFE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]{0,63}")
_UNSAFE_RUN = re.compile(r"[^A-Za-z0-9_-]+")
_DASHES = re.compile(r"-{2,}")
ESCAPE_MARK = "--"
"""Between an escaped name's readable prefix and its digest. No plain name holds it (an id
that does is escaped too), so a plain id never names what an escaped one does."""
_NAME_DIGEST_CHARS = 32
"""128 bits of sha256: no one can make a second id with a chosen id's name."""
_NAME_PREFIX_CHARS = 30
"""With the mark and the digest, a name of at most 64 characters."""
_LEGACY_PREFIX_CHARS = 40
_LEGACY_DIGEST_CHARS = 12

TASKS_DIR = "tasks"
OFFLOAD_DIR = "offload"
WORK_DIR = "work"
CACHE_DIR = "cache"
INCOMING_DIR = ".incoming"
TASK_ID_FILE = "task-id"
SANDBOX_START_FILE = "sandbox-start"
"""Which sandbox (container and start) the task's last call ran in, as its backend names it."""
TASK_FOLDERS = (OFFLOAD_DIR, WORK_DIR, CACHE_DIR, INCOMING_DIR)
"""The folders of a task's root, made by TaskStorage.ensure (or ahead of the task, by lay_out)."""


def lay_out(root: Path) -> None:
    """Make a task's folders under root (a task's own, or a warm pool slot's, pool.py)."""
    for folder in TASK_FOLDERS:
        (root / folder).mkdir(parents=True, exist_ok=True)


def safe_name(ident: str) -> str:
    """A filename stem for any id: the id itself if already plain, else a cleaned prefix,
    ESCAPE_MARK and a digest of the exact id. Distinct ids get distinct names: a plain name
    never holds ESCAPE_MARK, an escaped one always does, and escaped ones differ by digest.

    >>> safe_name("call_1"), safe_name("../../etc/passwd")
    ('call_1', 'etc_passwd--3754d6cb3a38e1185e5b382d5f3ef3f1')
    """
    if _SAFE.fullmatch(ident) and ESCAPE_MARK not in ident:
        return ident
    return _escaped(ident)


def _escaped(ident: str) -> str:
    digest = hashlib.sha256(encode_id(ident)).hexdigest()[:_NAME_DIGEST_CHARS]
    return f"{_prefix(ident)}{ESCAPE_MARK}{digest}"


def _prefix(ident: str) -> str:
    cleaned = _DASHES.sub("-", _UNSAFE_RUN.sub("_", ident)).strip("_-")
    return cleaned[:_NAME_PREFIX_CHARS].rstrip("_-") or "id"


def _legacy_name(ident: str) -> str:
    """The name spillbox gave a task's folder before ESCAPE_MARK (which a plain id could
    share with an escaped one): how existing homes' folders are found again."""
    if _SAFE.fullmatch(ident):
        return ident
    digest = hashlib.sha256(encode_id(ident)).hexdigest()[:_LEGACY_DIGEST_CHARS]
    prefix = _UNSAFE_RUN.sub("_", ident).strip("_-")[:_LEGACY_PREFIX_CHARS] or "id"
    return f"{prefix}-{digest}"


def encode_id(ident: str) -> bytes:
    """An id's exact bytes. surrogatepass: a str id may hold lone surrogates, and must
    still get a name of its own."""
    return ident.encode("utf-8", "surrogatepass")


def task_folder_name(home: Path, task_id: str) -> str:
    """The name of the task's folder under home/tasks, one task's alone.

    A folder records its task's exact id (TASK_ID_FILE). The task's folder is the one that
    records its id: under its name, its escaped form, or the name older versions gave it;
    else its name, unless another id's folder holds it (two ids shared one name before
    ESCAPE_MARK): then its escaped form, which no other id has.
    """
    tasks = home / TASKS_DIR
    name = safe_name(task_id)
    mine = encode_id(task_id)
    for candidate in dict.fromkeys((name, _escaped(task_id), _legacy_name(task_id))):
        if _recorded_id(tasks / candidate) == mine:
            return candidate
    claimed = _recorded_id(tasks / name)
    if claimed is not None and claimed != mine:
        return _escaped(task_id)
    return name


def _recorded_id(root: Path) -> bytes | None:
    """The exact id a task folder records; None if there is none (no folder, or not yet)."""
    try:
        return (root / TASK_ID_FILE).read_bytes()
    except OSError:
        return None


QUOTA_LOCK_FILE = "quota.lock"
APPEND_LOCK_FILE = "append.lock"
LOCKS_DIR = "locks"
OPEN_LOCK_SUFFIX = ".open"
CLOCK_SLACK_SECONDS = 1.0
"""File times come from the kernel's coarse clock, a few ms behind time.time(): a file
written just after a payload was recorded may carry a time just before it."""


@contextmanager
def exclusive(lock_file: Path) -> Iterator[None]:
    """Hold an exclusive lock on lock_file (created if missing): one holder at a time,
    across processes and threads alike; another waits."""
    lock_file.parent.mkdir(parents=True, exist_ok=True)
    with open(lock_file, "a+b") as lock:
        fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(lock.fileno(), fcntl.LOCK_UN)


class Hold(Protocol):
    """What holds a task open until released (OpenHold here; a host's, on a cluster)."""

    def release(self) -> None: ...


class OpenHold:
    """A shared lock on a task's open lock, held for as long as a harness has the task open.
    The kernel lets it go when a process dies, so a crashed worker never keeps a task open.

    The lock is taken before the task's folders are made: a remover holding it exclusively
    (unless_open) finishes deleting them before an opener makes them again.
    """

    def __init__(self, storage: TaskStorage, prepare: Callable[[], None]) -> None:
        """prepare makes the task's folders, once the lock is held."""
        fd = _open_lock(storage)
        try:
            fcntl.flock(fd, fcntl.LOCK_SH)
            prepare()
        except BaseException:
            os.close(fd)
            raise
        self._fd: int | None = fd

    def release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None


@contextmanager
def unless_open(storage: TaskStorage) -> Iterator[bool]:
    """True while no process has the task open, and none can open it until the block ends;
    False (at once, without waiting) while one has it open. For what removes a task's
    sandbox or storage behind its users' backs: garbage collection, and the last close."""
    fd = _open_lock(storage)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            yield False
            return
        yield True
    finally:
        os.close(fd)


def _open_lock(storage: TaskStorage) -> int:
    try:
        storage.open_lock.parent.mkdir(parents=True, exist_ok=True)
        return os.open(storage.open_lock, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    except OSError as e:
        raise StorageError(
            f"cannot open the task's lock {storage.open_lock}: {e.strerror}; "
            "check --home / SPILLBOX_HOME points to a writable folder"
        ) from e


def _stems(folder: Path) -> frozenset[str]:
    """The artifact ids of the payload files in folder (c1.json -> c1), by their names
    alone: names() reads each file's metadata to order them (3,000 files: 8.8 ms against
    1.8 here)."""
    try:
        with os.scandir(folder) as entries:
            return frozenset(
                entry.name.rsplit(".", 1)[0]
                for entry in entries
                if entry.is_file(follow_symlinks=False)
            )
    except (FileNotFoundError, NotADirectoryError):
        return frozenset()  # no payload yet


def _write(fd: int, data: bytes) -> None:
    """Write data to fd (closing it, mode 0644)."""
    with os.fdopen(fd, "wb") as out:
        os.fchmod(out.fileno(), 0o644)
        out.write(data)


@dataclass(frozen=True)
class StoredFile:
    """A payload file now visible in the task's offload folder."""

    name: str
    """File name inside offload/, e.g. "c1.json"; its stem is the artifact id."""
    host_path: Path
    sha256: str
    bytes: int

    @property
    def artifact_id(self) -> str:
        return self.name.rsplit(".", 1)[0]


@dataclass(frozen=True)
class Staged:
    """A payload complete in incoming/ and hashed, not yet visible in offload/."""

    storage: TaskStorage
    temp: str
    sha256: str
    bytes: int

    def publish(
        self, stem: str, extension: str, reserved: Callable[[str], bool] = lambda _: False
    ) -> StoredFile:
        """Link the payload into offload/ as <stem>.<ext>, or <stem>-2.<ext>... if that name
        exists or its stem is reserved.

        A stem is taken under any extension: it is the artifact id, whose catalog row a
        second c1.txt beside c1.json would replace, leaving c1.json unrecorded. reserved
        must know the stems of the files published since this storage object first
        published: an offload's is the catalog, which knows every id it gave (a
        tombstone's too), and a write without one asks the folder's listing (write). The
        files there before are listed once (found_stems): a crashed offload's file, which
        has no row, is among them until gc removes it. The folder is not listed for each
        payload: at 2,000 payloads a listing and its scan took over 1 ms of each offload."""
        storage = self.storage
        n = 1
        with storage.errors(f"payload {stem!r}"):
            found = storage.found_stems()
            while True:
                free = stem if n == 1 else f"{stem}-{n}"
                n += 1
                if free in found or reserved(free):
                    continue
                name = f"{free}.{extension}"
                try:
                    os.link(self.temp, storage.offload / name)
                    break
                except FileExistsError:
                    continue
        storage.published.append(name)
        return StoredFile(name, storage.offload / name, self.sha256, self.bytes)


class TaskStorage:
    """The folders of one task under the spillbox home.

    >>> storage = TaskStorage(Path("/tmp/spillbox-doc"), "t1")
    >>> stored = storage.write("c1", "json", b"[1, 2]")
    >>> stored.name, stored.bytes
    ('c1.json', 6)
    """

    def __init__(self, home: Path, task_id: str) -> None:
        self.task_id = task_id
        self.name = task_folder_name(home, task_id)
        """The task's own name on the host: its folder's, its lock's, its container's."""
        self.root = home / TASKS_DIR / self.name
        self.offload = self.root / OFFLOAD_DIR
        self.work = self.root / WORK_DIR
        self.cache = self.root / CACHE_DIR
        self.incoming = self.root / INCOMING_DIR
        self.open_lock = home / LOCKS_DIR / f"{self.name}{OPEN_LOCK_SUFFIX}"
        """Held shared by every harness that has the task open (see OpenHold)."""
        self.published: list[str] = []
        """The payload files published through this object since take_published."""
        self._found: frozenset[str] | None = None

    def ensure(self) -> None:
        """Create the task's folders; the original task id is kept beside them."""
        with _os_errors(
            f"cannot create task storage at {self.root}",
            "check --home / SPILLBOX_HOME points to a writable folder",
        ):
            lay_out(self.root)
            id_file = self.root / TASK_ID_FILE
            if not id_file.exists():
                # Bytes, not text: text mode would turn "\r" into "\n" on reading back.
                id_file.write_bytes(encode_id(self.task_id))

    def take_over(self, folder: Path) -> bool:
        """Make a folder laid out ahead of the task (a warm pool slot's, by lay_out) the
        task's root, with the task's id written in first: one rename, so no reader sees
        half a root. False, the folder left as it was, if the task has a root already."""
        id_file = folder / TASK_ID_FILE
        try:
            self.root.parent.mkdir(parents=True, exist_ok=True)
            id_file.write_bytes(encode_id(self.task_id))
            os.rename(folder, self.root)  # refused over a root with anything in it
        except OSError:
            id_file.unlink(missing_ok=True)
            return False
        return True

    def open_hold(self, prepare: Callable[[], None]) -> Hold:
        """Hold the task open (see OpenHold); prepare makes its folders once held."""
        return OpenHold(self, prepare)

    def unless_open(self) -> AbstractContextManager[bool]:
        """See unless_open: True while no process has the task open."""
        return unless_open(self)

    def swap_sandbox_start(self, start: str) -> str | None:
        """Record the sandbox the task's calls run in now; return the one recorded before
        (None: no call yet). Kept on the host, so a restart between two calls made by
        different processes (the CLI's) is seen too."""
        mark = self.root / SANDBOX_START_FILE
        try:
            before = mark.read_text("utf-8")
        except OSError:
            before = None
        if before != start:
            tmp = mark.with_name(f".{SANDBOX_START_FILE}.{os.getpid()}.{threading.get_ident()}")
            try:
                tmp.write_text(start, "utf-8")
                os.replace(tmp, mark)  # whole or not at all: a reader never sees half of it
            except OSError:  # not recorded (a full disk): the next call may note it again
                tmp.unlink(missing_ok=True)
        return before

    def locked(self) -> AbstractContextManager[None]:
        """The task's lock, for what must not interleave across processes (quota decisions)."""
        return exclusive(self.root / QUOTA_LOCK_FILE)

    def appending(self) -> AbstractContextManager[None]:
        """The task's append lock: one append to its appendable payloads at a time, across
        processes (taken before the quota lock, never while holding it)."""
        return exclusive(self.root / APPEND_LOCK_FILE)

    def append(self, name: str, at: int, data: bytes) -> None:
        """Write data into offload/<name> from byte `at` on (the size its catalog row
        records), leaving the bytes before it as they are: only the new bytes are written.

        Bytes past `at` are an append that failed before its row recorded it: written over,
        and cut off where this append ends. A reader of the file itself may find an append
        in progress (the kernel shows a write page by page); one that reads the size the
        catalog records (Task.read, the sandbox's SQL tables) never does.
        """
        missing = StorageError(f"no payload {name!r} in task {self.task_id!r} to append to")
        if "/" in name or name.startswith("."):
            raise missing
        with self.errors(f"{len(data)} bytes appended to {name!r}"):
            try:
                fd = os.open(self.offload / name, os.O_WRONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
            except OSError as e:
                if e.errno in (errno.ENOENT, errno.ELOOP):  # deleted, or a link planted
                    raise missing from e
                raise
            try:
                if not stat.S_ISREG(os.fstat(fd).st_mode):
                    raise missing
                view = memoryview(data)
                while view:
                    view = view[os.pwrite(fd, view, at + len(data) - len(view)) :]
                os.ftruncate(fd, at + len(data))
            finally:
                os.close(fd)

    def write(self, stem: str, extension: str, data: bytes) -> StoredFile:
        """Write data under offload/<stem>.<ext>, or <stem>-2.<ext>... if that stem is
        taken under any extension."""
        taken = _stems(self.offload)
        with self.stage(data) as staged:
            return staged.publish(stem, extension, reserved=taken.__contains__)

    def found_stems(self) -> frozenset[str]:
        """The stems of the payload files in the folder when this object first asked."""
        if self._found is None:
            self._found = _stems(self.offload)
        return self._found

    def take_published(self) -> list[str]:
        """The payload files published through this object since the last call (what a
        sandbox may load ahead of its first query)."""
        published, self.published = self.published, []
        return published

    @contextmanager
    def stage(
        self, data: bytes, want: tuple[str, str] | None = None, digest: Digest | None = None
    ) -> Iterator[Staged]:
        """Write data to a temp file in incoming/ and hash it; publish() makes it visible.

        A reader (or a crash) never sees half a payload, and an existing file is never
        replaced. What is not published is gone when the block ends. want: the stem and
        extension publish() will most likely be given (a cluster host links the payload
        under it ahead, saving a round trip; here publishing costs none). digest: data's,
        begun already (the gate's); if None, or of other bytes, it is begun here.
        """
        digest = Digest.of(data, digest)
        if not self.incoming.is_dir():
            self.ensure()
        what = f"a payload of {len(data)} bytes"
        with self.errors(what):
            fd, tmp = tempfile.mkstemp(dir=self.incoming, prefix="payload-")
        try:
            with self.errors(what):
                _write(fd, data)
            yield Staged(self, tmp, digest.hexdigest(), len(data))
        finally:
            os.unlink(tmp)

    def errors(self, what: str) -> AbstractContextManager[None]:
        """OSErrors while storing what: one line that says what to do."""
        return _os_errors(
            f"cannot store {what} in {self.offload}", "free disk space or choose another --home"
        )

    def read(self, name: str) -> bytes:
        """The bytes of offload/<name>; refuses names that are not plain files there."""
        path = self.offload / name
        if "/" in name or name.startswith(".") or not path.is_file() or path.is_symlink():
            raise StorageError(f"no payload {name!r} in task {self.task_id!r}")
        return path.read_bytes()

    def remove(self, name: str) -> None:
        """Delete offload/<name> if it is there (never following a link)."""
        path = self.offload / name
        if "/" not in name and (path.is_file() or path.is_symlink()):
            path.unlink()

    def remove_derived(self, sha256: str, size: int, since: float) -> int:
        """Delete the regular files in work/ that may hold a payload: exact copies of its
        bytes, and every file changed since `since` (its creation less CLOCK_SLACK_SECONDS,
        which the caller subtracts), for a script may have converted it (Parquet, CSV, an
        extract) and nothing tells which payload a script read. Scratch a script wrote
        meanwhile goes too: deletion errs on the side of deleting.

        The change time (ctime) is used, which no script can set back. work/ is writable
        by hostile code, which may swap a folder for a symlink at any moment: every step
        goes through file descriptors of folders already opened (os.fwalk without following
        links), so nothing outside work/ is read or deleted.
        """
        removed = 0
        if not self.work.is_dir():
            return removed
        for _, _, files, folder in os.fwalk(self.work, follow_symlinks=False):
            for name in files:
                try:
                    info = os.stat(name, dir_fd=folder, follow_symlinks=False)
                    if not stat.S_ISREG(info.st_mode):
                        continue
                    if info.st_ctime >= since or _is_copy(name, folder, info, sha256, size):
                        os.unlink(name, dir_fd=folder)
                        removed += 1
                except OSError:
                    continue  # changed or gone under us
        return removed

    def clear_cache(self) -> None:
        """Delete every derived copy (query-engine tables) of the task's payloads."""
        if self.cache.is_dir():
            with os.scandir(self.cache) as entries:
                for entry in entries:
                    if entry.is_dir(follow_symlinks=False):
                        shutil.rmtree(entry.path)
                    else:
                        os.unlink(entry.path)

    def names(self) -> list[str]:
        """The payload files of the task, oldest first."""
        if not self.offload.is_dir():
            return []
        found: list[tuple[int, str]] = []
        with os.scandir(self.offload) as entries:
            for entry in entries:
                try:
                    if entry.is_file(follow_symlinks=False):
                        found.append((entry.stat(follow_symlinks=False).st_mtime_ns, entry.name))
                except FileNotFoundError:
                    continue  # deleted meanwhile
        return [name for _, name in sorted(found)]

    def destroy(self) -> None:
        """Delete all of the task's storage. rmtree never follows symlinks a script planted."""
        if self.root.exists():
            shutil.rmtree(self.root)


def write_new(target: Path, data: bytes) -> None:
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


def _is_copy(name: str, folder: int, info: os.stat_result, sha256: str, size: int) -> bool:
    """Whether folder/name, a regular file as info found it, holds exactly these bytes."""
    if info.st_size != size:
        return False
    fd = os.open(name, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK, dir_fd=folder)
    with os.fdopen(fd, "rb") as f:
        opened = os.fstat(f.fileno())
        if (opened.st_dev, opened.st_ino) != (info.st_dev, info.st_ino):
            return False
        digest = hashlib.sha256()
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest() == sha256


def stored_task_ids(home: Path) -> list[str]:
    """The ids of every task with storage under home."""
    tasks = home / TASKS_DIR
    if not tasks.is_dir():
        return []
    ids = []
    for root in sorted(tasks.iterdir()):
        id_file = root / TASK_ID_FILE
        if root.is_dir() and id_file.is_file() and not id_file.is_symlink():
            ids.append(id_file.read_bytes().decode("utf-8", "surrogatepass"))
    return ids


@contextmanager
def _os_errors(doing: str, hint: str) -> Iterator[None]:
    """An OSError as one StorageError line: what failed, the system's reason, what to do."""
    try:
        yield
    except OSError as e:
        raise StorageError(f"{doing}: {e.strerror}; {hint}") from e
