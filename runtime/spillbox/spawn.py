"""Background threads whose caller does not wait for them to start.

threading.Thread.start() returns only once the new thread runs: on this 2-core machine,
beside a step's own work, that took 0.3-0.45 ms a thread, and a task's first offload sets
two going (its container's start and its tables' preload: 1.8 ms against 1.1 for a later
offload, benchmarks/sandbox_bench.py). spawn() hands the thread to one spawner thread per
process, which starts it: the caller pays a queue put.

    starting = spawn(self._start_in_background, "spillbox-start")
    ...
    starting.join()   # waits for the thread to be started, then for it to end
"""

from __future__ import annotations

import os
import queue
import threading
from collections.abc import Callable


class Spawned:
    """A daemon thread the spawner starts; join() waits until it has started and ended."""

    def __init__(self, target: Callable[[], object], name: str) -> None:
        self._thread = threading.Thread(target=target, name=name, daemon=True)
        self._started = threading.Event()

    def join(self) -> None:
        self._started.wait()
        if self._thread.ident is not None:  # None: it could not start, so it is over
            self._thread.join()

    def _start(self) -> None:
        try:
            self._thread.start()
        except RuntimeError:
            pass  # no thread to be had: its target never runs, as if it had returned
        finally:
            self._started.set()


class _Spawner:
    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._queue: queue.SimpleQueue[Spawned] = queue.SimpleQueue()
        self._running = False

    def spawn(self, target: Callable[[], object], name: str) -> Spawned:
        spawned = Spawned(target, name)
        self._queue.put(spawned)
        with self._lock:
            if not self._running:
                threading.Thread(target=self._run, name="spillbox-spawner", daemon=True).start()
                self._running = True
        return spawned

    def _run(self) -> None:
        while True:
            self._queue.get()._start()

    def _forked(self) -> None:
        """In a forked child: this process has no spawner thread yet (the parent's
        queue, and the threads it asked for, stay the parent's)."""
        self._lock = threading.Lock()
        self._queue = queue.SimpleQueue()
        self._running = False


_SPAWNER = _Spawner()
os.register_at_fork(after_in_child=_SPAWNER._forked)


def spawn(target: Callable[[], object], name: str) -> Spawned:
    """Run target in a daemon thread of its own, started by the process's spawner thread:
    this returns without waiting for the start."""
    return _SPAWNER.spawn(target, name)
