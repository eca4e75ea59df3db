"""What the host parses of a sandbox's answers, checked field by field.

Everything inside a sandbox may be hostile: a script runs as the same uid as the fork
server, so it can kill it and answer in its place (`{"exit_code": 1e999}`). Each answer is
parsed here, strictly (JSON without NaN or Infinity, each field of its type and range);
one that is not as the runners write it is an ExecError that names the answer as
malformed, which the call gets as its error result. Nothing of it reaches the host's
arithmetic, its catalog, or the loop.

    end = runner_end(b'{"exit_code": 0, "oom_killed": false, "nonce": "a1"}', "a1")
    end.exit_code
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

from spillbox.errors import ExecError

MAX_EXIT_CODE = 255
"""An exit status is a byte (128 + N for a signal N)."""
_SHOWN = 120
"""How much of a malformed answer its error shows."""


@dataclass(frozen=True)
class RunnerEnd:
    """A runner's END frame: how a stateless script (forkserver.py) or a session cell
    (session.py) ended."""

    exit_code: int
    oom_killed: bool
    outputs: bool
    """Files were left in /sandbox/outputs."""


@dataclass(frozen=True)
class EngineAnswer:
    """The SQL engine's answer to one query (sqlserver.py)."""

    exit_code: int
    stdout: str
    stderr: str
    timed_out: bool
    truncated: bool


def runner_end(data: bytes, nonce: str) -> RunnerEnd:
    """The END frame's data; a script that replaced the fork server writes what it likes,
    and a cell that reached its relay's stdout (gVisor keeps no process of the session uid
    from another's descriptors) writes frames into it: the end carries the nonce of the
    call it ends, which no script or cell is given."""
    what = "a runner's end of a script"
    answer = _object(data, what)
    if answer.get("nonce") != nonce:
        raise _malformed(what, "not this call's end (its nonce differs)")
    return RunnerEnd(
        exit_code=_exit_code(answer, what),
        oom_killed=_flag(answer, "oom_killed", what),
        outputs=_flag(answer, "outputs", what, default=False),
    )


def engine_answer(answer: Any) -> EngineAnswer:
    """The engine's answer (a JSON line its relay already parsed)."""
    what = "the SQL engine's answer"
    if not isinstance(answer, dict):
        raise _malformed(what, f"{type(answer).__name__}, not an object")
    return EngineAnswer(
        exit_code=_exit_code(answer, what),
        stdout=_text(answer, "stdout", what),
        stderr=_text(answer, "stderr", what),
        timed_out=_flag(answer, "timed_out", what, default=False),
        truncated=_flag(answer, "truncated", what, default=False),
    )


def _object(data: bytes, what: str) -> dict[str, Any]:
    try:
        answer = json.loads(data, parse_constant=_no_constant)  # no NaN, no Infinity
    except (ValueError, RecursionError):
        shown = data[:_SHOWN].decode("utf-8", "replace")
        raise _malformed(what, f"not JSON ({shown!r})") from None
    if not isinstance(answer, dict):
        raise _malformed(what, f"{type(answer).__name__}, not an object")
    return answer


def _exit_code(answer: dict[str, Any], what: str) -> int:
    value = answer.get("exit_code")
    if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_EXIT_CODE:
        raise _malformed(what, f"exit_code {_shown(value)} is not a whole number 0-255")
    return value


def _flag(answer: dict[str, Any], key: str, what: str, default: bool | None = None) -> bool:
    value = answer.get(key, default)
    if not isinstance(value, bool):
        raise _malformed(what, f"{key} {_shown(value)} is not true or false")
    return value


def _text(answer: dict[str, Any], key: str, what: str) -> str:
    value = answer.get(key)
    if not isinstance(value, str):
        raise _malformed(what, f"{key} {_shown(value)} is not text")
    if _has_surrogate(value):
        raise _malformed(what, f"{key} holds a lone surrogate (not valid Unicode)")
    return value


def _has_surrogate(text: str) -> bool:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError:
        return True
    return False


def _no_constant(name: str) -> Any:
    raise ValueError(f"{name} is not a JSON number")


def _shown(value: Any) -> str:
    return "missing" if value is None else repr(value)[:_SHOWN]


def _malformed(what: str, why: str) -> ExecError:
    return ExecError(
        f"the sandbox's answer was malformed ({what}: {why}): the call's result is lost; "
        "run it again, and if it repeats, close the task (something in the sandbox answers "
        "in place of spillbox's runner)"
    )
