"""One task's sandbox as this process holds it, and the calls that run in it.

The backend (backend.py) finds, creates and removes containers; a TaskSandbox owns what a
process keeps for one task between calls: the container its execs use, the background
start (and the Python session made ready behind it, and the tables loaded: sql.py's
TablePreload), and the kept channels into the sandbox's runners (channels.py): the fork
server's relay for stateless scripts, the session's relay for Python cells, the SQL
engine's relay for queries. How a call can end, and what the
host then does, is outcome.py's table; scripts.py reads a script or cell to its end, sql.py
a query, takeout.py the files a call left.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import replace
from functools import partial
from typing import Any

import docker

import spillbox.sandbox.docker.wire as wire
from spillbox.errors import SandboxError
from spillbox.sandbox.docker.channels import (
    C,
    Idle,
    ScriptChannel,
    SessionChannel,
    SqlChannel,
)
from spillbox.sandbox.docker.containers import LABEL_SLOT
from spillbox.sandbox.docker.layout import SCRIPT_USER, SESSION_USER
from spillbox.sandbox.docker.outcome import Closed, Outcome
from spillbox.sandbox.docker.scripts import NeverStarted, Output, outcome_of, raw_exec, read_to_end
from spillbox.sandbox.docker.sql import TablePreload, run_query
from spillbox.sandbox.docker.state import stopped_under
from spillbox.sandbox.docker.stream import GaveUp, SandboxDied
from spillbox.sandbox.docker.takeout import take_outputs
from spillbox.sandbox.docker_errors import DOCKER_FAILURES, best_effort, docker_errors
from spillbox.spawn import Spawned, spawn
from spillbox.types import ExecRequest, RawExec

PREPARE_AFTER_SECONDS = 1.0
"""How long after the container is up the session starts if no exec came (one that comes
sooner is waited for: the session's start would compete with it for the CPU)."""
PREPARE_SECONDS = 60.0
"""How long the session's start ahead of the first cell may take (seconds on a loaded
machine: the server imports duckdb, pyarrow and jq)."""
RESTARTED_NOTE = (
    b"spillbox: this task's sandbox started again since its last call (it had stopped: the "
    b"task closed, out of memory, killed, or its engine restarted): its Python session is new "
    b"(names defined before are gone) and files in /sandbox/work and /tmp are gone; the "
    b"payloads in /sandbox/offload are intact\n"
)


class TaskSandbox:
    """One task's sandbox, as this process holds it; DockerBackend makes one per task.

    >>> sandbox = DockerBackend(home).sandbox(storage)  # doctest: +SKIP
    >>> _ = sandbox.warm()  # the container starts in the background  # doctest: +SKIP
    >>> ls = ExecRequest("sh", "ls /sandbox/offload", timeout=10)
    >>> sandbox.exec(ls).exit_code  # doctest: +SKIP
    0
    """

    def __init__(
        self,
        task_id: str,
        client: Callable[[], docker.DockerClient],
        provide: Callable[[], Any],
        max_output_bytes: int,
        swap_start: Callable[[str], str | None],
    ) -> None:
        self.task_id = task_id
        self._client = client
        self._provide = provide
        """Finds, starts or creates the task's running container (the backend's job)."""
        self._max_output_bytes = max_output_bytes
        self._lock = threading.Lock()
        self._starting: Spawned | None = None
        self._preparing: threading.Thread | None = None
        self._start_error: BaseException | None = None
        self._first_exec_started = threading.Event()
        self._first_exec_done = threading.Event()
        self._closing = threading.Event()
        self._container: Any = None
        """The container the last exec used: saves a lookup (list + inspect) per exec."""
        self._adopted = False
        """The container is a warm pool slot's, running since before the task (adopt)."""
        self._scripts = Idle(self._opener(ScriptChannel))
        self._cells = Idle(self._opener(SessionChannel))
        self._engines = Idle(self._opener(SqlChannel))
        self.tables = TablePreload(self._engines, self._up)
        self._swap_start = swap_start
        """Records the container (and start) a call ran in, and returns the last call's: in
        another, or after a restart, the call's work files and session are new."""

    @property
    def client(self) -> docker.DockerClient:
        return self._client()

    def _opener(self, kind: type[C]) -> Callable[[Any], C]:
        return lambda container: kind(self.client, container)

    def warm(self) -> Spawned | None:
        """Start (or find) the container in the background, once; the thread doing it (None:
        a warm pool slot's container, adopted running)."""
        with self._lock:
            if self._starting is None and not self._adopted:
                self._starting = spawn(self._start_in_background, "spillbox-start")
            return self._starting

    def _start_in_background(self) -> None:
        try:
            container = self.container()
        except BaseException as e:  # re-raised by the first exec that needs the container
            self._start_error = e
            return
        # Not in this thread: the first exec waits for this one, never for the session.
        preparing = threading.Thread(target=self._prepare_session, args=(container,), daemon=True)
        with self._lock:
            self._preparing = preparing
        preparing.start()

    def _prepare_session(self, container: Any) -> None:
        """Start the task's Python session ahead of its first cell (session.py's prepare) and
        keep the channel that did it for that cell: the first cell then costs what a later
        one does. A task that never asks for a cell does not wait for it."""
        if self._first_exec_started.wait(PREPARE_AFTER_SECONDS):
            self._first_exec_done.wait()
        if self._closing.is_set():
            return  # closed before the session was asked for: nothing to make ready
        try:
            channel, generation = self._cells.take(container)
        except DOCKER_FAILURES:
            return  # the container stopped: the first cell starts its session
        prepared = False
        try:
            for kind, _ in channel.ask({"mode": "prepare"}, time.monotonic() + PREPARE_SECONDS):
                prepared = kind == wire.END
        except (GaveUp, SandboxDied, OSError):
            pass
        self._cells.give_back(channel, generation, prepared)

    def ready(self) -> Any:
        """The running container, once the background start is over (its error, if it failed:
        the next call starts again)."""
        starting = self.warm()
        if starting is not None:
            starting.join()
            with self._lock:
                error, self._start_error = self._start_error, None
                if error is not None:
                    self._starting = None
            if error is not None:
                raise error
        return self._container or self.container()

    def _up(self) -> Any | None:
        """The running container once the background start is over; None if it failed
        (the next exec reports why)."""
        starting = self.warm()
        if starting is not None:
            starting.join()
        return self._container

    def container(self) -> Any:
        """The task's running container: found by label, started, or created."""
        self._container = self._provide()
        return self._container

    def forget(self) -> None:
        """Drop what this process remembers of the container: the channels into its
        runners."""
        self._container = None
        self._drop_channels()

    def adopt(self, container: Any, scripts: ScriptChannel, cells: SessionChannel) -> None:
        """Take a warm pool slot's running container and its relays into the fork server
        and the Python session, both serving already: nothing starts in the background,
        and the task's first script and first cell take the fast path."""
        with self._lock:
            self._adopted = True
            self._container = container
        self._scripts.keep(scripts)
        self._cells.keep(cells)

    def _drop_channels(self) -> None:
        for channels in (self._scripts, self._cells, self._engines):
            channels.drop()

    def close(self) -> None:
        """Wait for the background start, and close the channels."""
        self._closing.set()
        self._first_exec_started.set()
        self._first_exec_done.set()  # the session, not made yet, is not made
        with self._lock:
            threads = (self._starting, self._preparing)
        for thread in threads:
            if thread is not None:
                thread.join()
        self.tables.close()
        self._drop_channels()

    def exec(self, request: ExecRequest) -> RawExec:
        """Run a script (lang "sql": a query; with session, a python cell in the task's
        session) in the sandbox. One that never started runs once more, in the container
        found, started or created again: the payloads are on the host."""
        self._first_exec_started.set()
        try:
            return self._exec(request)
        finally:
            self._first_exec_done.set()

    def _exec(self, request: ExecRequest) -> RawExec:
        container = self.ready()
        with docker_errors(f"running a script in task {self.task_id!r}"):
            try:
                return self._noted(container, self._run(container, request))
            except NeverStarted:
                pass
            except DOCKER_FAILURES as failure:
                if not stopped_under(failure, container, self.client):
                    raise
            self.forget()
            container = self.container()
            try:
                return self._noted(container, self._run(container, request))
            except NeverStarted:
                raise SandboxError(
                    f"the sandbox of task {self.task_id!r} stopped again before the script "
                    "could start: run it again",
                    retryable=True,
                ) from None

    def _noted(self, container: Any, ran: RawExec) -> RawExec:
        """The call's answer, told on stderr when the sandbox it ran in is not the one the
        task's last call ran in: what that call left in /sandbox/work is gone."""
        start = _started(container)
        before = self._swap_start(start)
        if before in (None, start):
            return ran
        # Another process may have restarted it under this one's cached inspection: ask.
        best_effort(container.reload, None)
        if (now := _started(container)) != start:
            self._swap_start(now)
        if before == now:
            return ran
        return replace(ran, stderr=RESTARTED_NOTE + ran.stderr)

    def _run(self, container: Any, request: ExecRequest) -> RawExec:
        code, timeout = request.code, request.timeout
        if request.lang == "sql":
            limits = (timeout, self._max_output_bytes)
            return run_query(self._engines, self.client, container, code, limits, self.forget)
        if request.session is not None:
            mode = "run" if request.session == "keep" else "reset"
            cell = {"mode": mode, "code": code, "timeout": timeout}
            return self._script(self._cells, container, cell, timeout, SESSION_USER)
        script = {"lang": request.lang, "code": code, "timeout": timeout}
        return self._script(self._scripts, container, script, timeout, SCRIPT_USER)

    def _script(
        self, channels: Idle[C], container: Any, request: dict[str, Any], timeout: float, user: str
    ) -> RawExec:
        """Run a script or cell over a channel taken from channels (given back if it
        answered whole), at kill_at killing every process of the runner's uid."""
        channel, generation = channels.take(container)
        kill = partial(_kill_as, container, user)
        try:
            output = read_to_end(channel, request, timeout, self._max_output_bytes, kill)
        except BaseException:  # a malformed end: the channel's next answer is not to be trusted
            channels.give_back(channel, generation, reusable=False)
            raise
        channels.give_back(channel, generation, reusable=output.end_mark)
        return self._finish(container, output, timeout)

    def _finish(self, container: Any, output: Output, timeout: float) -> RawExec:
        """Act on how a script or cell ended (outcome.py)."""
        if output.closed is Closed.GAVE_UP:
            self._restart(container)
        if not output.started:
            raise NeverStarted
        outcome = outcome_of(output, container, self.client, timeout)
        if outcome == Outcome.NEVER_STARTED:
            raise NeverStarted
        if Outcome.SANDBOX_STOPPED in outcome:
            self.forget()
        elif output.outputs:
            return raw_exec(output, outcome, *take_outputs(self.client, container))
        return raw_exec(output, outcome)

    def _restart(self, container: Any) -> None:
        """KILLED_AFTER_GRACE: restart the container (the payloads are on the host); a warm
        pool slot's is removed instead (its mounts name its folders as they were before the
        task adopted them), and the task's next call makes one of its own."""
        self.forget()
        if LABEL_SLOT in container.labels:
            again = partial(container.remove, force=True, v=True)
        else:
            again = partial(container.restart, timeout=0)
        best_effort(again, None)  # gone already: the next exec creates a new one


def _kill_as(container: Any, user: str) -> None:
    """Kill every process of a uid (the script uid: the whole group and any that escaped it;
    the session uid: the session, its cell and whatever that left)."""
    # A container that is gone took its processes with it.
    best_effort(partial(container.exec_run, ["kill", "-KILL", "-1"], user=user), None)


def _started(container: Any) -> str:
    """Which start of which container this is: one restarted in place keeps its id, and its
    start time tells the two apart."""
    if not container.attrs.get("State", {}).get("Running"):
        # Inspected when created, before its start (docker-py's run): ask once more.
        best_effort(container.reload, None)
    return f"{container.id}@{container.attrs.get('State', {}).get('StartedAt')}"
