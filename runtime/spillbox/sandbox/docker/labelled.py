"""The containers of one spillbox home, found by their labels: a task's own (found, started
or made), the warm pool's slots (made here, adopted by pool.py), and their sweep."""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterable
from contextlib import AbstractContextManager
from functools import partial
from pathlib import Path
from typing import Any

import docker

import spillbox.sandbox.docker.containers as containers
import spillbox.sandbox.docker.pool as pool
from spillbox.sandbox.docker.containers import (
    LABEL_HOME,
    LABEL_IMAGE,
    LABEL_POOL,
    LABEL_SLOT,
    LABEL_TASK,
    SandboxOptions,
)
from spillbox.sandbox.docker_errors import docker_errors, unless_gone
from spillbox.sandbox.image import ensure_image, image_tag
from spillbox.sandbox.storage import CACHE_DIR, OFFLOAD_DIR, TaskStorage


class HomeContainers:
    """Every container made for one home, by label: what it holds (its task, or its slot
    and pool) says whose it is.

    >>> found = HomeContainers(home, SandboxOptions(), lambda: client)  # doctest: +SKIP
    >>> found.find_or_create(storage).status  # doctest: +SKIP
    'running'
    """

    def __init__(
        self, home: Path, options: SandboxOptions, client: Callable[[], docker.DockerClient]
    ) -> None:
        self.home = home
        self.options = options
        self._client = client
        self._home_label = str(home.resolve())
        self._digest = hashlib.sha256(self._home_label.encode()).hexdigest()[:8]

    def name(self, storage: TaskStorage) -> str:
        """The task's own container name (its folder's name, which no other task has); the
        container is found by its labels, which hold the exact task id."""
        return f"spillbox-{self._digest}-{storage.name}"

    def listed(self, labels: dict[str, str]) -> list[Any]:
        """The home's containers with these labels too, running or not."""
        filters = [f"{k}={v}" for k, v in {LABEL_HOME: self._home_label, **labels}.items()]
        # ignore_removed: a container being created or removed by another thread can be
        # listed and then vanish before the SDK inspects it.
        found: list[Any] = self._client().containers.list(
            all=True, filters={"label": filters}, ignore_removed=True
        )
        return found

    def of_task(self, storage: TaskStorage) -> list[Any]:
        """The task's containers: its own (by label) and the pool slot it adopted."""
        found = self.listed({LABEL_TASK: storage.task_id})
        slot = pool.adopted(self.home, storage)
        return found + (self.listed({LABEL_SLOT: slot}) if slot else [])

    def find_or_create(self, storage: TaskStorage) -> Any:
        """The task's running container: found by its record or label (and started), or
        created."""
        client = self._client()
        with docker_errors(f"finding the container of task {storage.task_id!r}"):
            found = self.of_task(storage)
        tag = image_tag()
        for container in found:
            if container.labels.get(LABEL_IMAGE) != tag:
                # Built from an outdated image: payloads live on the host, so replace it.
                with docker_errors("removing an outdated container"):
                    container.remove(force=True)
                continue
            if container.status == "running":
                return container
            if LABEL_SLOT in container.labels:
                # A slot's mounts name its folder as it was before the task adopted it: a
                # start would mount new, empty folders there. Its task gets its own.
                with docker_errors("removing a stopped pool slot"):
                    unless_gone(partial(container.remove, force=True, v=True), None)
                continue
            if containers.start(client, container):
                return container
            # Removed (by a collector, or from outside) as we started it.
        ensure_image(client)
        identity = {LABEL_TASK: storage.task_id}
        labels = containers.labels(self._home_label, self.options, tag, **identity)
        settings = containers.run_options(
            self.options, self.name(storage), labels, storage.offload, storage.cache
        )
        owns = partial(self._owns, storage)
        return containers.create(client, tag, settings, owns, f"task {storage.task_id!r}")

    def _owns(self, storage: TaskStorage, container: Any) -> bool:
        """Whether the container was made for this task of this home (by its labels)."""
        labels = container.labels
        return bool(
            labels.get(LABEL_TASK) == storage.task_id and labels.get(LABEL_HOME) == self._home_label
        )

    def make_slot(self, pool_id: str, name: str, folder: Path) -> Any:
        """A pool slot's container: a task's own settings, with the slot's identity."""
        client = self._client()
        tag = image_tag()
        ensure_image(client)
        identity = {LABEL_SLOT: name, LABEL_POOL: pool_id}
        labels = containers.labels(self._home_label, self.options, tag, **identity)
        offload, cache = folder / OFFLOAD_DIR, folder / CACHE_DIR
        settings = containers.run_options(
            self.options, f"spillbox-{self._digest}-slot-{name}", labels, offload, cache
        )
        return containers.create(client, tag, settings, lambda _: False, f"slot {name}")

    def sweep(
        self,
        unused: Callable[[str], AbstractContextManager[bool]],
        storages: Iterable[TaskStorage],
        dry_run: bool,
    ) -> list[str]:
        """Remove the containers of tasks that are unused (its tasks' storages: to know the
        slots they adopted), and the unused slots of pools that are gone."""
        removed = []
        with docker_errors("sweeping containers"):
            found = self.listed({})
            slots = pool.slot_tasks(self.home, storages)
            removed += pool.sweep_dead(self.home, found, dry_run)
            for container in found:
                task_id = container.labels.get(LABEL_TASK)
                slot = container.labels.get(LABEL_SLOT)
                if task_id is None:
                    if slot not in slots:
                        continue  # a slot no task took: its pool's (sweep_dead above)
                    task_id = slots[slot]
                with unused(task_id) as yes:
                    if not yes:
                        continue
                    removed.append(f"{container.name} (task {task_id})")
                    if not dry_run:
                        # Gone already: another collector got there first.
                        unless_gone(partial(container.remove, force=True, v=True), None)
        return removed
