"""What each framework's measurement in integrations_bench.py shares: the row it gives, the
alternating measurement, a harness and an event loop for it.

One module per framework here, each with rows(quick) -> list[Row] and NOTE, what its rows
are in a few words for the report.
"""

from __future__ import annotations

import asyncio
import statistics
import tempfile
import time
from collections.abc import Awaitable, Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

SMALL = '{"ok": true, "count": 3}'
"""The small tool result every row calls for: a few bytes, left inline."""
WARMUP = 20
"""Rounds of each side run untimed before the measured ones."""


@dataclass(frozen=True)
class Row:
    """One path of one framework, without spillbox and with it."""

    framework: str
    path: str
    """What ran, and against what where the "without" side is not the bare framework."""
    bare_ms: float
    spillbox_ms: float
    samples: int
    """Timed samples a side the medians are of."""
    judged: bool = False
    """Whether the target (the median added under 1 ms) is judged on this row; the others
    explain it (the framework's own cost of more tools, a run's set-up, the noise of a CLI)."""

    @property
    def added_ms(self) -> float:
        return self.spillbox_ms - self.bare_ms


Side = Callable[[], list[float]]
"""One round of one side: runs it, and gives the milliseconds of each call it timed."""


def timed(fn: Callable[[], object]) -> Side:
    """A side of one call of fn, timed around it."""

    def side() -> list[float]:
        started = time.perf_counter()
        fn()
        return [(time.perf_counter() - started) * 1000]

    return side


def alternate(
    sides: Sequence[Side],
    rounds: int,
    *,
    warmup: int = WARMUP,
    before: Callable[[], object] = lambda: None,
) -> list[float]:
    """The median ms of each side, over rounds of every side once after warmup untimed
    rounds. Each side takes each place of the order in turn, so that none always runs after
    the same one (a collection or a wake-up that follows one is billed to all) and load hits
    all alike. before: run ahead of each round, untimed."""
    for _ in range(warmup):
        before()
        for side in sides:
            side()
    samples: list[list[float]] = [[] for _ in sides]
    for turn in range(rounds):
        before()
        shift = turn % len(sides)
        for index in [*range(shift, len(sides)), *range(shift)]:
            samples[index] += sides[index]()
    return [statistics.median(taken) for taken in samples]


@contextmanager
def harness() -> Iterator[Any]:
    """A harness on the "none" sandbox in a home of its own: a small inline result never
    reaches a sandbox, so the rows measure the integration and the gate, not Docker."""
    from spillbox import Harness

    with tempfile.TemporaryDirectory() as home:
        with Harness(sandbox="none", home=Path(home), gc_interval=-1) as made:
            yield made


@contextmanager
def event_loop() -> Iterator[Callable[[Awaitable[Any]], Any]]:
    """One event loop for a framework's async calls, as its run_until_complete."""
    loop = asyncio.new_event_loop()
    try:
        yield loop.run_until_complete
    finally:
        loop.close()
