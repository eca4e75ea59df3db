"""The cluster fixtures of the Ray test files (test_ray_cluster.py, test_ray_fleet.py): a
head and two more nodes started here (ray_cluster.py), a spillbox host on each over a home
of its own (runc on a and b, gVisor on c), the catalog on a Postgres database of the
module's own, and a harness on the cluster. Module-scoped: a cluster's start is most of a
file's time, so each file's tests share one."""

from __future__ import annotations

import uuid
from collections.abc import Iterator

import pytest
import ray

from catalog_backends import PostgresServer
from ray_cluster import RUNTIMES, LocalCluster, start_cluster, start_node_host
from spillbox import Harness
from spillbox.sandbox.docker import cleanup_home
from spillbox.sandbox.ray.backend import connect


@pytest.fixture(scope="module")
def ray_catalog_url(postgres_server: PostgresServer) -> Iterator[str]:
    """The cluster's catalog (named apart from conftest's catalog_url, which would win)."""
    name = f"ray_{uuid.uuid4().hex[:8]}"
    postgres_server.admin(f'CREATE DATABASE "{name}"')
    yield postgres_server.url(name)
    postgres_server.admin(f'DROP DATABASE "{name}" WITH (FORCE)')


@pytest.fixture(scope="module")
def cluster(sandbox_image: str, ray_catalog_url: str) -> Iterator[LocalCluster]:
    for running in start_cluster():
        connect(running.address)
        try:
            for name in RUNTIMES:
                start_node_host(running, name, ray_catalog_url)
            yield running
        finally:
            ray.shutdown()
            for home in running.homes.values():
                cleanup_home(home)


@pytest.fixture(scope="module")
def harness(
    cluster: LocalCluster, ray_catalog_url: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Harness]:
    home = tmp_path_factory.mktemp("ray-client")
    url = ray_catalog_url
    with Harness(cluster=cluster.address, catalog_url=url, home=home, environ={}) as h:
        yield h
