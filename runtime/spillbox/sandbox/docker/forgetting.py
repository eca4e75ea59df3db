"""Deleting what a payload left in a running sandbox, beyond the host's own copies."""

from __future__ import annotations

from typing import Any

import docker

from spillbox.errors import SandboxError
from spillbox.sandbox.docker.channels import kill_engines
from spillbox.sandbox.docker.containers import LABEL_SLOT, LABEL_TASK
from spillbox.sandbox.docker.layout import FORGET_SCRIPT, SCRIPT_USER, SESSION_USER
from spillbox.sandbox.docker.state import stopped_under
from spillbox.sandbox.docker_errors import DOCKER_FAILURES

FORGET_ATTEMPTS = 5
"""Runs of forget.py per uid before a deletion fails (each killed by another's start)."""


def forget_in(
    container: Any, client: docker.DockerClient, sha256: str, size: int, since: float
) -> None:
    """Stop every SQL engine of the container (any process's: they hold the tables open),
    then, as the script uid and as the session uid, every process of that uid (a script, a
    cell, a fork server or session, one posing as them: any may hold the payload's bytes in
    memory) and delete what they may have made of the payload in every folder of the
    container they can write, and their IPC objects (forget.py: copies of its bytes, and
    everything changed since it was created). The next query starts an engine that reloads
    what is left, the next script a fork server from the image, the next session call a
    new, empty session (told that its names are gone)."""
    kill_engines(container)
    try:
        for role, user in (("scripts", SCRIPT_USER), ("session", SESSION_USER)):
            _forget_as(container, role, user, [f"{since:f}", sha256, str(size)])
    except DOCKER_FAILURES as failure:
        # Stopped since it was listed: nothing is left to delete.
        if not stopped_under(failure, container, client):
            raise


def _forget_as(container: Any, role: str, user: str, args: list[str]) -> None:
    """Run forget.py as one uid until it says it is done (a deletion of the same task at
    once, or a fork server starting, may kill it: it then runs again)."""
    for _ in range(FORGET_ATTEMPTS):
        done = container.exec_run(["python3", FORGET_SCRIPT, role, *args], user=user)
        if done.exit_code == 0:
            return
    said = done.output.decode("utf-8", "replace").strip().splitlines()
    whose = container.labels.get(LABEL_TASK) or f"slot {container.labels.get(LABEL_SLOT)}"
    raise SandboxError(
        f"deleting what the {role} of task {whose!r} kept of a payload did not finish "
        f"({said[-1] if said else f'exit {done.exit_code}'}): "
        "delete it again, or close the task with delete=True",
        retryable=True,
    )
