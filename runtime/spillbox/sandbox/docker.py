"""The Docker backend: one hardened container per task.

The task's storage is bind-mounted: offload/ read-only at /sandbox/offload, work/ at
/sandbox/work, cache/ at /sandbox/cache. The host writes payloads straight into
offload/, so an offload never waits for the container, which starts in the background.

Two fixed non-root uids: SCRIPT_UID runs the model's scripts; ENGINE_UID runs PID 1 and
the task's SQL engine, so a script can neither kill the container nor tamper with the
engine. After a timeout every process of SCRIPT_UID is killed, which also catches a
process that left its group.

    backend = DockerBackend(Path("~/.spillbox").expanduser())
    storage = backend.storage("t1"); backend.create(storage)
    backend.exec(storage, "sh", "ls /sandbox/offload", timeout=10)
"""

from __future__ import annotations

import collections
import getpass
import hashlib
import json
import os
import socket
import struct
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from functools import partial
from pathlib import Path
from typing import Any, TypeVar

import docker
import docker.errors
from docker.types import LogConfig

from spillbox.errors import ExecError, SandboxError
from spillbox.sandbox.base import RawExec, SandboxBackend
from spillbox.sandbox.image import ensure_image, image_tag
from spillbox.sandbox.storage import StoredFile, TaskStorage, safe_name

SCRIPT_UID = 10001
ENGINE_UID = 10002
SANDBOX_GID = 10001
SANDBOX_ROOT = "/sandbox"
OFFLOAD_MOUNT = f"{SANDBOX_ROOT}/offload"
RUN_SCRIPT = "/opt/spillbox/run.sh"
SQL_ENGINE = "/opt/spillbox/sqlserver.py"

LABEL_TASK = "spillbox.task"
LABEL_HOME = "spillbox.home"
LABEL_OWNER = "spillbox.owner"
LABEL_EXPIRES = "spillbox.expires"
LABEL_IMAGE = "spillbox.image-tag"

DEFAULT_MEMORY = "1g"
DEFAULT_PIDS = 256
DEFAULT_CPUS = 1.0
DEFAULT_TMP_SIZE = "64m"
DEFAULT_EXPIRY = timedelta(days=7)
DEFAULT_MAX_OUTPUT_BYTES = 32 * 1024 * 1024
KILL_GRACE_SECONDS = 5.0
"""After a timeout, how long the in-container kill gets before the host kills for it."""
OUTPUT_TAIL_BYTES = 64 * 1024
MAX_CODE_BYTES = 256 * 1024
OOM_MARKER = b"\x1espillbox:oom_killed\n"
END_MARKER = b"\x1espillbox:end\n"
"""run.sh's last stderr line: a script's runner that ended by itself, in a live sandbox."""
CREATE_ATTEMPTS = 5
REMOVAL_SECONDS = 30.0
"""How long a container that is being removed may take to go, before a new one replaces it."""
STOPPED_NOTE = b"spillbox: the sandbox stopped while the script ran; the next exec restarts it\n"
EXEC_NOT_STARTED = 126
"""The exit code of an exec the runtime could not start (e.g. a stopped gVisor sandbox)."""
WATCH_SECONDS = 1.0
"""How often the container of an exec that is still running is checked: a gVisor sandbox
that dies under an exec (at its memory or pids limit) leaves the exec's connection open."""
OOM_EVENT_SECONDS = 2
"""How long Docker's "oom" event may trail an exec cut under its runner."""
SETTLE_SECONDS = 5.0
"""How long a runner that ended without its end mark may take to show up as a stopped
sandbox: gVisor can end the exec ("WaitPID failed: EOF") before Docker records the stop."""

_T = TypeVar("_T")


@dataclass(frozen=True)
class SandboxOptions:
    """How a task's container is confined. Every relaxation is an explicit field.

    >>> SandboxOptions(memory="2g").network
    False
    """

    network: bool = False
    """Give the container a network (default: none at all)."""
    read_only_root: bool = True
    """Mount the image's filesystem read-only; only /tmp, /sandbox/work and cache are writable."""
    memory: str = DEFAULT_MEMORY
    """Memory limit (swap included)."""
    pids: int = DEFAULT_PIDS
    """Most processes at once: a fork bomb stops here."""
    cpus: float = DEFAULT_CPUS
    tmp_size: str = DEFAULT_TMP_SIZE
    """Size cap of the /tmp tmpfs."""
    runtime: str | None = None
    """An OCI runtime, e.g. "runsc" for gVisor where the engine has it."""
    max_output_bytes: int = DEFAULT_MAX_OUTPUT_BYTES
    """stdout kept per exec; past it the head and a tail are kept, the middle dropped."""
    expiry: timedelta = DEFAULT_EXPIRY
    """Written on the container as a label, for garbage collection."""
    extra_labels: dict[str, str] = field(default_factory=dict)


def connect() -> docker.DockerClient:
    """A client for the local engine, or a SandboxError that says how to start one."""
    try:
        client = docker.from_env(timeout=120)
        client.ping()
    except docker.errors.DockerException as e:
        raise SandboxError(
            "Docker is not running (no engine answered): start it, e.g. "
            "`sudo systemctl start docker`, or run scripts/ensure-docker.sh as root"
        ) from e
    return client


@contextmanager
def docker_errors(doing: str) -> Iterator[None]:
    """Translate the Docker SDK's exceptions into one-line SandboxErrors."""
    try:
        yield
    except docker.errors.APIError as e:
        raise SandboxError(f"Docker failed while {doing}: {e.explanation or e}") from e
    except docker.errors.DockerException as e:
        raise SandboxError(f"Docker failed while {doing}: {e}") from e


class DockerBackend(SandboxBackend):
    """One hardened container per task, found again by its labels after a restart."""

    kind = "docker"
    languages = ("sql", "jq", "python", "sh")

    def __init__(self, home: Path, options: SandboxOptions | None = None) -> None:
        super().__init__(home)
        self.options = options or SandboxOptions()
        self._client: docker.DockerClient | None = None
        self._home_label = str(home.resolve())
        self._starting: dict[str, threading.Thread] = {}
        self._start_errors: dict[str, BaseException] = {}
        self._engines: dict[str, _SqlEngine] = {}
        self._running: dict[str, Any] = {}
        """The container each task's last exec used: saves a lookup (list + inspect) per exec."""
        self._scripts: collections.Counter[str] = collections.Counter()
        """Scripts running per task in this process: a sweep of the uid must spare the others."""
        self._lock = threading.Lock()

    @property
    def client(self) -> docker.DockerClient:
        if self._client is None:
            self._client = connect()
        return self._client

    def container_name(self, storage: TaskStorage) -> str:
        home_digest = hashlib.sha256(self._home_label.encode()).hexdigest()[:8]
        return f"spillbox-{home_digest}-{safe_name(storage.task_id)}"

    def create(self, storage: TaskStorage) -> None:
        """Prepare the task's storage for the sandbox's two uids."""
        storage.ensure()
        os.chown(storage.work, SCRIPT_UID, SANDBOX_GID)
        os.chown(storage.cache, ENGINE_UID, SANDBOX_GID)
        os.chmod(storage.work, 0o770)
        os.chmod(storage.cache, 0o750)

    def warm(self, storage: TaskStorage) -> None:
        """Start (or find) the task's container in the background; idempotent."""
        with self._lock:
            if storage.task_id in self._starting:
                return
            thread = threading.Thread(
                target=self._start_in_background, args=(storage,), daemon=True
            )
            self._starting[storage.task_id] = thread
        thread.start()

    def _start_in_background(self, storage: TaskStorage) -> None:
        # Thread.start() in warm() returns once this thread runs, but its caller then needs
        # the GIL, which the Docker SDK's Python work below would hold for about a
        # millisecond: yield it first, so the step that set the start going is not billed.
        time.sleep(0)
        try:
            self.container(storage)
        except BaseException as e:  # re-raised by the first exec that needs the container
            self._start_errors[storage.task_id] = e

    def container(self, storage: TaskStorage) -> Any:
        """The task's running container: found by label, started, or created."""
        name = self.container_name(storage)
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
            self._running[storage.task_id] = container
            return container
        ensure_image(self.client)
        container = self._create_container(storage, name, tag)
        self._running[storage.task_id] = container
        return container

    def _create_container(self, storage: TaskStorage, name: str, tag: str) -> Any:
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
            str(storage.work): {"bind": f"{SANDBOX_ROOT}/work", "mode": "rw"},
            str(storage.cache): {"bind": f"{SANDBOX_ROOT}/cache", "mode": "rw"},
        }
        kwargs: dict[str, Any] = {
            "name": name,
            "detach": True,
            "labels": labels,
            "user": f"{ENGINE_UID}:{SANDBOX_GID}",
            "working_dir": f"{SANDBOX_ROOT}/work",
            "environment": {"HOME": f"{SANDBOX_ROOT}/work"},
            "volumes": volumes,
            "read_only": options.read_only_root,
            "cap_drop": ["ALL"],
            "security_opt": ["no-new-privileges"],
            "pids_limit": options.pids,
            "mem_limit": options.memory,
            "memswap_limit": options.memory,
            "nano_cpus": int(options.cpus * 1e9),
            "tmpfs": {"/tmp": f"rw,noexec,nosuid,nodev,size={options.tmp_size}"},
            "log_config": LogConfig(type="json-file", config={"max-size": "1m", "max-file": "1"}),
            "ipc_mode": "private",
        }
        if not options.network:
            kwargs["network_mode"] = "none"
        if options.runtime:
            kwargs["runtime"] = options.runtime
        for _ in range(CREATE_ATTEMPTS):
            try:
                return self.client.containers.run(tag, **kwargs)
            except docker.errors.APIError as e:
                if e.status_code != 409:
                    raise SandboxError(
                        f"Docker could not start the sandbox of task {storage.task_id!r}: "
                        f"{e.explanation or e}"
                    ) from e
            # The name is taken: another process created it first (use theirs), or a
            # removal of the old one is still finishing (try again).
            try:
                container = self.client.containers.get(name)
            except docker.errors.NotFound:
                time.sleep(0.2)
                continue
            if container.status == "running" or self._start(container):
                return container
        raise SandboxError(
            f"Docker kept refusing the container name {name}: remove it with `docker rm -f {name}`"
        )

    def _start(self, container: Any) -> bool:
        """Start a stopped container; False if it was removed, or is being removed, under us
        (the caller then creates a new one: the payloads are on the host)."""
        with docker_errors(f"starting container {container.name}"):
            try:
                container.start()
                container.reload()
                return True
            except docker.errors.NotFound:
                return False
            except docker.errors.APIError:
                # "marked for removal and cannot be started" (409 or 500 by engine version):
                # wait for the removal to finish, then report it gone.
                deadline = time.monotonic() + REMOVAL_SECONDS
                while (state := _state(container, self.client)).get("Status") in (
                    "removing",
                    "dead",
                ) and time.monotonic() < deadline:
                    time.sleep(0.1)
                if not state:
                    return False
                raise

    def _ready(self, storage: TaskStorage) -> Any:
        self.warm(storage)
        thread = self._starting[storage.task_id]
        thread.join()
        error = self._start_errors.pop(storage.task_id, None)
        if error is not None:
            with self._lock:
                self._starting.pop(storage.task_id, None)
            raise error
        return self._running.get(storage.task_id) or self.container(storage)

    def visible_path(self, stored: StoredFile) -> str:
        return f"{OFFLOAD_MOUNT}/{stored.name}"

    def exec(self, storage: TaskStorage, lang: str, code: str, timeout: float) -> RawExec:
        if len(code.encode("utf-8", "surrogatepass")) > MAX_CODE_BYTES:
            raise ExecError(f"script is over {MAX_CODE_BYTES} bytes: write it shorter")
        return self._with_container(
            storage,
            lambda c: (
                self._sql(storage, c, code, timeout)
                if lang == "sql"
                else self._script(storage.task_id, c, lang, code, timeout)
            ),
        )

    def _with_container(self, storage: TaskStorage, run: Callable[[Any], _T]) -> _T:
        container = self._ready(storage)
        with docker_errors(f"running a script in task {storage.task_id!r}"):
            try:
                return run(container)
            except _SandboxStopped:
                pass
            except docker.errors.APIError:
                # Docker reports an exec into a stopped container as 404, 409 or (20.10)
                # 500 "is not running": ask the container, not the status code.
                if _running(container, self.client):
                    raise
            # Removed or stopped from outside (or by gVisor at its pids limit, a moment
            # after the last script ended), or the daemon restarted: the payloads are on
            # the host, so find, start or recreate the container and run once more.
            self._forget(storage.task_id)
            return run(self.container(storage))

    def _forget(self, task_id: str) -> None:
        """Drop what this process remembers of a task's container and engine."""
        with self._lock:
            engine = self._engines.pop(task_id, None)
            self._running.pop(task_id, None)
        if engine is not None:
            engine.close()

    def _script(
        self, storage_id: str, container: Any, lang: str, code: str, timeout: float
    ) -> RawExec:
        api = self.client.api
        stream = _ExecStream(
            api,
            container.id,
            [RUN_SCRIPT, f"{timeout:g}", lang, code],
            user=f"{SCRIPT_UID}:{SANDBOX_GID}",
            stdin=False,
            home=f"{SANDBOX_ROOT}/work",
        )
        with self._lock:
            self._scripts[storage_id] += 1
        started, since = time.monotonic(), time.time()
        stdout = _CappedBuffer(self.options.max_output_bytes)
        stderr = _CappedBuffer(1024 * 1024)
        gave_up, died = False, None
        kill_at = started + timeout + KILL_GRACE_SECONDS
        try:
            # Behind the in-container timeout: kill the uid's processes; if output is
            # still open after that (a kill that could not start at the pids limit),
            # stop waiting and restart the container, which ends every process in it.
            for kind, data in _watched_frames(
                stream,
                container,
                self.client,
                give_up_at=started + timeout + 3 * KILL_GRACE_SECONDS,
                late=(kill_at, partial(self._kill_scripts, container)),
            ):
                (stdout if kind == 1 else stderr).add(data)
        except _GaveUp:
            gave_up = True
            self._restart(storage_id, container)
        except _SandboxDied as e:
            died = e.state
        except OSError as e:
            raise ExecError(f"lost the connection to the script: {e}; run it again") from e
        finally:
            stream.close()
            with self._lock:
                self._scripts[storage_id] -= 1
                alone = not self._scripts[storage_id]
                if alone:
                    del self._scripts[storage_id]
        elapsed = time.monotonic() - started
        exit_code = None
        # A restart or a dead sandbox takes the exec, and its exit code, with it.
        if not gave_up and died is None:
            with docker_errors("reading a script's exit code"):
                exit_code = api.exec_inspect(stream.exec_id)["ExitCode"]
        exit_code = 137 if exit_code is None else int(exit_code)
        timed_out = gave_up or (elapsed >= timeout and exit_code in (124, 137))
        if timed_out and not gave_up and alone:
            # What escaped the script's group; with a neighbour still running, the sweep
            # waits for the last script of the task to end (run.sh sweeps then).
            self._kill_scripts(container)
        err_bytes, ended = _strip(stderr.value(), END_MARKER)
        err_bytes, oom = _strip(err_bytes, OOM_MARKER)
        if died is not None or not (ended or timed_out):
            # The runner did not end by itself: its exec was cut under it.
            state = died or _settled_state(container, self.client)
            if not state.get("Running"):
                # The sandbox itself stopped (gVisor ends one whose pids or memory limit is
                # hit). A script that never started runs again in a restarted container; one
                # that ran is not repeated: its failure is reported, the next exec restarts.
                self._forget(storage_id)
                if exit_code == EXEC_NOT_STARTED:
                    raise _SandboxStopped
                err_bytes += STOPPED_NOTE
            oom = oom or _memory_ran_out(self.client, container, state, since)
        return RawExec(
            exit_code=exit_code,
            stdout=stdout.value(),
            stderr=err_bytes,
            timed_out=timed_out,
            oom_killed=oom,
            stdout_truncated=stdout.dropped > 0,
        )

    def _restart(self, task_id: str, container: Any) -> None:
        """The last resort behind a timeout: restart the container (payloads are on the host)."""
        self._forget(task_id)
        try:
            container.restart(timeout=0)
        except docker.errors.DockerException:
            pass  # gone already: the next exec creates a new one

    def _kill_scripts(self, container: Any) -> None:
        """Kill every process of the script uid: the whole group and any that escaped it."""
        try:
            container.exec_run(["kill", "-KILL", "-1"], user=f"{SCRIPT_UID}:{SANDBOX_GID}")
        except docker.errors.DockerException:
            pass  # the container is gone: so are its processes

    def _sql(self, storage: TaskStorage, container: Any, code: str, timeout: float) -> RawExec:
        since = time.time()
        try:
            try:
                engine, response = self._query(storage, container, code, timeout)
            except ExecError:
                # The engine died (daemon restart, deletion, OOM) between queries or under
                # this one: one retry with a fresh engine. A query only reads, so running
                # it again is safe.
                engine, response = self._query(storage, container, code, timeout)
        except ExecError:
            # A query that kills its engine again fails for real, unless the container
            # stopped under it: then it runs in the restarted sandbox.
            if _running(container, self.client):
                raise
            raise _SandboxStopped from None
        except _SandboxDied as e:
            # As for a script: reported, not repeated; the next exec restarts the sandbox.
            self._forget(storage.task_id)
            oom = _memory_ran_out(self.client, container, e.state, since)
            return RawExec(137, b"", STOPPED_NOTE, False, oom)
        if response is None:  # hung past its timeout: kill it; the next query starts afresh
            with self._lock:
                self._engines.pop(storage.task_id, None)
            engine.kill()
            return RawExec(124, b"", b"query killed: it ran past its timeout", True, False)
        return RawExec(
            exit_code=int(response["exit_code"]),
            stdout=str(response["stdout"]).encode("utf-8"),
            stderr=str(response["stderr"]).encode("utf-8"),
            timed_out=bool(response.get("timed_out")),
            oom_killed=False,
            stdout_truncated=bool(response.get("truncated")),
        )

    def release(self, storage: TaskStorage) -> None:
        with self._lock:
            engine = self._engines.pop(storage.task_id, None)
        if engine is not None:
            engine.close()  # the engine sees end of input and exits

    def close(self) -> None:
        with self._lock:
            engines, self._engines = list(self._engines.values()), {}
            threads = list(self._starting.values())
        for thread in threads:
            thread.join()
        for engine in engines:
            engine.close()
        if self._client is not None:
            self._client.close()
            self._client = None

    def _query(
        self, storage: TaskStorage, container: Any, code: str, timeout: float
    ) -> tuple[_SqlEngine, dict[str, Any] | None]:
        with self._lock:
            engine = self._engines.get(storage.task_id)
            if engine is None or engine.container_id != container.id:
                if engine is not None:
                    engine.close()  # its container is gone or replaced
                engine = _SqlEngine(self.client, container)
                self._engines[storage.task_id] = engine
        try:
            return engine, engine.query(code, timeout, self.options.max_output_bytes)
        except ExecError:
            with self._lock:
                self._engines.pop(storage.task_id, None)
            engine.close()
            raise

    def destroy_sandbox(self, storage: TaskStorage) -> None:
        with self._lock:
            engine = self._engines.pop(storage.task_id, None)
            thread = self._starting.pop(storage.task_id, None)
            self._running.pop(storage.task_id, None)
        if thread is not None:
            thread.join()
            self._start_errors.pop(storage.task_id, None)
        if engine is not None:
            engine.close()
        with docker_errors(f"removing the container of task {storage.task_id!r}"):
            for container in self._containers({LABEL_TASK: storage.task_id}):
                container.remove(force=True, v=True)

    def forget_derived(self, storage: TaskStorage, sha256: str, size: int, since: float) -> None:
        """Stop every SQL engine of the task (any process's: they hold the tables open) and
        delete what scripts left in the container's /tmp since the payload was created,
        then what the host holds; the next query starts an engine that reloads what is left."""
        with self._lock:
            engine = self._engines.pop(storage.task_id, None)
        if engine is not None:
            engine.close()
        with docker_errors("deleting what a payload left in its sandbox"):
            for container in self._containers({LABEL_TASK: storage.task_id}):
                if container.status != "running":
                    continue  # a stopped container's /tmp (a tmpfs) is gone with it
                _kill_engines(container)
                try:
                    container.exec_run(
                        ["find", "/tmp", "-xdev", "-mindepth", "1", "-newerct",
                         f"@{int(since)}", "-delete"],
                        user=f"{SCRIPT_UID}:{SANDBOX_GID}",
                    )  # fmt: skip
                except docker.errors.APIError:
                    if _running(container, self.client):
                        raise  # it stopped since it was listed: nothing is left to delete
        super().forget_derived(storage, sha256, size, since)

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
                        try:
                            container.remove(force=True, v=True)
                        except docker.errors.NotFound:
                            pass  # another collector got there first
        return removed

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


class _SandboxStopped(Exception):
    """The container stopped before a script could start in it (or under a query, which
    only reads and so runs again)."""


class _SandboxDied(Exception):
    """The container stopped while an exec's output was still open (gVisor leaves it open)."""

    def __init__(self, state: dict[str, Any]) -> None:
        super().__init__("the sandbox stopped")
        self.state = state


class _GaveUp(Exception):
    """An exec's output stayed open past its last deadline."""


def _watched_frames(
    stream: _ExecStream,
    container: Any,
    client: docker.DockerClient,
    give_up_at: float,
    late: tuple[float, Callable[[], object]] | None = None,
) -> Iterator[tuple[int, bytes]]:
    """The frames of an exec's output until it ends, with the container watched.

    A gVisor sandbox that dies under an exec (at its memory or pids limit) leaves the exec's
    connection open, so every WATCH_SECONDS the container is asked whether it still runs:
    _SandboxDied if not. Past late's time (monotonic) its action runs once; past
    give_up_at, _GaveUp. Short execs end before the first check and cost no extra call.
    """
    stream.settimeout(WATCH_SECONDS)
    check_at = time.monotonic() + WATCH_SECONDS
    while True:
        now = time.monotonic()
        if now >= check_at:
            check_at = now + WATCH_SECONDS
            if now >= give_up_at:
                raise _GaveUp
            if late is not None and now >= late[0]:
                late[1]()
                late = None
            try:
                state = _state(container, client)
            except (docker.errors.DockerException, OSError):
                state = {"Running": True}  # the engine is busy or restarting: the deadlines hold
            if not state.get("Running"):
                raise _SandboxDied(state)
        try:
            frame = stream.frame()
        except TimeoutError:
            continue  # quiet for WATCH_SECONDS: check again
        if frame is None:
            return
        yield frame


def _state(container: Any, client: docker.DockerClient) -> dict[str, Any]:
    """The container's State as Docker has it now ({} once it is gone)."""
    try:
        state: dict[str, Any] = client.api.inspect_container(container.id)["State"]
    except docker.errors.NotFound:
        return {}
    return state


def _settled_state(container: Any, client: docker.DockerClient) -> dict[str, Any]:
    """The container's State once it stopped, or as it is after SETTLE_SECONDS running."""
    deadline = time.monotonic() + SETTLE_SECONDS
    while (state := _state(container, client)).get("Running") and time.monotonic() < deadline:
        time.sleep(0.1)
    return state


def _memory_ran_out(
    client: docker.DockerClient, container: Any, state: dict[str, Any], since: float
) -> bool:
    """Whether the container's memory limit struck since `since` (epoch seconds), for an
    exec cut under its runner (state: the container's State after it).

    State.OOMKilled is set only if Docker hears of the OOM before the exit, and only when
    the container stops. Under gVisor the exit can come first, or the OOM can kill a
    sandbox process and cut the exec while the container runs on; Docker still logs an
    "oom" event. Waits up to OOM_EVENT_SECONDS for one.
    """
    if state.get("OOMKilled"):
        return True
    try:
        events = client.api.events(
            since=int(since) - 1,
            until=int(time.time()) + OOM_EVENT_SECONDS,
            filters={"container": container.id, "event": "oom"},
            decode=True,
        )
        try:
            return next(iter(events), None) is not None
        finally:
            events.close()
    except (docker.errors.DockerException, OSError):
        return False  # the engine is busy or restarting: the exit is reported as it is


def _strip(data: bytes, marker: bytes) -> tuple[bytes, bool]:
    """`data` without `marker` at its end, and whether it was there."""
    if data.endswith(marker):
        return data[: -len(marker)], True
    return data, False


def _running(container: Any, client: docker.DockerClient) -> bool:
    return bool(_state(container, client).get("Running"))


def _kill_engines(container: Any) -> None:
    """Kill every SQL engine process in the container (as the engine's own uid)."""
    try:
        container.exec_run(
            ["pkill", "-KILL", "-u", str(ENGINE_UID), "-f", SQL_ENGINE],
            user=f"{ENGINE_UID}:{SANDBOX_GID}",
        )
    except docker.errors.DockerException:
        pass  # the container is gone: so are its engines


class _CappedBuffer:
    """Keeps the first `cap` bytes and the last OUTPUT_TAIL_BYTES; counts what it drops."""

    def __init__(self, cap: int) -> None:
        self.cap = cap
        self.head = bytearray()
        self.tail = bytearray()
        self.dropped = 0

    def add(self, chunk: bytes) -> None:
        room = self.cap - len(self.head)
        if room > 0:
            self.head += chunk[:room]
            chunk = chunk[room:]
        if chunk:
            self.tail += chunk
            if len(self.tail) > OUTPUT_TAIL_BYTES:
                excess = len(self.tail) - OUTPUT_TAIL_BYTES
                self.dropped += excess
                del self.tail[:excess]

    def value(self) -> bytes:
        if not self.dropped:
            return bytes(self.head + self.tail)
        marker = f"\n[spillbox: {self.dropped} bytes of output dropped here]\n".encode()
        return bytes(self.head) + marker + bytes(self.tail)


class _ExecStream:
    """One exec's raw connection: stdin to write, stdout/stderr frames to read.

    Docker multiplexes the two outputs in frames (8-byte header: stream, size). We read
    the socket ourselves so that closing it really closes it, and so a timeout on it is
    ours to set.
    """

    def __init__(
        self, api: Any, container_id: str, cmd: list[str], user: str, stdin: bool, home: str
    ) -> None:
        # Docker's errors pass through: the backend retries a vanished container once.
        self.exec_id: str = api.exec_create(
            container_id, cmd, stdin=stdin, user=user, workdir=home, environment={"HOME": home}
        )["Id"]
        self._raw = api.exec_start(self.exec_id, socket=True)
        self._sock: socket.socket = getattr(self._raw, "_sock", self._raw)
        self._pending = bytearray()
        """Bytes received and not yet returned: a timeout mid-frame loses nothing."""

    def settimeout(self, seconds: float | None) -> None:
        self._sock.settimeout(seconds)

    def send(self, data: bytes) -> None:
        self._sock.sendall(data)

    def frame(self) -> tuple[int, bytes] | None:
        """The next (stream, payload): 1 is stdout, 2 is stderr; None at end of output.

        A socket timeout (TimeoutError) keeps what came; the next call goes on from there.
        """
        if not self._fill(8):
            return None
        size = struct.unpack(">I", self._pending[4:8])[0]
        if not self._fill(8 + size):
            return None
        kind, data = self._pending[0], bytes(self._pending[8 : 8 + size])
        del self._pending[: 8 + size]
        return kind, data

    def _fill(self, size: int) -> bool:
        """Receive until `size` bytes are pending; False at the end of the output."""
        while len(self._pending) < size:
            chunk = self._sock.recv(max(size - len(self._pending), 1 << 16))
            if not chunk:
                return False
            self._pending += chunk
        return True

    def close(self) -> None:
        for closable in (self._raw, self._sock):
            try:
                closable.close()
            except OSError:
                pass


class _SqlEngine:
    """The task's long-lived DuckDB process, spoken to over one exec's stdin/stdout."""

    def __init__(self, client: docker.DockerClient, container: Any) -> None:
        self.container_id = container.id
        self._client = client
        self._container = container
        self._lock = threading.Lock()
        self._stream = _ExecStream(
            client.api,
            container.id,
            ["python3", SQL_ENGINE],
            user=f"{ENGINE_UID}:{SANDBOX_GID}",
            stdin=True,
            home=f"{SANDBOX_ROOT}/cache",  # DuckDB keeps its own files in HOME
        )
        self._buffer = bytearray()
        self._errors = bytearray()

    def query(self, sql: str, timeout: float, max_bytes: int) -> dict[str, Any] | None:
        """The engine's response, or None if it did not answer within timeout + grace.

        Raises _SandboxDied if the container stopped under the query.
        """
        request = json.dumps({"sql": sql, "timeout": timeout, "max_bytes": max_bytes}) + "\n"
        with self._lock:
            try:
                self._stream.send(request.encode("utf-8"))
                line = self._read_line(time.monotonic() + timeout + KILL_GRACE_SECONDS)
            except _GaveUp:
                return None
            except OSError as e:
                raise ExecError(
                    f"the SQL engine's connection broke: {e}; run the query again"
                ) from e
        try:
            response: dict[str, Any] = json.loads(line)
        except ValueError:
            # Docker writes why an exec could not start (a container stopping under it)
            # into the exec's stream as plain text.
            said = line.decode("utf-8", "replace").strip()[:200]
            error = ExecError(f"the SQL engine did not answer ({said}); run the query again")
            raise error from None
        return response

    def _read_line(self, give_up_at: float) -> bytes:
        frames = _watched_frames(self._stream, self._container, self._client, give_up_at)
        while b"\n" not in self._buffer:
            frame = next(frames, None)
            if frame is None:
                detail = self._errors.decode("utf-8", "replace").strip().splitlines()
                last = detail[-1] if detail else "no error message"
                raise ExecError(f"the SQL engine stopped: {last}; run the query again")
            stream, payload = frame
            (self._buffer if stream == 1 else self._errors).extend(payload)
        line, _, rest = bytes(self._buffer).partition(b"\n")
        self._buffer = bytearray(rest)
        return line

    def kill(self) -> None:
        """Kill the engine process and drop the connection."""
        _kill_engines(self._container)
        self.close()

    def close(self) -> None:
        self._stream.close()
