"""Every surface across the hosts of a real Ray cluster started here (ray_fixtures.py: a
head and two more nodes, runc on a and b, gVisor on c, the catalog on Postgres): MCP proxy
and `mcp serve` processes serving tasks that live on any host, the CLI's tasks, audit and
gc, leases on what a harness holds on a host, each host's gc scoped to its own tasks, and
each host's metrics scraped."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import time
import urllib.request
from collections.abc import AsyncIterator, Callable
from contextlib import asynccontextmanager
from pathlib import Path
from typing import Any

import mcp_types as types
import pytest
import ray
from prometheus_client.parser import text_string_to_metric_families

from mcp import Client
from ray_cluster import LocalCluster
from spillbox import Harness, Retention, ToolResult, parse_notice
from spillbox.catalog.placements import Placement, Placements
from spillbox.sandbox.ray.backend import NAMESPACE
from spillbox.sandbox.ray.link import ACTOR_PREFIX

sys.path.insert(0, str(Path(__file__).with_name("mcp")))  # the MCP tests' client helpers
from mcp_client import http_connect, listening, text_of, toy_server  # noqa: E402
from toy_server import blob  # noqa: E402

pytestmark = [pytest.mark.docker, pytest.mark.anyio]
pytest_plugins = ["ray_fixtures"]

BLOB = 300_000
BLOB_SHA256 = hashlib.sha256(blob(BLOB).encode()).hexdigest()
SPILLBOX = str(Path(sys.executable).with_name("spillbox"))


@pytest.fixture
def anyio_backend() -> str:
    return "asyncio"


def _placement(harness: Harness, task_id: str) -> Placement:
    placement = Placements(harness.catalog).of(task_id)
    assert placement is not None, f"task {task_id} is placed nowhere"
    return placement


def _actor(host: str) -> Any:
    return ray.get_actor(ACTOR_PREFIX + host, namespace=NAMESPACE)


@asynccontextmanager
async def _client(url: str, name: str) -> AsyncIterator[Client]:
    """A 2026-07-28 client: the proxy serves it the task its name names (mcp-<name>)."""
    info = types.Implementation(name=name, version="0")
    async with Client(url, mode="2026-07-28", client_info=info) as client:
        yield client


def _cli(cluster: LocalCluster, ray_catalog_url: str, *args: str) -> str:
    env = {
        **os.environ,
        "SPILLBOX_CATALOG_URL": ray_catalog_url,
        "SPILLBOX_CLUSTER": cluster.address,
    }
    done = subprocess.run(
        [SPILLBOX, *args, "--home", str(cluster.root / "cli-client")],
        env=env,
        capture_output=True,
        timeout=180,
        text=True,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


async def test_two_proxy_processes_and_mcp_serve_serve_tasks_on_any_host(
    harness: Harness,
    cluster: LocalCluster,
    ray_catalog_url: str,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv("SPILLBOX_CATALOG_URL", ray_catalog_url)
    on_cluster = ("--sandbox", "docker", "--cluster", cluster.address)
    # The toy upstream's start gets a loaded machine's room (its default is 8 s).
    upstream = ("--upstream-start-timeout", "120", "--", *toy_server())
    names = ("fleet-one", "fleet-two")
    with (
        listening(tmp_path / "p1", "proxy", *on_cluster, *upstream) as (one, _),
        listening(tmp_path / "p2", "proxy", *on_cluster, *upstream) as (two, _),
    ):
        paths = {}
        for name in names:  # opened by process one: each task placed on a host
            async with _client(one, name) as client:
                large = await client.call_tool("blob", {"size": BLOB})
            notice = parse_notice(text_of(large))
            assert notice is not None, text_of(large)
            paths[name] = notice["path"]
        placed = {name: _placement(harness, f"mcp-{name}") for name in names}
        assert len({p.host for p in placed.values()}) == 2, placed  # fewest open first
        for name in names:  # process two finds each task through its placement
            code = f"sha256sum {paths[name]} | cut -d' ' -f1"
            async with _client(two, name) as client:
                ran = await client.call_tool("sandbox_exec", {"lang": "sh", "code": code})
            assert json.loads(text_of(ran))["output"].strip() == BLOB_SHA256, text_of(ran)
        # `mcp serve` over HTTP, a third process, a legacy session: the same task's payload
        with listening(tmp_path / "p3", "serve", *on_cluster, "--task", "mcp-fleet-two") as (
            three,
            _,
        ):
            async with http_connect(three) as session:
                read = await session.call_tool("read_artifact", {"path": paths["fleet-two"]})
        assert json.loads(text_of(read))["text"].startswith(blob(BLOB)[:1000])
        # Found, not placed again: each task stays on the host process one put it on.
        assert {name: _placement(harness, f"mcp-{name}") for name in names} == placed


KEPT_A_SECOND = Retention(keep_after_close=1.0)
"""Due for deletion a second after its close (0 would delete it at its close)."""


def _past_keep(harness: Harness, task_id: str) -> None:
    """Wait out the second a task is kept after its close (a deadline this test set)."""
    row = harness.catalog.task(task_id)
    assert row is not None and row.state == "closed" and row.delete_after is not None
    _until(lambda: time.time() > row.delete_after)  # type: ignore[operator]


def test_the_cli_lists_audits_and_collects_the_clusters_tasks(
    harness: Harness, cluster: LocalCluster, ray_catalog_url: str
) -> None:
    with harness.task("cli-fleet", retention=KEPT_A_SECOND) as task:
        task.admit([ToolResult(call_id="c1", tool="rows", content=blob(BLOB))])
        assert task.read("c1") == blob(BLOB).encode()
    host = _placement(harness, "cli-fleet").host
    [listed] = [
        t
        for t in json.loads(_cli(cluster, ray_catalog_url, "tasks", "--json"))
        if t["task"] == "cli-fleet"
    ]
    assert (listed["state"], listed["artifacts"], listed["bytes"]) == ("closed", 1, BLOB)
    audit = json.loads(_cli(cluster, ray_catalog_url, "audit", "cli-fleet", "--json"))
    assert {"offload", "read"} <= {entry["action"] for entry in audit}, audit
    assert list((cluster.homes[host] / "tasks").glob("cli-fleet")), "kept on its host"
    _past_keep(harness, "cli-fleet")
    removed = json.loads(_cli(cluster, ray_catalog_url, "gc", "--json"))
    assert ("task", "cli-fleet") in {(r["kind"], r["task_id"]) for r in removed}, removed
    assert not list((cluster.homes[host] / "tasks").glob("cli-fleet"))
    row = harness.catalog.task("cli-fleet")
    assert row is not None and (row.state, row.deleted_by) == ("deleted", "keep_after_close")


def test_a_hosts_gc_decides_only_for_the_tasks_placed_on_it(
    harness: Harness, cluster: LocalCluster
) -> None:
    # Each host collected over the whole catalog: another host's task, open there, was
    # judged here by this home's open lock (never held) and deleted from the catalog.
    with harness.task("scoped", retention=KEPT_A_SECOND) as task:
        task.admit([ToolResult(call_id="c1", tool="rows", content=blob(BLOB))])
    owner = _placement(harness, "scoped").host
    _past_keep(harness, "scoped")
    for other in sorted(set(cluster.homes) - {owner}):
        removed = ray.get(_actor(other).collect.remote(False))
        assert "scoped" not in {r.task_id for r in removed}, (other, removed)
    row = harness.catalog.task("scoped")
    assert row is not None and row.state == "closed"
    removed = ray.get(_actor(owner).collect.remote(False))
    assert ("task", "scoped") in {(r.kind, r.task_id) for r in removed}
    assert not list((cluster.homes[owner] / "tasks").glob("scoped"))
    scraped = _scrape(cluster, owner)
    assert scraped.get(("spillbox_gc_removals_total", (("kind", "task"),)), 0) >= 1, scraped


def _nobody_has(host: str, task_id: str) -> bool:
    actor = _actor(host)
    token, nobody = ray.get(actor.unless_open.remote(task_id))
    ray.get(actor.end.remote(token))
    return bool(nobody)


def test_a_dead_harness_hold_lapses_and_a_live_ones_is_renewed(
    harness: Harness, cluster: LocalCluster, ray_catalog_url: str
) -> None:
    live = harness.task("lease-live")
    # t is kept: a Task dropped lets go of its share of the hold (weakref.finalize).
    script = (
        "import sys, time\nfrom spillbox import Harness\n"
        f"h = Harness(cluster={cluster.address!r}, catalog_url={ray_catalog_url!r}, "
        "home=sys.argv[1], environ={})\n"
        "t = h.task('lease-dead')\nprint('open', flush=True)\ntime.sleep(600)\n"
    )
    with subprocess.Popen(
        [sys.executable, "-c", script, str(cluster.root / "lease-client")],
        stdout=subprocess.PIPE,
        text=True,
    ) as dead:
        try:
            assert dead.stdout is not None
            opened = dead.stdout.readline()
            assert opened == "open\n", opened
            host = _placement(harness, "lease-dead").host
            assert not _nobody_has(host, "lease-dead"), "held open by its harness"
        finally:
            dead.kill()  # SIGKILL: it renews nothing from now on, and says nothing
    # The lease (ray_fixtures.LEASE_SECONDS) lapses with no renewal; the live harness
    # renewed its own all along, for longer than one lease.
    _until(lambda: _nobody_has(host, "lease-dead"))
    assert not _nobody_has(_placement(harness, "lease-live").host, "lease-live")
    live.close()


def _until(done: Callable[[], bool], limit: float = 120.0) -> None:
    """Wait for what the cluster does by itself (the limit only ends a test that would
    otherwise hang; it leaves a loaded machine room for a 10 s lease several times)."""
    deadline = time.monotonic() + limit
    while not done():
        assert time.monotonic() < deadline, "the cluster never got there (a loaded machine?)"
        time.sleep(0.2)


def _scrape(
    cluster: LocalCluster, host: str
) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """A host's metrics as Prometheus serves them: each sample by name and labels."""
    port = cluster.hosts[host]["metrics_port"]
    with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=30) as response:
        text = response.read().decode()
    return {
        (sample.name, tuple(sorted(sample.labels.items()))): sample.value
        for family in text_string_to_metric_families(text)
        for sample in family.samples
    }


def test_each_host_serves_its_own_metrics(harness: Harness, cluster: LocalCluster) -> None:
    python = ("spillbox_exec_duration_seconds_count", (("language", "python"),))
    before = {host: _scrape(cluster, host).get(python, 0.0) for host in cluster.homes}
    with harness.task("metrics-fleet") as task:
        host = _placement(harness, "metrics-fleet").host
        assert task.exec("python", "print(6 * 7)").text.strip() == "42"
        during = {name: _scrape(cluster, name) for name in cluster.homes}
    assert during[host][python] == before[host] + 1, (host, during[host])
    for other in set(cluster.homes) - {host}:
        assert during[other].get(python, 0.0) == before[other], other
    assert during[host][("spillbox_sandboxes_alive", ())] >= 1


def test_a_payload_linked_ahead_but_not_published_is_unlinked(
    harness: Harness, cluster: LocalCluster
) -> None:
    # The host links a staged payload under its likely name in the same call (one round
    # trip per admit); the same bytes again are de-duplicated, so that link must go.
    with harness.task("ahead") as task:
        [first] = task.admit([ToolResult(call_id="c1", tool="rows", content=blob(BLOB))])
        [again] = task.admit([ToolResult(call_id="c2", tool="rows", content=blob(BLOB))])
        assert first.offloaded and again.offloaded
        offload = cluster.homes[_placement(harness, "ahead").host] / "tasks" / "ahead" / "offload"
        _until(lambda: [p.name for p in offload.iterdir()] == ["c1.txt"])
        assert [row.artifact_id for row in task.artifacts()] == ["c1"]
        assert parse_notice(again.text)["path"] == parse_notice(first.text)["path"]  # type: ignore[index]


def test_a_taken_name_is_published_under_the_next_free_one(
    harness: Harness, cluster: LocalCluster
) -> None:
    # The host links a staged payload ahead under its likely name only if that is free;
    # a call id again (other bytes), or a deleted artifact's id (never given again), makes
    # the harness link it under the next free name itself. Each is read back byte for byte.
    payloads = [blob(BLOB) + f"\n{i}" for i in range(3)]
    with harness.task("taken") as task:
        [first] = task.admit([ToolResult(call_id="c1", tool="rows", content=payloads[0])])
        [second] = task.admit([ToolResult(call_id="c1", tool="rows", content=payloads[1])])
        assert first.artifact is not None and second.artifact is not None
        assert (first.artifact.id, second.artifact.id) == ("c1", "c1-2")
        task.delete("c1-2")
        [third] = task.admit([ToolResult(call_id="c1", tool="rows", content=payloads[2])])
        assert third.artifact is not None and third.artifact.id == "c1-3"
        rows = {row.artifact_id: row for row in task.artifacts()}
        assert sorted(rows) == ["c1", "c1-3"]
        assert task.read(rows["c1"]) == payloads[0].encode()
        assert task.read(rows["c1-3"]) == payloads[2].encode()
        offload = cluster.homes[_placement(harness, "taken").host] / "tasks" / "taken" / "offload"
        _until(lambda: sorted(p.name for p in offload.iterdir()) == ["c1-3.txt", "c1.txt"])


def test_a_harness_learns_a_hosts_stems_once_and_never_gives_one_twice(
    harness: Harness, cluster: LocalCluster, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The host lists the task's folder at a harness's first payload only (a listing per
    payload grew each offload with the task); after it the harness withholds a want it
    knows taken. A file a crashed offload left with no row (c5.csv, there before) keeps
    its stem; a call id again gets the next free one (the catalog knows it)."""
    from spillbox.sandbox.ray.link import HostLink

    staged: list[tuple[Any, ...]] = []
    ask = HostLink.ask

    def recorded(link: HostLink, method: str, *args: Any) -> Any:
        if method == "stage":
            staged.append((args[2], args[3]))  # want, and whether the stems are asked
        return ask(link, method, *args)

    rows = json.dumps([{"id": i, "pad": "victim " * 30} for i in range(400)])
    with harness.task("stems") as task:
        offload = cluster.homes[_placement(harness, "stems").host] / "tasks" / "stems" / "offload"
        offload.mkdir(parents=True, exist_ok=True)
        (offload / "c5.csv").write_bytes(b"a\n1\n")
        monkeypatch.setattr(HostLink, "ask", recorded)
        results = [
            ToolResult("c1", "t", rows),
            ToolResult("c1", "t", "plain words " * 3000),
            ToolResult("c5", "t", rows.replace("victim", "c5")),
            ToolResult("c6", "t", rows.replace("victim", "c6")),
        ]
        admitted = [task.admit([result])[0] for result in results]
        names = [a.artifact.name for a in admitted if a.artifact is not None]
        assert names == ["c1.json", "c1-2.txt", "c5-2.json", "c6.json"]
        assert [row.artifact_id for row in task.artifacts()] == ["c1", "c1-2", "c5-2", "c6"]
    assert [asked for _, asked in staged] == [True, False, False, False]
    # c1's JSON, then c1 again (unknown to the harness's listing: the catalog says no),
    # then c5 (in the listing: withheld), then c6 (free: linked ahead).
    assert [want for want, _ in staged] == [("c1", "json"), ("c1", "txt"), None, ("c6", "json")]
