"""A small, provider-agnostic agent loop: the model, the user's tools plus spillbox's, the gate.

    result = run(task, ScriptedModel(script), "Which author merged most?", tools=[prs_tool])
    result.answer, result.context_tokens, result.inline_tokens

The history is kept in the Chat Completions shape; each model class converts it to its
provider's wire format (OpenAIChatModel, OpenAIResponsesModel and AnthropicModel through
the official SDKs, the extras spillbox[openai] and spillbox[anthropic]). Every step's tool
results (the user's and spillbox's) pass the gate together, so parallel calls count as one
aggregate. A tool's images (a script's charts) stay in its tool message, as Chat
Completions image parts after the text, each with its artifact's path (IMAGE_PATH); each
model sends them in its provider's shape (to_chat_completions, to_responses,
to_anthropic). With a budget, the history is checked before every model call, and
compacted by default (the model's NativePlan through Native, else spillbox's Fallback;
compactor=None turns compaction off); record_turns=True also keeps every turn in the
task's history (spillbox.history), whatever a provider's compaction does:

    result = run(task, model, prompt, budget=Budget(window=32_000), record_turns=True)
"""

from __future__ import annotations

import contextlib
import importlib
import json
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Literal, Protocol

from spillbox.adapters import image_caption, image_part
from spillbox.budget import IMAGE_TOKENS, PROVIDER_CONTENT, Budget, BudgetReport, Compactor
from spillbox.compaction import Fallback
from spillbox.errors import ConfigError, SpillboxError
from spillbox.history import History
from spillbox.native import Native, NativePlan, features, plan_native
from spillbox.tools import Format, Toolset, ToolSpec
from spillbox.types import ToolResult

if TYPE_CHECKING:
    from spillbox.config import ModelEndpoint
    from spillbox.protocols import TaskHandle
    from spillbox.tokens import TokenCounter
    from spillbox.types import Admitted, Image

DEFAULT_MAX_STEPS = 12
HTTP_TIMEOUT_SECONDS = 120.0
DEFAULT_MAX_RETRIES = 2
"""How often the SDK retries a request that failed in a way worth retrying (its default)."""
IMAGE_PATH = "path"
"""The key of a history tool message's image part that names the artifact the image is
(sent to no provider: Chat Completions gets it as a caption)."""


@dataclass(frozen=True)
class ToolCall:
    id: str
    name: str
    arguments: Mapping[str, Any]
    error: str | None = None
    """Why the arguments could not be read (e.g. a model sent malformed JSON)."""


@dataclass(frozen=True)
class Turn:
    """One model reply: text, and the tool calls it asks for (none means it is done)."""

    text: str = ""
    tool_calls: tuple[ToolCall, ...] = ()
    provider_content: tuple[Mapping[str, Any], ...] = ()
    """A provider's own blocks to keep in the history and send back (Anthropic's
    compaction blocks)."""


class Model(Protocol):
    def respond(self, messages: Sequence[Mapping[str, Any]], tools: Sequence[ToolSpec]) -> Turn: ...


@dataclass(frozen=True)
class UserTool:
    """One of the user's own tools: its spec and the function that runs it."""

    spec: ToolSpec
    run: Callable[[Mapping[str, Any]], str | bytes]


class ScriptedModel:
    """A deterministic model for tests and demos: a function of the history picks each turn.

    >>> model = ScriptedModel(lambda messages: Turn(text="done"))
    >>> model.respond([], []).text
    'done'
    """

    def __init__(self, script: Callable[[Sequence[Mapping[str, Any]]], Turn]) -> None:
        self._script = script

    def respond(self, messages: Sequence[Mapping[str, Any]], tools: Sequence[ToolSpec]) -> Turn:
        return self._script(messages)


@dataclass
class Step:
    """One step of the loop: the calls the model made and what came back (gated)."""

    calls: list[ToolCall]
    admitted: list[Admitted]


@dataclass
class LoopResult:
    answer: str
    messages: list[dict[str, Any]]
    steps: list[Step] = field(default_factory=list)
    context_tokens: int = 0
    """Tokens of the final history as the model saw it (notices instead of payloads)."""
    inline_tokens: int = 0
    """Tokens the same history would hold with every tool result inline."""
    seconds: float = 0.0
    reports: list[BudgetReport] = field(default_factory=list)
    """With a budget: its report before each model call, compaction included."""


def run(
    task: TaskHandle,
    model: Model,
    prompt: str,
    tools: Sequence[UserTool] = (),
    system: str | None = None,
    max_steps: int = DEFAULT_MAX_STEPS,
    budget: Budget | None = None,
    compactor: Compactor | None | Literal["default"] = "default",
    record_turns: bool = False,
) -> LoopResult:
    """Run the model until it answers without tool calls (or max_steps is reached).

    With a budget, the history (in the Chat Completions shape the loop keeps) is checked
    before every model call: over a soft limit the compactor makes room (the history
    continues from the compacted one), over a hard limit BudgetExceeded is raised before
    the call. Each check's report is in LoopResult.reports. The step's results are then
    gated with what the tool_results route has left, for a policy's dynamic per-call
    limit (Policy.per_call_share). compactor "default": Native with the model's own
    NativePlan (its `native`), else Fallback(task); None: no compaction (the check then
    only fails loudly).

    record_turns: append every turn to the task's history as the loop goes (the turns
    new since the last request, before each model call, and the last answer), so each
    stays recoverable whatever a provider's irreversible compaction removes: for audit and
    zero-data-retention set-ups. Each append writes only the new turns (the history is one
    artifact per task, grown in place), though it reads the history back for its digest.
    """
    started = time.monotonic()
    toolset = Toolset(task)
    if compactor == "default":
        compactor = _default_compactor(task, model) if budget is not None else None
    user_tools, specs = _offered(tools, toolset)
    messages: list[dict[str, Any]] = [{"role": "system", "content": system}] if system else []
    messages.append({"role": "user", "content": prompt})
    result = LoopResult(answer="", messages=messages)
    definitions = [spec.definition("openai") for spec in specs]
    recorder = _Recorder(History(task) if record_turns else None)
    try:
        for _ in range(max_steps):
            recorder.record(messages)
            remaining = None
            if budget is not None:
                remaining = _check(budget, compactor, messages, definitions, result.reports)
                recorder.skip(messages)  # a compaction's own notice is not a turn
            turn = model.respond(messages, specs)
            messages.append(_assistant_message(turn))
            if not turn.tool_calls:
                result.answer = turn.text
                break
            result.steps.append(_step(task, turn, user_tools, toolset, remaining, messages))
        else:
            result.answer = ""
    finally:
        recorder.record(messages)  # the last answer, or what came before a failed call
    result.context_tokens, result.inline_tokens = _tokens(task.counter, messages, result.steps)
    result.seconds = time.monotonic() - started
    return result


def _check(
    budget: Budget,
    compactor: Compactor | None,
    messages: list[dict[str, Any]],
    definitions: list[dict[str, Any]],
    reports: list[BudgetReport],
) -> int | None:
    """Check the history against the budget before a model call (compacted in place when
    over a soft limit, its report kept); what the tool_results route has left."""
    report = budget.check(
        {"messages": messages, "tools": definitions}, "chat_completions", compactor
    )
    messages[:] = report.request["messages"]
    reports.append(report)
    return report.room(budget.route_counting("tool_results"))


def _offered(
    tools: Sequence[UserTool], toolset: Toolset
) -> tuple[dict[str, UserTool], list[ToolSpec]]:
    """The user's tools by name, and the specs the model is offered: the user's, then
    spillbox's (whose names the user's may not reuse)."""
    user_tools = {tool.spec.name: tool for tool in tools}
    clash = set(user_tools) & set(toolset.names)
    if clash:
        raise ConfigError(f"user tools may not reuse spillbox's tool names: {', '.join(clash)}")
    return user_tools, [tool.spec for tool in tools] + toolset.specs()


class _Recorder:
    """record_turns: appends to the task's history the messages new since the last time."""

    def __init__(self, history: History | None) -> None:
        self.history = history
        self.recorded = 0
        """Messages at the start of the loop's messages already in the history."""

    def record(self, messages: list[dict[str, Any]]) -> None:
        if self.history is not None and self.recorded < len(messages):
            self.history.append(messages[self.recorded :])
        self.recorded = len(messages)

    def skip(self, messages: list[dict[str, Any]]) -> None:
        self.recorded = len(messages)


def _step(
    task: TaskHandle,
    turn: Turn,
    user_tools: Mapping[str, UserTool],
    toolset: Toolset,
    remaining: int | None,
    messages: list[dict[str, Any]],
) -> Step:
    """Run a turn's calls, gate their results as one step (with what the route has left),
    and append the tool messages to the history."""
    calls = [_call(call, user_tools, toolset) for call in turn.tool_calls]
    admitted = task.admit([tool_result for tool_result, _ in calls], remaining)
    for (tool_result, images), item in zip(calls, admitted, strict=True):
        messages.append(_tool_message(tool_result.call_id, item.text, images))
    return Step(list(turn.tool_calls), admitted)


def _tokens(
    counter: TokenCounter, messages: Sequence[Mapping[str, Any]], steps: Sequence[Step]
) -> tuple[int, int]:
    """Tokens of the history as the model saw it, and as it would be with every tool
    result inline."""
    shown = sum(_message_tokens(counter, m) for m in messages)
    extra = sum(
        (item.tokens or 0) - item.inline_tokens
        for step in steps
        for item in step.admitted
        if item.offloaded
    )
    return shown, shown + extra


def _default_compactor(task: TaskHandle, model: Model) -> Compactor:
    """The compactor a budget gets when run() is given none: the model's native plan
    (OpenAIResponsesModel, AnthropicModel), which stores what the provider would remove
    first, else spillbox's reversible Fallback."""
    plan = getattr(model, "native", None)
    if isinstance(plan, NativePlan) and plan.feature is not None:
        return Native(task, plan)
    return Fallback(task)


def _call(
    call: ToolCall, user_tools: Mapping[str, UserTool], toolset: Toolset
) -> tuple[ToolResult, tuple[Image, ...]]:
    """A call's result for the gate, and the images to show after it (spillbox's tools')."""
    if call.error is not None:
        error = json.dumps({"error": call.error})
        return ToolResult(call.id, call.name, error, is_error=True), ()
    if call.name in toolset.names:
        output = toolset.call(call.name, call.arguments)
        result = ToolResult(call.id, call.name, output.text, output.is_error, output.offloadable)
        return result, output.images
    tool = user_tools.get(call.name)
    if tool is None:
        message = json.dumps({"error": f"unknown tool {call.name!r}"})
        return ToolResult(call.id, call.name, message, is_error=True), ()
    try:
        return ToolResult(call.id, call.name, tool.run(call.arguments)), ()
    except Exception as e:  # noqa: BLE001 - a failing tool is the model's to see, not a crash
        message = json.dumps({"error": f"{type(e).__name__}: {e}"})
        return ToolResult(call.id, call.name, message, is_error=True), ()


def _tool_message(call_id: str, text: str, images: Sequence[Image]) -> dict[str, Any]:
    """A tool message of the history: the gated text, then the images as Chat Completions
    image parts, each naming its artifact (IMAGE_PATH)."""
    if not images:
        return {"role": "tool", "tool_call_id": call_id, "content": text}
    parts = [{"type": "text", "text": text}]
    parts += [{**image_part(i.data_url(), "openai"), IMAGE_PATH: i.path} for i in images]
    return {"role": "tool", "tool_call_id": call_id, "content": parts}


def _assistant_message(turn: Turn) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": turn.text}
    if turn.provider_content:
        message[PROVIDER_CONTENT] = [dict(b) for b in turn.provider_content]
    if turn.tool_calls:
        message["tool_calls"] = [
            {
                "id": call.id,
                "type": "function",
                "function": {"name": call.name, "arguments": json.dumps(call.arguments)},
            }
            for call in turn.tool_calls
        ]
    return message


def _message_tokens(counter: TokenCounter, message: Mapping[str, Any]) -> int:
    """Tokens of a history message as the model sees it: its text, its tool calls, and
    IMAGE_TOKENS for each image."""
    content = message.get("content") or ""
    parts = [{"type": "text", "text": content}] if isinstance(content, str) else content
    text = "".join(str(p.get("text", "")) for p in parts if p.get("type") == "text")
    for call in message.get("tool_calls") or ():
        text += call["function"]["name"] + call["function"]["arguments"]
    images = sum(1 for p in parts if p.get("type") == "image_url")
    return counter.count(text) + images * IMAGE_TOKENS


# Real endpoints, through the official SDKs (the extras spillbox[openai] and
# spillbox[anthropic]): their retries, timeouts and error types, their exceptions
# translated in one place (_endpoint_errors).


class OpenAIChatModel:
    """An OpenAI-compatible Chat Completions endpoint, through the openai SDK."""

    provider = "chat_completions"

    def __init__(self, endpoint: ModelEndpoint, max_retries: int = DEFAULT_MAX_RETRIES) -> None:
        self.endpoint = endpoint
        self._client = _client("openai", endpoint, max_retries)

    def respond(self, messages: Sequence[Mapping[str, Any]], tools: Sequence[ToolSpec]) -> Turn:
        with _endpoint_errors(self.endpoint):
            reply = self._client.chat.completions.create(
                model=self.endpoint.model,
                messages=to_chat_completions(messages),
                tools=[spec.definition("openai") for spec in tools],
            )
            message = reply.choices[0].message
            calls = tuple(
                _openai_call(c.id, c.function.name, c.function.arguments)
                for c in message.tool_calls or ()
            )
            return Turn(text=message.content or "", tool_calls=calls)


class OpenAIResponsesModel:
    """An OpenAI Responses endpoint, through the openai SDK.

    With a NativePlan (spillbox.native.plan_native for provider "responses") its
    context_management (server-side compaction past the budget's threshold) goes with
    every request, and the compaction items the API returns are kept in the history
    (Turn.provider_content) and sent back in the next request's input.

    store=False (the default) asks OpenAI to keep nothing: every request carries the whole
    input and never chains previous_response_id, so nothing is gained by keeping data at
    OpenAI (and server compaction stays zero-data-retention friendly). A plan's own store
    wins.
    """

    provider = "responses"

    def __init__(
        self,
        endpoint: ModelEndpoint,
        native: NativePlan | None = None,
        max_retries: int = DEFAULT_MAX_RETRIES,
        *,
        store: bool = False,
    ) -> None:
        self.endpoint = endpoint
        self.native = native if native is not None and native.feature is not None else None
        self.store = store
        self._client = _client("openai", endpoint, max_retries)

    def respond(self, messages: Sequence[Mapping[str, Any]], tools: Sequence[ToolSpec]) -> Turn:
        instructions, items = to_responses(messages)
        body: dict[str, Any] = {
            "model": self.endpoint.model,
            "input": items,
            "tools": [spec.definition("responses") for spec in tools],
            "store": self.store,
        }
        if instructions:
            body["instructions"] = instructions
        if self.native is not None:
            body.update(self.native.params)
        with _endpoint_errors(self.endpoint):
            reply = self._client.responses.create(**body)
            output = [item.model_dump(exclude_none=True, warnings=False) for item in reply.output]
        text = "".join(
            str(part.get("text", ""))
            for item in output
            if item.get("type") == "message"
            for part in item.get("content") or ()
            if part.get("type") == "output_text"
        )
        calls = tuple(
            _openai_call(item["call_id"], item["name"], item.get("arguments"))
            for item in output
            if item.get("type") == "function_call"
        )
        kept = tuple(item for item in output if item.get("type") in _ROUND_TRIP_ITEMS)
        return Turn(text=text, tool_calls=calls, provider_content=kept)


_ROUND_TRIP_ITEMS = ("compaction",)
"""Responses output items the history keeps and sends back as they came (the compaction
item carries what the server compacted away)."""


class AnthropicModel:
    """An Anthropic-compatible Messages endpoint, through the anthropic SDK.

    With a NativePlan (spillbox.native.plan_native) its context_management edits and beta
    headers go with every request, and the compaction blocks the API returns are kept in
    the history (Turn.provider_content) and sent back, as the API requires.
    """

    provider = "anthropic"

    def __init__(
        self,
        endpoint: ModelEndpoint,
        max_tokens: int = 4096,
        native: NativePlan | None = None,
        max_retries: int = DEFAULT_MAX_RETRIES,
    ) -> None:
        self.endpoint = endpoint
        self.max_tokens = max_tokens
        self.native = native if native is not None and native.feature is not None else None
        self._client = _client("anthropic", endpoint, max_retries)

    def respond(self, messages: Sequence[Mapping[str, Any]], tools: Sequence[ToolSpec]) -> Turn:
        system, converted = to_anthropic(messages)
        body: dict[str, Any] = {
            "model": self.endpoint.model,
            "max_tokens": self.max_tokens,
            "messages": converted,
            "tools": [spec.definition("anthropic") for spec in tools],
        }
        if system:
            body["system"] = system
        with _endpoint_errors(self.endpoint):
            if self.native is None:
                reply = self._client.messages.create(**body)
            else:
                body.update(self.native.params)
                reply = self._client.beta.messages.create(**body, betas=list(self.native.betas))
            blocks = [b.model_dump(exclude_none=True) for b in reply.content]
        text = "".join(b.get("text", "") for b in blocks if b.get("type") == "text")
        calls = tuple(
            ToolCall(b["id"], b["name"], b.get("input") or {})
            for b in blocks
            if b.get("type") == "tool_use"
        )
        kept = tuple(b for b in blocks if b.get("type") in _ROUND_TRIP_BLOCKS)
        return Turn(text=text, tool_calls=calls, provider_content=kept)


_ROUND_TRIP_BLOCKS = ("compaction",)
"""Anthropic blocks the history keeps and sends back as they came (the API drops what
came before a compaction block and reads the summary in it)."""


def _without_provider_content(message: Mapping[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in message.items() if k != PROVIDER_CONTENT}


def to_chat_completions(messages: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
    """The history as Chat Completions takes it: a provider's kept blocks left out, and a
    tool message's images (a tool message holds text only) moved into one user message
    right after the step's tool messages, each image after a text part naming its call and
    path."""
    out: list[dict[str, Any]] = []
    shown: list[dict[str, Any]] = []
    for m in messages:
        if m["role"] != "tool" and shown:
            out.append({"role": "user", "content": shown})
            shown = []
        content = m.get("content")
        if m["role"] != "tool" or not isinstance(content, list) or not _has_images(content):
            out.append(_without_provider_content(m))
            continue
        text = "".join(str(p.get("text", "")) for p in content if p.get("type") == "text")
        out.append({**m, "content": text})
        for part in content:
            if part.get("type") == "image_url":
                caption = image_caption(str(m["tool_call_id"]), str(part.get(IMAGE_PATH, "")))
                shown.append({"type": "text", "text": caption})
                shown.append(image_part(part["image_url"]["url"], "openai"))
    if shown:
        out.append({"role": "user", "content": shown})
    return out


def _has_images(parts: Sequence[Mapping[str, Any]]) -> bool:
    return any(p.get("type") == "image_url" for p in parts)


def _tool_content(content: Any, fmt: Format) -> Any:
    """A history tool message's content in fmt's shape: a string as it is; parts as fmt's
    text parts and images (the history keeps Chat Completions image parts)."""
    if isinstance(content, str):
        return content
    text = "input_text" if fmt == "responses" else "text"
    return [
        image_part(p["image_url"]["url"], fmt)
        if p.get("type") == "image_url"
        else {"type": text, "text": str(p.get("text", ""))}
        for p in content
    ]


def _client(sdk: str, endpoint: ModelEndpoint, max_retries: int) -> Any:
    """The SDK's client for endpoint, with spillbox's timeout and the retries asked for."""
    module = _import(sdk)
    client_class = module.OpenAI if sdk == "openai" else module.Anthropic
    return client_class(
        api_key=endpoint.api_key,
        base_url=endpoint.base_url,
        timeout=HTTP_TIMEOUT_SECONDS,
        max_retries=max_retries,
    )


def _import(name: str) -> Any:
    try:
        return importlib.import_module(name)
    except ImportError as e:
        raise ConfigError(
            f"a real {name} model needs the {name} SDK: pip install 'spillbox[{name}]'"
        ) from e


@contextlib.contextmanager
def _endpoint_errors(endpoint: ModelEndpoint) -> Iterator[None]:
    """The SDKs' exceptions as spillbox errors, in one place: one line, no key in it."""
    sdk = _import("openai" if endpoint.provider == "openai" else "anthropic")
    url = endpoint.base_url
    try:
        yield
    except sdk.APIStatusError as e:
        # One line, however the endpoint formats its error page.
        detail = " ".join(e.response.text.split())[:300]
        raise SpillboxError(
            f"the model endpoint {url} answered {e.status_code}: {detail}",
            retryable=e.status_code in (408, 409, 429) or e.status_code >= 500,
        ) from e
    except sdk.APIConnectionError as e:
        raise SpillboxError(
            f"the model endpoint {url} did not answer ({type(e).__name__}): check the base URL",
            retryable=True,
        ) from e
    except (AttributeError, IndexError, KeyError, TypeError) as e:
        raise SpillboxError(f"the model endpoint sent an unexpected reply (no {e})") from e


def _openai_call(call_id: str, name: str, arguments: str | None) -> ToolCall:
    """A tool call whose JSON arguments may be malformed: the model then sees the error."""
    try:
        parsed = json.loads(arguments or "{}")
    except ValueError as e:
        return ToolCall(call_id, name, {}, error=f"the arguments are not valid JSON ({e})")
    if not isinstance(parsed, dict):
        return ToolCall(call_id, name, {}, error="the arguments must be a JSON object")
    return ToolCall(call_id, name, parsed)


def to_anthropic(messages: Sequence[Mapping[str, Any]]) -> tuple[str, list[dict[str, Any]]]:
    """Chat Completions history as (system, Anthropic messages): tool calls become
    tool_use blocks, tool messages tool_result blocks in one user message per step (a
    tool's images as image blocks in its tool_result, after the text)."""
    system = "\n".join(str(m["content"]) for m in messages if m["role"] == "system")
    out: list[dict[str, Any]] = []
    for m in messages:
        if m["role"] == "system":
            continue
        if m["role"] == "tool":
            block = {
                "type": "tool_result",
                "tool_use_id": m["tool_call_id"],
                "content": _tool_content(m["content"], "anthropic"),
            }
            if out and out[-1]["role"] == "user" and isinstance(out[-1]["content"], list):
                out[-1]["content"].append(block)
            else:
                out.append({"role": "user", "content": [block]})
        elif m["role"] == "assistant":
            blocks: list[dict[str, Any]] = [dict(b) for b in m.get(PROVIDER_CONTENT) or ()]
            if m.get("content"):
                blocks.append({"type": "text", "text": m["content"]})
            for call in m.get("tool_calls") or ():
                blocks.append(
                    {
                        "type": "tool_use",
                        "id": call["id"],
                        "name": call["function"]["name"],
                        "input": json.loads(call["function"]["arguments"] or "{}"),
                    }
                )
            out.append({"role": "assistant", "content": blocks})
        else:
            out.append({"role": "user", "content": m["content"]})
    return system, out


def to_responses(messages: Sequence[Mapping[str, Any]]) -> tuple[str, list[dict[str, Any]]]:
    """Chat Completions history as (instructions, Responses input items): tool calls become
    function_call items, tool messages function_call_output items (a tool's images make
    the output a list: input_text, then input_image items), and a provider's kept
    items (compaction) go back where they came, the latest one first: what came before it
    is not sent."""
    instructions = "\n".join(str(m["content"]) for m in messages if m["role"] == "system")
    items: list[dict[str, Any]] = []
    for m in messages:
        if m["role"] == "system":
            continue
        if m["role"] == "tool":
            output = {"type": "function_call_output", "call_id": m["tool_call_id"]}
            items.append({**output, "output": _tool_content(m["content"], "responses")})
            continue
        items.extend(dict(item) for item in m.get(PROVIDER_CONTENT) or ())
        if m.get("content"):
            items.append({"role": m["role"], "content": m["content"]})
        for call in m.get("tool_calls") or ():
            function = call["function"]
            items.append(
                {
                    "type": "function_call",
                    "call_id": call["id"],
                    "name": function["name"],
                    "arguments": function["arguments"] or "{}",
                }
            )
    # The latest compaction item carries what came before it (OpenAI's compaction guide):
    # nothing before it is sent.
    latest = max((i for i, item in enumerate(items) if item.get("type") == "compaction"), default=0)
    return instructions, items[latest:]


def model_from_endpoint(
    endpoint: ModelEndpoint,
    max_retries: int = DEFAULT_MAX_RETRIES,
    budget: Budget | None = None,
) -> Model:
    """The model class for a configured endpoint, with the provider's own compaction where
    the capability table (spillbox.native) gives the model one: Anthropic's Messages with
    its compaction or clearing; for OpenAI, the Responses API (store=False) for a model with
    server compaction, else Chat Completions.

    The compaction threshold comes from budget, else from the model's known window
    (budget.CONTEXT_WINDOWS); with neither, the model is sent no compaction parameters
    (the loop's Fallback still holds its budget, where one is given).
    """
    if budget is None:
        with contextlib.suppress(ConfigError):  # a window spillbox does not know
            budget = Budget(model=endpoint.model)
    if endpoint.provider == "anthropic":
        provider: Literal["anthropic", "responses"] = "anthropic"
    elif "server_compaction" in features("responses", endpoint.model):
        provider = "responses"
    else:
        return OpenAIChatModel(endpoint, max_retries=max_retries)
    plan = plan_native(provider, endpoint.model, budget) if budget is not None else None
    if provider == "anthropic":
        return AnthropicModel(endpoint, native=plan, max_retries=max_retries)
    return OpenAIResponsesModel(endpoint, native=plan, max_retries=max_retries)
