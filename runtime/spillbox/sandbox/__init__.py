"""Sandbox backends, chosen in one place."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

from spillbox.config import DEFAULT_POOL_SIZE, SandboxKind
from spillbox.errors import ConfigError
from spillbox.sandbox.base import SandboxBackend
from spillbox.sandbox.none import NoneBackend
from spillbox.types import RawExec

if TYPE_CHECKING:
    from spillbox.catalog import Catalog
    from spillbox.sandbox.docker import SandboxOptions

__all__ = ["RawExec", "SandboxBackend", "make_backend"]


def make_backend(
    kind: SandboxKind,
    home: Path,
    options: SandboxOptions | None = None,
    pool_size: int = DEFAULT_POOL_SIZE,
    cluster: str | None = None,
    catalog: Catalog | None = None,
) -> SandboxBackend:
    """The backend for a sandbox kind, or for a cluster's hosts (Ray, imported only then:
    the spillbox[ray] extra); the Docker SDK is imported only when used. pool_size: the Docker
    backend's ready sandboxes (its warm pool)."""
    if cluster is not None:
        try:
            from spillbox.sandbox.ray.backend import RayBackend
        except ImportError as e:
            raise ConfigError(
                f"a cluster ({cluster}) needs Ray: pip install 'spillbox[ray]' ({e})"
            ) from None
        assert catalog is not None, "a cluster's tasks are placed in the catalog"
        return RayBackend(home, cluster, catalog)
    if kind == "docker":
        from spillbox.sandbox.docker import DockerBackend

        return DockerBackend(home, options, pool_size)
    return NoneBackend(home)
