"""Steps for a server that answers concurrent requests: MCP has no batches, so tool calls
whose lifetimes overlap are one step, and their results pass the gate together.

    steps = Steps(admit)                 # admit: one step's ToolResults -> Admitted, in order
    admitted = await steps.run(call)     # call: an async function returning a ToolResult

A finished result is held while other calls of its step still run, until the step's last
call finishes or STEP_BOUND_SECONDS after the step's first result finished, whichever comes
first; then every result held is admitted at once. A call that starts while results are
held is waited for too (within the same bound) and joins that step if it finishes in
time; a call still running when the step is admitted joins the next step.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

import anyio

from spillbox.types import Admitted, ToolResult

STEP_BOUND_SECONDS = 2.0
"""How long a finished result waits for the other calls of its step."""

Admit = Callable[[Sequence[ToolResult]], Awaitable[list[Admitted]]]


@dataclass
class _Held:
    result: ToolResult
    done: anyio.Event = field(default_factory=anyio.Event)
    taken: bool = False
    admitted: Admitted | None = None
    error: BaseException | None = None


class Steps:
    """Groups overlapping calls into steps and admits each step's results together."""

    def __init__(self, admit: Admit, bound: float = STEP_BOUND_SECONDS) -> None:
        self._admit = admit
        self._bound = bound
        self._running = 0
        self._held: list[_Held] = []
        self._deadline = 0.0
        self._changed = anyio.Event()

    async def run(self, call: Callable[[], Awaitable[ToolResult]]) -> Admitted:
        """Run one call, then hold its result until its step is admitted."""
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
        try:
            return await self._wait(held)
        finally:
            if not held.taken:  # cancelled while held: it leaves the step
                self._held.remove(held)

    async def _wait(self, held: _Held) -> Admitted:
        while not held.taken:
            if self._running == 0 or anyio.current_time() >= self._deadline:
                await self._flush()
                break
            with anyio.move_on_after(self._deadline - anyio.current_time()):
                await self._changed.wait()
        await held.done.wait()
        if held.error is not None:
            raise held.error
        assert held.admitted is not None
        return held.admitted

    async def _flush(self) -> None:
        """Admit every result held, as one step."""
        step, self._held = self._held, []
        for held in step:
            held.taken = True
        # Shielded: the calls of this step wait for it, whichever of them is cancelled.
        with anyio.CancelScope(shield=True):
            try:
                admitted = await self._admit([held.result for held in step])
                for held, item in zip(step, admitted, strict=True):
                    held.admitted = item
            except Exception as e:  # noqa: BLE001 - every call of the step hears of it
                for held in step:
                    held.error = e
            finally:
                for held in step:
                    held.done.set()
        self._poke()

    def _poke(self) -> None:
        """Wake the held calls: a call ended or a step was admitted."""
        self._changed.set()
        self._changed = anyio.Event()
