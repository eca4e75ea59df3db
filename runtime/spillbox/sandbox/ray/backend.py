"""The cluster backend: a harness's sandbox seam, served by the spillbox hosts of a Ray
cluster (one per node, spillbox.sandbox.ray.host).

Placement rule: a new task goes to the live host with the fewest open tasks (ties: the
first by name) that is under its cap; the placement is recorded in the catalog before the
task opens, so any harness process, on any machine, finds the task's host there. A task
never moves: its payloads exist on its host only. No host under its cap: a clear refusal.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from pathlib import Path
from typing import Any, TypeVar, cast

import ray

from spillbox.catalog import Catalog
from spillbox.catalog.placements import PLACED, Placement, Placements
from spillbox.errors import ConfigError, HostLostError, SandboxError
from spillbox.langs import LANGS
from spillbox.sandbox.base import SandboxBackend
from spillbox.sandbox.docker.layout import OFFLOAD_MOUNT
from spillbox.sandbox.ray.link import ACTOR_PREFIX, HostLink, Leases, lost_message
from spillbox.sandbox.ray.storage import HostStorage
from spillbox.sandbox.storage import StoredFile, TaskStorage
from spillbox.types import ExecRequest, RawExec

NAMESPACE = "spillbox"
_T = TypeVar("_T")


def connect(address: str) -> None:
    """Join the cluster as a driver (once per process)."""
    if not ray.is_initialized():
        ray.init(address=address, namespace=NAMESPACE, log_to_driver=False, configure_logging=False)


class RayBackend(SandboxBackend):
    """Each task's storage and sandbox on the cluster host its placement names."""

    kind = "ray"
    languages = LANGS

    def __init__(self, home: Path, address: str, catalog: Catalog) -> None:
        super().__init__(home)
        if catalog.path is not None:
            raise ConfigError(
                "a cluster needs a catalog every host shares: set SPILLBOX_CATALOG_URL "
                "to a Postgres database (postgresql://USER:PASSWORD@HOST/DB)"
            )
        connect(address)
        self.placements = Placements(catalog)
        self._actors: dict[tuple[str, str], Any] = {}
        self._leases: dict[tuple[str, str], float] = {}
        """Each host epoch's lease on what this process holds there (its info's)."""
        self.leases = Leases()

    def _actor(self, host: str, epoch: str) -> Any | None:
        """The live actor of this host's epoch, or None (its host is gone or restarted)."""
        found = self._actors.get((host, epoch))
        if found is not None:
            return found
        try:
            actor = ray.get_actor(ACTOR_PREFIX + host, namespace=NAMESPACE)
            info = cast(dict[str, Any], ray.get(actor.info.remote()))
            if info["epoch"] != epoch:
                return None
        except (ValueError, ray.exceptions.RayActorError):
            return None
        self._actors[(host, epoch)] = actor
        self._leases[(host, epoch)] = float(info["lease"])
        return actor

    def _alive(self, host: str, epoch: str) -> bool:
        """Whether the host answers now (a handle kept from before may be a dead one's):
        asked before each placement, so no task is placed on a host known to be gone."""
        actor = self._actor(host, epoch)
        try:
            return actor is not None and ray.get(actor.info.remote())["epoch"] == epoch
        except ray.exceptions.RayActorError:
            return False

    def _link(self, placement: Placement) -> HostLink:
        actor = self._actor(placement.host, placement.epoch) if placement.state == PLACED else None
        key = (placement.host, placement.epoch)
        link = HostLink(
            placement.task_id,
            placement.host,
            actor,
            lambda: self._lose(*key),
            self.leases,
            self._leases.get(key, 0.0),
        )
        if actor is None and placement.state == PLACED:
            self._lose(placement.host, placement.epoch)
        return link

    def _lose(self, host: str, epoch: str) -> None:
        self._actors.pop((host, epoch), None)
        self.placements.lose(host, epoch)

    def storage(self, task_id: str) -> TaskStorage:
        placement = self.placements.of(task_id)
        if placement is None:
            return HostStorage(task_id, None, None)
        link = self._link(placement)
        offload = link.call("offload_dir", task_id) if link.actor is not None else None
        return HostStorage(task_id, link, offload)

    def opening(self, task_id: str) -> TaskStorage:
        """The task's storage on its host; a task placed nowhere is placed first. A task
        whose host was lost is refused: reopened elsewhere it would be another, empty task
        under the same id."""
        storage = self.storage(task_id)
        assert isinstance(storage, HostStorage)
        if storage.link is None:
            return self._place(task_id)
        if storage.link.actor is None:
            raise HostLostError(lost_message(task_id, storage.link.host))
        return storage

    def _place(self, task_id: str) -> HostStorage:
        """The task's storage on the host the placement rule picks (recorded first)."""
        loads = self.placements.loads()
        for load in loads:
            if load.open >= load.cap:
                continue
            if not self._alive(load.name, load.epoch):
                self._lose(load.name, load.epoch)
                continue
            placement = self.placements.claim(task_id, load.name, load.epoch)
            if placement is not None:
                storage = self.storage(task_id)
                assert isinstance(storage, HostStorage)
                return storage
        raise SandboxError(
            f"no spillbox host can take task {task_id!r}: "
            + (
                f"all {len(loads)} live hosts are at their cap of open tasks "
                f"({', '.join(f'{h.name}: {h.open}/{h.cap}' for h in loads)}); "
                "close tasks, raise a host's --cap or add a node"
                if loads
                else "the cluster has no live host; start one on a node with `spillbox host`"
            ),
            retryable=bool(loads),
        )

    def _on_host(self, storage: TaskStorage) -> HostLink | None:
        assert isinstance(storage, HostStorage)
        return storage.link

    def _call(self, storage: TaskStorage, method: str, *args: Any) -> Any:
        link = self._on_host(storage)
        if link is None:
            return None  # placed nowhere: nothing is kept for it anywhere
        return link.call("backend_call", storage.task_id, method, *args)

    def create(self, storage: TaskStorage) -> None:
        self._call(storage, "create")

    def warm(self, storage: TaskStorage, published: Sequence[str] | None = None) -> None:
        """Start the sandbox on its host and preload its tables: asked once, then again
        only after a payload came (an admit whose results all stayed inline, such as a
        query's, would ask for nothing new, at the cost of a call). What the host released
        meanwhile (another process closed the task) starts at the next exec, its tables
        loaded by their first query."""
        link = self._on_host(storage)
        assert isinstance(storage, HostStorage)
        if link is not None and storage.to_warm():
            link.send("backend_call", storage.task_id, "warm")

    def visible_path(self, stored: StoredFile) -> str:
        return f"{OFFLOAD_MOUNT}/{stored.name}"

    def exec(self, storage: TaskStorage, request: ExecRequest) -> RawExec:
        link = self._on_host(storage)
        if link is None:
            raise HostLostError(lost_message(storage.task_id, "(none)"))
        result: RawExec = link.call("exec", storage.task_id, request)
        return result

    def read(self, storage: TaskStorage, name: str) -> bytes:
        return storage.read(name)

    def release(self, storage: TaskStorage) -> None:
        self._call(storage, "release")

    def stop_sandbox(self, storage: TaskStorage) -> None:
        self._call(storage, "stop_sandbox")

    def destroy_sandbox(self, storage: TaskStorage) -> None:
        self._call(storage, "destroy_sandbox")

    def destroy(self, storage: TaskStorage) -> None:
        self._call(storage, "destroy")

    def forget_derived(self, storage: TaskStorage, sha256: str, size: int, since: float) -> None:
        self._call(storage, "forget_derived", sha256, size, since)

    def sweep(
        self, unused: Callable[[str], AbstractContextManager[bool]], dry_run: bool
    ) -> list[str]:
        return []  # each host sweeps its own node (SpillboxHost.collect)

    def collect(self, here: Callable[[], list[_T]], dry_run: bool) -> list[_T]:
        """Every live host's collection of its own node."""
        removed: list[_T] = []
        for load in self.placements.loads():
            actor = self._actor(load.name, load.epoch)
            if actor is not None:
                removed.extend(ray.get(actor.collect.remote(dry_run)))
        return removed

    def list(self) -> list[str]:
        return []

    def close(self) -> None:
        self.leases.close()
