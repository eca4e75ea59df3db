"""A script or a session cell run over a kept channel (channels.py): read to its end, and
what the host makes of that end (outcome.py's table) as the caller's RawExec."""

from __future__ import annotations

import secrets
import time
from collections.abc import Callable
from dataclasses import dataclass
from functools import partial
from typing import Any

import docker

import spillbox.sandbox.docker.wire as wire
from spillbox.sandbox.docker.answers import runner_end
from spillbox.sandbox.docker.channels import Channel
from spillbox.sandbox.docker.outcome import (
    EXIT_KILLED,
    STOPPED_NOTE,
    Closed,
    Deadlines,
    Observed,
    Outcome,
    classify,
)
from spillbox.sandbox.docker.state import State, memory_ran_out, settled_state
from spillbox.sandbox.docker.stream import CappedBuffer, GaveUp, SandboxDied
from spillbox.types import OutputFile, RawExec

STDERR_CAP_BYTES = 1024 * 1024
CUT_NOTE = (
    b"spillbox: the runner's connection ended while this call ran (a process killed it): "
    b"its output may be cut short; the next call opens a new one\n"
)


class NeverStarted(Exception):
    """The exec never ran (NEVER_STARTED): it runs once more, in the container found,
    started or created again."""


@dataclass(frozen=True)
class Output:
    """A script or cell as the host read it."""

    started: bool
    """It ran (the runner said STARTED)."""
    exit_code: int
    end_mark: bool
    """Its runner said it ended (END)."""
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


def read_to_end(
    channel: Channel,
    request: dict[str, Any],
    timeout: float,
    max_output_bytes: int,
    kill: Callable[[], object],
) -> Output:
    """Ask the channel to run a script or cell and read it until its END, the sandbox's
    death, or the host gives up (Deadlines: at kill_at, kill runs: it kills every process
    of the runner's uid)."""
    nonce = secrets.token_hex(16)
    started, since = time.monotonic(), time.time()
    deadlines = Deadlines.behind(timeout, started)
    stdout = CappedBuffer(max_output_bytes)
    stderr = CappedBuffer(STDERR_CAP_BYTES)
    closed, died, began, end = Closed.OUTPUT_ENDED, None, False, None
    try:
        late = (deadlines.kill_at, kill)
        for kind, data in channel.ask({**request, "nonce": nonce}, deadlines.give_up_at, late):
            if kind == wire.STARTED:
                began = True
            elif kind == wire.END:
                end = runner_end(data, nonce)
            else:
                (stdout if kind == wire.STDOUT else stderr).add(data)
    except GaveUp:
        closed = Closed.GAVE_UP
    except SandboxDied as e:
        closed, died = Closed.SANDBOX_DIED, e.state
    except OSError:
        pass  # the connection broke: the script ended unseen (or never began)
    return Output(
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


def outcome_of(
    output: Output, container: Any, client: docker.DockerClient, timeout: float
) -> Outcome:
    """The outcome of a script or cell that started (outcome.py's table)."""
    seen = Observed(
        closed=output.closed,
        exit_code=output.exit_code if output.closed is Closed.OUTPUT_ENDED else EXIT_KILLED,
        ran_for=output.ran_for,
        timeout=timeout,
        end_mark=output.end_mark,
        oom_mark=output.oom_mark,
        died=output.died,
    )
    return classify(
        seen,
        settle=partial(settled_state, container, client),
        memory_ran_out=partial(memory_ran_out, container, client, since=output.since),
    )


def raw_exec(
    output: Output,
    outcome: Outcome,
    files: tuple[OutputFile, ...] = (),
    notes: tuple[str, ...] = (),
) -> RawExec:
    """What the caller gets of a script or cell that ran."""
    exit_code = output.exit_code if output.closed is Closed.OUTPUT_ENDED else EXIT_KILLED
    if Outcome.OUT_OF_MEMORY in outcome and not output.end_mark:
        # gVisor can cut the runner's exec with a status of its own (128: "WaitPID
        # failed") as the OOM kill ends the script: it was killed, as under runc.
        exit_code = EXIT_KILLED
    stderr = output.stderr
    if Outcome.SANDBOX_STOPPED in outcome:
        stderr += STOPPED_NOTE
    elif not output.end_mark and outcome == Outcome.ENDED:
        stderr += CUT_NOTE
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
