"""The metrics of code mode against a real engine (issue 27 item 4): exec latency by
language, and the sandboxes a process's harnesses run."""

from __future__ import annotations

from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry

from spillbox import Harness, metrics

pytestmark = pytest.mark.docker


def test_exec_latency_is_observed_by_language_and_live_sandboxes_are_counted(
    docker_home: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(metrics, "_metrics", None)
    registry = CollectorRegistry()
    metrics.enable(registry)

    def sample(name: str, **labels: str) -> float:
        return registry.get_sample_value(name, labels) or 0.0

    with Harness(
        sandbox="docker", home=docker_home, environ={}, gc_interval=-1, pool_size=0
    ) as harness:  # no pool: its ready slots would count as alive too
        task = harness.task("m")
        assert task.exec("sql", "SELECT 42 AS n").exit_code == 0
        assert task.exec("python", "print(1)").exit_code == 0
        assert task.exec("python", "raise SystemExit(3)").exit_code == 3  # failures count too
        assert sample("spillbox_exec_duration_seconds_count", language="sql") == 1
        assert sample("spillbox_exec_duration_seconds_count", language="python") == 2
        assert sample("spillbox_exec_duration_seconds_sum", language="python") > 0
        assert sample("spillbox_sandboxes_alive") == 1
        task.close()  # the last close stops the task's container
        assert sample("spillbox_sandboxes_alive") == 0
