"""How the Docker SDK's failures become spillbox errors: one table, for the Docker backend
(spillbox.sandbox.docker) and the image builder (spillbox.sandbox.image) alike.

| the SDK raises                  | fault       | retryable | what it means                       |
|---------------------------------|-------------|-----------|-------------------------------------|
| NotFound (ImageNotFound too)    | GONE        | no        | not there: removed, or never built  |
| APIError with status 409        | CONFLICT    | no        | its state forbids the call for now: |
|                                 |             |           | a name still taken, a removal under |
|                                 |             |           | way, an exec into a stopped one     |
| APIError, any other status      | REFUSED     | no        | the engine answered with an error   |
| DockerException, any other      | FAILED      | no        | the SDK itself failed: its settings |
|                                 |             |           | (DOCKER_HOST, TLS, context), a bad  |
|                                 |             |           | argument or reply                   |
| OSError (requests' connection   | UNREACHABLE | yes       | the engine did not answer: stopped, |
| errors and timeouts are ones)   |             |           | restarting or busy                  |

A failure becomes a SandboxError whose message the call site words around the failure's
`detail` (what it was doing, what to do next) and whose `retryable` is the table's:

    with docker_errors("listing containers"):
        client.containers.list()

Where a fault is an answer rather than an error, a helper built on the table says so:
`unless_gone` (a missing object is a result) and `best_effort` (a cleanup or a check whose
failure changes nothing).

It lives beside the docker package rather than in it: image.py uses it, and the package
imports image.py.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from enum import Enum
from typing import TypeVar

import docker.errors

from spillbox.errors import SandboxError

_T = TypeVar("_T")
_D = TypeVar("_D")


class Fault(Enum):
    """A row of the table: what kind of Docker failure this is."""

    GONE = "gone"
    CONFLICT = "conflict"
    REFUSED = "refused"
    FAILED = "failed"
    UNREACHABLE = "unreachable"

    @property
    def retryable(self) -> bool:
        return self is Fault.UNREACHABLE

    @property
    def answered(self) -> bool:
        """Whether the engine answered (with an error status), as an APIError says."""
        return self in (Fault.GONE, Fault.CONFLICT, Fault.REFUSED)


DOCKER_FAILURES: tuple[type[BaseException], ...] = (docker.errors.DockerException, OSError)
"""Every exception the table knows; catch these, then ask fault_of which one it is."""

_TABLE: tuple[tuple[type[BaseException], int | None, Fault], ...] = (
    # First match wins: the subclasses before their bases.
    (docker.errors.NotFound, None, Fault.GONE),
    (docker.errors.APIError, 409, Fault.CONFLICT),
    (docker.errors.APIError, None, Fault.REFUSED),
    (docker.errors.DockerException, None, Fault.FAILED),
    (OSError, None, Fault.UNREACHABLE),
)


def fault_of(failure: BaseException) -> Fault:
    """The table's row for one of DOCKER_FAILURES."""
    for kind, status, fault in _TABLE:
        if isinstance(failure, kind) and status in (None, getattr(failure, "status_code", None)):
            return fault
    raise TypeError(f"not a Docker failure: {failure!r}")


def detail(failure: BaseException) -> str:
    """What the engine said (an API error's explanation), else the failure's own text."""
    return str(getattr(failure, "explanation", None) or failure)


@contextmanager
def translated(message: Callable[[str], str]) -> Iterator[None]:
    """Any Docker failure in the block becomes a SandboxError saying message(detail)."""
    try:
        yield
    except DOCKER_FAILURES as failure:
        error = SandboxError(message(detail(failure)), retryable=fault_of(failure).retryable)
        raise error from failure


def docker_errors(doing: str) -> AbstractContextManager[None]:
    """The backend's wording: "Docker failed while <doing>: <detail>"."""
    return translated(lambda said: f"Docker failed while {doing}: {said}")


def unless_gone(call: Callable[[], _T], gone: _D) -> _T | _D:
    """call(), or `gone` if what it asks for is not there; other failures are raised as
    they are (an enclosing docker_errors words them)."""
    try:
        return call()
    except DOCKER_FAILURES as failure:
        if fault_of(failure) is not Fault.GONE:
            raise
        return gone


def best_effort(call: Callable[[], _T], failed: _D) -> _T | _D:
    """call(), or `failed` if Docker failed in any way: for a cleanup whose target may be
    gone already, or a check that must not fail while the engine is busy or restarting."""
    try:
        return call()
    except DOCKER_FAILURES:
        return failed
