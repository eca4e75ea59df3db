"""Retention policies: how long payloads live, how much they take, who may copy them out.

    from spillbox import Harness, Retention
    harness.task("t1", retention=Retention(ttl=parse_duration("24h"), max_bytes=parse_size("500M")))

A task's policy is given when the task is first used and stored in the catalog; a later
use with another policy replaces it and the change is logged.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import asdict, dataclass
from typing import Any, Literal

from spillbox.errors import ConfigError, RetentionError
from spillbox.types import ArtifactRow, TaskRow

TtlFrom = Literal["created", "access"]
OnQuota = Literal["evict", "refuse"]
Export = Literal["allow", "deny"]

DEFAULT_TTL_SECONDS = 7 * 24 * 3600.0

_DURATION = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([smhdw]?)\s*$")
_DURATION_UNITS = {"": 1, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([KMGT]?)i?B?\s*$", re.IGNORECASE)
_SIZE_UNITS = {"": 1, "K": 1 << 10, "M": 1 << 20, "G": 1 << 30, "T": 1 << 40}


def parse_duration(text: str) -> float:
    """Seconds in a duration like 90s, 15m, 24h, 7d (a bare number is seconds).

    >>> parse_duration("15m"), parse_duration("7d")
    (900.0, 604800.0)
    """
    match = _DURATION.match(text)
    if not match:
        raise ConfigError(f"bad duration {text!r}: write it like 90s, 15m, 24h or 7d")
    return float(match[1]) * _DURATION_UNITS[match[2]]


def parse_size(text: str) -> int:
    """Bytes in a size like 500K, 20M, 1G (a bare number is bytes).

    >>> parse_size("500K"), parse_size("1G")
    (512000, 1073741824)
    """
    match = _SIZE.match(text)
    if not match:
        raise ConfigError(f"bad size {text!r}: write it like 500K, 20M or 1G")
    return int(float(match[1]) * _SIZE_UNITS[match[2].upper()])


@dataclass(frozen=True)
class Retention:
    """One task's retention policy.

    >>> Retention(ttl=3600, max_artifacts=50, on_quota="refuse").export
    'deny'
    """

    ttl: float | None = DEFAULT_TTL_SECONDS
    """Seconds an artifact lives (None: until its task is deleted)."""
    ttl_from: TtlFrom = "created"
    """Count the TTL from creation, or from the last read or query."""
    keep_after_close: float | None = None
    """When the task closes: 0 deletes it now, N seconds keeps it that long, None keeps
    it until its artifacts expire."""
    max_bytes: int | None = None
    """Most payload bytes the task may hold."""
    max_artifacts: int | None = None
    """Most artifacts the task may hold."""
    on_quota: OnQuota = "evict"
    """Over quota: evict the oldest unpinned artifacts, or refuse the new one."""
    export: Export = "deny"
    """Whether a payload may be copied out of the sandbox (each export is logged)."""
    redact: bool = False
    """Replace secrets (keys, tokens, private keys) before a payload is written."""

    def __post_init__(self) -> None:
        for name in ("ttl", "keep_after_close"):
            value = getattr(self, name)
            if value is not None and value < 0:
                raise ConfigError(f"{name} must not be negative, got {value}")
        for name in ("max_bytes", "max_artifacts"):
            value = getattr(self, name)
            if value is not None and value < 1:
                raise ConfigError(f"{name} must be at least 1, got {value}")
        _check_choice("ttl_from", self.ttl_from, ("created", "access"))
        _check_choice("on_quota", self.on_quota, ("evict", "refuse"))
        _check_choice("export", self.export, ("allow", "deny"))

    def to_json(self) -> str:
        return json.dumps(asdict(self), sort_keys=True)

    @classmethod
    def from_json(cls, text: str) -> Retention:
        data: dict[str, Any] = json.loads(text)
        return cls(**data)

    @classmethod
    def from_options(cls, options: Mapping[str, str | None], base: Retention) -> Retention:
        """A policy from textual options (CLI flags, environment), over a base policy."""
        fields: dict[str, Any] = asdict(base)
        for name, value in options.items():
            if value is None:
                continue
            if name in ("ttl", "keep_after_close"):
                fields[name] = None if value in ("none", "forever") else parse_duration(value)
            elif name == "max_bytes":
                fields[name] = parse_size(value)
            elif name == "max_artifacts":
                fields[name] = _positive_int(name, value)
            elif name == "redact":
                fields[name] = value.lower() in ("1", "true", "yes", "on")
            else:
                fields[name] = value
        return cls(**fields)


# The decisions: pure functions of a policy, the catalog's rows and the time. Task and
# garbage collection apply them; nothing here deletes or writes.


def policy_for(known: TaskRow | None, given: Retention | None, default: Retention) -> Retention:
    """The policy a task is used with: the one given, else the one stored for it (unless it
    was deleted), else the harness's default."""
    if given is not None:
        return given
    if known is not None and known.state != "deleted":
        return Retention.from_json(known.retention)
    return default


def expires_at(policy: Retention, since: float) -> float | None:
    """When an artifact created (or, with ttl_from access, last used) at `since` expires."""
    return None if policy.ttl is None else since + policy.ttl


def expiry_after_access(policy: Retention, now: float) -> float | None:
    """The new expiry of an artifact read or queried now, or None if access does not move it."""
    return expires_at(policy, now) if policy.ttl_from == "access" else None


def close_deadline(policy: Retention, now: float) -> float | None:
    """When a task closed now is deleted (now: at once; None: when its artifacts expire)."""
    keep = policy.keep_after_close
    return None if keep is None else now + keep


def due_for_deletion(task: TaskRow, live_artifacts: int, now: float) -> str | None:
    """Why a closed task must be deleted now, or None if it must not (or is not closed)."""
    if task.state != "closed":
        return None
    if task.delete_after is not None and task.delete_after <= now:
        return "keep_after_close"
    if task.delete_after is None and not live_artifacts:
        return "expired"  # kept until its artifacts expire: they have
    return None


def quota_evictions(
    policy: Retention,
    task_id: str,
    usage: tuple[int, int],
    live: Callable[[], Sequence[ArtifactRow]],
    size: int,
) -> list[ArtifactRow]:
    """The artifacts to evict, oldest first, so that a new payload of `size` bytes fits the
    task's quota; a RetentionError if it must be refused instead.

    usage: how many live artifacts the task has and their bytes (a count the database
    makes); live(): those artifacts, oldest first, listed only when the payload does not
    fit, and then counted from the listing itself."""
    if policy.max_bytes is None and policy.max_artifacts is None:
        return []
    if policy.max_bytes is not None and size > policy.max_bytes:
        raise RetentionError(
            f"a payload of {size} bytes is over task {task_id}'s quota of "
            f"{policy.max_bytes} bytes: raise --max-bytes"
        )

    def over(count: int, used: int) -> bool:
        too_many = policy.max_artifacts is not None and count + 1 > policy.max_artifacts
        return too_many or (policy.max_bytes is not None and used + size > policy.max_bytes)

    if not over(*usage):
        return []
    rows = live()
    count, used = len(rows), sum(row.bytes for row in rows)
    if not over(count, used):
        return []  # room was made meanwhile
    if policy.on_quota == "refuse":
        raise RetentionError(
            f"task {task_id} is at its quota ({count} artifacts, {used} bytes): "
            "delete artifacts, or use --on-quota evict"
        )
    evicted = []
    for row in rows:
        if row.pinned:
            continue
        evicted.append(row)
        count, used = count - 1, used - row.bytes
        if not over(count, used):
            return evicted
    raise RetentionError(
        f"task {task_id} is at its quota and every remaining artifact is pinned: "
        "unpin some, or raise --max-bytes / --max-artifacts"
    )


def _check_choice(name: str, value: str, choices: tuple[str, ...]) -> None:
    if value not in choices:
        raise ConfigError(f"{name} must be one of {', '.join(choices)}, got {value!r}")


def _positive_int(name: str, value: str) -> int:
    try:
        return int(value)
    except ValueError:
        raise ConfigError(f"{name} must be a whole number, got {value!r}") from None
