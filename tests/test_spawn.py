"""spawn(): threads started by the process's spawner, not by their caller (spillbox.spawn).
A join may come before the start; a forked child spawns with a spawner of its own."""

from __future__ import annotations

import os
import threading

import pytest

from spillbox import spawn as spawning
from spillbox.spawn import Spawned, spawn


def test_a_join_asked_before_the_thread_started_waits_for_it_to_start_and_end() -> None:
    ran: list[str] = []
    late = Spawned(lambda: ran.append("ran"), "late")  # asked for, not started yet
    joined = threading.Event()

    def join() -> None:
        late.join()  # a Thread's own join would raise here: not started
        joined.set()

    waiter = threading.Thread(target=join)
    waiter.start()
    assert not joined.wait(0.2)
    late._start()  # what the spawner does
    waiter.join(10)
    assert joined.is_set() and ran == ["ran"]


def test_every_thread_asked_for_runs_once() -> None:
    ran: list[int] = []
    lock = threading.Lock()

    def add(n: int) -> None:
        with lock:
            ran.append(n)

    spawned = [spawn(lambda n=n: add(n), f"n{n}") for n in range(50)]
    for one in spawned:
        one.join()
    assert sorted(ran) == list(range(50))


def test_a_thread_that_cannot_start_is_joined_as_over(monkeypatch: pytest.MonkeyPatch) -> None:
    def refuse(self: threading.Thread) -> None:
        raise RuntimeError("can't start new thread")

    spawner = spawning._Spawner()
    spawner.spawn(lambda: None, "first").join()  # the spawner's own thread is running
    monkeypatch.setattr(threading.Thread, "start", refuse)
    ran: list[str] = []
    refused = spawner.spawn(lambda: ran.append("ran"), "refused")
    refused.join()  # returns: no thread ever ran, so none is left to wait for
    monkeypatch.undo()
    assert ran == []
    spawner.spawn(lambda: ran.append("after"), "after").join()  # the spawner lives on
    assert ran == ["after"]


def test_a_forked_child_spawns_with_a_spawner_of_its_own() -> None:
    spawn(lambda: None, "parent").join()  # the parent's spawner runs; the child has none
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: its join would hang if the parent's spawner were counted on
        try:
            ran: list[str] = []
            done = threading.Event()
            spawn(lambda: (ran.append("child"), done.set()), "child")
            os.write(write, b"ok" if done.wait(10) and ran == ["child"] else b"no")
        finally:
            os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as answer:
        said = answer.read()
    os.waitpid(pid, 0)
    assert said == b"ok"
