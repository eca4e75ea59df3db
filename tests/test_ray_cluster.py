"""spillbox on a real Ray cluster started here: a head and two more nodes, a spillbox host
on each over a home of its own (tests/ray_cluster.py), the catalog on Postgres.

One cluster for the module (its start is the slow part); the tests run in file order, the
faults last: a node killed, a harness killed mid-offload, a host that comes back, a full
cluster. Hosts a and b run sandboxes under runc, host c under gVisor.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import ray

from conftest import runtime_or_skip
from ray_cluster import RUNTIMES, LocalCluster, start_node_host
from spillbox import Harness, HostLostError, SandboxError, ToolResult
from spillbox.catalog.placements import Placements
from spillbox.sandbox.ray.backend import NAMESPACE
from spillbox.sandbox.ray.link import ACTOR_PREFIX

pytestmark = pytest.mark.docker
pytest_plugins = ["ray_fixtures"]

PAYLOAD = "\n".join(
    f'{{"id": {i}, "name": "row {i}", "ok": {str(i % 2 == 0).lower()}}}' for i in range(4000)
)


def _host_of(harness: Harness, task_id: str) -> str:
    placement = Placements(harness.catalog).of(task_id)
    assert placement is not None
    return placement.host


def _big(call_id: str) -> ToolResult:
    return ToolResult(call_id=call_id, tool="list_rows", content=PAYLOAD)


def test_tasks_go_to_the_least_loaded_host_and_see_what_one_machine_shows(
    harness: Harness, docker_home: Path
) -> None:
    tasks = [harness.task(f"spread-{i}") for i in range(3)]
    assert [_host_of(harness, t.id) for t in tasks] == ["a", "b", "c"]
    [admitted] = tasks[1].admit([_big("c1")])
    assert admitted.offloaded
    with Harness(sandbox="docker", home=docker_home, environ={}, gc_interval=-1) as local:
        with local.task("spread-1") as alone:
            [there] = alone.admit([_big("c1")])
    assert admitted.text == there.text
    assert tasks[1].read("c1") == PAYLOAD.encode()
    for task in tasks:
        task.close()


def test_exec_runs_on_the_tasks_host_under_runc_and_gvisor(
    harness: Harness, docker_client: Any
) -> None:
    # Three open tasks: one per host by the rule; a runs runc, c runs gVisor.
    tasks = {}
    for i in range(3):
        task = harness.task(f"exec-{i}")
        tasks[_host_of(harness, task.id)] = task
    for host in ("a", "c"):
        try:
            runtime_or_skip(docker_client, RUNTIMES[host])
        except pytest.skip.Exception:
            for task in tasks.values():
                task.close()
            raise
        task = tasks[host]
        task.admit([_big("rows")])
        result = task.exec("sql", "SELECT count(*) AS n FROM rows WHERE ok")
        assert result.exit_code == 0 and "2000" in result.text, (host, result)
        python = task.exec("python", "import platform; print(platform.release())")
        assert python.exit_code == 0, (host, python)
        # gVisor's kernel reports its own release (4.4.0), runc the host's.
        assert (python.text.strip() == "4.4.0") == (RUNTIMES[host] == "runsc"), python.text
    for task in tasks.values():
        task.close()


def test_another_harness_process_reaches_a_task_on_any_host(
    harness: Harness, cluster: LocalCluster, ray_catalog_url: str
) -> None:
    with harness.task("shared") as task:
        task.admit([_big("c1")])
        script = (
            "import sys\nfrom spillbox import Harness\n"
            f"h = Harness(cluster={cluster.address!r}, catalog_url={ray_catalog_url!r}, "
            "home=sys.argv[1], environ={})\n"
            "t = h.existing('shared')\n"
            "sys.stdout.buffer.write(t.read('c1'))\n"
            "h.close()\n"
        )
        out = subprocess.run(
            [sys.executable, "-c", script, str(cluster.root / "other-client")],
            capture_output=True,
            timeout=120,
            check=True,
        )
    assert out.stdout == PAYLOAD.encode()


def test_the_cli_lists_and_removes_a_task_on_another_host(
    harness: Harness, cluster: LocalCluster, ray_catalog_url: str
) -> None:
    with harness.task("by-cli") as task:
        task.admit([_big("c1")])
    host = _host_of(harness, "by-cli")
    stored = list((cluster.homes[host] / "tasks").glob("by-cli/offload/*"))
    assert stored, "the payload is on its host"
    spillbox = str(Path(sys.executable).with_name("spillbox"))
    env = {
        **os.environ,
        "SPILLBOX_CATALOG_URL": ray_catalog_url,
        "SPILLBOX_CLUSTER": cluster.address,
    }
    home = ["--home", str(cluster.root / "cli-client")]
    listed = subprocess.run(
        [spillbox, "artifacts", "by-cli", "--json", *home],
        env=env,
        capture_output=True,
        timeout=120,
        check=True,
        text=True,
    )
    assert '"c1"' in listed.stdout
    subprocess.run(
        [spillbox, "rm", "by-cli", *home], env=env, capture_output=True, timeout=120, check=True
    )
    assert not list((cluster.homes[host] / "tasks").glob("by-cli*"))
    row = harness.catalog.task("by-cli")
    assert row is not None and row.state == "deleted"


def test_harness_killed_mid_offload_leaves_no_partial_artifact(
    harness: Harness, cluster: LocalCluster, ray_catalog_url: str
) -> None:
    # Killed after its payload is linked on the host, before the catalog records it: the
    # worst moment. No harness anywhere sees an artifact; the host's gc removes the file.
    script = (
        "import os, signal, sys\nfrom spillbox import Harness, ToolResult\n"
        "from spillbox.catalog import Catalog\n"
        "Catalog.add_artifact = lambda *a, **k: os.kill(os.getpid(), signal.SIGKILL)\n"
        f"h = Harness(cluster={cluster.address!r}, catalog_url={ray_catalog_url!r}, "
        "home=sys.argv[1], environ={})\n"
        "t = h.task('killed')\n"
        "t.admit([ToolResult(call_id='c1', tool='t', content='x' * 200000)])\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", script, str(cluster.root / "killed-client")],
        capture_output=True,
        timeout=120,
    )
    assert done.returncode == -signal.SIGKILL, done.stderr[-2000:]
    host = _host_of(harness, "killed")
    assert harness.catalog.artifacts("killed", include_deleted=True) == []
    offload = next((cluster.homes[host] / "tasks").glob("killed/offload"))
    assert [p.name for p in offload.iterdir()] == ["c1.txt"]  # on the host, unrecorded
    actor = ray.get_actor(ACTOR_PREFIX + host, namespace=NAMESPACE)
    removed = ray.get(actor.collect.remote(False, 0.0))
    assert ("payload", "killed", "c1.txt") in {(r.kind, r.task_id, r.what) for r in removed}
    assert list(offload.iterdir()) == []


def _containers(docker_client: Any, home: Path) -> list[str]:
    found = docker_client.containers.list(
        all=True, filters={"label": f"spillbox.home={home.resolve()}"}
    )
    return [c.labels["spillbox.task"] for c in found]


def test_a_node_killed_mid_task_loses_its_tasks_and_nothing_else(
    harness: Harness, cluster: LocalCluster, ray_catalog_url: str, docker_client: Any
) -> None:
    for task_id in ("doomed-x", "doomed-y", "doomed-z"):
        harness.task(task_id)  # one on each host (fewest open, by name)
    doomed = next(t for t in ("doomed-x", "doomed-y", "doomed-z") if _host_of(harness, t) == "b")
    task = harness.task(doomed)
    task.admit([_big("c1")])
    assert task.exec("python", "print(1 + 1)").text.strip() == "2"
    assert doomed in _containers(docker_client, cluster.homes["b"])

    os.kill(cluster.raylet("b"), signal.SIGKILL)
    # Ray declares the node dead after its health checks (FAST_FAILURE: a few hundred ms);
    # from then on every call on its tasks fails at once.
    _until(lambda: not any(n["Alive"] for n in ray.nodes() if "spillbox_b" in n["Resources"]))
    with pytest.raises(HostLostError, match=r"host 'b'.*payloads and sandbox on it are gone"):
        task.exec("python", "print(2)")
    with pytest.raises(HostLostError, match="host 'b'"):
        task.read("c1")
    row = harness.catalog.task(doomed)
    assert row is not None and (row.state, row.deleted_by) == ("deleted", "host lost: b")
    [lost] = harness.catalog.artifacts(doomed, include_deleted=True)
    assert (lost.state, lost.deleted_by) == ("deleted", "host lost: b")
    with pytest.raises(HostLostError):
        harness.task(doomed)  # never reopened empty on another host
    with harness.task("after-loss") as fresh:
        assert _host_of(harness, "after-loss") in ("a", "c")
        fresh.admit([_big("c1")])
        assert fresh.read("c1") == PAYLOAD.encode()

    # The node comes back: its host sweeps what the lost epoch left, containers and files.
    cluster.start_node("b")
    deadline = time.monotonic() + 60
    while True:
        try:
            info = start_node_host(cluster, "b", ray_catalog_url)
            break
        except ValueError:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.5)  # the new node is not yet listed alive
    assert doomed in info["swept"]
    assert doomed not in _containers(docker_client, cluster.homes["b"])
    assert not list((cluster.homes["b"] / "tasks").glob(f"{doomed}*"))
    with pytest.raises(HostLostError):
        harness.task(doomed)


def _until(done: Callable[[], bool], limit: float = 60.0) -> None:
    """Wait for a condition the cluster reaches by itself (not a timing assertion: the
    limit only ends a test that would otherwise hang)."""
    deadline = time.monotonic() + limit
    while not done():
        assert time.monotonic() < deadline, "the cluster never got there"
        time.sleep(0.1)


def test_a_host_gone_since_its_handle_was_kept_gets_no_new_task(
    harness: Harness, cluster: LocalCluster, ray_catalog_url: str
) -> None:
    # The harness has talked to c (a handle kept); c's actor then dies on a live node.
    ray.kill(ray.get_actor(ACTOR_PREFIX + "c", namespace=NAMESPACE), no_restart=True)
    opened = [harness.task(f"after-c-{i}") for i in range(3)]
    assert {_host_of(harness, t.id) for t in opened} <= {"a", "b"}
    for task in opened:
        task.close()
    start_node_host(cluster, "c", ray_catalog_url)  # back for the next test


def test_a_full_cluster_refuses_with_a_clear_error(harness: Harness) -> None:
    opened = []
    with pytest.raises(SandboxError, match="no spillbox host can take task .*at their cap"):
        for i in range(20):
            opened.append(harness.task(f"fill-{i}"))
    hosts = {_host_of(harness, t.id) for t in opened}
    assert hosts == {"a", "b", "c"}  # every host filled before the refusal
    for task in opened:
        task.close()
