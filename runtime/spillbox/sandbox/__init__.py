"""Sandbox backends, chosen in one place."""

from __future__ import annotations

from pathlib import Path

from spillbox.config import SandboxKind
from spillbox.sandbox.base import RawExec, SandboxBackend
from spillbox.sandbox.none import NoneBackend

__all__ = ["RawExec", "SandboxBackend", "make_backend"]


def make_backend(kind: SandboxKind, home: Path) -> SandboxBackend:
    """The backend for a sandbox kind; Docker is imported only when used."""
    if kind == "docker":
        from spillbox.sandbox.docker import DockerBackend

        return DockerBackend(home)
    return NoneBackend(home)
