"""Sandbox backends, chosen in one place."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from spillbox.config import SandboxKind
from spillbox.sandbox.base import SandboxBackend
from spillbox.sandbox.none import NoneBackend
from spillbox.types import RawExec

if TYPE_CHECKING:
    from spillbox.sandbox.docker import SandboxOptions

__all__ = ["RawExec", "SandboxBackend", "make_backend"]


def make_backend(
    kind: SandboxKind, home: Path, options: SandboxOptions | None = None
) -> SandboxBackend:
    """The backend for a sandbox kind; the Docker SDK is imported only when used."""
    if kind == "docker":
        from spillbox.sandbox.docker import DockerBackend

        return DockerBackend(home, options)
    return NoneBackend(home)
