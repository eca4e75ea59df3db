"""The providers' own compaction, where the model has it: which features a model offers, the
request parameters that turn them on, and the offload that runs before them.

A capability table maps a provider and a model name (a glob) to its native features; the
user may extend or replace it. plan() picks a feature for one request:

- OpenAI Responses, "server_compaction": `context_management=[{"type": "compaction",
  "compact_threshold": N}]`; past N input tokens the server compacts the conversation
  into an encrypted compaction item. `store=False` keeps nothing on OpenAI's side (zero
  data retention). "compact_endpoint": POST /responses/compact, explicit compaction
  between phases (compact_responses()).
- Anthropic Messages, "compaction": beta `compact-2026-01-12`, `context_management.edits`
  with `compact_20260112` and an `input_tokens` trigger (at least 50,000): past it, the
  API summarises older context into a compaction block.
- Anthropic Messages, "clear_tool_uses": beta `context-management-2025-06-27`,
  `clear_tool_uses_20250919`: past its trigger, the API deletes the oldest tool results
  (keeping the last few), for users who prefer deletion to summaries. "clear_thinking":
  `clear_thinking_20251015` beside it, first among the edits: the API drops the thinking
  blocks of all but the latest assistant turns.

Either way the provider takes tool results out of what the model sees. Native (a
Compactor) stores them in the task first, so read_artifact and code mode still reach
them, and falls back to spillbox's own stages when the request would not fit at all.

    plan = plan_native("anthropic", "claude-sonnet-4-6", budget)
    request = {**request, **plan.params}; betas = plan.betas
    budget.check(request, "anthropic", compactor=Native(task, plan))
"""

from __future__ import annotations

import fnmatch
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any, Literal, Protocol

from spillbox.adapters import tool_results
from spillbox.budget import Budget, BudgetReport, Provider, Stage, message_list_key
from spillbox.compaction import Fallback, Measure
from spillbox.errors import ConfigError

if TYPE_CHECKING:
    from spillbox.protocols import TaskHandle

Feature = Literal[
    "server_compaction", "compact_endpoint", "compaction", "clear_tool_uses", "clear_thinking"
]
Prefer = Literal["summary", "clear"]

ANTHROPIC_COMPACTION_BETA = "compact-2026-01-12"
ANTHROPIC_CONTEXT_EDITING_BETA = "context-management-2025-06-27"
ANTHROPIC_MIN_COMPACT_TRIGGER = 50_000
"""Anthropic refuses a compact_20260112 trigger under this many input tokens."""
DEFAULT_KEEP_TOOL_USES = 3
"""clear_tool_uses keeps this many of the latest tool uses (Anthropic's own default)."""
DEFAULT_KEEP_THINKING_TURNS = 1
"""clear_thinking keeps the thinking of this many latest assistant turns (Anthropic's own
default, the SDK's BetaThinkingTurnsParam shape)."""


@dataclass(frozen=True)
class Capability:
    """One row of the capability table: a provider's models (a glob) and their features."""

    provider: Provider
    models: str
    """A glob over model names, e.g. "claude-sonnet-4-6*" (dated snapshots match too)."""
    features: frozenset[Feature]


def _row(provider: Provider, models: str, *features: Feature) -> Capability:
    return Capability(provider, models, frozenset(features))


_OPENAI: tuple[Feature, ...] = ("server_compaction", "compact_endpoint")
_ANTHROPIC_BOTH: tuple[Feature, ...] = ("compaction", "clear_tool_uses")
_ANTHROPIC_THINKING: tuple[Feature, ...] = (*_ANTHROPIC_BOTH, "clear_thinking")
DEFAULT_CAPABILITIES: tuple[Capability, ...] = (
    # OpenAI. Neither the compaction guide (developers.openai.com/api/docs/guides/compaction)
    # nor the SDK says which models compact: openai 3.57's ResponseCompactParams.model is
    # the general model list (gpt-3.5-turbo is in it), so it is no evidence either way. The
    # evidence found: GPT-5.4 is "the first mainline model trained to support compaction"
    # (an experiment report, rewards-assistant-docs.fetchrewards.com; ai-radar's GPT-5.4
    # notes agree), and gpt-5-mini hit context_length_exceeded without it. So gpt-5, 5.1,
    # 5.2 (and 5.3) are left out: they predate compaction. Rows for 5.4 and later.
    _row("responses", "gpt-5.4*", *_OPENAI),
    _row("responses", "gpt-5.5*", *_OPENAI),
    _row("responses", "gpt-5.6*", *_OPENAI),
    _row("responses", "gpt-6*", *_OPENAI),
    # Anthropic, the 5 family and Opus 4.8: compaction, clearing and thinking clearing as
    # the project's compaction document lists them. No stored Anthropic page confirms
    # their compaction (the stored compaction page predates them); anthropic 2.14's
    # ModelParam names these ids, and its BetaContextManagementConfigParam takes the three
    # edits. Fable 5 and Mythos 5 think always ("Adaptive (always on)", the models
    # overview), so clearing thinking applies to every request of theirs.
    _row("anthropic", "claude-fable-5*", *_ANTHROPIC_THINKING),
    _row("anthropic", "claude-mythos-5*", *_ANTHROPIC_THINKING),
    _row("anthropic", "claude-sonnet-5*", *_ANTHROPIC_THINKING),
    _row("anthropic", "claude-opus-4-8*", *_ANTHROPIC_THINKING),
    # Anthropic's compaction page (platform.claude.com/docs/en/build-with-claude/compaction,
    # "Supported models") lists these four.
    _row("anthropic", "claude-opus-4-6*", *_ANTHROPIC_BOTH),
    _row("anthropic", "claude-sonnet-4-6*", *_ANTHROPIC_BOTH),
    _row("anthropic", "claude-opus-4-7*", *_ANTHROPIC_BOTH),
    _row("anthropic", "claude-mythos-preview*", *_ANTHROPIC_BOTH),
    # Context editing (clear_tool_uses) only, as the context-editing page listed them.
    _row("anthropic", "claude-opus-4-5*", "clear_tool_uses"),
    _row("anthropic", "claude-sonnet-4-5*", "clear_tool_uses"),
    _row("anthropic", "claude-haiku-4-5*", "clear_tool_uses"),
    _row("anthropic", "claude-opus-4-1*", "clear_tool_uses"),
    _row("anthropic", "claude-opus-4-2025*", "clear_tool_uses"),
    _row("anthropic", "claude-sonnet-4-2025*", "clear_tool_uses"),
)
"""Chat Completions has no native compaction: every model there uses the fallback."""


def features(
    provider: Provider, model: str, capabilities: Sequence[Capability] = DEFAULT_CAPABILITIES
) -> frozenset[Feature]:
    """The native features of provider's model: the first matching row's (user rows first)."""
    for row in capabilities:
        if row.provider == provider and fnmatch.fnmatchcase(model, row.models):
            return row.features
    return frozenset()


@dataclass(frozen=True)
class NativePlan:
    """What one request turns on natively, or why it does not (then the fallback runs)."""

    provider: Provider
    model: str
    feature: Feature | None
    """The feature the request uses; None: none fits, spillbox's fallback compacts."""
    threshold: int
    """Input tokens past which the provider compacts or clears."""
    params: dict[str, Any] = field(default_factory=dict)
    """Fields to add to the request body (context_management, store)."""
    betas: tuple[str, ...] = ()
    """anthropic-beta values the request needs (the SDK's betas=[...])."""
    keep_tool_uses: int = 0
    """For clear_tool_uses: how many latest tool results the provider keeps."""
    reason: str = ""
    """Why this feature (or none) was chosen."""


def plan_native(
    provider: Provider,
    model: str,
    budget: Budget,
    *,
    prefer: Prefer = "summary",
    store: bool = False,
    keep_tool_uses: int = DEFAULT_KEEP_TOOL_USES,
    keep_thinking_turns: int = DEFAULT_KEEP_THINKING_TURNS,
    capabilities: Sequence[Capability] = DEFAULT_CAPABILITIES,
) -> NativePlan:
    """The native feature and request parameters for provider's model under budget.

    The threshold is budget.compact_threshold(): the provider compacts before spillbox's
    hard limits are reached. prefer="clear" picks Anthropic's tool-result clearing over
    its summarising compaction (with clear_thinking first where the model offers it,
    keeping keep_thinking_turns turns' thinking). store (Responses) is False by default:
    OpenAI keeps nothing, and spillbox never chains previous_response_id, so keeping it
    gains nothing.
    """
    if prefer not in ("summary", "clear"):
        raise ConfigError(f"prefer must be 'summary' or 'clear', got {prefer!r}")
    for name, value in (
        ("keep_tool_uses", keep_tool_uses),
        ("keep_thinking_turns", keep_thinking_turns),
    ):
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise ConfigError(f"{name} must be 0 or more, got {value!r}")
    threshold = budget.compact_threshold()
    offered = features(provider, model, capabilities)
    base = NativePlan(provider, model, None, threshold)
    if provider == "responses" and "server_compaction" in offered:
        return _server_compaction(base, store)
    if provider == "anthropic":
        summary = "compaction" in offered and prefer == "summary"
        if summary and threshold < ANTHROPIC_MIN_COMPACT_TRIGGER:
            if "clear_tool_uses" not in offered:
                return _fallback(
                    base,
                    f"its compaction trigger must be at least "
                    f"{ANTHROPIC_MIN_COMPACT_TRIGGER:,} tokens, the budget's "
                    f"threshold is {threshold:,}",
                )
            summary = False
        if summary:
            return _anthropic_compaction(base)
        if "clear_tool_uses" in offered:
            thinking = keep_thinking_turns if "clear_thinking" in offered else None
            return _anthropic_clearing(base, keep_tool_uses, thinking)
    return _fallback(base, f"{provider} model {model!r} has no native compaction in the table")


def _server_compaction(base: NativePlan, store: bool) -> NativePlan:
    """OpenAI Responses: the server compacts past the threshold."""
    threshold = base.threshold
    params: dict[str, Any] = {
        "context_management": [{"type": "compaction", "compact_threshold": threshold}],
        "store": store,
    }
    return replace(
        base,
        feature="server_compaction",
        params=params,
        reason=f"{base.model} compacts server-side past {threshold:,} input tokens",
    )


def _anthropic_compaction(base: NativePlan) -> NativePlan:
    """Anthropic: the API summarises older context past the threshold."""
    edit = {"type": "compact_20260112", "trigger": _input_tokens(base.threshold)}
    return replace(
        base,
        feature="compaction",
        params={"context_management": {"edits": [edit]}},
        betas=(ANTHROPIC_COMPACTION_BETA,),
        reason=f"{base.model} summarises older context past {base.threshold:,} input tokens",
    )


def _anthropic_clearing(
    base: NativePlan, keep_tool_uses: int, keep_thinking_turns: int | None
) -> NativePlan:
    """Anthropic: the API clears old tool results past the threshold (and old thinking,
    keeping keep_thinking_turns turns', where the model offers it: not None)."""
    edits: list[dict[str, Any]] = [
        {
            "type": "clear_tool_uses_20250919",
            "trigger": _input_tokens(base.threshold),
            "keep": {"type": "tool_uses", "value": keep_tool_uses},
        }
    ]
    if keep_thinking_turns is not None:
        # First among the edits: the order Anthropic's context-editing guide gives
        # when both are used (the guide is not in the stored docs; the SDK's types
        # accept either order).
        keep = {"type": "thinking_turns", "value": keep_thinking_turns}
        edits.insert(0, {"type": "clear_thinking_20251015", "keep": keep})
    return replace(
        base,
        feature="clear_tool_uses",
        params={"context_management": {"edits": edits}},
        betas=(ANTHROPIC_CONTEXT_EDITING_BETA,),
        keep_tool_uses=keep_tool_uses,
        reason=f"{base.model} clears tool results past {base.threshold:,} input tokens, "
        f"keeping the last {keep_tool_uses}",
    )


def _fallback(base: NativePlan, why: str) -> NativePlan:
    return NativePlan(base.provider, base.model, None, base.threshold, reason=f"fallback: {why}")


def _input_tokens(value: int) -> dict[str, Any]:
    return {"type": "input_tokens", "value": value}


class Native:
    """A Compactor for a request that carries a NativePlan's parameters.

    Over a soft limit, or at the budget's compaction threshold (where the provider may
    compact on this very call), it stores the tool results the provider would take away
    (all of them for compaction, all but the latest keep_tool_uses for clearing), once
    each, and leaves the request as it is: the provider compacts it. If the request would
    still not fit (a route over its hard limit), or the plan has no native feature,
    spillbox's Fallback stages run.
    """

    def __init__(
        self, task: TaskHandle, plan: NativePlan, fallback: Fallback | None = None
    ) -> None:
        self.task = task
        self.plan = plan
        self.fallback = fallback or Fallback(task)
        self._stored: set[tuple[str, int]] = set()

    def compact(
        self, request: Mapping[str, Any], provider: Provider, measure: Measure
    ) -> tuple[Mapping[str, Any], list[Stage]]:
        if self.plan.feature is None or self.plan.feature == "compact_endpoint":
            return self.fallback.compact(request, provider, measure)
        stored = self.store_removable(request.get(message_list_key(provider)) or [])
        stage = Stage(
            "native",
            f"{self.plan.feature} by the provider past {self.plan.threshold:,} tokens; "
            f"{stored} tool results stored first",
            0,
        )
        report: BudgetReport = measure(request)
        if not report.over_hard:
            return request, [stage]
        compacted, stages = self.fallback.compact(request, provider, measure)
        return compacted, [stage, *stages]

    def store_removable(self, messages: Sequence[Mapping[str, Any]] | str) -> int:
        """Store the tool results the plan's feature would remove; how many were new."""
        if isinstance(messages, str):
            return 0
        results = tool_results(messages)
        if self.plan.feature == "clear_tool_uses":
            results = results[: max(len(results) - self.plan.keep_tool_uses, 0)]
        new = 0
        for result in results:
            key = (result.call_id, hash(result.content))
            if key not in self._stored:
                self.task.offload(result)
                self._stored.add(key)
                new += 1
        return new


class _ResponsesClient(Protocol):
    """What compact_responses needs of an openai.OpenAI client."""

    @property
    def responses(self) -> Any: ...


def compact_params(
    model: str, items: Sequence[Mapping[str, Any]], instructions: str | None = None
) -> dict[str, Any]:
    """The body of POST /responses/compact for a conversation's input items."""
    params: dict[str, Any] = {"model": model, "input": [dict(i) for i in items]}
    if instructions:
        params["instructions"] = instructions
    return params


def compact_responses(
    task: TaskHandle,
    client: _ResponsesClient,
    model: str,
    items: Sequence[Mapping[str, Any]],
    instructions: str | None = None,
) -> list[dict[str, Any]]:
    """Compact a Responses conversation explicitly (between phases of a task), through
    the openai SDK's client.responses.compact.

    The endpoint keeps the user messages and replaces the rest with one encrypted
    compaction item, so every tool result in items is stored in the task first. Returns
    the compacted items, to send as the next request's input.
    """
    Native(task, NativePlan("responses", model, "server_compaction", 0)).store_removable(items)
    compacted = client.responses.compact(**compact_params(model, items, instructions))
    # The endpoint returns user messages as input_text, which the SDK's output-message type
    # does not describe; they are passed back as they came, so its warning is moot.
    return [item.model_dump(exclude_none=True, warnings=False) for item in compacted.output]
