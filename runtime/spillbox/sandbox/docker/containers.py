"""How a sandbox container is confined, created and started: one set of settings for a
task's own container and a warm pool's slot alike (pool.py), which differ only in their
labels and in the host folders they bind-mount."""

from __future__ import annotations

import getpass
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path
from typing import Any

import docker
from docker.types import LogConfig

from spillbox.errors import SandboxError, retry
from spillbox.sandbox.docker.layout import (
    CACHE_MOUNT,
    ENGINE_UID,
    ENGINE_USER,
    OFFLOAD_MOUNT,
    OUTPUTS_MOUNT,
    RUN_MOUNT,
    SANDBOX_GID,
    SCRIPT_UID,
    SESSION_UID,
    WORK_MOUNT,
)
from spillbox.sandbox.docker.state import state
from spillbox.sandbox.docker_errors import (
    DOCKER_FAILURES,
    Fault,
    docker_errors,
    fault_of,
    translated,
    unless_gone,
)

LABEL_TASK = "spillbox.task"
LABEL_HOME = "spillbox.home"
LABEL_OWNER = "spillbox.owner"
LABEL_EXPIRES = "spillbox.expires"
LABEL_IMAGE = "spillbox.image-tag"
LABEL_SLOT = "spillbox.slot"
"""A warm pool's slot (pool.py): made before any task asked for it, with no task's identity."""
LABEL_POOL = "spillbox.pool"
"""The pool (one per harness) that made a slot: its slots go once that pool is gone."""

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
CREATE_ATTEMPTS = 5
REMOVAL_SECONDS = 30.0
"""How long a container that is being removed may take to go, before a new one replaces it."""


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

    @property
    def gvisor(self) -> bool:
        """Whether the sandboxes run under gVisor (runtime runsc)."""
        return (self.runtime or "").startswith("runsc")


def prepare_mounts(offload: Path, cache: Path) -> None:
    """offload/ readable by the sandbox's group; cache/ the engine uid's alone (scripts can
    neither reach the engine nor its tables)."""
    os.chown(offload, -1, SANDBOX_GID)
    os.chmod(offload, 0o750)
    os.chown(cache, ENGINE_UID, SANDBOX_GID)
    os.chmod(cache, 0o700)


def labels(home_label: str, options: SandboxOptions, tag: str, **identity: str) -> dict[str, str]:
    """A container's labels: its home, owner, expiry and image, and whose it is (identity:
    its task, or its slot and pool)."""
    expires = datetime.now(UTC) + options.expiry
    return {
        **identity,
        LABEL_HOME: home_label,
        LABEL_OWNER: getpass.getuser(),
        LABEL_EXPIRES: expires.isoformat(timespec="seconds"),
        LABEL_IMAGE: tag,
    }


def run_options(
    options: SandboxOptions, name: str, labels: dict[str, str], offload: Path, cache: Path
) -> dict[str, Any]:
    """The hardened container's settings (README, "The sandbox"): every relaxation is a
    field of SandboxOptions. offload/ is mounted read-only, cache/ (the engine's) writable."""
    volumes = {
        str(offload): {"bind": OFFLOAD_MOUNT, "mode": "ro"},
        str(cache): {"bind": CACHE_MOUNT, "mode": "rw"},
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
    settings: dict[str, Any] = {
        "name": name,
        "detach": True,
        "labels": {**labels, **options.extra_labels},
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
        settings["network_mode"] = "none"
    if options.runtime:
        settings["runtime"] = options.runtime
    return settings


def create(
    client: docker.DockerClient,
    tag: str,
    settings: dict[str, Any],
    owns: Callable[[Any], bool],
    whose: str,
) -> Any:
    """Run a container of these settings under its name; if another process created it
    first and it is ours (owns), use that one. whose names it in errors ("task 't1'")."""
    name = settings["name"]

    def claim() -> Any:
        try:
            return client.containers.run(tag, **settings)
        except DOCKER_FAILURES as failure:
            if fault_of(failure) is not Fault.CONFLICT:
                raise
        # The name is taken: another process created it first (use theirs), or a
        # removal of the old one is still finishing (try again).
        container = unless_gone(partial(client.containers.get, name), None)
        if container is None:
            time.sleep(0.2)
        elif not owns(container):
            raise SandboxError(
                f"the container name {name} is held by a container of another task or "
                f"home: {whose} does not use it; remove it with "
                f"`docker rm -f {name}` if it is stale"
            )
        elif container.status == "running" or start(client, container):
            return container
        raise SandboxError(
            f"Docker kept refusing the container name {name}: remove it with `docker rm -f {name}`",
            retryable=True,
        )

    with translated(lambda said: f"Docker could not start the sandbox of {whose}: {said}"):
        return retry(claim, CREATE_ATTEMPTS)


def start(client: docker.DockerClient, container: Any) -> bool:
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
            while (now := state(container, client)).get("Status") in (
                "removing",
                "dead",
            ) and time.monotonic() < deadline:
                time.sleep(0.1)
            if not now:
                return False
            raise
