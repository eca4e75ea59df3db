"""One base exception with a few categories; every message says what happened and what to do."""

from __future__ import annotations


class SpillboxError(Exception):
    """Base of every error spillbox raises on purpose."""


class ConfigError(SpillboxError):
    """Bad configuration or input: a setting, a path, an encoding, an argument."""


class StorageError(SpillboxError):
    """The task's storage could not be read or written."""


class SandboxError(SpillboxError):
    """The sandbox backend (Docker, its image) failed or is not available."""


class ExecError(SpillboxError):
    """A code-mode script could not be run (not: the script failed; that is an ExecResult)."""


class RetentionError(SpillboxError):
    """A retention policy refused the operation (quota, export, a deleted artifact)."""
