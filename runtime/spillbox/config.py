"""Configuration: frozen dataclasses, named defaults, and the one place the environment is read."""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Literal, get_args

import platformdirs

from spillbox.errors import ConfigError
from spillbox.retention import Retention, parse_duration
from spillbox.tokens import DEFAULT_ENCODING

DEFAULT_PER_CALL_TOKENS = 6_000
DEFAULT_AGGREGATE_TOKENS = 10_000
DEFAULT_NOTICE_MAX_TOKENS = 400
DEFAULT_PREVIEW_CHARS = 100
DEFAULT_MAX_RESULT_BYTES = 256 * 1024 * 1024

SandboxKind = Literal["none", "docker"]
DEFAULT_SANDBOX: SandboxKind = "docker"
DEFAULT_GC_INTERVAL = 600.0
DEFAULT_POOL_SIZE = 2
"""Ready Docker sandboxes a harness keeps for the tasks it opens (the warm pool)."""

_RETENTION_ENV = {
    "ttl": "SPILLBOX_TTL",
    "ttl_from": "SPILLBOX_TTL_FROM",
    "keep_after_close": "SPILLBOX_KEEP_AFTER_CLOSE",
    "max_bytes": "SPILLBOX_MAX_BYTES",
    "max_artifacts": "SPILLBOX_MAX_ARTIFACTS",
    "on_quota": "SPILLBOX_ON_QUOTA",
    "export": "SPILLBOX_EXPORT",
    "redact": "SPILLBOX_REDACT",
}


@dataclass(frozen=True)
class Policy:
    """How the gate decides what stays in context.

    >>> Policy(per_call_tokens=2_000).aggregate_tokens
    10000
    """

    per_call_tokens: int = DEFAULT_PER_CALL_TOKENS
    """A single result estimated above this many tokens is offloaded."""
    aggregate_tokens: int = DEFAULT_AGGREGATE_TOKENS
    """The results of one step together put at most this many tokens into context."""
    notice_max_tokens: int = DEFAULT_NOTICE_MAX_TOKENS
    """A notice never exceeds this many tokens, whatever the payload."""
    preview_chars: int = DEFAULT_PREVIEW_CHARS
    """The notice previews this many characters of the payload's head and of its tail."""
    encoding: str = DEFAULT_ENCODING
    """The tiktoken encoding that counts tokens (ignored when a custom counter is given)."""
    max_result_bytes: int = DEFAULT_MAX_RESULT_BYTES
    """A result (or a script's output file) over this many bytes is refused: the model
    gets a one-line error instead, and nothing is stored. A result is held in host memory
    (in more than one copy) while it is stored: this bounds that memory."""
    per_call_share: float | None = None
    """The dynamic per-call limit: a step told how many tokens remain for tool results (the
    loop is, by its budget) offloads a result over this share of them, never above
    per_call_tokens and never below notice_max_tokens. None: per_call_tokens alone."""

    def __post_init__(self) -> None:
        for name in (
            "per_call_tokens",
            "aggregate_tokens",
            "notice_max_tokens",
            "preview_chars",
            "max_result_bytes",
        ):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ConfigError(f"{name} must be a positive whole number, got {value!r}")
        share = self.per_call_share
        if share is not None and (
            not isinstance(share, (int, float)) or isinstance(share, bool) or not 0 < share <= 1
        ):
            raise ConfigError(
                f"per_call_share must be a share above 0 and at most 1 (0.3 for 30%), got {share!r}"
            )


@dataclass(frozen=True)
class ModelEndpoint:
    """A real model endpoint for the agent loop (used only when a key and base URL are set)."""

    provider: Literal["openai", "anthropic"]
    base_url: str
    api_key: str = field(repr=False)
    model: str


@dataclass(frozen=True)
class Settings:
    """Where spillbox keeps its files, which sandbox it uses, and the gate's policy."""

    home: Path = field(default_factory=lambda: Path(platformdirs.user_data_dir("spillbox")))
    """Root of all task storage (SPILLBOX_HOME)."""
    sandbox: SandboxKind = DEFAULT_SANDBOX
    """"docker" (a hardened container per task) or "none" (store only, no code mode)."""
    policy: Policy = field(default_factory=Policy)
    retention: Retention = field(default_factory=Retention)
    """The retention policy of tasks opened without one of their own."""
    gc_interval: float = DEFAULT_GC_INTERVAL
    """Seconds between garbage collections while a harness runs (0: only at start; <0: never)."""
    pool_size: int = DEFAULT_POOL_SIZE
    """Ready sandboxes kept for new tasks (SPILLBOX_POOL_SIZE; 0: every task starts its own
    container when it first needs one). Filled from the first task a harness opens."""
    catalog_url: str | None = None
    """The catalog's database (SPILLBOX_CATALOG_URL): None for SQLite in the home, or a
    Postgres URL (postgresql://USER:PASSWORD@HOST/DB) that several harness hosts share."""
    cluster: str | None = None
    """The Ray cluster whose spillbox hosts keep the tasks (SPILLBOX_CLUSTER): its address
    ("auto", "ray://head:10001", "head:6379"); None: this machine's sandbox backend."""
    endpoint: ModelEndpoint | None = None
    """A real model for the loop: SPILLBOX_MODEL_PROVIDER (openai|anthropic),
    SPILLBOX_MODEL_BASE_URL, SPILLBOX_MODEL_API_KEY, SPILLBOX_MODEL."""
    metrics_listen: str | None = None
    """HOST:PORT to serve this process's Prometheus metrics at, /metrics
    (SPILLBOX_METRICS_LISTEN; spillbox.metrics); None: no metrics kept."""

    def __post_init__(self) -> None:
        if self.pool_size < 0:
            raise ConfigError(f"the pool size must be 0 or more, got {self.pool_size}")
        if self.sandbox not in get_args(SandboxKind):
            raise ConfigError(
                f"unknown sandbox {self.sandbox!r}: use one of {', '.join(get_args(SandboxKind))}"
            )

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Settings:
        """Settings from SPILLBOX_* variables; the only place spillbox reads the environment."""
        env = os.environ if environ is None else environ
        settings = cls()
        if env.get("SPILLBOX_HOME"):
            settings = replace(settings, home=Path(env["SPILLBOX_HOME"]).expanduser())
        if env.get("SPILLBOX_SANDBOX"):
            settings = replace(settings, sandbox=env["SPILLBOX_SANDBOX"])  # type: ignore[arg-type]
        policy = Policy(
            per_call_tokens=_int(env, "SPILLBOX_PER_CALL_TOKENS", DEFAULT_PER_CALL_TOKENS),
            aggregate_tokens=_int(env, "SPILLBOX_AGGREGATE_TOKENS", DEFAULT_AGGREGATE_TOKENS),
            max_result_bytes=_int(env, "SPILLBOX_MAX_RESULT_BYTES", DEFAULT_MAX_RESULT_BYTES),
            encoding=env.get("SPILLBOX_ENCODING") or DEFAULT_ENCODING,
        )
        retention = Retention.from_options(
            {name: env.get(var) or None for name, var in _RETENTION_ENV.items()}, Retention()
        )
        gc_interval = env.get("SPILLBOX_GC_INTERVAL")
        return replace(
            settings,
            policy=policy,
            retention=retention,
            gc_interval=DEFAULT_GC_INTERVAL if not gc_interval else _gc_interval(gc_interval),
            endpoint=_endpoint(env),
            catalog_url=env.get("SPILLBOX_CATALOG_URL") or None,
            cluster=env.get("SPILLBOX_CLUSTER") or None,
            metrics_listen=env.get("SPILLBOX_METRICS_LISTEN") or None,
            pool_size=_int(env, "SPILLBOX_POOL_SIZE", DEFAULT_POOL_SIZE),
        )


def _endpoint(env: Mapping[str, str]) -> ModelEndpoint | None:
    key, base = env.get("SPILLBOX_MODEL_API_KEY"), env.get("SPILLBOX_MODEL_BASE_URL")
    if not key or not base:
        return None
    provider = env.get("SPILLBOX_MODEL_PROVIDER", "openai")
    if provider not in ("openai", "anthropic"):
        raise ConfigError(f"SPILLBOX_MODEL_PROVIDER must be openai or anthropic, got {provider!r}")
    model = env.get("SPILLBOX_MODEL")
    if not model:
        raise ConfigError("SPILLBOX_MODEL must name the model when a model endpoint is set")
    return ModelEndpoint(provider, base, key, model)  # type: ignore[arg-type]


def _gc_interval(raw: str) -> float:
    return -1.0 if raw in ("never", "off") else parse_duration(raw)


def _int(env: Mapping[str, str], name: str, default: int) -> int:
    raw = env.get(name)
    if not raw:
        return default
    try:
        return int(raw)
    except ValueError:
        raise ConfigError(f"{name} must be a whole number, got {raw!r}") from None
