"""A real Ray cluster on this machine for the cluster tests (and the benchmark): a head and
two more nodes, each with a custom resource of its own and a spillbox host over a home of
its own, all under one temp dir and on ports of their own, so no other Ray is touched.

Stopped by ending exactly the processes that this cluster's temp dir names (never `ray
stop`, which would end every Ray of the machine).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

NODES = ("a", "b", "c")
"""Node a is the head. Each node's resource is spillbox_<name>."""

RUNTIMES = {"a": None, "b": None, "c": "runsc"}
"""Each test host's OCI runtime: runc on a and b, gVisor on c."""
LEASE_SECONDS = 10.0
"""The hosts' lease on what a harness holds there: short, so that a dead harness's hold
lapses within a test, yet renewed (every third of it) even on a loaded machine."""

FAST_FAILURE = {
    "RAY_health_check_initial_delay_ms": "0",
    "RAY_health_check_period_ms": "300",
    "RAY_health_check_timeout_ms": "300",
    "RAY_health_check_failure_threshold": "2",
}
"""The head's node health checks: a dead node is declared in well under a second (Ray's
defaults take about 15 s)."""


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _ray() -> str:
    return str(Path(sys.executable).parent / "ray")


@dataclass
class LocalCluster:
    root: Path
    address: str
    node_ports: dict[str, int] = field(default_factory=dict)
    homes: dict[str, Path] = field(default_factory=dict)
    hosts: dict[str, dict[str, Any]] = field(default_factory=dict)
    """The info of each node's spillbox host, as it last started."""

    def start_node(self, name: str, head: bool = False) -> None:
        """Start a node; again on fresh ports if one it was given was taken meanwhile
        (a free port found here may be another process's by the time Ray binds it)."""
        failed = ""
        for _ in range(3):
            done = self._start_node(name, head)
            if done.returncode == 0:
                return
            failed = (done.stdout + done.stderr).decode(errors="replace")[-3000:]
            if head:  # a half-started head keeps its session in the GCS: start afresh
                self.stop()
                self.address = f"127.0.0.1:{_free_port()}"
        raise RuntimeError(f"ray start of node {name} failed:\n{failed}")

    def _start_node(self, name: str, head: bool) -> subprocess.CompletedProcess[bytes]:
        port = _free_port()
        self.node_ports[name] = port
        ports = [
            "--node-manager-port",
            str(port),
            "--object-manager-port",
            str(_free_port()),
            "--min-worker-port",
            "0",
            "--max-worker-port",
            "0",
            "--dashboard-agent-listen-port",
            str(_free_port()),
            "--dashboard-agent-grpc-port",
            str(_free_port()),
            "--metrics-export-port",
            str(_free_port()),
            "--runtime-env-agent-port",
            str(_free_port()),
        ]
        where = (
            [
                "--head",
                "--port",
                self.address.rsplit(":", 1)[1],
                "--temp-dir",
                str(self.root),
                "--include-dashboard=false",
            ]
            if head
            else ["--address", self.address]
        )
        argv = [
            _ray(),
            "start",
            *where,
            *ports,
            "--num-cpus",
            "1",
            "--node-ip-address",
            "127.0.0.1",
            "--resources",
            f'{{"spillbox_{name}": 1}}',
            "--disable-usage-stats",
        ]
        env = {**os.environ, **FAST_FAILURE, "RAY_USAGE_STATS_ENABLED": "0"}
        return subprocess.run(argv, env=env, capture_output=True, timeout=180)

    def pids(self, needle: str = "") -> list[int]:
        """The processes of this cluster (those whose command line names its temp dir or
        its session), optionally only those naming needle too."""
        found = []
        for entry in os.listdir("/proc"):
            if not entry.isdigit():
                continue
            try:
                cmd = Path(f"/proc/{entry}/cmdline").read_bytes().replace(b"\0", b" ").decode()
            except OSError:
                continue
            if str(self.root) in cmd and needle in cmd:
                found.append(int(entry))
        return found

    def raylet(self, name: str) -> int:
        [pid] = [
            p
            for p in self.pids(f"--node_manager_port={self.node_ports[name]}")
            if "raylet" in Path(f"/proc/{p}/cmdline").read_bytes().decode(errors="replace")
        ]
        return pid

    def stop(self) -> None:
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for pid in self.pids():
                try:
                    os.kill(pid, sig)
                except ProcessLookupError:
                    pass
            deadline = time.monotonic() + 10
            while self.pids() and time.monotonic() < deadline:
                time.sleep(0.1)


def start_cluster() -> Iterator[LocalCluster]:
    root = Path(tempfile.mkdtemp(prefix="sbray-", dir="/tmp"))
    cluster = LocalCluster(root, f"127.0.0.1:{_free_port()}")
    try:
        for i, name in enumerate(NODES):
            cluster.start_node(name, head=i == 0)
            cluster.homes[name] = root / f"home-{name}"
        yield cluster
    finally:
        cluster.stop()
        shutil.rmtree(root, ignore_errors=True)


def node_id(name: str) -> str:
    import ray

    [node] = [
        n["NodeID"] for n in ray.nodes() if n["Alive"] and f"spillbox_{name}" in n["Resources"]
    ]
    return str(node)


def start_node_host(cluster: LocalCluster, name: str, catalog_url: str) -> dict[str, Any]:
    """(Re)start node name's host (RUNTIMES, LEASE_SECONDS), its metrics served on a free
    port; its info."""
    from spillbox.sandbox.ray.host import HostSettings
    from spillbox.sandbox.ray.start import start_host

    settings = HostSettings(
        name,
        str(cluster.homes[name]),
        catalog_url,
        cap=4,
        runtime=RUNTIMES[name],
        gc_interval=0,
        lease=LEASE_SECONDS,
        metrics_listen="127.0.0.1:0",
    )
    info = start_host(settings, node_id=node_id(name))
    cluster.hosts[name] = info
    return info
