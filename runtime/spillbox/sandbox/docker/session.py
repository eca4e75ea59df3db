"""One task's sandbox as this process holds it, and the execs that run in it.

The backend (backend.py) finds, creates and removes containers; a TaskSandbox owns what a
process keeps for one task between calls: the container its execs use, the connection to
its SQL engine, the background start, and how many of its scripts run here. How an exec
can end, and what the host then does, is outcome.py's table.
"""

from __future__ import annotations

import json
import secrets
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, replace
from functools import partial
from typing import Any

import docker

from spillbox.errors import ExecError, SandboxError, retry
from spillbox.sandbox.docker.answers import engine_answer, fork_server_end
from spillbox.sandbox.docker.engine import SqlEngine
from spillbox.sandbox.docker.layout import (
    ENGINE_USER,
    SCRIPT_USER,
    SESSION_SCRIPT,
    SESSION_USER,
    TAKEOUT_SCRIPT,
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
    split_end,
)
from spillbox.sandbox.docker.runner import END, STARTED, STDOUT, Runner
from spillbox.sandbox.docker.state import (
    State,
    memory_ran_out,
    settled_state,
    stopped_under,
)
from spillbox.sandbox.docker.stream import (
    CappedBuffer,
    ExecStream,
    Frames,
    GaveUp,
    SandboxDied,
    watched_frames,
)
from spillbox.sandbox.docker_errors import DOCKER_FAILURES, best_effort, docker_errors
from spillbox.types import OutputFile, RawExec, SessionCall

STDERR_CAP_BYTES = 1024 * 1024
QUERY_ATTEMPTS = 2
"""A query whose engine died under it runs once more, on a fresh engine: it only reads."""
MAX_OUTPUT_FILES = 32
"""Files taken from /sandbox/outputs after one call; the rest are removed, and named."""
MAX_OUTPUT_FILE_BYTES = 32 * 1024 * 1024
TAKEOUT_SECONDS = 60.0
"""How long taking the output files may last (at most the folder's cap, read in memory)."""
SESSION_RESTARTED_NOTE = (
    b"spillbox: the sandbox restarted since this task's last Python session call: this call "
    b"runs in a new, empty session; names defined before are gone\n"
)


@dataclass(frozen=True)
class _Output:
    """A script as the host read it."""

    started: bool
    """It ran (a session relay always starts its cell; a fork server says so)."""
    exit_code: int
    end_mark: bool
    """Its runner said it ended (the session relay's end mark, the fork server's END)."""
    oom_mark: bool
    closed: Closed
    died: State | None
    """The container's State as the watch saw it stop (closed is SANDBOX_DIED)."""
    stdout: bytes
    stdout_truncated: bool
    stderr: bytes
    since: float
    """When the exec started (epoch seconds): Docker's events are asked from then on."""
    ran_for: float
    outputs: bool = False
    """Its runner saw files left in /sandbox/outputs."""


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
        self._runners: list[Runner] = []
        """Idle relays into the fork server (runner.py), kept for the next script."""
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
            # Started under the lock: a second caller must never get a thread it cannot join
            # yet (two first execs at once raised "cannot join thread before it is started").
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
        """Drop what this process remembers of the container: its engine connection and
        the relays into its fork server."""
        self._container = None
        self.drop_engine()
        self._drop_runners()

    def _drop_runners(self) -> None:
        with self._lock:
            runners, self._runners = self._runners, []
        for runner in runners:
            runner.close()

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
        self._drop_runners()

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
        return self._finish(container, self._fast(container, lang, code, timeout), timeout)

    def _cell(
        self, container: Any, session: SessionCall, code: str, timeout: float
    ) -> RawExec | Outcome:
        """Run a python cell in the task's session (session.py in the image): its relay
        ends with the end mark, so the cell is read and classified as a script is."""
        # -S: the relay needs no site-packages, and starts faster without them.
        command = ["python3", "-S", SESSION_SCRIPT, "run" if session == "keep" else "reset"]
        command.append(f"{timeout:g}")
        # A container restarted in place keeps its id: its start time tells the two apart.
        started = f"{container.id}@{container.attrs.get('State', {}).get('StartedAt')}"
        before, self._session_in = self._session_in, started
        output = self._read(container, command, code, timeout)
        ran = self._finish(container, output, timeout)
        if isinstance(ran, RawExec) and session == "keep" and before not in (None, started):
            ran = replace(ran, stderr=SESSION_RESTARTED_NOTE + ran.stderr)
        return ran

    def _finish(self, container: Any, output: _Output, timeout: float) -> RawExec | Outcome:
        """Classify how a script or session cell ended, and act on that (outcome.py)."""
        if output.closed is Closed.GAVE_UP:
            self._restart(container)
        if not output.started:
            self.forget()
            return Outcome.NEVER_STARTED
        exit_code = output.exit_code if output.closed is Closed.OUTPUT_ENDED else EXIT_KILLED
        seen = Observed(
            output.closed,
            exit_code,
            output.ran_for,
            timeout,
            output.end_mark,
            output.oom_mark,
            output.died,
        )
        outcome = classify(
            seen,
            settle=partial(settled_state, container, self.client),
            memory_ran_out=partial(memory_ran_out, container, self.client, since=output.since),
        )
        if outcome is Outcome.NEVER_STARTED:
            self.forget()
            return outcome
        if Outcome.OUT_OF_MEMORY in outcome and not output.end_mark:
            # gVisor can cut the runner's exec with a status of its own (128: "WaitPID
            # failed") as the OOM kill ends the script: it was killed, as under runc.
            exit_code = EXIT_KILLED
        stderr = output.stderr
        files: tuple[OutputFile, ...] = ()
        notes: tuple[str, ...] = ()
        if Outcome.SANDBOX_STOPPED in outcome:
            self.forget()
            stderr += STOPPED_NOTE
        elif output.outputs:
            files, notes = self._take_outputs(container)
        return RawExec(
            exit_code=exit_code,
            stdout=output.stdout,
            stderr=stderr,
            timed_out=Outcome.TIMED_OUT in outcome,
            oom_killed=Outcome.OUT_OF_MEMORY in outcome,
            stdout_truncated=output.stdout_truncated,
            files=files,
            file_notes=notes,
        )

    def _take_outputs(self, container: Any) -> tuple[tuple[OutputFile, ...], tuple[str, ...]]:
        """Take the files a call left in /sandbox/outputs (takeout.py, as the engine uid: no
        script can stop or steer it), which empties the folder; what was not taken is
        named in the notes."""
        command = [
            *("python3", "-S", TAKEOUT_SCRIPT, "collect"),
            *(str(MAX_OUTPUT_FILES), str(MAX_OUTPUT_FILE_BYTES)),
        ]
        files: list[OutputFile] = []
        notes: list[str] = []
        errors = bytearray()
        frames = Frames()
        with docker_errors("taking the files a script left in /sandbox/outputs"):
            stream = ExecStream(
                self.client.api, container.id, command, ENGINE_USER, stdin=False, home=WORK_MOUNT
            )
            try:
                give_up_at = time.monotonic() + TAKEOUT_SECONDS
                for kind, data in watched_frames(stream, container, self.client, give_up_at):
                    if kind != 1:
                        errors += data[: 4096 - len(errors)]
                        continue
                    frames.feed(data)
                    for tag, body in frames:
                        if tag == b"F":
                            name, _, content = body.partition(b"\n")
                            files.append(OutputFile(name.decode("utf-8"), content))
                        else:
                            notes.append(body.decode("utf-8", "replace"))
            except (GaveUp, SandboxDied, OSError) as e:
                why = {
                    GaveUp: f"it took over {TAKEOUT_SECONDS:g} s",
                    SandboxDied: "the sandbox stopped",
                }.get(type(e), f"the connection broke: {e}")
                notes.append(f"the output files could not all be taken ({why}): write them again")
            finally:
                stream.close()
        if errors:
            notes.append(f"taking the output files failed: {_last_line(bytes(errors))}")
        return tuple(files), tuple(notes)

    def _fast(self, container: Any, lang: str, code: str, timeout: float) -> _Output:
        """Run a stateless script in the fork server, through a relay kept open (runner.py),
        and read it until its end, the sandbox's death, or the host gives up (Deadlines: at
        kill_at the host kills every process of the script uid)."""
        runner = self._runner_for(container)
        started, since = time.monotonic(), time.time()
        deadlines = Deadlines.behind(timeout, started)
        stdout = CappedBuffer(self._max_output_bytes)
        stderr = CappedBuffer(STDERR_CAP_BYTES)
        closed, died, began, end = Closed.OUTPUT_ENDED, None, False, None
        try:
            late = (deadlines.kill_at, partial(self._kill_scripts, container, SCRIPT_USER))
            for kind, data in runner.run(lang, code, timeout, deadlines.give_up_at, late):
                if kind == STARTED:
                    began = True
                elif kind == END:
                    end = fork_server_end(data)
                else:
                    (stdout if kind == STDOUT else stderr).add(data)
        except GaveUp:
            closed = Closed.GAVE_UP
        except SandboxDied as e:
            closed, died = Closed.SANDBOX_DIED, e.state
        except OSError:
            pass  # the relay's connection broke: the script ended unseen (or never began)
        finally:
            self._put_back(runner, end is not None)
        return _Output(
            started=began,
            exit_code=EXIT_KILLED if end is None else end.exit_code,
            end_mark=end is not None,
            oom_mark=end is not None and end.oom_killed,
            closed=closed,
            died=died,
            stdout=stdout.value(),
            stdout_truncated=stdout.dropped > 0,
            stderr=stderr.value(),
            since=since,
            ran_for=time.monotonic() - started,
            outputs=end is not None and end.outputs,
        )

    def _runner_for(self, container: Any) -> Runner:
        """An idle relay into the container's fork server, or a new one."""
        with self._lock:
            while self._runners:
                runner = self._runners.pop()
                if runner.container_id == container.id:
                    return runner
                runner.close()
        return Runner(self.client, container)

    def _put_back(self, runner: Runner, reusable: bool) -> None:
        if not reusable:
            runner.close()
            return
        with self._lock:
            self._runners.append(runner)

    def _read(self, container: Any, command: list[str], code: str, timeout: float) -> _Output:
        """Start a session cell's relay, hand it the cell (on stdin: an exec's command line
        is in /proc for every process to read) and a nonce for its end line, and read its
        output until it ends, the sandbox dies, or the host gives up (Deadlines: at kill_at
        the host kills every process of the session uid)."""
        stream = ExecStream(
            self.client.api,
            container.id,
            command,
            user=SESSION_USER,
            stdin=True,
            home=WORK_MOUNT,
        )
        nonce = secrets.token_hex(16)
        started, since = time.monotonic(), time.time()
        deadlines = Deadlines.behind(timeout, started)
        stdout = CappedBuffer(self._max_output_bytes)
        stderr = CappedBuffer(STDERR_CAP_BYTES)
        closed, died = Closed.OUTPUT_ENDED, None
        try:
            stream.send((json.dumps({"code": code, "nonce": nonce}) + "\n").encode())
            for kind, data in watched_frames(
                stream,
                container,
                self.client,
                give_up_at=deadlines.give_up_at,
                late=(deadlines.kill_at, partial(self._kill_scripts, container, SESSION_USER)),
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
        text, end_mark, oom_mark, outputs = split_end(stderr.value(), nonce)
        return _Output(
            started=True,
            exit_code=self._exit_code(stream.exec_id) if closed is Closed.OUTPUT_ENDED else 0,
            end_mark=end_mark,
            oom_mark=oom_mark,
            closed=closed,
            died=died,
            stdout=stdout.value(),
            stdout_truncated=stdout.dropped > 0,
            stderr=text,
            since=since,
            ran_for=time.monotonic() - started,
            outputs=outputs,
        )

    def _exit_code(self, exec_id: str) -> int:
        """An exec's exit code, once its output ended."""
        with docker_errors("reading a script's exit code"):
            exit_code = self.client.api.exec_inspect(exec_id)["ExitCode"]
        return EXIT_KILLED if exit_code is None else int(exit_code)

    def _restart(self, container: Any) -> None:
        """KILLED_AFTER_GRACE: restart the container (the payloads are on the host)."""
        self.forget()
        # Gone already: the next exec creates a new one.
        best_effort(partial(container.restart, timeout=0), None)

    def _kill_scripts(self, container: Any, user: str) -> None:
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
        answer = engine_answer(response)
        return RawExec(
            exit_code=answer.exit_code,
            stdout=answer.stdout.encode("utf-8"),
            stderr=answer.stderr.encode("utf-8"),
            timed_out=answer.timed_out,
            oom_killed=False,
            stdout_truncated=answer.truncated,
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


def _last_line(data: bytes) -> str:
    lines = data.decode("utf-8", "replace").strip().splitlines()
    return lines[-1] if lines else ""
