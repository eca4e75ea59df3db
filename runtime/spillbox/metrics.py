"""What a host did, for an operator to scrape: Prometheus metrics of this process.

Off until asked for, and then free of cost to whoever did not ask: nothing is imported and
every record below is one `is None` test. SPILLBOX_METRICS_LISTEN=HOST:PORT (any harness:
the library, the CLI, the MCP proxy, a cluster host) serves them at http://HOST:PORT/metrics;
enable(registry) adds them to a registry of the caller's own (an application that already
exports Prometheus metrics).

    spillbox_offloads_total{reason}            results stored instead of shown
    spillbox_offloaded_bytes_total{reason}     bytes of those payloads, as stored
    spillbox_tokens_kept_out_total{reason}     their tokens, less the notices' tokens
    spillbox_exec_duration_seconds{language}   code-mode calls, end to end (histogram)
    spillbox_sandboxes_alive                   sandboxes this process's harnesses run
    spillbox_gc_removals_total{kind}           what garbage collection removed
    spillbox_quota_refusals_total              payloads a task's quota refused
    spillbox_redactions_total{kind}            secrets replaced, per kind of secret

Prometheus' text format, through prometheus_client (the reference client): a scrape target
needs no collector beside it, and every Prometheus-compatible system (OpenTelemetry
collectors included) reads it. The values are per process, as Prometheus counts them.
"""

from __future__ import annotations

import threading
import weakref
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from prometheus_client import CollectorRegistry

EXEC_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)
"""Seconds: a kept relay answers in milliseconds, a cold sandbox in about a second, and
code mode's default timeout is 30 s."""


@dataclass(frozen=True)
class _Metrics:
    offloads: Any
    offloaded_bytes: Any
    tokens_kept_out: Any
    exec_seconds: Any
    gc_removals: Any
    quota_refusals: Any
    redactions: Any


_metrics: _Metrics | None = None
"""The metrics being kept, or None: every record is then a no-op."""
_made: dict[CollectorRegistry, _Metrics] = {}
"""The metrics made in each registry (a registry refuses a second copy of a name)."""
_lock = threading.Lock()
_served: dict[tuple[str, int], int] = {}
_alive: weakref.WeakKeyDictionary[object, Callable[[], int]] = weakref.WeakKeyDictionary()


def enable(registry: CollectorRegistry | None = None) -> None:
    """Keep spillbox's metrics from now on, in registry (default: prometheus_client's).
    Again with another registry: they move there."""
    global _metrics
    try:
        import prometheus_client as prom
    except ImportError as e:
        raise ImportError(
            "spillbox's metrics need prometheus_client: pip install 'spillbox[metrics]'"
        ) from e

    registry = registry or prom.REGISTRY
    with _lock:
        if registry not in _made:
            _made[registry] = _make(prom, registry)
        _metrics = _made[registry]


def _make(prom: Any, registry: CollectorRegistry) -> _Metrics:
    reason, kind = ["reason"], ["kind"]
    made = _Metrics(
        offloads=prom.Counter(
            "spillbox_offloads", "Tool results offloaded", reason, registry=registry
        ),
        offloaded_bytes=prom.Counter(
            "spillbox_offloaded_bytes",
            "Bytes of offloaded payloads, as stored",
            reason,
            registry=registry,
        ),
        tokens_kept_out=prom.Counter(
            "spillbox_tokens_kept_out",
            "Tokens of offloaded results that did not reach the model (less their notices)",
            reason,
            registry=registry,
        ),
        exec_seconds=prom.Histogram(
            "spillbox_exec_duration_seconds",
            "Code-mode calls, from the call to its gated answer",
            ["language"],
            buckets=EXEC_BUCKETS,
            registry=registry,
        ),
        gc_removals=prom.Counter(
            "spillbox_gc_removals", "What garbage collection removed", kind, registry=registry
        ),
        quota_refusals=prom.Counter(
            "spillbox_quota_refusals", "Payloads a task's quota refused", registry=registry
        ),
        redactions=prom.Counter(
            "spillbox_redactions", "Secrets replaced by redaction", kind, registry=registry
        ),
    )
    alive = prom.Gauge("spillbox_sandboxes_alive", "Sandboxes this process runs", registry=registry)
    alive.set_function(_sandboxes_alive)
    return made


def serve(listen: str) -> int:
    """Serve the metrics at http://HOST:PORT/metrics (once per address in a process);
    the port it listens on (PORT 0: one the system chose)."""
    host, _, port_text = listen.rpartition(":")
    if not host or not port_text.isdigit() or int(port_text) > 65535:
        from spillbox.errors import ConfigError

        raise ConfigError(f"SPILLBOX_METRICS_LISTEN must be HOST:PORT, not {listen!r}")
    enable()
    import prometheus_client as prom

    key = (host, int(port_text))
    with _lock:
        if key not in _served:
            server, _ = prom.start_http_server(key[1], addr=host)
            _served[key] = server.server_port
        return _served[key]


def watch(owner: object, count: Callable[[], int]) -> None:
    """Count owner's live sandboxes (count()) in spillbox_sandboxes_alive while it lives."""
    _alive[owner] = count


def unwatch(owner: object) -> None:
    _alive.pop(owner, None)


def _sandboxes_alive() -> float:
    total = 0
    for count in list(_alive.values()):
        try:
            total += count()
        except Exception:  # noqa: BLE001 - an engine that does not answer runs none we can see
            continue
    return float(total)


def offloaded(reason: str, stored_bytes: int, tokens_kept_out: int) -> None:
    if _metrics is not None:
        _metrics.offloads.labels(reason).inc()
        _metrics.offloaded_bytes.labels(reason).inc(stored_bytes)
        _metrics.tokens_kept_out.labels(reason).inc(max(tokens_kept_out, 0))


def executed(language: str, seconds: float) -> None:
    if _metrics is not None:
        _metrics.exec_seconds.labels(language).observe(seconds)


def collected(kinds: Iterable[str]) -> None:
    if _metrics is not None:
        for kind in kinds:
            _metrics.gc_removals.labels(kind).inc()


def quota_refused() -> None:
    if _metrics is not None:
        _metrics.quota_refusals.inc()


def redacted(counts: Mapping[str, int]) -> None:
    if _metrics is not None:
        for kind, n in counts.items():
            _metrics.redactions.labels(kind).inc(n)
