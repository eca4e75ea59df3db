"""The Docker backend: one hardened container per task.

The task's storage is bind-mounted: offload/ read-only at /sandbox/offload, cache/ (the
SQL engine's alone) at /sandbox/cache. The host writes payloads straight into offload/, so
an offload never waits for the container, which starts in the background. What scripts
write (/sandbox/work, /tmp) lives in size-capped tmpfs folders of the container, never on
the host's disk.

    backend = DockerBackend(Path("~/.spillbox").expanduser())
    storage = backend.storage("t1"); backend.create(storage)
    backend.exec(storage, ExecRequest("sh", "ls /sandbox/offload", timeout=10))

The modules, from the top:

- backend: DockerBackend, each task's container, its lifecycle and its calls; connect(),
  cleanup_home().
- labelled: the containers of one home, found, made and swept by their labels.
- containers: SandboxOptions, and the one set of settings every container is made with.
- pool: the warm pool, ready containers a new task adopts (its slots, their sweep).
- forgetting: deleting what a payload left in a running container.
- sandbox: TaskSandbox, what a process holds for one task (its container, background
  start, the Python session made ready behind it, the kept channels), and the calls that
  run in it.
- channels: the kept connections into the sandbox's runners (the fork server's relay, the
  Python session's, the SQL engine's), one frame protocol (wire), and the idle ones kept.
- scripts: a script or cell read to its end, and the RawExec made of that end.
- sql: one query in the task's SQL engine. takeout: the files a call left.
- answers: the runners' answers, parsed strictly.
- outcome: how an exec can end (one table), classify(), and the host's deadlines.
- stream: an exec's output as read: the raw connection, the watched frames, the cap.
- state: what Docker says of a container (running, settled, out of memory).
- layout: the uids and paths inside the sandbox.

Docker's exceptions become spillbox errors in one table, spillbox.sandbox.docker_errors.
"""

from __future__ import annotations

from spillbox.sandbox.docker.backend import MAX_CODE_BYTES, DockerBackend, cleanup_home, connect
from spillbox.sandbox.docker.containers import (
    LABEL_EXPIRES,
    LABEL_HOME,
    LABEL_IMAGE,
    LABEL_OWNER,
    LABEL_POOL,
    LABEL_SLOT,
    LABEL_TASK,
    SandboxOptions,
)
from spillbox.sandbox.docker.layout import (
    ENGINE_UID,
    ENGINE_USER,
    OFFLOAD_MOUNT,
    SANDBOX_GID,
    SCRIPT_UID,
    SESSION_UID,
)
from spillbox.sandbox.docker.outcome import Outcome
from spillbox.sandbox.docker.sandbox import TaskSandbox
from spillbox.sandbox.docker.stream import OUTPUT_TAIL_BYTES

__all__ = [
    "ENGINE_UID",
    "ENGINE_USER",
    "LABEL_EXPIRES",
    "LABEL_HOME",
    "LABEL_IMAGE",
    "LABEL_OWNER",
    "LABEL_POOL",
    "LABEL_SLOT",
    "LABEL_TASK",
    "MAX_CODE_BYTES",
    "OFFLOAD_MOUNT",
    "OUTPUT_TAIL_BYTES",
    "SANDBOX_GID",
    "SCRIPT_UID",
    "SESSION_UID",
    "DockerBackend",
    "Outcome",
    "SandboxOptions",
    "TaskSandbox",
    "cleanup_home",
    "connect",
]
