"""What Docker says of a container now: its State, whether it runs, how it settled after an
exec was cut under its runner, and whether its memory limit struck (see outcome.py)."""

from __future__ import annotations

import time
from typing import Any

import docker

from spillbox.sandbox.docker_errors import best_effort, fault_of, unless_gone

State = dict[str, Any]
"""Docker's State of a container (Running, Status, OOMKilled, ...); {} once it is gone."""

SETTLE_SECONDS = 5.0
"""How long the sandbox of a runner cut under its exec may take to show as stopped."""
OOM_EVENT_SECONDS = 2
"""How long Docker's "oom" event may trail the exec it cut."""


def state(container: Any, client: docker.DockerClient) -> State:
    """The container's State as Docker has it now ({} once it is gone)."""
    found: State = unless_gone(lambda: client.api.inspect_container(container.id)["State"], {})
    return found


def is_running(container: Any, client: docker.DockerClient) -> bool:
    return bool(state(container, client).get("Running"))


def stopped_under(failure: BaseException, container: Any, client: docker.DockerClient) -> bool:
    """Whether Docker refused a call because the container no longer runs. It answers a call
    into a stopped container with 404, 409 or (20.10) 500 "is not running": ask the
    container, not the status code."""
    return fault_of(failure).answered and not is_running(container, client)


def settled_state(container: Any, client: docker.DockerClient) -> State:
    """The container's State once it stopped, or as it is after SETTLE_SECONDS running."""
    deadline = time.monotonic() + SETTLE_SECONDS
    while (now := state(container, client)).get("Running") and time.monotonic() < deadline:
        time.sleep(0.1)
    return now


def memory_ran_out(container: Any, client: docker.DockerClient, after: State, since: float) -> bool:
    """Whether the container's memory limit struck since `since` (epoch seconds), for an exec
    cut under its runner (`after`: the container's State then): Docker's OOMKilled record,
    else the "oom" event it logs, waited for up to OOM_EVENT_SECONDS."""
    if after.get("OOMKilled"):
        return True

    def oom_logged() -> bool:
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

    # The engine busy or restarting: the exit is reported as it is.
    return best_effort(oom_logged, False)
