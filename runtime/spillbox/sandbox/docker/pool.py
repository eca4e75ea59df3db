"""The warm pool: sandboxes started before any task asks, each given to one task only.

A slot is a container made with the very settings of a task's own (containers.py), but with
no task's identity: labelled with its slot and the pool that made it (one pool per harness),
bind-mounting the offload and cache folders of home/slots/<slot>/, a folder laid out as a
task's root is (storage.lay_out) and recording its slot (RECORD_FILE). Its fork server and
Python session are started and a relay into each kept, so a task's first script and first
cell take the fast path. The session is the task's alone: a slot goes to one task only.

A task opened new takes a ready slot (adopt): the slot's folder becomes the task's root in
one rename (TaskStorage.take_over), refused if the task has a root already (the slot then
goes back to the pool, untouched). A bind mount follows its folder, so the container now
shows the task's folders, and every path on the host (payloads, quota, deletion) is the
task's. The record finds the container again after a restart; a slot whose folder is still
under home/slots/ was never adopted. A slot is never given back once adopted: the task's
last close removes it.

Each pool holds home/pools/<pool>.lock while it lives (the kernel lets go of it when the
process dies): the slots no task took of a pool whose lock is free are swept by the next
pool's start and by gc.
"""

from __future__ import annotations

import fcntl
import os
import secrets
import shutil
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import Any

import docker

import spillbox.sandbox.docker.wire as wire
from spillbox.sandbox.docker.channels import Channel, ScriptChannel, SessionChannel
from spillbox.sandbox.docker.containers import LABEL_POOL, LABEL_SLOT, prepare_mounts
from spillbox.sandbox.docker_errors import best_effort
from spillbox.sandbox.storage import CACHE_DIR, OFFLOAD_DIR, TaskStorage, lay_out

SLOTS_DIR = "slots"
POOLS_DIR = "pools"
RECORD_FILE = "slot"
"""In a task's folder: the slot it adopted."""
WARM_SECONDS = 120.0
"""How long a new slot's fork server may take to run its first script, and its session to
start (it imports duckdb, pyarrow and jq: seconds on a loaded machine)."""
REFILL_PAUSE_SECONDS = 1.0
"""How long a refill waits after a take: a container start competing for the cores would
slow the first steps of the task that took the slot several times over."""
RETRY_SECONDS = 5.0
"""The pause after a slot failed to start, before the next try."""


@dataclass
class Slot:
    """A ready sandbox of the pool: its container and the relays into its fork server and
    its Python session, both serving."""

    name: str
    folder: Path
    container: Any
    scripts: ScriptChannel
    cells: SessionChannel


class WarmPool:
    """Keeps `size` ready slots, refilled in a background thread that starts at the first
    take() (a harness that opens no task starts no container).

    >>> pool = WarmPool(home, 2, make=make_slot_container, client=lambda: client)  # doctest: +SKIP
    >>> slot = pool.take()  # None until one is ready  # doctest: +SKIP
    """

    def __init__(
        self,
        home: Path,
        size: int,
        make: Callable[[str, Path], Any],
        client: Callable[[], docker.DockerClient],
        sweep: Callable[[], object] = lambda: None,
    ) -> None:
        self.id = secrets.token_hex(6)
        self.size = size
        self.home = home
        self._make = make
        """Creates and starts the slot's container over its folder (the backend's job)."""
        self._client = client
        self._sweep = sweep
        """Removes the slots of pools that are gone (sweep_dead), before the first refill."""
        self._ready: list[Slot] = []
        self._lock = threading.Lock()
        self._filled = threading.Condition(self._lock)
        self._wake = threading.Event()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self._alive: int | None = None
        self._made = 0
        self._taken_at = 0.0

    def take(self) -> Slot | None:
        """A ready slot, now the caller's alone; None if none is ready yet."""
        if self.size <= 0:
            return None
        with self._lock:
            self._start()
            slot = self._ready.pop() if self._ready else None
            self._taken_at = time.monotonic()
        self._wake.set()
        return slot

    def fill(self, timeout: float) -> bool:
        """Start filling now, and wait until the pool is full (True) or timeout passed."""
        with self._lock:
            self._start()
            return self._filled.wait_for(lambda: len(self._ready) >= self.size, timeout)

    def resize(self, size: int) -> None:
        """Keep `size` ready slots from now on (0: none); the ready ones past it go."""
        with self._lock:
            self.size = max(size, 0)
            extra, self._ready = self._ready[self.size :], self._ready[: self.size]
        self._wake.set()
        for slot in extra:
            discard(slot)

    def _start(self) -> None:
        """Start the refills (under _lock), once."""
        if self._thread is None and self.size > 0 and not self._stop.is_set():
            self._alive = _hold(self.home, self.id)
            self._thread = threading.Thread(target=self._fill, daemon=True)
            self._thread.start()

    def put_back(self, slot: Slot) -> None:
        """Return a slot no task used (its adoption was refused), unless the pool is full."""
        with self._lock:
            if not self._stop.is_set() and len(self._ready) < self.size:
                self._ready.append(slot)
                self._filled.notify_all()
                return
        discard(slot)

    def close(self) -> None:
        """Stop the refills and remove every slot no task took."""
        self._stop.set()
        self._wake.set()
        if self._thread is not None:
            self._thread.join()
        with self._lock:
            slots, self._ready = self._ready, []
        for slot in slots:
            discard(slot)
        if self._alive is not None:
            os.close(self._alive)
            self._alive = None
            (self.home / POOLS_DIR / f"{self.id}.lock").unlink(missing_ok=True)

    def _fill(self) -> None:
        best_effort(self._sweep, None)  # gc sweeps them too, and reports what it could not
        while not self._stop.is_set():
            with self._lock:
                short = len(self._ready) < self.size
            if not short:
                self._wake.wait()
                self._wake.clear()
                continue
            pause = self._taken_at + REFILL_PAUSE_SECONDS - time.monotonic()
            if pause > 0:
                if self._stop.wait(pause):
                    return
                continue  # taken again, or resized, meanwhile: look again
            try:
                slot = self._new_slot()
            except Exception:  # noqa: BLE001 - a failed refill must not kill the harness
                self._stop.wait(RETRY_SECONDS)  # tasks meanwhile start their own containers
                continue
            if slot is not None:
                self.put_back(slot)

    def _new_slot(self) -> Slot | None:
        self._made += 1
        name = f"{self.id}-{self._made}"
        folder = self.home / SLOTS_DIR / name
        lay_out(folder)
        (folder / RECORD_FILE).write_text(name)
        os.chmod(folder, 0o700)
        prepare_mounts(folder / OFFLOAD_DIR, folder / CACHE_DIR)
        container = self._make(name, folder)
        client = self._client()
        scripts = cells = None
        try:
            scripts = ScriptChannel(client, container)
            cells = SessionChannel(client, container)
            # The fork server first: a slot serves scripts even while its session starts.
            ready = _answered(scripts, SCRIPT_WARMUP) and _answered(cells, PREPARE)
            if self._stop.is_set() or not ready:
                _remove(container, folder, scripts, cells)
                return None
            container.reload()  # as it runs now: the first cell reads its start from it
        except BaseException:
            _remove(container, folder, scripts, cells)
            raise
        return Slot(name, folder, container, scripts, cells)


SCRIPT_WARMUP = {"lang": "sh", "code": "true", "timeout": WARM_SECONDS, "nonce": "warm"}
"""Run through the relay (which starts the fork server)."""
PREPARE = {"mode": "prepare"}
"""Starts the session server (session.py), with nothing in it."""


def _answered(channel: Channel, request: dict[str, Any]) -> bool:
    """Ask the channel once; True once the answer ended."""
    give_up_at = time.monotonic() + WARM_SECONDS
    return any(kind == wire.END for kind, _ in channel.ask(request, give_up_at))


def discard(slot: Slot) -> None:
    _remove(slot.container, slot.folder, slot.scripts, slot.cells)


def _remove(container: Any, folder: Path, *channels: Channel | None) -> None:
    for channel in channels:
        if channel is not None:
            channel.close()
    best_effort(partial(container.remove, force=True, v=True), None)
    shutil.rmtree(folder, ignore_errors=True)


def adopt(slot: Slot, storage: TaskStorage) -> bool:
    """Make the slot's folder the task's root (see the module's docstring); False if the
    task has one already: the slot is untouched, and goes back to the pool."""
    return storage.take_over(slot.folder)


def adopted(home: Path, storage: TaskStorage) -> str | None:
    """The slot whose container is the task's: recorded, and adopted to the end."""
    try:
        slot = (storage.root / RECORD_FILE).read_text()
    except OSError:
        return None
    # Empty: the task's own container, made when no slot was adopted.
    return None if not slot or (home / SLOTS_DIR / slot).exists() else slot


def slot_tasks(home: Path, storages: Iterable[TaskStorage]) -> dict[str, str]:
    """Each adopted slot's task, of these tasks."""
    return {
        slot: storage.task_id
        for storage in storages
        if (slot := adopted(home, storage)) is not None
    }


def sweep_dead(home: Path, containers: list[Any], dry_run: bool) -> list[str]:
    """Remove the slots no task took of every pool that is gone (and their folders and
    locks); the adopted ones are their tasks' containers. Returns what went."""
    removed = []
    for container in containers:
        slot, pool = container.labels.get(LABEL_SLOT), container.labels.get(LABEL_POOL, "")
        if slot and (home / SLOTS_DIR / slot).exists() and not _is_alive(home, pool):
            removed.append(f"{container.name} (unused slot of pool {pool})")
            if not dry_run:
                best_effort(partial(container.remove, force=True, v=True), None)
    if dry_run:
        return removed
    for folder in _entries(home / SLOTS_DIR):
        if not _is_alive(home, folder.name.rsplit("-", 1)[0]):
            shutil.rmtree(folder, ignore_errors=True)
    for lock in _entries(home / POOLS_DIR):
        if not _is_alive(home, lock.stem):
            lock.unlink(missing_ok=True)
    return removed


def _entries(folder: Path) -> list[Path]:
    return sorted(folder.iterdir()) if folder.is_dir() else []


def _hold(home: Path, pool: str) -> int:
    """Take the pool's lock for as long as the pool lives."""
    (home / POOLS_DIR).mkdir(parents=True, exist_ok=True)
    fd = os.open(home / POOLS_DIR / f"{pool}.lock", os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    fcntl.flock(fd, fcntl.LOCK_EX)
    return fd


def _is_alive(home: Path, pool: str) -> bool:
    """Whether the pool's process still holds its lock."""
    try:
        fd = os.open(home / POOLS_DIR / f"{pool}.lock", os.O_RDWR | os.O_CLOEXEC)
    except OSError:
        return False
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        return False
    except BlockingIOError:
        return True
    finally:
        os.close(fd)
