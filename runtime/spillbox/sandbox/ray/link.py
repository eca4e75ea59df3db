"""Calls from a harness process to one spillbox host actor, with Ray's failures translated.

A host that died (its node's raylet killed, the node gone) is reported once, as what it
means to the task: its payloads are gone. The catalog learns it at the same moment, so
every other harness process sees the task and its artifacts as lost.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

import ray
from ray.exceptions import RayActorError, RayTaskError

from spillbox.errors import HostLostError

ACTOR_PREFIX = "spillbox-host:"
"""A host actor's name: this prefix and the host's name, in the cluster's namespace."""


def lost_message(task_id: str, host: str) -> str:
    return (
        f"task {task_id!r} was kept by spillbox host {host!r}, which is lost (its Ray node "
        "died or its host restarted): the task's payloads and sandbox on it are gone; "
        "open a new task"
    )


class Leases:
    """The tokens this process holds on each host (open holds, locks, staged payloads),
    renewed from a thread of its own at a third of the host's lease: while this process
    lives its holds stay; once it dies they lapse on the host (SpillboxHost._lapse)."""

    def __init__(self) -> None:
        self._held: dict[Any, tuple[float, set[str]]] = {}
        """Per host actor: its lease (seconds) and the tokens held there."""
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def keep(self, actor: Any, lease: float, token: str) -> None:
        with self._lock:
            self._held.setdefault(actor, (lease, set()))[1].add(token)
            if self._thread is None:
                self._thread = threading.Thread(target=self._renew, daemon=True)
                self._thread.start()

    def let_go(self, actor: Any, token: str) -> None:
        with self._lock:
            found = self._held.get(actor)
            if found is not None:
                found[1].discard(token)
                if not found[1]:
                    del self._held[actor]

    def _every(self) -> float:
        with self._lock:
            return min((lease for lease, _ in self._held.values()), default=30.0) / 3

    def _renew(self) -> None:
        while not self._stop.wait(self._every()):
            with self._lock:
                held = [(actor, list(tokens)) for actor, (_, tokens) in self._held.items()]
            for actor, tokens in held:
                try:
                    ray.get(actor.renew.remote(tokens))
                except RayActorError:
                    continue  # a lost host: the task's next call says so

    def close(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()


class HostLink:
    """One task's host: its actor handle, and what to do when it is found dead."""

    def __init__(
        self,
        task_id: str,
        host: str,
        actor: Any,
        lose: Callable[[], None],
        leases: Leases | None = None,
        lease: float = 0.0,
    ) -> None:
        """leases, lease: where the tokens this link takes are renewed, and the host's lease."""
        self.task_id = task_id
        self.host = host
        self.actor = actor
        self._lose = lose
        self._leases = leases
        self._lease = lease

    def take(self, method: str, *args: Any) -> Any:
        """Call a method whose answer is a token (or starts with one) that the host keeps
        leased until end(): renewed while this process lives."""
        answer = self.call(method, *args)
        self.kept(answer if isinstance(answer, str) else answer[0])
        return answer

    def end(self, token: str, wait: bool = False, keep: str | None = None) -> None:
        """Let go of a token take() got; wait: until the host has (a lock this process may
        take again next), else without waiting; keep: the payload linked ahead that was
        published (SpillboxHost.stage)."""
        if self._leases is not None and self.actor is not None:
            self._leases.let_go(self.actor, token)
        args = (token,) if keep is None else (token, keep)
        if wait:
            self.call("end", *args)
        else:
            self.send("end", *args)

    def call(self, method: str, *args: Any) -> Any:
        """The host's answer; an error raised there is raised here as itself."""
        return self.answer(self.ask(method, *args))

    def ask(self, method: str, *args: Any) -> Any:
        """Ask now, for an answer taken later (answer()): work that needs none of it runs
        meanwhile, beside the host's."""
        if self.actor is None:
            raise HostLostError(lost_message(self.task_id, self.host))
        return getattr(self.actor, method).remote(*args)

    def answer(self, asked: Any) -> Any:
        """The answer to what ask() asked, as call() gives it."""
        try:
            return ray.get(asked)
        except RayTaskError as e:
            raise e.cause from None
        except RayActorError:
            self._lose()
            self.actor = None
            raise HostLostError(lost_message(self.task_id, self.host)) from None

    def kept(self, token: str) -> None:
        """Renew a token the host answered with until end() (what take() does)."""
        if self._leases is not None:
            self._leases.keep(self.actor, self._lease, token)

    def send(self, method: str, *args: Any) -> None:
        """Ask without waiting, for what no later call depends on (letting go of a hold,
        warming a sandbox): the host serves calls in threads (MAX_CONCURRENCY), so a later
        call may run before this one. What must be done first is a call (end(wait=True))."""
        if self.actor is not None:
            getattr(self.actor, method).remote(*args)
