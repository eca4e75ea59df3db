"""One base exception with a few categories; every message says what happened and what to do.

An error also says whether it is `retryable`: whether the same operation, run again as it
is, may succeed (the Docker engine did not answer, a container name was still being
released, a query's engine died under it). The place that makes the error decides;
`retry` is the one loop that acts on it.

>>> calls = []
>>> def flaky() -> str:
...     calls.append(1)
...     if len(calls) < 2:
...         raise SandboxError("the engine did not answer", retryable=True)
...     return "ok"
>>> retry(flaky, attempts=3), len(calls)
('ok', 2)
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TypeVar

_T = TypeVar("_T")


class SpillboxError(Exception):
    """Base of every error spillbox raises on purpose."""

    retryable: bool
    """Whether running the same operation again, as it is, may succeed."""

    def __init__(self, *args: object, retryable: bool = False) -> None:
        super().__init__(*args)
        self.retryable = retryable


class ConfigError(SpillboxError):
    """Bad configuration or input: a setting, a path, an encoding, an argument."""


class StorageError(SpillboxError):
    """The task's storage could not be read or written."""


class SandboxError(SpillboxError):
    """The sandbox backend (Docker, its image) failed or is not available."""


class ExecError(SpillboxError):
    """A code-mode script could not be run (not: the script failed; that is an ExecResult)."""


class HostLostError(StorageError):
    """The host that kept a task (a node of a cluster) is gone, and its payloads with it."""


class RetentionError(SpillboxError):
    """A retention policy refused the operation (quota, export, a deleted artifact)."""


def retry(call: Callable[[], _T], attempts: int) -> _T:
    """call(), run again at once while it raises a retryable SpillboxError, `attempts` times
    in all; the last attempt's error, or any error that is not retryable, is raised as it is.

    Waiting between attempts, where one is needed, is the call's own business (it knows
    what it waits for).
    """
    for _ in range(attempts - 1):
        try:
            return call()
        except SpillboxError as error:
            if not error.retryable:
                raise
    return call()
