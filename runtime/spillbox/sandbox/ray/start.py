"""Starting a node's spillbox host: a detached, named Ray actor pinned to that node.

    spillbox host --home /var/lib/spillbox --cap 500        # on the node, after `ray start`
    start_host(HostSettings("node-b", "/var/lib/spillbox", catalog_url), node_id=...)

The actor's name is the host's ("spillbox-host:<name>", namespace "spillbox"); a host
started again under the same name replaces the old one, and registers a new epoch.
"""

from __future__ import annotations

from typing import Any

import ray
from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

from spillbox.sandbox.ray.backend import NAMESPACE, connect
from spillbox.sandbox.ray.host import HostSettings, SpillboxHost
from spillbox.sandbox.ray.link import ACTOR_PREFIX

MAX_CONCURRENCY = 64
"""Calls one host serves at once (threads of its actor): tasks' execs run side by side."""


def start_host(settings: HostSettings, node_id: str | None = None) -> dict[str, Any]:
    """Start (or restart) the host on a node (this driver's node by default); its info
    (metrics_port: where its metrics are served, if settings.metrics_listen asked)."""
    if not ray.is_initialized():
        connect("auto")
    node = node_id or ray.get_runtime_context().get_node_id()
    actor_name = ACTOR_PREFIX + settings.name
    try:
        ray.kill(ray.get_actor(actor_name, namespace=NAMESPACE), no_restart=True)
    except ValueError:
        pass  # no host of this name yet
    host: Any = (
        ray.remote(SpillboxHost)
        .options(
            name=actor_name,
            namespace=NAMESPACE,
            lifetime="detached",
            max_concurrency=MAX_CONCURRENCY,
            num_cpus=0,
            scheduling_strategy=NodeAffinitySchedulingStrategy(node, soft=False),
        )
        .remote(settings, node)
    )
    info: dict[str, Any] = ray.get(host.info.remote())
    return info
