"""The spillbox host of one Ray node: the node's home, its sandboxes and its collector.

One host per node, not per task (each Ray actor is a process; thousands of tasks share
it). It runs the node's own sandbox backend (Docker) over the node's own home, so a task's
payloads and sandbox live where they are used and travel nowhere else. Harness processes
anywhere reach it through spillbox.sandbox.ray.backend; this class is what the actor runs,
and imports no Ray itself (start.py makes it an actor).

Starting, a host registers a new epoch in the catalog: what its earlier epoch kept (a
node that died and came back) is marked lost there and swept here, containers and files.

What a harness holds here between calls (a task's open hold, its quota lock, a staged
payload) is leased: the harness renews its tokens (spillbox.sandbox.ray.link.Leases), and
one it stops renewing (its process died) lapses, as the kernel lets a dead process's lock
go on one machine.
"""

from __future__ import annotations

import secrets
import threading
import time
from contextlib import AbstractContextManager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from spillbox import gc, metrics
from spillbox.catalog.placements import HostRecord, Placements
from spillbox.config import SandboxKind
from spillbox.errors import ConfigError
from spillbox.gc import GRACE_SECONDS, Removal
from spillbox.harness import Harness
from spillbox.sandbox.docker import SandboxOptions
from spillbox.sandbox.storage import Hold, TaskStorage
from spillbox.types import ExecRequest, RawExec

STORAGE_CALLS = frozenset({"ensure", "read", "append", "remove", "names", "destroy"})
BACKEND_CALLS = frozenset(
    {
        "create",
        "warm",
        "read",
        "release",
        "stop_sandbox",
        "destroy_sandbox",
        "destroy",
        "forget_derived",
    }
)
"""What a harness may ask of a task's storage and of the node's backend by name."""

DEFAULT_CAP = 500
"""Open tasks a host takes at most, unless its operator says otherwise."""
DEFAULT_LEASE_SECONDS = 30.0
"""How long a token a harness holds here lasts unless renewed (harnesses renew at a third
of it): a dead harness's open hold lapses this long after its last renewal."""

Held = Hold | AbstractContextManager[Any]


@dataclass(frozen=True)
class HostSettings:
    """What a node's host is started with (`spillbox host`'s flags)."""

    name: str
    home: str
    catalog_url: str
    """The cluster's Postgres: every host's and every harness's catalog."""
    cap: int = DEFAULT_CAP
    sandbox: SandboxKind = "docker"
    gc_interval: float = 300.0
    """Seconds between the host's own collections of its node (0: none)."""
    runtime: str | None = None
    """The node's OCI runtime for sandboxes ("runsc" for gVisor; None: Docker's default)."""
    lease: float = DEFAULT_LEASE_SECONDS
    metrics_listen: str | None = None
    """HOST:PORT where this host's metrics are served (its sandboxes, execs and gc; None:
    not served)."""


class SpillboxHost:
    """What a node's host actor does: task storage, sandbox calls and gc, by task id."""

    def __init__(self, settings: HostSettings, node_id: str) -> None:
        name, home = settings.name, settings.home
        self.name = name
        self.epoch = secrets.token_hex(8)
        self.cap = settings.cap
        self.lease = settings.lease
        # The node's own harness: its backend, catalog and collector; it opens no Task.
        # No warm pool on a host yet: placement, the lost-host sweep and the node-kill
        # tests know a task's container by its task label, which a pool slot lacks.
        self.harness = Harness(
            sandbox=settings.sandbox,
            home=Path(home),
            catalog_url=settings.catalog_url,
            gc_interval=-1,
            pool_size=0,
            environ={},
            options=SandboxOptions(runtime=settings.runtime),
        )
        self.backend = self.harness.backend
        self.placements = Placements(self.harness.catalog)
        self.placements.register(HostRecord(name, self.epoch, node_id, settings.cap))
        listen = settings.metrics_listen
        self.metrics_port = metrics.serve(listen) if listen else None
        self.swept = self._sweep_lost()
        self._held: dict[str, tuple[Held, float]] = {}
        """What each token holds, and until when (time.monotonic()) unless renewed."""
        self._ahead: dict[str, tuple[str, str]] = {}
        """A staged payload's token: the task and file name it was linked under ahead."""
        self._lock = threading.Lock()
        self._stop = threading.Event()
        threading.Thread(target=self._lapse, daemon=True).start()
        if settings.gc_interval > 0:
            interval = (settings.gc_interval,)
            threading.Thread(target=self._collect, args=interval, daemon=True).start()

    def _sweep_lost(self) -> list[str]:
        """Remove the containers and files of tasks this host kept in an epoch now lost."""
        swept = []
        for task_id in self.placements.to_sweep(self.name):
            self.backend.destroy(self.backend.storage(task_id))
            self.placements.swept(task_id)
            swept.append(task_id)
        return swept

    def _collect(self, interval: float) -> None:
        while not self._stop.wait(interval):
            try:
                self.collect(dry_run=False)
            except Exception:  # noqa: BLE001 - a failed sweep must not end the host
                pass  # the next sweep (or `spillbox gc`) tries again and reports

    def info(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "epoch": self.epoch,
            "kind": self.backend.kind,
            "languages": tuple(self.backend.languages),
            "home": str(self.backend.home),
            "runtime": self.harness.backend.options.runtime  # type: ignore[attr-defined]
            if self.backend.kind == "docker"
            else None,
            "swept": self.swept,
            "lease": self.lease,
            "metrics_port": self.metrics_port,
        }

    def collect(self, dry_run: bool, grace: float = GRACE_SECONDS) -> list[Removal]:
        """Collect this node's home and the tasks placed on it (no other host's: their
        open holds and files are not here to decide by); grace: how old an orphaned file
        must be to go."""
        return gc.collect(self.harness, dry_run, grace, host=self.name)

    # Holds, the open lock and the quota lock: kept here, between calls, under a token.

    def _keep(self, held: Held) -> str:
        token = secrets.token_hex(8)
        with self._lock:
            self._held[token] = (held, time.monotonic() + self.lease)
        return token

    def renew(self, tokens: list[str]) -> None:
        """Extend the leases of the tokens a live harness still holds."""
        until = time.monotonic() + self.lease
        with self._lock:
            for token in tokens:
                found = self._held.get(token)
                if found is not None:
                    self._held[token] = (found[0], until)

    def _lapse(self) -> None:
        """End what no harness renewed in time: the holds of harnesses that died."""
        while not self._stop.wait(self.lease / 4):
            now = time.monotonic()
            with self._lock:
                lapsed = [token for token, (_, until) in self._held.items() if until < now]
            for token in lapsed:
                # A payload linked ahead stays: its harness may have recorded it before it
                # died; gc removes it if no catalog row names it.
                with self._lock:
                    self._ahead.pop(token, None)
                self._release(token)

    def hold(self, task_id: str) -> str:
        storage = self.backend.storage(task_id)
        return self._keep(storage.open_hold(lambda: self.backend.create(storage)))

    def unless_open(self, task_id: str) -> tuple[str, bool]:
        held = self.backend.storage(task_id).unless_open()
        return self._keep(held), held.__enter__()

    def lock(self, task_id: str, which: str = "quota") -> str:
        """Hold the task's quota lock, or (which="append") its append lock."""
        storage = self.backend.storage(task_id)
        held = storage.appending() if which == "append" else storage.locked()
        held.__enter__()
        return self._keep(held)

    def stage(
        self, task_id: str, data: bytes, want: tuple[str, str] | None = None, stems: bool = True
    ) -> tuple[str, str, str, int, list[str] | None, str | None]:
        """Write a payload into the task's incoming/ (see TaskStorage.stage): its token,
        temp file, digest and size, the artifact ids its offload folder holds (if stems:
        a harness asks once, at its first payload, and then sends a want only where it
        knows the stem free), and the name it was linked under ahead (want's stem and
        extension, if free; None if not): publishing it then costs the harness no call;
        end() unlinks it unless kept."""
        storage = self.backend.storage(task_id)
        held = storage.stage(data)
        staged = held.__enter__()
        taken = sorted(storage.found_stems()) if stems else None
        token = self._keep(held)
        ahead = None
        if want is not None and (taken is None or want[0] not in taken):
            name = f"{want[0]}.{want[1]}"
            if self.link(task_id, staged.temp, name) is not None:
                ahead = name
                with self._lock:
                    self._ahead[token] = (task_id, name)
        return token, staged.temp, staged.sha256, staged.bytes, taken, ahead

    def end(self, token: str, keep: str | None = None) -> None:
        """Let go of what a token holds (a hold, a lock, a staged payload); a payload
        linked ahead is unlinked unless keep names it (its harness published it)."""
        with self._lock:
            ahead = self._ahead.pop(token, None)
        if ahead is not None and ahead[1] != keep:
            self.backend.storage(ahead[0]).remove(ahead[1])
        self._release(token)

    def _release(self, token: str) -> None:
        with self._lock:
            found = self._held.pop(token, None)
        if found is None:
            return
        held = found[0]
        if isinstance(held, AbstractContextManager):
            held.__exit__(None, None, None)
        else:
            held.release()

    def link(self, task_id: str, temp: str, name: str) -> str | None:
        """Make a staged payload visible as offload/<name>; its path, or None if taken."""
        storage = self.backend.storage(task_id)
        target = storage.offload / name
        with storage.errors(f"payload {name!r}"):
            try:
                Path(target).hardlink_to(temp)
            except FileExistsError:
                return None
        return str(target)

    # The task's storage and sandbox, through the node's own backend.

    def storage_call(self, task_id: str, method: str, *args: Any) -> Any:
        if method not in STORAGE_CALLS:
            raise ConfigError(f"a spillbox host does not do {method!r} on task storage")
        return getattr(self.backend.storage(task_id), method)(*args)

    def backend_call(self, task_id: str, method: str, *args: Any) -> Any:
        if method not in BACKEND_CALLS:
            raise ConfigError(f"a spillbox host does not do {method!r} for a task")
        return getattr(self.backend, method)(self.backend.storage(task_id), *args)

    def exec(self, task_id: str, request: ExecRequest) -> RawExec:
        started = time.perf_counter()
        try:
            return self.backend.exec(self.backend.storage(task_id), request)
        finally:
            metrics.executed(request.lang, time.perf_counter() - started)

    def offload_dir(self, task_id: str) -> str:
        return str(TaskStorage(self.backend.home, task_id).offload)
