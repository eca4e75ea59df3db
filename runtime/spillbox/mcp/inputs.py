"""The upstream's sampling, elicitation and roots requests, for a 2026-07-28 client.

That era has no server-to-client requests. A server that needs the client answers the
client's tools/call, prompts/get or resources/read with an `input_required` result that
embeds its requests; the client calls again with its answers (`inputResponses`) and the
result's `requestState`. The proxy's upstream may ask in either era (a legacy request, or
an `input_required` result that spillbox.mcp.upstream drives through the same callbacks),
so the proxy holds the call in a round of its own:

    rounds = Rounds(group)                # the proxy server's middleware, and its asks
    answer = await rounds.ask(types.ListRootsRequest(), types.ListRootsResult)

A 2026-07-28 client's call runs in a round (a task of the proxy's). When the upstream asks
while it runs, the call is answered with `input_required` at once (the request under a key,
the round's id as its requestState, sealed by the SDK's RequestStateBoundary); the client's
retry delivers its answers to the upstream and waits again, for the call's own result or
the next request. The gate sees only that final result: an `input_required` answer never
reaches it. A request made by the upstream's own call (its `input_required` result) goes to
that call's round; a legacy upstream's request says nothing of the call it belongs to, so
it goes to the earliest round still open, or to the client's next call if none is.
"""

from __future__ import annotations

import secrets
from collections.abc import Mapping
from contextvars import ContextVar
from dataclasses import dataclass, field
from typing import Any

import anyio
import anyio.abc
import mcp_types as types
from mcp.server.context import CallNext, HandlerResult
from mcp.shared.dispatcher import ProgressFnT
from mcp.shared.exceptions import MCPError
from mcp.shared.jsonrpc_dispatcher import progress_token_from_params
from mcp_types.methods import INPUT_REQUIRED_METHODS
from mcp_types.version import MODERN_PROTOCOL_VERSIONS
from pydantic import BaseModel, ValidationError

from spillbox.mcp.upstream import Ctx

STATE_SECONDS = 600.0
"""How long a round waits for the client's answer (and its requestState is honoured); an
unanswered request is then answered to the upstream with an error."""


@dataclass(eq=False)
class _Ask:
    """One request of the upstream's, waiting for the client's answer."""

    request: types.InputRequest
    result_type: type[BaseModel]
    answered: anyio.Event = field(default_factory=anyio.Event)
    answer: Any = None


class _Round:
    """One call of a 2026-07-28 client, across its legs: the first request and each retry
    that carries answers."""

    def __init__(self, ctx: Ctx) -> None:
        self.id = secrets.token_urlsafe(16)
        self.leg: Ctx | None = ctx
        """The request now waiting on this round, if any (progress goes to it)."""
        self.asks: dict[str, _Ask] = {}
        """Requests not yet answered, by the key the client answers them under."""
        self._keys = 0
        self.done = anyio.Event()
        self.result: HandlerResult = None
        self.error: BaseException | None = None
        self.taken = anyio.Event()
        """Set once a leg has been given the result (or the round was dropped)."""
        self.scope = anyio.CancelScope()
        self._changed = anyio.Event()

    def put(self, ask: _Ask) -> None:
        self._keys += 1
        self.asks[f"{ask.request.method}-{self._keys}"] = ask
        self._changed.set()

    def withdraw(self, ask: _Ask) -> None:
        for key, held in list(self.asks.items()):
            if held is ask:
                del self.asks[key]

    def answer(self, responses: Mapping[str, Any]) -> None:
        """Deliver the client's answers; one that is not an answer to what was asked under
        its key is refused, naming the key (the others are delivered)."""
        wrong: list[str] = []
        for key, raw in responses.items():
            ask = self.asks.get(key)
            if ask is None:
                continue  # answered already, or never asked: a client may send it again
            try:
                ask.answer = ask.result_type.model_validate(raw, by_name=False)
            except ValidationError as e:
                first = e.errors(include_url=False, include_input=False)[0]
                where = "".join(f".{part}" for part in first["loc"])
                wrong.append(
                    f"inputResponses[{key!r}]{where}: {first['msg']} (the answer to "
                    f"{ask.request.method})"
                )
                continue
            del self.asks[key]
            ask.answered.set()
        if wrong:
            raise MCPError(types.INVALID_PARAMS, f"Invalid params: {wrong[0]}", data=wrong)

    async def run(self, call_next: CallNext, ctx: Ctx) -> None:
        token = _ROUND.set(self)
        try:
            with self.scope:
                self.result = await call_next(ctx)
            if self.scope.cancelled_caught:
                self.error = MCPError(types.INVALID_REQUEST, "the call was cancelled")
        except Exception as e:  # noqa: BLE001 - the waiting leg raises it
            self.error = e
        finally:
            _ROUND.reset(token)
            self.done.set()
            self._changed.set()

    async def wait(self) -> HandlerResult:
        """The call's result, or an input_required answer while the upstream waits for
        the client; None once the result has been given (the round is over)."""
        while True:
            if self._changed.is_set():
                self._changed = anyio.Event()
            if self.done.is_set():
                if self.error is not None:
                    raise self.error
                return self.result
            if self.asks:
                return types.InputRequiredResult(
                    input_requests={key: ask.request for key, ask in self.asks.items()},
                    request_state=self.id,
                )
            await self._changed.wait()


_ROUND: ContextVar[_Round | None] = ContextVar("spillbox_mcp_round", default=None)
"""The round whose call is running: the requests its own upstream call makes go to it."""


class Rounds:
    """The proxy server's middleware that runs each 2026-07-28 client call of the methods
    that may need input in a round, and the upstream's requests to that client."""

    def __init__(self, group: anyio.abc.TaskGroup, seconds: float = STATE_SECONDS) -> None:
        self.group = group
        self.seconds = seconds
        self.open: dict[str, _Round] = {}
        """Rounds by id, earliest first."""
        self._unplaced: list[_Ask] = []
        """Requests made while no round was open: they go to the next one."""

    async def __call__(self, ctx: Ctx, call_next: CallNext) -> HandlerResult:
        if (
            ctx.method not in INPUT_REQUIRED_METHODS
            or ctx.protocol_version not in MODERN_PROTOCOL_VERSIONS
            or ctx.request_id is None
        ):
            return await call_next(ctx)
        params = ctx.params or {}
        state = params.get("requestState")  # the SDK's boundary has verified and unsealed it
        if state is None:
            round_ = _Round(ctx)
            self.open[round_.id] = round_
            for ask in self._unplaced:
                round_.put(ask)
            self._unplaced.clear()
            self.group.start_soon(self._run, round_, call_next, ctx)
        else:
            found = self.open.get(state)
            if found is None:
                raise MCPError(
                    types.INVALID_PARAMS,
                    "Invalid params: requestState: no call of this server waits for input "
                    "under it (it ended, timed out, or the server restarted); call again "
                    "without requestState and inputResponses",
                )
            round_ = found
            round_.leg = ctx
            round_.answer(params.get("inputResponses") or {})
        try:
            answer = await round_.wait()
        except anyio.get_cancelled_exc_class():
            round_.scope.cancel()  # the client cancelled the call it is waiting on
            self._drop(round_)
            raise
        finally:
            round_.leg = None
        if round_.done.is_set():
            self._drop(round_)
        return answer

    def _drop(self, round_: _Round) -> None:
        self.open.pop(round_.id, None)
        round_.taken.set()

    async def _run(self, round_: _Round, call_next: CallNext, ctx: Ctx) -> None:
        await round_.run(call_next, ctx)
        with anyio.move_on_after(self.seconds):  # a result no retry came to take
            await round_.taken.wait()
        self._drop(round_)

    async def ask(self, request: types.InputRequest, result_type: type[BaseModel]) -> Any:
        """The client's answer to request, or the ErrorData the upstream is given when
        none comes in time."""
        ask = _Ask(request, result_type)
        round_ = _ROUND.get()
        if round_ is None or round_.done.is_set():
            round_ = next((held for held in self.open.values() if not held.done.is_set()), None)
        if round_ is not None:
            round_.put(ask)
        else:
            self._unplaced.append(ask)
        with anyio.move_on_after(self.seconds):
            await ask.answered.wait()
            return ask.answer
        if round_ is not None:
            round_.withdraw(ask)
        elif ask in self._unplaced:
            self._unplaced.remove(ask)
        return types.ErrorData(
            code=types.INTERNAL_ERROR,
            message=f"the client (protocol 2026-07-28) did not answer {request.method} within "
            f"{self.seconds:g} s; it is asked in an input_required result of its calls",
        )


def relay_progress(ctx: Ctx) -> ProgressFnT | None:
    """Progress for an upstream request, routed back under the client's own token; for a
    call in a round, to its leg now waiting (between legs it has no request to go to)."""
    round_ = _ROUND.get()
    if round_ is None and progress_token_from_params(ctx.params) is None:
        return None

    async def report(progress: float, total: float | None, message: str | None) -> None:
        leg = ctx if round_ is None else round_.leg
        if leg is not None:
            await leg.session.report_progress(progress, total, message)

    return report
