"""Attacks on the warm pool's sandboxes (issue 24 item 1): a pooled container is confined
exactly as a task's own, is given to one task only and never reused, and is never started
again over the folders it was made with (they are its task's now).

Each test runs under runc and again under gVisor (the harness fixture of test_attacks);
every other attack test that takes the `task` fixture runs against a pooled sandbox too.
"""

from __future__ import annotations

import hashlib
import json
import re
from typing import Any

import pytest
import test_attacks

from conftest import POOL_FILL_SECONDS, pooled_task
from spillbox import Harness, Task, ToolResult
from spillbox.sandbox.docker import LABEL_SLOT, LABEL_TASK
from spillbox.sandbox.docker.pool import RECORD_FILE, SLOTS_DIR, adopt, adopted
from spillbox.sandbox.storage import TASK_FOLDERS

pytestmark = pytest.mark.docker

harness = test_attacks.harness


def container_of(task: Task) -> Any:
    container = task.harness.backend.container(task.storage)  # type: ignore[attr-defined]
    container.reload()
    return container


HOST_CONFINEMENT = (
    "CapAdd",
    "CapDrop",
    "SecurityOpt",
    "Privileged",
    "ReadonlyRootfs",
    "Memory",
    "MemorySwap",
    "NanoCpus",
    "PidsLimit",
    "Tmpfs",
    "Sysctls",
    "NetworkMode",
    "IpcMode",
    "PidMode",
    "Runtime",
    "LogConfig",
    "Devices",
    "PortBindings",
    "Ulimits",
    "OomKillDisable",
)


def confinement(container: Any) -> dict[str, Any]:
    """What confines a container, from its inspect: its user and workdir, caps, seccomp and
    AppArmor (SecurityOpt, AppArmorProfile), read-only root, the mounts' targets and modes,
    its limits, its network and its runtime; everything but its name, labels and the host
    paths of its two bind mounts."""
    attrs = container.attrs
    host = attrs["HostConfig"]
    return {
        "user": attrs["Config"]["User"],
        "workdir": attrs["Config"]["WorkingDir"],
        "env": sorted(attrs["Config"]["Env"]),
        "image": attrs["Image"],
        "apparmor": attrs.get("AppArmorProfile"),
        "host": {key: host.get(key) for key in HOST_CONFINEMENT},
        "mounts": sorted(
            (m["Type"], m["Destination"], m["RW"], m.get("Mode"), m.get("Propagation"))
            for m in attrs["Mounts"]
        ),
        "networks": sorted(attrs["NetworkSettings"]["Networks"]),
    }


def mount_view(probe: str) -> list[str]:
    """The probe's lines in any order, with gVisor's 9p descriptor numbers (rfdno, wfdno)
    left out: the gofer numbers the mounts in the order Docker hands them over, which varies
    between containers made from one spec and says nothing of how they confine (seen in CI:
    a slot's cache on 6 and offload on 5, a cold container's the other way round)."""
    return sorted(re.sub(r"\b([rw]fdno)=\d+", r"\1=N", line) for line in probe.splitlines())


def test_a_pooled_container_is_confined_exactly_as_a_cold_one(harness: Harness) -> None:
    pooled = pooled_task(harness, "pooled")
    cold = harness.task("cold")  # the pool keeps no slot now: the cold path
    try:
        cold.exec("sh", "true")
        slot, own = container_of(pooled), container_of(cold)
        assert LABEL_SLOT in slot.labels and LABEL_TASK not in slot.labels
        assert own.labels[LABEL_TASK] == "cold" and LABEL_SLOT not in own.labels
        assert confinement(slot) == confinement(own)
        # And as the container sees it: the same uid, capabilities and mounts (in any order).
        probe = "id -u; grep -E '^Cap(Eff|Prm|Bnd)' /proc/self/status; grep sandbox /proc/mounts"
        seen = [task.exec("sh", probe) for task in (pooled, cold)]
        assert all(result.exit_code == 0 for result in seen), [r.stderr for r in seen]
        assert mount_view(seen[0].text) == mount_view(seen[1].text)
    finally:
        pooled.close(delete=True)
        cold.close(delete=True)


def test_a_pooled_sandbox_goes_to_one_task_and_is_never_reused(
    harness: Harness, docker_client: Any
) -> None:
    first = pooled_task(harness, "first")
    slot = container_of(first)
    planted = first.exec(
        "python",
        "open('/sandbox/work/note', 'w').write('mine')\nsecret = 'first-task-secret'",
        session=True,
    )
    assert planted.exit_code == 0, planted.stderr
    second = pooled_task(harness, "second")  # a slot of its own, while the first is open
    try:
        other = container_of(second)
        assert other.id != slot.id
        assert second.exec("sh", "test -e /sandbox/work/note").exit_code == 1
        asked = second.exec("python", "'secret' in dir()", session=True)
        assert asked.text == "False\n", asked.stderr
        first.close()  # its last close: the slot is removed, never given back to the pool
        assert docker_client.containers.list(all=True, filters={"id": slot.id}) == []
        third = pooled_task(harness, "third")
        try:
            assert container_of(third).id not in (slot.id, other.id)
            assert third.exec("sh", "test -e /sandbox/work/note").exit_code == 1
        finally:
            third.close(delete=True)
    finally:
        second.close(delete=True)
        harness.task("first").close(delete=True)


def test_a_stopped_pool_slot_is_not_started_over_empty_folders(harness: Harness) -> None:
    # A slot's container was made over home/slots/<slot>/, renamed onto the task's folder
    # when the task adopted it, and Docker keeps the path it was given: started again, it
    # would mount new, empty folders there (Docker makes a missing bind source), and the
    # task would see none of its payloads. The task gets a container of its own instead.
    task = pooled_task(harness, "stopped")
    home = harness.settings.home
    try:
        data = json.dumps([{"id": i, "pad": "é" * 40} for i in range(2000)])
        [admitted] = task.admit([ToolResult(call_id="c1", tool="t", content=data)])
        assert admitted.offloaded
        slot = container_of(task)
        name = adopted(home, task.storage)
        assert name is not None and slot.labels[LABEL_SLOT] == name
        slot.stop(timeout=0)  # from outside: an engine restart, an operator
        harness.backend.release(task.storage)  # type: ignore[attr-defined]
        seen = task.exec("sh", "sha256sum /sandbox/offload/c1.json | cut -d' ' -f1")
        assert seen.exit_code == 0, seen.stderr
        assert seen.text.strip() == hashlib.sha256(data.encode()).hexdigest()
        assert container_of(task).labels[LABEL_TASK] == "stopped"
        assert not (home / SLOTS_DIR / name).exists()  # nothing made where the slot was
    finally:
        task.close(delete=True)


def test_a_slot_is_never_renamed_over_a_task_folder_that_exists(harness: Harness) -> None:
    # Another process made the task's folder first (a payload): the task takes no slot, and
    # a slot offered to it is refused untouched (it goes back to the pool), never renamed
    # over the task's folder.
    pool = harness.backend.pool  # type: ignore[attr-defined]
    pool.resize(1)
    assert pool.fill(POOL_FILL_SECONDS)
    existing = harness.backend.storage("has-folder")
    existing.write("c1", "txt", b"already here")
    task = harness.task("has-folder")
    try:
        slot = pool.take()
        assert slot is not None, "the task took the slot over its own folder"
        assert not adopt(slot, existing)
        assert sorted(p.name for p in slot.folder.iterdir()) == sorted([*TASK_FOLDERS, RECORD_FILE])
        pool.put_back(slot)
        assert pool.fill(0), "the refused slot went back to the pool"
        assert task.exec("sh", "cat /sandbox/offload/c1.txt").text == "already here"
        assert container_of(task).labels[LABEL_TASK] == "has-folder"
    finally:
        pool.resize(0)
        task.close(delete=True)
