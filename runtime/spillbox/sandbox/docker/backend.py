"""The Docker backend: each task's container, its lifecycle and its calls.

Which containers are a task's (by their labels, or the warm pool slot its folder records),
and how they are made and swept, is labelled.py's; what a process holds for one task
between calls (its container, the kept channels into its runners, background start) is
that task's TaskSandbox (sandbox.py). This module keeps one per task and hands each call
to it.
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from functools import partial
from pathlib import Path
from typing import Any

import docker

import spillbox.sandbox.docker.containers as containers
import spillbox.sandbox.docker.pool as pool
from spillbox.config import DEFAULT_POOL_SIZE
from spillbox.errors import ExecError
from spillbox.langs import LANGS
from spillbox.sandbox.base import SandboxBackend
from spillbox.sandbox.docker.containers import LABEL_SLOT, LABEL_TASK, SandboxOptions
from spillbox.sandbox.docker.forgetting import forget_in
from spillbox.sandbox.docker.labelled import HomeContainers
from spillbox.sandbox.docker.layout import OFFLOAD_MOUNT
from spillbox.sandbox.docker.pool import WarmPool
from spillbox.sandbox.docker.sandbox import TaskSandbox
from spillbox.sandbox.docker_errors import docker_errors, translated
from spillbox.sandbox.storage import StoredFile, TaskStorage
from spillbox.types import ExecRequest, RawExec

MAX_CODE_BYTES = 256 * 1024
STOP_SECONDS = 2
"""How long a stopped task's processes get after SIGTERM (tini passes it on) before KILL."""


def connect() -> docker.DockerClient:
    """A client for the local engine, or a SandboxError that says how to start one."""
    with translated(
        lambda _said: (
            "Docker is not running (no engine answered): start it, e.g. "
            "`sudo systemctl start docker`, or run scripts/ensure-docker.sh as root"
        )
    ):
        client = docker.from_env(timeout=120)
        client.ping()
    return client


class DockerBackend(SandboxBackend):
    """One hardened container per task, found again by its labels (or the warm pool slot
    its folder records) after a restart (labelled.py); what this process holds for each
    task is its TaskSandbox."""

    kind = "docker"
    languages = LANGS

    def __init__(
        self,
        home: Path,
        options: SandboxOptions | None = None,
        pool_size: int = DEFAULT_POOL_SIZE,
    ) -> None:
        super().__init__(home)
        self.options = options or SandboxOptions()
        self._client: docker.DockerClient | None = None
        self.containers = HomeContainers(home, self.options, lambda: self.client)
        self._sandboxes: dict[str, TaskSandbox] = {}
        self._lock = threading.Lock()
        self.pool = WarmPool(
            home,
            pool_size,
            lambda name, folder: self.containers.make_slot(self.pool.id, name, folder),
            lambda: self.client,
            sweep=lambda: pool.sweep_dead(home, self.containers.listed({}), False),
        )

    @property
    def client(self) -> docker.DockerClient:
        if self._client is None:
            self._client = connect()
        return self._client

    def container_name(self, storage: TaskStorage) -> str:
        return self.containers.name(storage)

    def create(self, storage: TaskStorage) -> None:
        """Prepare the task's storage (closed to the host's other users); a new task takes
        a ready slot of the warm pool, if there is one, whose folder is laid out already."""
        if not storage.root.exists() and self._adopt(storage):
            return
        storage.ensure()
        # No other user of the host reaches the payloads (a home under /tmp is everyone's):
        # the task's folder is its owner's alone. The container needs no way through it (its
        # mounts start below it).
        os.chmod(storage.root, 0o700)
        containers.prepare_mounts(storage.offload, storage.cache)

    def _adopt(self, storage: TaskStorage) -> bool:
        """Give a new task a ready slot; False if none is ready, or the task has a folder
        already (made by another process since: the slot goes back to the pool)."""
        slot = self.pool.take()
        if slot is None:
            return False
        if not pool.adopt(slot, storage):
            self.pool.put_back(slot)
            return False
        self.sandbox(storage).adopt(slot.container, slot.scripts, slot.cells)
        return True

    def sandbox(self, storage: TaskStorage) -> TaskSandbox:
        """The task's TaskSandbox, made on first use."""
        with self._lock:
            sandbox = self._sandboxes.get(storage.task_id)
            if sandbox is None:
                sandbox = self._sandboxes[storage.task_id] = TaskSandbox(
                    storage.task_id,
                    client=lambda: self.client,
                    provide=partial(self.containers.find_or_create, storage),
                    max_output_bytes=self.options.max_output_bytes,
                    swap_start=storage.swap_sandbox_start,
                )
        return sandbox

    def warm(self, storage: TaskStorage, published: Sequence[str] | None = None) -> None:
        """Start (or find) the task's container in the background, and have its SQL engine
        load the tables of payloads offloaded since (not under gVisor); idempotent."""
        sandbox = self.sandbox(storage)
        # Under gVisor (this machine's runsc, 2022-12-19) a sandbox whose SQL engine started
        # while a script ran died in 3 of 4 runs of test_file_commands' coreutils script:
        # there the tables load at their first query, as before the background load.
        if not self.options.gvisor:
            sandbox.tables.request(storage.offload, published)
        sandbox.warm()

    def container(self, storage: TaskStorage) -> Any:
        """The task's running container: found by label, started, or created."""
        return self.sandbox(storage).container()

    def visible_path(self, stored: StoredFile) -> str:
        return f"{OFFLOAD_MOUNT}/{stored.name}"

    def exec(self, storage: TaskStorage, request: ExecRequest) -> RawExec:
        if len(request.code.encode("utf-8", "surrogatepass")) > MAX_CODE_BYTES:
            raise ExecError(f"script is over {MAX_CODE_BYTES} bytes: write it shorter")
        return self.sandbox(storage).exec(request)

    def release(self, storage: TaskStorage) -> None:
        """Let go of the task's TaskSandbox: its SQL engine, the kept relays, the background
        start. A long-lived process (`mcp proxy --listen`) closes many tasks."""
        with self._lock:
            sandbox = self._sandboxes.pop(storage.task_id, None)
        if sandbox is not None:
            sandbox.close()

    def stop_sandbox(self, storage: TaskStorage) -> None:
        """Stop the task's container (it keeps its labels: gc removes it with the task, and
        a task opened again starts it); a pool slot's is removed, never used again. Its
        tmpfs folders and session go with the stop."""
        self.release(storage)
        with docker_errors(f"stopping the container of task {storage.task_id!r}"):
            for container in self.task_containers(storage):
                if LABEL_SLOT in container.labels:
                    container.remove(force=True, v=True)
                elif container.status == "running":
                    container.stop(timeout=STOP_SECONDS)

    def close(self) -> None:
        self.pool.close()
        with self._lock:
            sandboxes = list(self._sandboxes.values())
        for sandbox in sandboxes:
            sandbox.close()
        if self._client is not None:
            self._client.close()
            self._client = None

    def destroy_sandbox(self, storage: TaskStorage) -> None:
        self.release(storage)
        with docker_errors(f"removing the container of task {storage.task_id!r}"):
            for container in self.task_containers(storage):
                container.remove(force=True, v=True)

    def forget_derived(self, storage: TaskStorage, sha256: str, size: int, since: float) -> None:
        """Stop every SQL engine of the task, then forget what its scripts and session made
        of the payload (forgetting.py), then the engine's tables."""
        with self._lock:
            sandbox = self._sandboxes.get(storage.task_id)
        if sandbox is not None:
            sandbox.forget()  # its engine and the relays into a fork server about to go
        with docker_errors("deleting what a payload left in its sandbox"):
            for container in self.task_containers(storage):
                if container.status == "running":  # a stopped one's tmpfs folders are gone
                    forget_in(container, self.client, sha256, size, since)
        storage.clear_cache()

    def sweep(
        self, unused: Callable[[str], AbstractContextManager[bool]], dry_run: bool
    ) -> list[str]:
        return self.containers.sweep(unused, map(self.storage, super().list()), dry_run)

    def task_containers(self, storage: TaskStorage) -> list[Any]:
        """The task's containers: its own (by label) and the pool slot it adopted."""
        return self.containers.of_task(storage)

    def alive(self) -> int:
        with docker_errors("listing containers"):
            return sum(c.status == "running" for c in self.containers.listed({}))

    def list(self) -> list[str]:
        with docker_errors("listing containers"):
            listed = self.containers.listed({})
        running = {c.labels[LABEL_TASK] for c in listed if LABEL_TASK in c.labels}
        return sorted(running | set(super().list()))  # an adopted slot's task has storage


def cleanup_home(home: Path) -> None:
    """Remove every container made for a home, and all task storage (tests use this)."""
    backend = DockerBackend(home)
    try:
        with docker_errors("cleaning up"):
            for container in backend.containers.listed({}):
                container.remove(force=True, v=True)
        for task_id in backend.list():
            backend.storage(task_id).destroy()
    finally:
        backend.close()
