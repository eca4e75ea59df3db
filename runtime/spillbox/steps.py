"""Steps: the tool results of one model turn pass the gate together (the aggregate rule).

Every surface that gates results hands them in here, so the grouping exists once:

    steps = Steps(task.admit)        # admit: one step's ToolResults -> Admitted, in order
    admitted = await steps.submit(result, step=key, expected=n)   # a framework's async hook
    admitted = steps.submit_sync(result, step=key, expected=n)    # its sync twin, a thread a call
    admitted = await steps.run(call)                             # calls grouped by overlap (MCP)
    steps.withdraw(step=key, expected=n)   # one of the step's calls raised: wait for it no more

A framework knows its steps: the results submitted under one key (the id of the assistant
message whose tool calls they answer) are one step, admitted when `expected` of them are in
or STEP_BOUND_SECONDS after the first, whichever comes first; a result that arrives under a
key already admitted starts a step of its own.

MCP has no batches, so `run` infers steps from time: calls whose lifetimes overlap are one
step. A finished result is held while other calls of its step still run, until the step's
last call finishes or STEP_BOUND_SECONDS after the step's first result finished; a call that
starts while results are held is waited for too (within the same bound) and joins that step
if it finishes in time; a call still running when the step is admitted joins the next step.

Steps are admitted one at a time. On the event loop a small step is gated in place and a
large one in a worker thread, so the loop never waits for the task's lock while a large
step is stored.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Awaitable, Callable, Hashable, Sequence
from dataclasses import dataclass, field

import anyio
import anyio.to_thread

from spillbox.types import Admitted, ToolResult

STEP_BOUND_SECONDS = 2.0
"""How long a finished result waits for the other results of its step."""

ADMIT_IN_LOOP_CHARS = 4096
"""A step's results of up to this many characters in all are gated on the event loop
(well under a millisecond); larger ones in a worker thread, so that counting and storing
them does not hold up other calls' messages. A thread hop costs about half a millisecond."""

Admit = Callable[[Sequence[ToolResult]], list[Admitted]]


@dataclass
class _Held:
    """One result waiting for its step to be admitted."""

    result: ToolResult
    done: threading.Event = field(default_factory=threading.Event)
    taken: bool = False
    admitted: Admitted | None = None
    error: BaseException | None = None

    def answer(self) -> Admitted:
        if self.error is not None:
            raise self.error
        assert self.admitted is not None
        return self.admitted


@dataclass
class _Group:
    """The results of one keyed step received so far."""

    expected: int
    deadline: float
    held: list[_Held] = field(default_factory=list)

    def full(self) -> bool:
        return len(self.held) >= self.expected


def _settle(step: Sequence[_Held], admit: Callable[[], list[Admitted]]) -> None:
    """Give every result of a step its answer: its Admitted, or the error all of them hear."""
    try:
        admitted = admit()
        for held, item in zip(step, admitted, strict=True):
            held.admitted = item
    except Exception as e:  # noqa: BLE001 - every call of the step hears of it
        for held in step:
            held.error = e
    finally:
        for held in step:
            held.done.set()


def _take(step: Sequence[_Held]) -> list[ToolResult]:
    for held in step:
        held.taken = True
    return [held.result for held in step]


class Steps:
    """Groups one task's tool results into steps and admits each step's results together."""

    def __init__(self, admit: Admit, bound: float = STEP_BOUND_SECONDS) -> None:
        self._admit = admit
        self._bound = bound
        self._admitting = anyio.Lock()
        self._open: dict[Hashable, _Group] = {}
        self._changed = anyio.Event()
        # run's steps, inferred from overlap
        self._running = 0
        self._held: list[_Held] = []
        self._deadline = 0.0
        # submit_sync's steps: their own table, guarded by a condition, admitted under a lock
        self._sync_open: dict[Hashable, _Group] = {}
        self._sync_changed = threading.Condition()
        self._sync_admitting = threading.Lock()

    async def submit(self, result: ToolResult, *, step: Hashable, expected: int) -> Admitted:
        """Hold one result of a step of `expected` results until the step is admitted."""
        group, held = self._join(self._open, step, expected, anyio.current_time(), result)
        self._poke()

        def detach() -> None:
            if self._open.get(step) is group:
                del self._open[step]

        return await self._hold(held, group.held, group.full, lambda: group.deadline, detach)

    def withdraw(self, *, step: Hashable, expected: int) -> None:
        """Say that one of a step's `expected` results will not come (its call raised, or
        was deferred), so the step's other results are admitted without waiting for it."""
        group = self._open.get(step)
        if group is None:
            group = self._open[step] = _Group(
                _checked(expected), anyio.current_time() + self._bound
            )
        group.expected -= 1
        if group.expected == 0 and not group.held:
            del self._open[step]
        self._poke()

    def submit_sync(self, result: ToolResult, *, step: Hashable, expected: int) -> Admitted:
        """submit for a caller without an event loop: blocks this thread until the step is
        admitted (the other results of the step arrive on other threads)."""
        with self._sync_changed:
            group, held = self._join(self._sync_open, step, expected, time.monotonic(), result)
            self._sync_changed.notify_all()
            while not held.taken and not group.full():
                left = group.deadline - time.monotonic()
                if left <= 0:
                    break
                self._sync_changed.wait(left)
            mine = not held.taken
            if mine:
                if self._sync_open.get(step) is group:
                    del self._sync_open[step]
                results = _take(group.held)
        if mine:
            with self._sync_admitting:
                _settle(group.held, lambda: self._admit(results))
        held.done.wait()
        return held.answer()

    async def run(self, call: Callable[[], Awaitable[ToolResult]]) -> Admitted:
        """Run one call, then hold its result until its step (the calls overlapping it) is
        admitted."""
        self._running += 1
        try:
            result = await call()
        finally:
            self._running -= 1
            self._poke()
        held = _Held(result)
        if not self._held:
            self._deadline = anyio.current_time() + self._bound
        self._held.append(held)

        def detach() -> None:
            self._held = []

        return await self._hold(
            held, self._held, lambda: self._running == 0, lambda: self._deadline, detach
        )

    def _join(
        self,
        table: dict[Hashable, _Group],
        step: Hashable,
        expected: int,
        now: float,
        result: ToolResult,
    ) -> tuple[_Group, _Held]:
        """Add a result to its open step, opening the step if it is new."""
        group = table.get(step)
        if group is None:
            group = table[step] = _Group(_checked(expected), now + self._bound)
        held = _Held(result)
        group.held.append(held)
        return group, held

    async def _hold(
        self,
        held: _Held,
        step: list[_Held],
        complete: Callable[[], bool],
        deadline: Callable[[], float],
        detach: Callable[[], None],
    ) -> Admitted:
        """Wait until the step is complete or its deadline passed, then admit it (unless
        another of its calls did); detach: the step takes no more results."""
        try:
            while not held.taken:
                if complete() or anyio.current_time() >= deadline():
                    detach()
                    await self._flush(step)
                    break
                with anyio.move_on_after(deadline() - anyio.current_time()):
                    await self._changed.wait()
            return await self._answer(held)
        finally:
            if not held.taken:  # cancelled while held: it leaves the step
                step.remove(held)

    async def _flush(self, step: list[_Held]) -> None:
        """Admit every result of a step at once, one step at a time."""
        results = _take(step)
        # Shielded: the calls of this step wait for it, whichever of them is cancelled.
        with anyio.CancelScope(shield=True):
            async with self._admitting:
                admit = lambda: self._admit(results)  # noqa: E731
                if sum(len(result.content) for result in results) <= ADMIT_IN_LOOP_CHARS:
                    _settle(step, admit)
                else:
                    await anyio.to_thread.run_sync(_settle, step, admit)
        self._poke()

    async def _answer(self, held: _Held) -> Admitted:
        """The answer of a result whose step another call is admitting."""
        while not held.done.is_set():
            await self._changed.wait()
        return held.answer()

    def _poke(self) -> None:
        """Wake the held calls: a result arrived, a call ended or a step was admitted."""
        self._changed.set()
        self._changed = anyio.Event()


def _checked(expected: int) -> int:
    if expected < 1:
        raise ValueError(f"a step expects at least one result, not {expected}")
    return expected
