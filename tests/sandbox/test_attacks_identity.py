"""Attacks on which container a task id maps to (issue 21 item 7): distinct task ids never
share a container, whatever their spelling, and a container name held by another task is
refused, never adopted. Under runc and under gVisor, as tests/sandbox/test_attacks.py.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from test_attacks import payload

from conftest import GVISOR, runtime_or_skip
from spillbox import Harness, SandboxError, ToolResult
from spillbox.sandbox.docker import LABEL_HOME, LABEL_TASK, DockerBackend, SandboxOptions
from spillbox.sandbox.image import image_tag
from spillbox.sandbox.storage import safe_name
from test_identity_attacks import old_name

pytestmark = pytest.mark.docker


@pytest.fixture(params=[None, GVISOR], ids=["runc", "gvisor"])
def harness(
    request: pytest.FixtureRequest, docker_client: Any, docker_home: Path
) -> Iterator[Harness]:
    """A docker harness under runc, and again under gVisor, without a collector (which
    would sweep the stale container below as an orphan)."""
    options = SandboxOptions(runtime=runtime_or_skip(docker_client, request.param))
    with Harness(sandbox="docker", home=docker_home, options=options, gc_interval=-1) as h:
        yield h


def offloaded(harness: Harness, task_id: str) -> list[str]:
    """What the task's own scripts see in /sandbox/offload."""
    task = harness.task(task_id)
    # Not `ls /sandbox/offload`: under gVisor, ls of a path there fails with EINVAL.
    result = task.exec("python", "import os; print(*sorted(os.listdir('/sandbox/offload')))")
    assert result.exit_code == 0, result.stderr
    return result.text.split()


@pytest.mark.parametrize("spelling", ["escaped now", "escaped before"])
def test_a_task_named_like_another_ids_escaped_name_has_a_container_of_its_own(
    harness: Harness, spelling: str
) -> None:
    victim = harness.task("../victim")
    [admitted] = victim.admit([ToolResult("c1", "secrets", payload("victim-secret"))])
    assert admitted.offloaded
    assert offloaded(harness, "../victim") == ["c1.json"]
    backend = harness.backend
    assert isinstance(backend, DockerBackend)
    name = safe_name("../victim") if spelling == "escaped now" else old_name("../victim")
    intruder = harness.task(name)
    intruder.admit([ToolResult("i1", "t", payload("intruder"))])
    assert offloaded(harness, intruder.id) == ["i1.json"]
    assert backend.container(intruder.storage).id != backend.container(victim.storage).id
    intruder.close(delete=True)
    # Removing the intruder removed nothing of the victim's: its container still runs
    # and its scripts still read its payload.
    assert backend.container(victim.storage).status == "running"
    read = victim.exec("sh", "grep -c victim-secret /sandbox/offload/c1.json")
    assert read.text.strip() == "1", read.stderr
    victim.close(delete=True)


def test_a_container_name_held_by_another_task_is_refused(
    harness: Harness, docker_client: Any
) -> None:
    """A stale container under the name a task would get, made for another task (as the
    old naming could leave): the task refuses it rather than run its scripts in there."""
    backend = harness.backend
    assert isinstance(backend, DockerBackend)
    task = harness.task("victim-0123456789ab")
    name = backend.container_name(task.storage)
    home = str(Path(harness.settings.home).resolve())
    stale = docker_client.containers.run(
        image_tag(),
        ["sleep", "600"],
        name=name,
        labels={LABEL_TASK: "../victim", LABEL_HOME: home},
        detach=True,
        network_mode="none",
        **({"runtime": backend.options.runtime} if backend.options.runtime else {}),
    )
    try:
        with pytest.raises(SandboxError, match="held by a container of another task"):
            task.exec("sh", "echo ran")
        stale.reload()
        assert stale.status == "running"
        assert stale.labels[LABEL_TASK] == "../victim"
    finally:
        stale.remove(force=True)
    task.close(delete=True)


def test_a_scripts_file_named_like_a_later_call_id_never_shadows_it_for_jq(
    harness: Harness,
) -> None:
    task = harness.task("shadowed")
    decoy = task.exec("sh", "echo '[\"decoy\"]' > /sandbox/outputs/c5.json")
    assert [f.id for f in decoy.files] == ["c5"], decoy.file_notes
    [real] = task.admit([ToolResult("c5", "list_prs", payload("the-real-result"))])
    assert real.artifact is not None and real.artifact.id != "c5"
    query = task.exec("jq", ".[0].secret", artifact="c5")
    assert query.text.strip() == '"the-real-result"', query.stderr
    assert task.exec("jq", ".[0]", artifact=decoy.files[0].path).text.strip() == '"decoy"'
    task.close(delete=True)
