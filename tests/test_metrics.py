"""The metrics an operator scrapes (issue 27 item 4): each one moves when what it counts
happens, and a scrape over HTTP reads them in Prometheus' text format. The Docker-side ones
(exec latency by language, sandboxes alive) are in tests/sandbox/test_metrics_docker.py."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry
from prometheus_client.parser import text_string_to_metric_families

from spillbox import Harness, Retention, ToolResult, gc, metrics
from spillbox.errors import ConfigError, RetentionError

SECRET = "AKIAIOSFODNN7REALKEY"


@pytest.fixture
def registry(monkeypatch: pytest.MonkeyPatch) -> CollectorRegistry:
    """A registry of the test's own, the metrics kept in it for the test only."""
    monkeypatch.setattr(metrics, "_metrics", None)
    registry = CollectorRegistry()
    metrics.enable(registry)
    return registry


@pytest.fixture
def harness(tmp_path: Path) -> Iterator[Harness]:
    with Harness(sandbox="none", home=tmp_path / "home", environ={}, gc_interval=-1) as h:
        yield h


def value(registry: CollectorRegistry, name: str, **labels: str) -> float:
    found = registry.get_sample_value(name, labels)
    return 0.0 if found is None else found


def rows(n: int) -> str:
    return json.dumps([{"id": i, "body": "lorem ipsum " * 20} for i in range(n)])


def test_nothing_is_kept_until_metrics_are_enabled(
    harness: Harness, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(metrics, "_metrics", None)
    harness.task("t").admit([ToolResult("c1", "list", rows(400))])
    registry = CollectorRegistry()
    metrics.enable(registry)  # from now on, not before
    assert value(registry, "spillbox_offloads_total", reason="per_call") == 0


def test_an_offload_counts_its_reason_bytes_and_the_tokens_it_kept_out(
    registry: CollectorRegistry, harness: Harness
) -> None:
    task = harness.task("t")
    big, small = ToolResult("c1", "list", rows(400)), ToolResult("c2", "ping", "ok")
    [offloaded, inline] = task.admit([big, small])
    assert offloaded.offloaded and not inline.offloaded
    assert offloaded.artifact is not None and offloaded.tokens is not None
    assert value(registry, "spillbox_offloads_total", reason="per_call") == 1
    assert value(registry, "spillbox_offloaded_bytes_total", reason="per_call") == (
        offloaded.artifact.bytes
    )
    kept_out = offloaded.tokens - offloaded.inline_tokens
    assert kept_out > 5_000
    assert value(registry, "spillbox_tokens_kept_out_total", reason="per_call") == kept_out
    task.offload(ToolResult("c3", "note", "a short note"), reason="compaction")
    assert value(registry, "spillbox_offloads_total", reason="compaction") == 1


def test_redactions_are_counted_by_kind(registry: CollectorRegistry, harness: Harness) -> None:
    task = harness.task("r", retention=Retention(redact=True))
    config = json.dumps({"aws_access_key_id": SECRET, "other": f"again {SECRET}"})
    [admitted] = task.admit([ToolResult("c1", "get_config", config)])
    assert SECRET not in admitted.text
    assert value(registry, "spillbox_redactions_total", kind="aws_access_token") == 2


def test_a_quota_refusal_is_counted(registry: CollectorRegistry, harness: Harness) -> None:
    task = harness.task("q", retention=Retention(max_bytes=1_000))
    with pytest.raises(RetentionError, match="quota"):
        task.admit([ToolResult("c1", "list", rows(400))])
    assert value(registry, "spillbox_quota_refusals_total") == 1


def test_garbage_collection_counts_what_it_removed_by_kind(
    registry: CollectorRegistry, harness: Harness, clock: object
) -> None:
    task = harness.task("g", retention=Retention(ttl=60))
    task.admit([ToolResult("c1", "list", rows(400))])
    gc.collect(harness, dry_run=True)
    assert value(registry, "spillbox_gc_removals_total", kind="artifact") == 0  # a dry run
    clock.advance(120)  # type: ignore[attr-defined]
    gc.collect(harness)
    assert value(registry, "spillbox_gc_removals_total", kind="artifact") == 1


def test_a_scrape_over_http_reads_every_metric(tmp_path: Path) -> None:
    port = metrics.serve("127.0.0.1:0")
    with Harness(sandbox="none", home=tmp_path / "home", environ={}, gc_interval=-1) as harness:
        harness.task("s").admit([ToolResult("c1", "list", rows(400))])
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=10) as answer:
            text = answer.read().decode()
    families = {family.name: family for family in text_string_to_metric_families(text)}
    for name in (
        "spillbox_offloads",
        "spillbox_offloaded_bytes",
        "spillbox_tokens_kept_out",
        "spillbox_exec_duration_seconds",
        "spillbox_sandboxes_alive",
        "spillbox_gc_removals",
        "spillbox_quota_refusals",
        "spillbox_redactions",
    ):
        assert name in families, name
    [alive] = families["spillbox_sandboxes_alive"].samples
    assert alive.value == 0  # the store-only backend runs no sandbox
    offloads = {s.labels.get("reason"): s.value for s in families["spillbox_offloads"].samples}
    assert offloads.get("per_call", 0) >= 1


@pytest.mark.parametrize("listen", ["9464", "host:port", ":9464", "127.0.0.1:70000"])
def test_a_listen_address_that_is_not_host_port_is_refused(listen: str) -> None:
    with pytest.raises(ConfigError, match="HOST:PORT"):
        metrics.serve(listen)
