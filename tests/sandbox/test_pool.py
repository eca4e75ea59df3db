"""The warm pool (issue 24 item 1): a task opened new adopts a ready sandbox, confined as a
task's own container is, given to that task alone, removed when the task lets go of it, and
swept once the harness that made it is gone.

Each test runs under runc and under gVisor (runsc), as tests/sandbox/test_attacks.py does.
"""

from __future__ import annotations

import hashlib
import json
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from conftest import GVISOR, runtime_or_skip
from spillbox import Harness, Task, ToolResult
from spillbox.sandbox.docker import LABEL_HOME, LABEL_POOL, LABEL_SLOT, LABEL_TASK, SandboxOptions
from spillbox.sandbox.docker.pool import SLOTS_DIR

pytestmark = pytest.mark.docker

FILL_SECONDS = 300.0
"""How long a test waits for its pool to be full (a slot starts a fork server: seconds)."""
HARNESS_PROCESS = """
import sys, time
from spillbox import Harness
from spillbox.sandbox.docker import SandboxOptions
runtime = sys.argv[2] or None
harness = Harness(sandbox="docker", home=sys.argv[1], gc_interval=-1, pool_size=1,
                  options=SandboxOptions(runtime=runtime))
assert harness.backend.pool.fill(300)
print(harness.backend.pool.id, flush=True)
time.sleep(600)
"""


@pytest.fixture(params=[None, GVISOR], ids=["runc", "gvisor"])
def runtime(request: pytest.FixtureRequest, docker_client: Any) -> str | None:
    return runtime_or_skip(docker_client, request.param)


def pooled(home: Path, runtime: str | None, size: int = 1) -> Harness:
    """A harness whose pool of `size` is full (size 0: no pool, the cold path)."""
    harness = Harness(
        sandbox="docker",
        home=home,
        gc_interval=-1,
        pool_size=size,
        options=SandboxOptions(runtime=runtime),
    )
    assert size == 0 or harness.backend.pool.fill(FILL_SECONDS)  # type: ignore[attr-defined]
    return harness


@pytest.fixture
def harness(docker_home: Path, runtime: str | None) -> Iterator[Harness]:
    with pooled(docker_home, runtime) as harness:
        yield harness


def container_of(task: Task) -> Any:
    return task.harness.backend.container(task.storage)  # type: ignore[attr-defined]


def home_containers(docker_client: Any, home: Path, *labels: str) -> list[Any]:
    filters = [f"{LABEL_HOME}={home.resolve()}", *labels]
    found: list[Any] = docker_client.containers.list(all=True, filters={"label": filters})
    return found


def hardening(container: Any) -> dict[str, Any]:
    """What confines a container: its HostConfig but the host folders it mounts, its user."""
    container.reload()
    host = dict(container.attrs["HostConfig"])
    binds = sorted(bind.split(":", 1)[1] for bind in host.pop("Binds"))
    return {"host": host, "binds": binds, "user": container.attrs["Config"]["User"]}


def test_a_pooled_task_is_confined_as_a_cold_one_and_sees_its_payloads_exactly(
    harness: Harness, docker_home: Path, runtime: str | None
) -> None:
    task = harness.task("pooled")
    container = container_of(task)
    assert LABEL_SLOT in container.labels and LABEL_TASK not in container.labels
    assert container.labels[LABEL_POOL] == harness.backend.pool.id  # type: ignore[attr-defined]
    data = json.dumps([{"id": i, "pad": "é" * 50} for i in range(2000)])
    [admitted] = task.admit([ToolResult(call_id="c1", tool="t", content=data)])
    assert admitted.offloaded
    seen = task.exec("sh", "sha256sum /sandbox/offload/c1.json | cut -d' ' -f1")
    assert seen.text.strip() == hashlib.sha256(data.encode()).hexdigest()
    assert task.exec("sql", 'SELECT count(*) AS n FROM "c1"').text.split() == ["n", "2000"]
    # The mounts are read-only offload and the engine's cache, as a cold task's.
    assert task.exec("sh", "touch /sandbox/offload/x").exit_code != 0
    with pooled(docker_home, runtime, size=0) as cold_harness:
        cold = cold_harness.task("cold")
        cold.exec("sh", "true")
        cold_container = container_of(cold)
        assert LABEL_TASK in cold_container.labels
        assert hardening(container) == hardening(cold_container)
        cold.close(delete=True)
    task.close(delete=True)


def test_each_slot_goes_to_one_task_and_is_removed_with_it(
    harness: Harness, docker_client: Any, docker_home: Path
) -> None:
    first = harness.task("first")
    slot = container_of(first)
    first.exec("sh", "echo mine > /sandbox/work/note")
    assert harness.backend.pool.fill(FILL_SECONDS)  # type: ignore[attr-defined]
    second = harness.task("second")
    other = container_of(second)
    assert other.id != slot.id
    assert second.exec("sh", "cat /sandbox/work/note").exit_code != 0
    first.close()  # its last close: a slot is removed, never given to another task
    assert (
        home_containers(docker_client, docker_home, f"{LABEL_SLOT}={slot.labels[LABEL_SLOT]}") == []
    )
    assert harness.backend.pool.fill(FILL_SECONDS)  # type: ignore[attr-defined]
    again = harness.task("first")  # reopened: a task of its own, not a new slot
    assert again.exec("sh", "test -e /sandbox/work/note").exit_code == 1
    assert LABEL_TASK in container_of(again).labels
    again.close(delete=True)
    second.close(delete=True)


def test_a_task_reattached_by_another_harness_finds_its_slot(
    harness: Harness, docker_home: Path, runtime: str | None
) -> None:
    task = harness.task("kept")
    task.admit([ToolResult(call_id="c1", tool="t", content="x" * 100_000)])
    container = container_of(task)
    task.exec("sh", "echo here > /sandbox/work/note")
    harness.close()  # the task stays open, its container running
    with Harness(sandbox="docker", home=docker_home, gc_interval=-1, pool_size=0) as restarted:
        again = restarted.task("kept")
        assert container_of(again).id == container.id
        assert again.exec(
            "sh", "cat /sandbox/work/note; wc -c < /sandbox/offload/c1.txt"
        ).text.split() == ["here", "100000"]
        again.delete("c1")  # the deletion reaches the adopted container
        assert again.exec("sh", "ls /sandbox/offload").text.strip() == ""
        again.close(delete=True)


def test_closing_a_harness_removes_its_unused_slots(
    docker_home: Path, docker_client: Any, runtime: str | None
) -> None:
    harness = pooled(docker_home, runtime, size=2)
    pool = harness.backend.pool.id  # type: ignore[attr-defined]
    assert len(home_containers(docker_client, docker_home, f"{LABEL_POOL}={pool}")) == 2
    harness.close()
    assert home_containers(docker_client, docker_home, f"{LABEL_POOL}={pool}") == []
    assert list((docker_home / SLOTS_DIR).iterdir()) == []


def test_two_harness_processes_keep_pools_of_their_own_and_a_dead_ones_is_swept(
    docker_home: Path, docker_client: Any, runtime: str | None
) -> None:
    other = subprocess.Popen(
        [sys.executable, "-c", HARNESS_PROCESS, str(docker_home), runtime or ""],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert other.stdout is not None
        other_pool = other.stdout.readline().strip()
        with pooled(docker_home, runtime) as harness:
            mine = harness.backend.pool.id  # type: ignore[attr-defined]
            assert other_pool and other_pool != mine
            task = harness.task("t")
            assert container_of(task).labels[LABEL_POOL] == mine
            harness.gc()  # the other harness lives: its slot stays
            assert (
                len(home_containers(docker_client, docker_home, f"{LABEL_POOL}={other_pool}")) == 1
            )
            other.kill()
            other.communicate()
            harness.gc()  # its harness is gone: its slot goes, the task's own stays
            assert home_containers(docker_client, docker_home, f"{LABEL_POOL}={other_pool}") == []
            assert not any(
                p.name.startswith(other_pool) for p in (docker_home / SLOTS_DIR).iterdir()
            )
            assert task.exec("sh", "true").exit_code == 0
            task.close(delete=True)
    finally:
        if other.returncode is None:
            other.kill()
            other.communicate()


def test_with_no_pool_a_task_starts_a_container_of_its_own(
    docker_home: Path, docker_client: Any, runtime: str | None
) -> None:
    with pooled(docker_home, runtime, size=0) as harness:
        task = harness.task("cold")
        assert task.exec("sh", "echo hi").text == "hi\n"
        assert home_containers(docker_client, docker_home, LABEL_SLOT) == []
        assert container_of(task).labels[LABEL_TASK] == "cold"
        task.close(delete=True)
