"""One task's sandbox as this process holds it, and the execs that run in it.

The backend (backend.py) finds, creates and removes containers; a TaskSandbox owns what a
process keeps for one task between calls: the container its execs use, the connection to
its SQL engine, the background start, and how many of its scripts run here. How an exec
can end, and what the host then does, is outcome.py's table.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

import docker

from spillbox.errors import ExecError, SandboxError, retry
from spillbox.sandbox.docker.engine import SqlEngine
from spillbox.sandbox.docker.layout import (
    RUN_SCRIPT,
    SCRIPT_USER,
    SESSION_SCRIPT,
    SESSION_USER,
    WORK_MOUNT,
)
from spillbox.sandbox.docker.outcome import (
    EXIT_KILLED,
    STOPPED_NOTE,
    Closed,
    Deadlines,
    Observed,
    Outcome,
    classify,
    split_marks,
)
from spillbox.sandbox.docker.state import (
    State,
    memory_ran_out,
    settled_state,
    stopped_under,
)
from spillbox.sandbox.docker.stream import (
    CappedBuffer,
    ExecStream,
    GaveUp,
    SandboxDied,
    watched_frames,
)
from spillbox.sandbox.docker_errors import DOCKER_FAILURES, best_effort, docker_errors
from spillbox.types import RawExec, SessionCall

STDERR_CAP_BYTES = 1024 * 1024
QUERY_ATTEMPTS = 2
"""A query whose engine died under it runs once more, on a fresh engine: it only reads."""
SESSION_RESTARTED_NOTE = (
    b"spillbox: the sandbox restarted since this task's last Python session call: this call "
    b"runs in a new, empty session; names defined before are gone\n"
)


@dataclass(frozen=True)
class _Runner:
    """What one exec runs, and as whom: run.sh for a stateless script (the script uid), the
    session's relay for a session cell (the session uid)."""

    command: list[str]
    user: str
    stateless: bool


@dataclass(frozen=True)
class _Output:
    """A script's exec as the host read it."""

    exec_id: str
    closed: Closed
    died: State | None
    """The container's State as the watch saw it stop (closed is SANDBOX_DIED)."""
    stdout: bytes
    stdout_truncated: bool
    stderr: bytes
    since: float
    """When the exec started (epoch seconds): Docker's events are asked from then on."""
    ran_for: float
    alone: bool
    """No other script of the task ran in this process when it ended."""


class TaskSandbox:
    """One task's sandbox, as this process holds it; DockerBackend makes one per task.

    >>> sandbox = DockerBackend(home).sandbox(storage)  # doctest: +SKIP
    >>> _ = sandbox.warm()  # the container starts in the background  # doctest: +SKIP
    >>> sandbox.exec("sh", "ls /sandbox/offload", timeout=10).exit_code  # doctest: +SKIP
    0
    """

    def __init__(
        self,
        task_id: str,
        client: Callable[[], docker.DockerClient],
        provide: Callable[[], Any],
        max_output_bytes: int,
    ) -> None:
        self.task_id = task_id
        self._client = client
        self._provide = provide
        """Finds, starts or creates the task's running container (the backend's job)."""
        self._max_output_bytes = max_output_bytes
        self._lock = threading.Lock()
        self._starting: threading.Thread | None = None
        self._start_error: BaseException | None = None
        self._container: Any = None
        """The container the last exec used: saves a lookup (list + inspect) per exec."""
        self._engine: SqlEngine | None = None
        self._scripts = 0
        """Stateless scripts of the task running in this process: a sweep of the script uid
        must spare them."""
        self._session_in: str | None = None
        """The container (and start) of this process's last session call: in another, or
        after a restart, the session is new."""

    @property
    def client(self) -> docker.DockerClient:
        return self._client()

    def warm(self) -> threading.Thread:
        """Start (or find) the container in the background, once; the thread doing it."""
        with self._lock:
            if self._starting is not None:
                return self._starting
            thread = self._starting = threading.Thread(
                target=self._start_in_background, daemon=True
            )
        thread.start()
        return thread

    def _start_in_background(self) -> None:
        # Thread.start() in warm() returns once this thread runs, but its caller then needs
        # the GIL, which the Docker SDK's Python work below would hold for about a
        # millisecond: yield it first, so the step that set the start going is not billed.
        time.sleep(0)
        try:
            self.container()
        except BaseException as e:  # re-raised by the first exec that needs the container
            self._start_error = e

    def ready(self) -> Any:
        """The running container, once the background start is over (its error, if it failed:
        the next call starts again)."""
        self.warm().join()
        with self._lock:
            error, self._start_error = self._start_error, None
            if error is not None:
                self._starting = None
        if error is not None:
            raise error
        return self._container or self.container()

    def container(self) -> Any:
        """The task's running container: found by label, started, or created."""
        self._container = self._provide()
        return self._container

    def forget(self) -> None:
        """Drop what this process remembers of the container and its engine."""
        self._container = None
        self.drop_engine()

    def drop_engine(self, *, kill: bool = False) -> None:
        """Let go of the SQL engine connection: the engine sees its input end and exits
        (kill: a hung engine is killed). The next query opens a new one."""
        with self._lock:
            engine, self._engine = self._engine, None
        if engine is not None:
            if kill:
                engine.kill()
            else:
                engine.close()

    def close(self) -> None:
        """Wait for the background start, and let go of the engine connection."""
        with self._lock:
            thread = self._starting
        if thread is not None:
            thread.join()
        self.drop_engine()

    def exec(
        self, lang: str, code: str, timeout: float, session: SessionCall | None = None
    ) -> RawExec:
        """Run a script (lang "sql": a query; with session, a python cell in the task's
        session) in the sandbox. One that never started runs once more, in the container
        found, started or created again: the payloads are on the host."""
        container = self.ready()
        with docker_errors(f"running a script in task {self.task_id!r}"):
            try:
                ran = self._run(container, lang, code, timeout, session)
            except DOCKER_FAILURES as failure:
                if not stopped_under(failure, container, self.client):
                    raise
                ran = Outcome.NEVER_STARTED
            if ran is Outcome.NEVER_STARTED:
                self.forget()
                ran = self._run(self.container(), lang, code, timeout, session)
        if isinstance(ran, Outcome):
            raise SandboxError(
                f"the sandbox of task {self.task_id!r} stopped again before the script "
                "could start: run it again",
                retryable=True,
            )
        return ran

    def _run(
        self, container: Any, lang: str, code: str, timeout: float, session: SessionCall | None
    ) -> RawExec | Outcome:
        if lang == "sql":
            return self._sql(container, code, timeout)
        if session is not None:
            return self._cell(container, session, code, timeout)
        runner = _Runner([RUN_SCRIPT, f"{timeout:g}", lang, code], SCRIPT_USER, stateless=True)
        return self._script(container, runner, timeout)

    def _cell(
        self, container: Any, session: SessionCall, code: str, timeout: float
    ) -> RawExec | Outcome:
        """Run a python cell in the task's session (session.py in the image): its relay
        ends as run.sh does, so the cell is read and classified as a script is."""
        # -S: the relay needs no site-packages, and starts faster without them.
        command = ["python3", "-S", SESSION_SCRIPT, "run" if session == "keep" else "reset"]
        runner = _Runner([*command, f"{timeout:g}", code], SESSION_USER, stateless=False)
        # A container restarted in place keeps its id: its start time tells the two apart.
        started = f"{container.id}@{container.attrs.get('State', {}).get('StartedAt')}"
        before, self._session_in = self._session_in, started
        ran = self._script(container, runner, timeout)
        if isinstance(ran, RawExec) and session == "keep" and before not in (None, started):
            ran = replace(ran, stderr=SESSION_RESTARTED_NOTE + ran.stderr)
        return ran

    def _script(self, container: Any, runner: _Runner, timeout: float) -> RawExec | Outcome:
        """Run one script (run.sh) or session cell (its relay): read its output, classify
        how it ended, act on that (outcome.py)."""
        output = self._read(container, runner, timeout)
        if output.closed is Closed.GAVE_UP:
            self._restart(container)
        stderr, end_mark, oom_mark = split_marks(output.stderr)
        exit_code = self._exit_code(output)
        seen = Observed(
            output.closed, exit_code, output.ran_for, timeout, end_mark, oom_mark, output.died
        )
        outcome = classify(
            seen,
            settle=partial(settled_state, container, self.client),
            memory_ran_out=partial(memory_ran_out, container, self.client, since=output.since),
        )
        if outcome is Outcome.NEVER_STARTED:
            self.forget()
            return outcome
        restarted = Outcome.KILLED_AFTER_GRACE in outcome
        if runner.stateless and output.alone and Outcome.TIMED_OUT in outcome and not restarted:
            # What escaped the script's group; with a neighbour still running, the sweep
            # waits for the last script of the task to end (run.sh sweeps then).
            self._kill_scripts(container)
        if Outcome.SANDBOX_STOPPED in outcome:
            self.forget()
            stderr += STOPPED_NOTE
        return RawExec(
            exit_code=exit_code,
            stdout=output.stdout,
            stderr=stderr,
            timed_out=Outcome.TIMED_OUT in outcome,
            oom_killed=Outcome.OUT_OF_MEMORY in outcome,
            stdout_truncated=output.stdout_truncated,
        )

    def _read(self, container: Any, runner: _Runner, timeout: float) -> _Output:
        """Start the script and read its output until it ends, the sandbox dies, or the host
        gives up (Deadlines: at kill_at the host kills the runner uid's processes)."""
        stream = ExecStream(
            self.client.api,
            container.id,
            runner.command,
            user=runner.user,
            stdin=False,
            home=WORK_MOUNT,
        )
        started, since = time.monotonic(), time.time()
        deadlines = Deadlines.behind(timeout, started)
        stdout = CappedBuffer(self._max_output_bytes)
        stderr = CappedBuffer(STDERR_CAP_BYTES)
        closed, died = Closed.OUTPUT_ENDED, None
        self._script_started(runner.stateless)
        try:
            for kind, data in watched_frames(
                stream,
                container,
                self.client,
                give_up_at=deadlines.give_up_at,
                late=(deadlines.kill_at, partial(self._kill_scripts, container, runner.user)),
            ):
                (stdout if kind == 1 else stderr).add(data)
        except GaveUp:
            closed = Closed.GAVE_UP
        except SandboxDied as e:
            closed, died = Closed.SANDBOX_DIED, e.state
        except OSError as e:
            raise ExecError(f"lost the connection to the script: {e}; run it again") from e
        finally:
            stream.close()
            alone = self._script_ended(runner.stateless)
        return _Output(
            exec_id=stream.exec_id,
            closed=closed,
            died=died,
            stdout=stdout.value(),
            stdout_truncated=stdout.dropped > 0,
            stderr=stderr.value(),
            since=since,
            ran_for=time.monotonic() - started,
            alone=alone,
        )

    def _exit_code(self, output: _Output) -> int:
        """The exec's exit code; a restart or a dead sandbox takes it with the exec."""
        if output.closed is not Closed.OUTPUT_ENDED:
            return EXIT_KILLED
        with docker_errors("reading a script's exit code"):
            exit_code = self.client.api.exec_inspect(output.exec_id)["ExitCode"]
        return EXIT_KILLED if exit_code is None else int(exit_code)

    def _script_started(self, stateless: bool) -> None:
        with self._lock:
            self._scripts += stateless

    def _script_ended(self, stateless: bool) -> bool:
        """Count one script fewer; whether no stateless script of the task runs here now."""
        with self._lock:
            self._scripts -= stateless
            return not self._scripts

    def _restart(self, container: Any) -> None:
        """KILLED_AFTER_GRACE: restart the container (the payloads are on the host)."""
        self.forget()
        # Gone already: the next exec creates a new one.
        best_effort(partial(container.restart, timeout=0), None)

    def _kill_scripts(self, container: Any, user: str = SCRIPT_USER) -> None:
        """Kill every process of a uid (the script uid: the whole group and any that escaped
        it; the session uid: the session, its cell and whatever that left)."""
        # A container that is gone took its processes with it.
        best_effort(partial(container.exec_run, ["kill", "-KILL", "-1"], user=user), None)

    def _sql(self, container: Any, code: str, timeout: float) -> RawExec | Outcome:
        """Run one query in the task's engine; its endings are the query paragraph of
        outcome.py."""
        since = time.time()
        try:
            response = retry(partial(self._query, container, code, timeout), QUERY_ATTEMPTS)
        except ExecError:
            # Both attempts failed. A container being killed can still show as running for
            # a moment while Docker refuses to exec into it ("setns process: exit status 1"),
            # so its state is read once it settles: stopped, the query runs again after the
            # restart; still running, the engine itself failed and the error stands.
            if settled_state(container, self.client).get("Running"):
                raise
            return Outcome.NEVER_STARTED
        except SandboxDied as died:
            self.forget()
            oom = memory_ran_out(container, self.client, died.state, since)
            return RawExec(EXIT_KILLED, b"", STOPPED_NOTE, False, oom)
        if response is None:
            self.drop_engine(kill=True)
            return RawExec(124, b"", b"query killed: it ran past its timeout", True, False)
        return RawExec(
            exit_code=int(response["exit_code"]),
            stdout=str(response["stdout"]).encode("utf-8"),
            stderr=str(response["stderr"]).encode("utf-8"),
            timed_out=bool(response.get("timed_out")),
            oom_killed=False,
            stdout_truncated=bool(response.get("truncated")),
        )

    def _query(self, container: Any, code: str, timeout: float) -> dict[str, Any] | None:
        engine = self._engine_for(container)
        try:
            return engine.query(code, timeout, self._max_output_bytes)
        except ExecError:
            self.drop_engine()
            raise

    def _engine_for(self, container: Any) -> SqlEngine:
        """The connection to the container's engine: the one kept, or a new one (replacing
        one whose container is gone or replaced)."""
        with self._lock:
            engine = self._engine
            if engine is None or engine.container_id != container.id:
                if engine is not None:
                    engine.close()
                engine = self._engine = SqlEngine(self.client, container)
        return engine
