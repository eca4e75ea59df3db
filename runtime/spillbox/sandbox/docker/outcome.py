"""How an exec ends: the outcomes, told apart in one function (classify), and the deadlines
at which the host steps in behind a script's own timeout.

A script runs under a runner inside the container, which applies its timeout, sweeps what
it left, and says when it ended: a stateless script in the fork server (forkserver.py), a
session cell in the Python session (session.py), each read through a relay the host keeps
open (channels.py), whose END frame carries the exit code and the OOM mark (the end mark).
The host reads the output, asks whether the container still runs whenever that output is
quiet for a second (stream.watched_frames), kills every process of the runner's uid at
Deadlines.kill_at and gives up at Deadlines.give_up_at. An exec's outcome is one or more of
these flags:

| outcome            | the host tells it by            | the host then         | the caller gets  |
|--------------------|---------------------------------|-----------------------|------------------|
| ENDED              | none of the rows below holds    | nothing               | the exit code    |
| TIMED_OUT          | exit 124 or 137 at or past the  | nothing more (the     | timed_out        |
|                    | timeout (the runner's timeout,  | runner killed the     |                  |
|                    | or the host's kill at kill_at)  | script and swept)     |                  |
| KILLED_AFTER_GRACE | the output still open at        | restarts the sandbox, | exit 137,        |
| (with TIMED_OUT)   | give_up_at                      | which ends every      | timed_out        |
|                    |                                 | process in it         |                  |
| SANDBOX_STOPPED    | the watch finds the container   | forgets its container | STOPPED_NOTE in  |
|                    | stopped, or a runner cut (no    | and engine; the next  | stderr           |
|                    | end mark, not timed out) whose  | exec restarts it      |                  |
|                    | sandbox shows stopped within    |                       |                  |
|                    | SETTLE_SECONDS                  |                       |                  |
| NEVER_STARTED      | as SANDBOX_STOPPED with exit    | runs it once more, in | the second run's |
| (alone)            | 126; or Docker refuses the exec | a restarted sandbox   | result           |
|                    | and the container is not running|                       |                  |
| OUT_OF_MEMORY      | the runner's OOM mark; for a cut| nothing more          | oom_killed       |
|                    | runner, Docker's OOMKilled or   |                       |                  |
|                    | its "oom" event within          |                       |                  |
|                    | OOM_EVENT_SECONDS               |                       |                  |

Why the rows are as they are (each seen under gVisor, runtime runsc, in CI or loaded runs):

- gVisor ends the whole sandbox at its memory or pids limit and leaves the exec's connection
  open: without the watch, such a script would be reported only at give_up_at, as a timeout.
- gVisor can end a runner's exec ("WaitPID failed: EOF", exit 128) a moment before Docker
  records the stop: a runner without its end mark waits SETTLE_SECONDS for the sandbox to
  show as stopped, so the stop (and an OOM) is reported as what it was.
- A stateless script whose relay ended before the fork server said it started (a relay
  kept from a sandbox that has restarted since) never ran: NEVER_STARTED.
- Docker sets OOMKilled only if it hears of the OOM before the exit, and only when the
  container stops. Under gVisor the exit can come first, or the OOM can kill one sandbox
  process and cut the exec while the container runs on; the "oom" event is logged either way.
- An exec made as the sandbox stops cannot start: the runtime answers 126, or Docker refuses
  it with 404, 409 or (20.10) 500 "is not running". Nothing ran, so it runs again. A gVisor
  sandbox at its pids limit can stop a moment after the last script ended, under the next.
- At the pids limit the runner's own kill may not start; an escaped process can hold the
  output open: hence the host's kill at kill_at, and the restart at give_up_at.
- A script that ran when its sandbox stopped is not run again: its failure is reported
  (exit 137 and the note), and the next exec restarts the sandbox.

A query (lang "sql") is answered by the task's SQL engine, which applies its timeout
itself: the answer is ENDED or TIMED_OUT as the engine says. No answer KILL_GRACE_SECONDS
past the timeout is KILLED_AFTER_GRACE (the host kills the engine; exit 124). The container
stopping under it is SANDBOX_STOPPED (exit 137; OUT_OF_MEMORY as for a cut runner). An engine
that died under it (a daemon restart, a deletion, an OOM) gets one retry with a fresh
engine, since a query only reads; if that fails too and the container has stopped (read
once its state settles: a container being killed shows as running for a moment while Docker
already refuses to exec into it), it is NEVER_STARTED: it runs again in the restarted sandbox.

>>> seen = Observed(Closed.OUTPUT_ENDED, 124, ran_for=3.0, timeout=2.0, end_mark=True,
...                 oom_mark=False)
>>> classify(seen, settle=dict, memory_ran_out=lambda state: False)
<Outcome.TIMED_OUT: 2>
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum, Flag, auto

from spillbox.sandbox.docker.state import State

KILL_GRACE_SECONDS = 5.0
"""After a timeout, how long the in-container kill gets before the host kills for it."""
EXEC_NOT_STARTED = 126
"""The exit code of an exec the runtime could not start."""
EXIT_KILLED = 137
"""The exit code reported when a restart or a dead sandbox took the exec's own with it."""
TIMEOUT_EXITS = (124, 137)
"""`timeout`'s own exit, and that of a process it (or the host) killed with SIGKILL."""
STOPPED_NOTE = (
    b"spillbox: the sandbox stopped while the script ran; the next exec restarts it, with "
    b"an empty /sandbox/work and a new, empty Python session (the payloads stay)\n"
)


class Outcome(Flag):
    """How an exec ended: one or more flags (see the table above)."""

    ENDED = auto()
    TIMED_OUT = auto()
    KILLED_AFTER_GRACE = auto()
    SANDBOX_STOPPED = auto()
    NEVER_STARTED = auto()
    OUT_OF_MEMORY = auto()


class Closed(Enum):
    """How the host stopped reading an exec's output."""

    OUTPUT_ENDED = "output ended"
    SANDBOX_DIED = "the watch found the container stopped"
    GAVE_UP = "still open at give_up_at"


@dataclass(frozen=True)
class Observed:
    """What the host saw of a script's exec by the end of its output."""

    closed: Closed
    exit_code: int
    """The exec's exit code; EXIT_KILLED when Docker has none (GAVE_UP, SANDBOX_DIED)."""
    ran_for: float
    """Seconds from the exec's start to the end of its output."""
    timeout: float
    end_mark: bool
    """The runner said the script ended (its end line, or the fork server's END)."""
    oom_mark: bool
    """The runner said the memory limit killed something while it ran."""
    died: State | None = None
    """The container's State as the watch saw it stop (closed is SANDBOX_DIED)."""


@dataclass(frozen=True)
class Deadlines:
    """When the host steps in behind a script's in-container timeout (monotonic seconds)."""

    kill_at: float
    """Kill every process of the script uid: the runner's own kill had its grace."""
    give_up_at: float
    """Stop waiting and restart the sandbox: not even the host's kill ended the output."""

    @classmethod
    def behind(cls, timeout: float, started: float) -> Deadlines:
        return cls(
            kill_at=started + timeout + KILL_GRACE_SECONDS,
            give_up_at=started + timeout + 3 * KILL_GRACE_SECONDS,
        )


def classify(
    seen: Observed,
    settle: Callable[[], State],
    memory_ran_out: Callable[[State], bool],
) -> Outcome:
    """The outcome of a script's exec, by the table above.

    settle gives the container's State once it stopped (or after SETTLE_SECONDS running);
    memory_ran_out asks Docker's record and events. Each is asked only for a runner cut
    under its exec, and memory_ran_out not for one that never started.
    """
    oom = Outcome.OUT_OF_MEMORY if seen.oom_mark else Outcome(0)
    if seen.closed is Closed.GAVE_UP:
        return Outcome.KILLED_AFTER_GRACE | Outcome.TIMED_OUT | oom
    timed_out = seen.exit_code in TIMEOUT_EXITS and seen.ran_for >= seen.timeout
    outcome = Outcome.TIMED_OUT if timed_out else Outcome(0)
    cut = seen.closed is Closed.SANDBOX_DIED or not (seen.end_mark or timed_out)
    if cut:
        after = seen.died if seen.died is not None else settle()
        if not after.get("Running"):
            if seen.exit_code == EXEC_NOT_STARTED:
                return Outcome.NEVER_STARTED
            outcome |= Outcome.SANDBOX_STOPPED
        if not oom and memory_ran_out(after):
            oom = Outcome.OUT_OF_MEMORY
    return (outcome | oom) or Outcome.ENDED
