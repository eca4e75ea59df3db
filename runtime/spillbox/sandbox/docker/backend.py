"""The Docker backend: finds, creates and removes each task's container, by its labels.

What a process holds for one task between calls (its container, engine connection,
background start, running scripts) is that task's TaskSandbox (session.py); this module
keeps one per task and hands each call to it.
"""

from __future__ import annotations

import getpass
import hashlib
import os
import threading
import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path
from typing import Any

import docker
from docker.types import LogConfig

from spillbox.errors import ExecError, SandboxError, retry
from spillbox.sandbox.base import SandboxBackend
from spillbox.sandbox.docker.engine import kill_engines
from spillbox.sandbox.docker.layout import (
    CACHE_MOUNT,
    ENGINE_UID,
    ENGINE_USER,
    FORGET_SCRIPT,
    OFFLOAD_MOUNT,
    OUTPUTS_MOUNT,
    RUN_MOUNT,
    SANDBOX_GID,
    SCRIPT_UID,
    SCRIPT_USER,
    SESSION_UID,
    SESSION_USER,
    WORK_MOUNT,
)
from spillbox.sandbox.docker.session import TaskSandbox
from spillbox.sandbox.docker.state import state, stopped_under
from spillbox.sandbox.docker_errors import (
    DOCKER_FAILURES,
    Fault,
    docker_errors,
    fault_of,
    translated,
    unless_gone,
)
from spillbox.sandbox.image import ensure_image, image_tag
from spillbox.sandbox.storage import StoredFile, TaskStorage
from spillbox.types import LANGS, RawExec, SessionCall

LABEL_TASK = "spillbox.task"
LABEL_HOME = "spillbox.home"
LABEL_OWNER = "spillbox.owner"
LABEL_EXPIRES = "spillbox.expires"
LABEL_IMAGE = "spillbox.image-tag"

DEFAULT_MEMORY = "1g"
DEFAULT_PIDS = 256
DEFAULT_CPUS = 1.0
DEFAULT_TMP_SIZE = "64m"
DEFAULT_WORK_SIZE = "256m"
DEFAULT_OUTPUTS_SIZE = "64m"
RUN_SIZE = "16m"
"""Cap of /sandbox/run, where the Python session keeps its socket, lock and log."""
NO_IPC = {
    "kernel.shmmni": "0",
    "kernel.msgmni": "0",
    "kernel.sem": "0 0 0 0",
    "fs.mqueue.queues_max": "0",
}
"""The container's IPC limits: no System V shared memory, message queue or semaphore set,
and no POSIX message queue (POSIX shared memory and semaphores are files in /dev/shm)."""
DEFAULT_EXPIRY = timedelta(days=7)
DEFAULT_MAX_OUTPUT_BYTES = 32 * 1024 * 1024
MAX_CODE_BYTES = 256 * 1024
CREATE_ATTEMPTS = 5
FORGET_ATTEMPTS = 5
"""Runs of forget.py per uid before a deletion fails (each killed by another's start)."""
REMOVAL_SECONDS = 30.0
"""How long a container that is being removed may take to go, before a new one replaces it."""
STOP_SECONDS = 2
"""How long a stopped task's processes get after SIGTERM (tini passes it on) before KILL."""


@dataclass(frozen=True)
class SandboxOptions:
    """How a task's container is confined. Every relaxation is an explicit field.

    >>> SandboxOptions(memory="2g").network
    False
    """

    network: bool = False
    """Give the container a network (default: none at all)."""
    read_only_root: bool = True
    """Mount the image's filesystem read-only; only /tmp, /sandbox/work, /sandbox/outputs and
    cache are writable (by scripts: the first three, each a size-capped tmpfs)."""
    memory: str = DEFAULT_MEMORY
    """Memory limit (swap included)."""
    pids: int = DEFAULT_PIDS
    """Most processes at once: a fork bomb stops here."""
    cpus: float = DEFAULT_CPUS
    tmp_size: str = DEFAULT_TMP_SIZE
    """Size cap of the /tmp tmpfs."""
    work_size: str = DEFAULT_WORK_SIZE
    """Size cap of /sandbox/work, a tmpfs: a write past it fails at once with ENOSPC. Its
    files live in the container's memory, so they also count against `memory`, and last as
    long as the container."""
    outputs_size: str = DEFAULT_OUTPUTS_SIZE
    """Size cap of /sandbox/outputs, a tmpfs: what a script leaves there is taken after each
    call (and becomes artifacts), so the cap bounds what one call can hand out."""
    runtime: str | None = None
    """An OCI runtime, e.g. "runsc" for gVisor where the engine has it."""
    max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES
    """stdout kept per exec; past it the head and a tail are kept, the middle dropped."""
    expiry: timedelta = DEFAULT_EXPIRY
    """Written on the container as a label, for garbage collection."""
    extra_labels: dict[str, str] = field(default_factory=dict)


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
    """One hardened container per task, found again by its labels after a restart."""

    kind = "docker"
    languages = LANGS

    def __init__(self, home: Path, options: SandboxOptions | None = None) -> None:
        super().__init__(home)
        self.options = options or SandboxOptions()
        self._client: docker.DockerClient | None = None
        self._home_label = str(home.resolve())
        self._sandboxes: dict[str, TaskSandbox] = {}
        self._lock = threading.Lock()

    @property
    def client(self) -> docker.DockerClient:
        if self._client is None:
            self._client = connect()
        return self._client

    def container_name(self, storage: TaskStorage) -> str:
        """The task's own container name (its folder's name, which no other task has); the
        container is found by its labels, which hold the exact task id."""
        home_digest = hashlib.sha256(self._home_label.encode()).hexdigest()[:8]
        return f"spillbox-{home_digest}-{storage.name}"

    def create(self, storage: TaskStorage) -> None:
        """Prepare the task's storage: for the engine's uid (scripts write only to tmpfs),
        and closed to the host's other users."""
        storage.ensure()
        # No other user of the host reaches the payloads (a home under /tmp is everyone's):
        # the task's folder is its owner's alone. The container needs no way through it (its
        # mounts start below it), only into offload/, which the sandbox's group may read.
        os.chmod(storage.root, 0o700)
        os.chown(storage.offload, -1, SANDBOX_GID)
        os.chmod(storage.offload, 0o750)
        os.chown(storage.cache, ENGINE_UID, SANDBOX_GID)
        os.chmod(storage.cache, 0o700)  # scripts can neither reach the engine nor its tables

    def sandbox(self, storage: TaskStorage) -> TaskSandbox:
        """The task's TaskSandbox, made on first use."""
        with self._lock:
            sandbox = self._sandboxes.get(storage.task_id)
            if sandbox is None:
                sandbox = self._sandboxes[storage.task_id] = TaskSandbox(
                    storage.task_id,
                    client=lambda: self.client,
                    provide=partial(self._find_or_create, storage),
                    max_output_bytes=self.options.max_output_bytes,
                )
        return sandbox

    def warm(self, storage: TaskStorage) -> None:
        """Start (or find) the task's container in the background; idempotent."""
        self.sandbox(storage).warm()

    def container(self, storage: TaskStorage) -> Any:
        """The task's running container: found by label, started, or created."""
        return self.sandbox(storage).container()

    def visible_path(self, stored: StoredFile) -> str:
        return f"{OFFLOAD_MOUNT}/{stored.name}"

    def exec(
        self,
        storage: TaskStorage,
        lang: str,
        code: str,
        timeout: float,
        session: SessionCall | None = None,
    ) -> RawExec:
        if len(code.encode("utf-8", "surrogatepass")) > MAX_CODE_BYTES:
            raise ExecError(f"script is over {MAX_CODE_BYTES} bytes: write it shorter")
        return self.sandbox(storage).exec(lang, code, timeout, session)

    def release(self, storage: TaskStorage) -> None:
        """Let go of the task's TaskSandbox: its SQL engine, the kept relays, the background
        start. A long-lived process (`mcp proxy --listen`) closes many tasks."""
        with self._lock:
            sandbox = self._sandboxes.pop(storage.task_id, None)
        if sandbox is not None:
            sandbox.close()

    def stop_sandbox(self, storage: TaskStorage) -> None:
        """Stop the task's container (it keeps its labels: gc removes it with the task, and
        a task opened again starts it). Its tmpfs folders and session go with the stop."""
        self.release(storage)
        with docker_errors(f"stopping the container of task {storage.task_id!r}"):
            for container in self._containers({LABEL_TASK: storage.task_id}):
                if container.status == "running":
                    container.stop(timeout=STOP_SECONDS)

    def close(self) -> None:
        with self._lock:
            sandboxes = list(self._sandboxes.values())
        for sandbox in sandboxes:
            sandbox.close()
        if self._client is not None:
            self._client.close()
            self._client = None

    def destroy_sandbox(self, storage: TaskStorage) -> None:
        with self._lock:
            sandbox = self._sandboxes.pop(storage.task_id, None)
        if sandbox is not None:
            sandbox.close()
        with docker_errors(f"removing the container of task {storage.task_id!r}"):
            for container in self._containers({LABEL_TASK: storage.task_id}):
                container.remove(force=True, v=True)

    def forget_derived(self, storage: TaskStorage, sha256: str, size: int, since: float) -> None:
        """Stop every SQL engine of the task (any process's: they hold the tables open),
        then, as the script uid and as the session uid, every process of that uid (a
        script, a cell, a fork server or session, one posing as them: any may hold the
        payload's bytes in memory) and delete what they may have made of the payload in
        every folder of the container they can write, and their IPC objects (forget.py:
        copies of its bytes, and everything changed since it was created); then the
        engine's tables. The next query starts an engine that reloads what is left, the
        next script a fork server from the image, the next session call a new, empty
        session (told that its names are gone)."""
        sandbox = self._held(storage.task_id)
        if sandbox is not None:
            sandbox.forget()  # its engine and the relays into a fork server about to go
        with docker_errors("deleting what a payload left in its sandbox"):
            for container in self._containers({LABEL_TASK: storage.task_id}):
                if container.status != "running":
                    continue  # a stopped container's tmpfs folders are gone with it
                kill_engines(container)
                try:
                    for role, user in (("scripts", SCRIPT_USER), ("session", SESSION_USER)):
                        self._forget_as(container, role, user, [f"{since:f}", sha256, str(size)])
                except DOCKER_FAILURES as failure:
                    # Stopped since it was listed: nothing is left to delete.
                    if not stopped_under(failure, container, self.client):
                        raise
        storage.clear_cache()

    def _forget_as(self, container: Any, role: str, user: str, args: list[str]) -> None:
        """Run forget.py as one uid until it says it is done (a deletion of the same task
        at once, or a fork server starting, may kill it: it then runs again)."""
        for _ in range(FORGET_ATTEMPTS):
            done = container.exec_run(["python3", FORGET_SCRIPT, role, *args], user=user)
            if done.exit_code == 0:
                return
        said = done.output.decode("utf-8", "replace").strip().splitlines()
        raise SandboxError(
            f"deleting what the {role} of task {container.labels.get(LABEL_TASK)!r} kept of a "
            f"payload did not finish ({said[-1] if said else f'exit {done.exit_code}'}): "
            "delete it again, or close the task with delete=True",
            retryable=True,
        )

    def sweep(
        self, unused: Callable[[str], AbstractContextManager[bool]], dry_run: bool
    ) -> list[str]:
        removed = []
        with docker_errors("sweeping containers"):
            for container in self._containers({}):
                task_id = container.labels.get(LABEL_TASK, "")
                with unused(task_id) as yes:
                    if not yes:
                        continue
                    removed.append(f"{container.name} (task {task_id})")
                    if not dry_run:
                        # Gone already: another collector got there first.
                        unless_gone(partial(container.remove, force=True, v=True), None)
        return removed

    def _held(self, task_id: str) -> TaskSandbox | None:
        with self._lock:
            return self._sandboxes.get(task_id)

    def _find_or_create(self, storage: TaskStorage) -> Any:
        """The task's running container: found by label (and started), or created."""
        with docker_errors(f"finding the container of task {storage.task_id!r}"):
            found = self._containers({LABEL_TASK: storage.task_id})
        tag = image_tag()
        for container in found:
            if container.labels.get(LABEL_IMAGE) != tag:
                # Built from an outdated image: payloads live on the host, so replace it.
                with docker_errors("removing an outdated container"):
                    container.remove(force=True)
                continue
            if container.status != "running" and not self._start(container):
                continue  # removed (by a collector, or from outside) as we started it
            return container
        ensure_image(self.client)
        return self._create_container(storage, tag)

    def _create_container(self, storage: TaskStorage, tag: str) -> Any:
        name = self.container_name(storage)
        run_options = self._run_options(storage, name, tag)

        def claim() -> Any:
            try:
                return self.client.containers.run(tag, **run_options)
            except DOCKER_FAILURES as failure:
                if fault_of(failure) is not Fault.CONFLICT:
                    raise
            # The name is taken: another process created it first (use theirs), or a
            # removal of the old one is still finishing (try again).
            container = unless_gone(partial(self.client.containers.get, name), None)
            if container is None:
                time.sleep(0.2)
            elif not self._owns(container, storage):
                raise SandboxError(
                    f"the container name {name} is held by a container of another task or "
                    f"home: task {storage.task_id!r} does not use it; remove it with "
                    f"`docker rm -f {name}` if it is stale"
                )
            elif container.status == "running" or self._start(container):
                return container
            raise SandboxError(
                f"Docker kept refusing the container name {name}: "
                f"remove it with `docker rm -f {name}`",
                retryable=True,
            )

        with translated(
            lambda said: f"Docker could not start the sandbox of task {storage.task_id!r}: {said}"
        ):
            return retry(claim, CREATE_ATTEMPTS)

    def _owns(self, container: Any, storage: TaskStorage) -> bool:
        """Whether the container was made for this task of this home (by its labels)."""
        labels = container.labels
        return bool(
            labels.get(LABEL_TASK) == storage.task_id and labels.get(LABEL_HOME) == self._home_label
        )

    def _run_options(self, storage: TaskStorage, name: str, tag: str) -> dict[str, Any]:
        """The hardened container's settings (README, "The sandbox"): every relaxation is a
        field of SandboxOptions."""
        options = self.options
        expires = datetime.now(UTC) + options.expiry
        labels = {
            LABEL_TASK: storage.task_id,
            LABEL_HOME: self._home_label,
            LABEL_OWNER: getpass.getuser(),
            LABEL_EXPIRES: expires.isoformat(timespec="seconds"),
            LABEL_IMAGE: tag,
            **options.extra_labels,
        }
        volumes = {
            str(storage.offload): {"bind": OFFLOAD_MOUNT, "mode": "ro"},
            str(storage.cache): {"bind": CACHE_MOUNT, "mode": "rw"},
        }
        # Every folder a script can write is a tmpfs with a size cap, which the kernel (or
        # gVisor's) enforces as the write happens: a script cannot fill the host's disk.
        # uid/gid/mode: gVisor makes a tmpfs root-owned 1777 otherwise (runc copies the
        # image folder's owner and mode, which the Dockerfile sets alike).
        work = f"uid={SCRIPT_UID},gid={SANDBOX_GID},mode=0770"
        # The output folder is the engine uid's (which takes the files), open to the group:
        # scripts and the session write there, and none can lock it or make it sticky.
        outputs = f"uid={ENGINE_UID},gid={SANDBOX_GID},mode=0770"
        run = f"uid={SESSION_UID},gid={SANDBOX_GID},mode=0700"
        run_options: dict[str, Any] = {
            "name": name,
            "detach": True,
            "labels": labels,
            "user": ENGINE_USER,
            "working_dir": WORK_MOUNT,
            "environment": {"HOME": WORK_MOUNT},
            "volumes": volumes,
            "read_only": options.read_only_root,
            "cap_drop": ["ALL"],
            "security_opt": ["no-new-privileges"],
            "pids_limit": options.pids,
            "mem_limit": options.memory,
            "memswap_limit": options.memory,
            "nano_cpus": int(options.cpus * 1e9),
            "tmpfs": {
                "/tmp": f"rw,noexec,nosuid,nodev,size={options.tmp_size}",
                WORK_MOUNT: f"rw,noexec,nosuid,nodev,size={options.work_size},{work}",
                OUTPUTS_MOUNT: f"rw,noexec,nosuid,nodev,size={options.outputs_size},{outputs}",
                RUN_MOUNT: f"rw,noexec,nosuid,nodev,size={RUN_SIZE},{run}",
            },
            # System V IPC objects and POSIX message queues outlive every process that made
            # them, in no folder a deletion can walk: none can be made. (gVisor ignores these:
            # the fork server and the session relay refuse the calls too, noipc.py.)
            "sysctls": NO_IPC,
            "log_config": LogConfig(type="json-file", config={"max-size": "1m", "max-file": "1"}),
            "ipc_mode": "private",
        }
        if not options.network:
            run_options["network_mode"] = "none"
        if options.runtime:
            run_options["runtime"] = options.runtime
        return run_options

    def _start(self, container: Any) -> bool:
        """Start a stopped container; False if it was removed, or is being removed, under us
        (the caller then creates a new one: the payloads are on the host)."""
        with docker_errors(f"starting container {container.name}"):
            try:
                container.start()
                container.reload()
                return True
            except DOCKER_FAILURES as failure:
                fault = fault_of(failure)
                if fault is Fault.GONE:
                    return False
                if not fault.answered:
                    raise
                # "marked for removal and cannot be started" (409 or 500 by engine version):
                # wait for the removal to finish, then report it gone.
                deadline = time.monotonic() + REMOVAL_SECONDS
                while (now := state(container, self.client)).get("Status") in (
                    "removing",
                    "dead",
                ) and time.monotonic() < deadline:
                    time.sleep(0.1)
                if not now:
                    return False
                raise

    def _containers(self, labels: dict[str, str]) -> list[Any]:
        filters = [f"{k}={v}" for k, v in {LABEL_HOME: self._home_label, **labels}.items()]
        # ignore_removed: a container being created or removed by another thread can be
        # listed and then vanish before the SDK inspects it.
        found: list[Any] = self.client.containers.list(
            all=True, filters={"label": filters}, ignore_removed=True
        )
        return found

    def list(self) -> list[str]:
        with docker_errors("listing containers"):
            running = {c.labels[LABEL_TASK] for c in self._containers({})}
        return sorted(running | set(super().list()))


def cleanup_home(home: Path) -> None:
    """Remove every container made for a home, and all task storage (tests use this)."""
    backend = DockerBackend(home)
    try:
        with docker_errors("cleaning up"):
            for container in backend._containers({}):
                container.remove(force=True, v=True)
        for task_id in backend.list():
            backend.storage(task_id).destroy()
    finally:
        backend.close()
