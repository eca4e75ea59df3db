"""Token budgets per route: a plan for the model's window, checked before every call.

A request is counted by route (system prompt, tool definitions, history, tool results,
retrieved content), in the tokens of the model it goes to, and each route is held to its
limit. Over a soft limit the check asks a compactor to make room; over a hard limit after
that it raises BudgetExceeded. Nothing is ever cut silently.

    budget = Budget(window=32_000)                 # or Budget(model="gpt-4.1"): its window
    report = budget.check({"messages": messages, "tools": tools}, provider="chat_completions")
    print(report)   # use and limit per route, headroom

With the default routes the conversation (history, tool results, retrieved content) shares
what the window leaves after the output reserve and the system prompt and tools use:
compaction starts at DEFAULT_SOFT_SHARE of that room, not at one route's own share.

Counting is incremental: each text is counted once and remembered by its content, so a
check after one new message costs time proportional to that message.
"""

from __future__ import annotations

import fnmatch
import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, Literal, Protocol, get_args

from spillbox.errors import ConfigError, SpillboxError
from spillbox.tokens import TokenCounter, counter_for_model, default_counter

Provider = Literal["chat_completions", "responses", "anthropic"]
PROVIDERS: tuple[str, ...] = get_args(Provider)

KINDS = ("system", "tools", "history", "tool_results", "retrieved")
"""What a request's parts are, before they are routed: the default routes bear these names."""
OUTPUT = "output"
"""The route that reserves room for the reply; nothing in a request counts against it."""
COMPACTABLE = ("history", "tool_results", "retrieved")
"""Kinds a compactor can shrink: the system prompt and the tool definitions stay as given."""

DEFAULT_ROUTE_SHARES = {
    "system": 0.10,
    "tools": 0.10,
    "history": 0.30,
    "tool_results": 0.30,
    "retrieved": 0.05,
}
"""The default routes' limits as shares of the window; output takes the rest (15%). With
the default routes the compactable ones share their room (Budget's share_room): these are
then the nominal split, and each may use what the others leave."""
DEFAULT_OUTPUT_SHARE = 0.15
DEFAULT_SOFT_SHARE = 0.8
"""A route's soft limit, where compaction starts, as a share of its hard limit (and, with
shared room, the share of the input limit where it starts)."""

CONTEXT_WINDOWS: tuple[tuple[str, int], ...] = (
    # Anthropic's models overview (platform.claude.com, the zh-CN page as stored): Claude
    # Fable 5.x, Opus 5 and Sonnet 5 have 1M tokens, Haiku 4.5 200K. Mythos 5 shares Fable 5's
    # specs (the English overview: "Claude Mythos 5 shares Claude Fable 5's specs").
    ("claude-fable-5*", 1_000_000),
    ("claude-mythos-5*", 1_000_000),
    ("claude-opus-5*", 1_000_000),
    ("claude-sonnet-5*", 1_000_000),
    ("claude-haiku-4-5*", 200_000),
    # Anthropic's Claude Sonnet 4.6 page (platform.claude.com/docs/zh-CN/models/sonnet-4-6):
    # "Context window: 1M tokens".
    ("claude-sonnet-4-6*", 1_000_000),
    # The rest of Claude 4.x (Opus 4.8 to 4.5, Sonnet 4.5): the sources disagree (third-party
    # tables give Opus 4.8 1M or 200K; Anthropic's release notes gave Opus 4.6 1M as a beta
    # with long-context pricing past 200K). The smaller figure: a window set too small
    # compacts early, one set too large lets a request fail at the provider.
    ("claude-opus-4*", 200_000),
    ("claude-sonnet-4*", 200_000),
    # OpenAI: an experiment report (rewards-assistant-docs.fetchrewards.com, gpt-5.4
    # compaction) runs gpt-5.4 and gpt-5.4-mini at 1M and gpt-5-mini at 400K; no OpenAI
    # page in the stored docs states the windows of gpt-5.5 and later, so they are left out.
    ("gpt-5.4*", 1_000_000),
    ("gpt-5", 400_000),
    ("gpt-5-*", 400_000),
)
"""Context windows of known models (a glob over the name, first match wins), for
Budget(model=...) without a window; the caller's window= always wins. Each row says what
it rests on; a model not here needs window=."""

MESSAGE_OVERHEAD_TOKENS = 4
"""Tokens a message costs beyond its content (role and separators), as OpenAI counts them."""
IMAGE_TOKENS = 1_600
"""An image part counts this much: Anthropic's figure for a ~1.15 megapixel image."""
MAX_CACHED_TEXTS = 200_000
"""The cache of counts is emptied past this many entries (bounds its memory)."""


class BudgetExceeded(SpillboxError):
    """A route is over its hard limit, after whatever compaction could do."""

    def __init__(self, route: str, used: int, limit: int, report: BudgetReport) -> None:
        advice = (
            _SHARED_ADVICE
            if route in report.shared
            else _ADVICE.get(route, f"raise routes[{route!r}]")
        )
        super().__init__(
            f"the {route!r} route uses {used:,} tokens, over its hard limit of {limit:,} "
            f"(window {report.window:,}, after {report.stages_text()}): {advice}"
        )
        self.route, self.used, self.limit, self.report = route, used, limit, report


_ADVICE = {
    "system": "raise routes['system'] (or shorten the system prompt)",
    "tools": "raise routes['tools'] (or offer fewer tools)",
    "history": "raise routes['history'], or pass a compactor so older turns are archived",
    "tool_results": "raise routes['tool_results'], or pass a compactor so older results move out",
    "retrieved": "raise routes['retrieved'] (or retrieve less)",
}
_SHARED_ADVICE = (
    "the conversation fills what the window leaves after the output reserve, the system "
    "prompt and the tools: pass a compactor so older turns and results move out, or raise window"
)


@dataclass(frozen=True)
class Route:
    """One route's limits, in tokens.

    >>> Route(10_000).soft
    8000
    """

    limit: int
    """The hard limit: over it (after compaction) the check raises BudgetExceeded."""
    soft: int = 0
    """Where compaction starts; 0 means DEFAULT_SOFT_SHARE of the hard limit."""

    def __post_init__(self) -> None:
        if self.soft == 0 and _positive_int(self.limit):
            object.__setattr__(self, "soft", max(1, int(self.limit * DEFAULT_SOFT_SHARE)))


@dataclass(frozen=True)
class RouteUse:
    name: str
    used: int
    soft: int
    limit: int

    @property
    def over_soft(self) -> bool:
        return self.used > self.soft

    @property
    def over_hard(self) -> bool:
        return self.used > self.limit


@dataclass(frozen=True)
class Stage:
    """One compaction stage that ran: what it did and how many tokens it freed."""

    name: str
    detail: str
    freed: int


@dataclass
class BudgetReport:
    """A checked request: use and limits per route, headroom, and the compaction that ran."""

    provider: str
    window: int
    routes: list[RouteUse]
    input_tokens: int
    """Tokens of the whole request (every route but output)."""
    reserve_output: int
    request: Mapping[str, Any]
    """The request as checked: compacted if a stage ran, else the one given."""
    parts: list[tuple[int, str, int]] = field(default_factory=list)
    """(index in the request's message list, or -1 for top-level fields; kind; tokens) of
    each counted part."""
    stages: list[Stage] = field(default_factory=list)
    compactable: frozenset[str] = frozenset()
    """The routes a compactor can shrink (those history, tool_results and retrieved count in)."""
    shared: frozenset[str] = frozenset()
    """The routes that share their room (Budget's share_room): each one's soft and hard
    limit is what the window leaves it beside the others' use."""

    @property
    def needs_room(self) -> bool:
        """Whether a compactable route is over its soft limit."""
        return any(r.over_soft for r in self.routes if r.name in self.compactable)

    @property
    def headroom(self) -> int:
        """What the window still holds beyond the input and the output reserve."""
        return self.window - self.input_tokens - self.reserve_output

    def route(self, name: str) -> RouteUse:
        return next(r for r in self.routes if r.name == name)

    def excess(self, share: float) -> int:
        """Tokens to free so that every compactable route is at most share of its hard
        limit; routes that share their room count once, as one pool."""
        pool = [r for r in self.routes if r.name in self.shared]
        excess = 0
        if pool:
            used = sum(r.used for r in pool)
            # The pool's room: the input limit less the rest of the request.
            limit = self.window - self.reserve_output - (self.input_tokens - used)
            excess += max(used - int(limit * share), 0)
        for r in self.routes:
            if r.name in self.compactable and r.name not in self.shared:
                excess += max(r.used - int(r.limit * share), 0)
        return excess

    def room(self, name: str) -> int:
        """Tokens a route may still take before its hard limit, within what the window
        holds; the window's headroom alone for a route the budget does not have."""
        route = next((r for r in self.routes if r.name == name), None)
        left = self.headroom if route is None else min(route.limit - route.used, self.headroom)
        return max(left, 0)

    @property
    def over_soft(self) -> list[RouteUse]:
        return [r for r in self.routes if r.over_soft]

    @property
    def over_hard(self) -> list[RouteUse]:
        return [r for r in self.routes if r.over_hard]

    def stages_text(self) -> str:
        if not self.stages:
            return "no compaction"
        return "compaction: " + ", ".join(s.name for s in self.stages)

    def as_dict(self) -> dict[str, Any]:
        return {
            "provider": self.provider,
            "window": self.window,
            "input_tokens": self.input_tokens,
            "reserve_output": self.reserve_output,
            "headroom": self.headroom,
            "routes": {
                r.name: {"used": r.used, "soft": r.soft, "limit": r.limit} for r in self.routes
            },
            "stages": [{"name": s.name, "detail": s.detail, "freed": s.freed} for s in self.stages],
        }

    def __str__(self) -> str:
        parts = []
        for r in self.routes:
            flag = "!!" if r.over_hard else "!" if r.over_soft else ""
            parts.append(f"{r.name} {r.used:,}/{r.limit:,}{flag}")
        line = f"{self.input_tokens:,} in + {self.reserve_output:,} out of {self.window:,}"
        line += f" (headroom {self.headroom:,}) | " + " ".join(parts)
        if self.stages:
            line += " | " + "; ".join(
                f"{s.name}: {s.detail}" + (f" (-{s.freed:,})" if s.freed > 0 else "")
                for s in self.stages
            )
        return line


class Compactor(Protocol):
    """Makes room in a request whose compactable routes are over their soft limits.

    compact() gets the request and a `measure` function (a request to its report), runs its
    stages in order while measure() still shows a route over its soft limit, and returns
    the compacted request with the stages that ran. It never drops content: what leaves
    the request is stored first.
    """

    def compact(
        self,
        request: Mapping[str, Any],
        provider: Provider,
        measure: Callable[[Mapping[str, Any]], BudgetReport],
    ) -> tuple[Mapping[str, Any], list[Stage]]: ...


RouteOf = Callable[[Mapping[str, Any]], str | None]
"""A hook naming the kind of a message or item (e.g. "retrieved"), or None for the default."""


class Budget:
    """A window split into routes, each with a hard and a soft limit.

    >>> budget = Budget(window=32_000)
    >>> budget.route("history")
    Route(limit=9600, soft=7680)
    >>> budget.check({"messages": [{"role": "user", "content": "hi"}]},
    ...              provider="chat_completions").route("history").used
    5

    window may be left out with a model CONTEXT_WINDOWS knows. routes replaces the
    defaults (a name with an int or a Route; default_routes(window) gives them, to change
    one); reserve_output is the output route's limit. share_room (by default: when routes
    is not given) lets the compactable routes share their room: each may take what the
    window leaves beside the others, so compaction starts when the whole input reaches
    DEFAULT_SOFT_SHARE of the input limit and BudgetExceeded comes past the input limit
    (the system and tools routes keep their own limits). Renamed or dropped routes: kinds
    maps each kind of content (system, tools, history, tool_results, retrieved) to the
    route it counts against; a kind whose route is dropped counts against history. model
    counts in that model's own tokens (tokens.counter_for_model); counter overrides it.
    """

    def __init__(
        self,
        window: int | None = None,
        routes: Mapping[str, int | Route] | None = None,
        reserve_output: int | None = None,
        *,
        kinds: Mapping[str, str] | None = None,
        model: str | None = None,
        counter: TokenCounter | None = None,
        route_of: RouteOf | None = None,
        share_room: bool | None = None,
    ) -> None:
        if window is None:
            window = _known_window(model)
        if not _positive_int(window):
            raise ConfigError(f"window must be a positive number of tokens, got {window!r}")
        self.window = window
        if counter is None:
            counter = default_counter() if model is None else counter_for_model(model)
        self.counter = counter
        self.route_of = route_of
        self._routes = _routes(window, routes, reserve_output)
        self.reserve_output = self._routes[OUTPUT].limit
        self._kinds = _kinds(self._routes, kinds)
        self._shared = (
            frozenset(self._kinds[k] for k in COMPACTABLE)
            if (routes is None if share_room is None else share_room)
            else frozenset()
        )
        self._texts: dict[tuple[int, int], int] = {}
        self._objects: dict[int, tuple[object, int]] = {}

    @property
    def routes(self) -> dict[str, Route]:
        return dict(self._routes)

    def route(self, name: str) -> Route:
        return self._routes[name]

    def route_counting(self, kind: str) -> str:
        """The route a kind of content (system, tools, history, tool_results, retrieved)
        counts against."""
        return self._kinds[kind]

    @property
    def input_limit(self) -> int:
        """The most tokens a request may hold: the window less the output reserve."""
        return self.window - self.reserve_output

    def check(
        self,
        request: Mapping[str, Any],
        provider: Provider,
        compactor: Compactor | None = None,
    ) -> BudgetReport:
        """Count request by route; call the compactor if a compactable route is over its
        soft limit (or the whole input at compact_threshold()); raise BudgetExceeded if any
        route is then over its hard limit.

        The request is never changed in place: a compacted one is in the report.
        """
        report = self.measure(request, provider)
        # At the compaction threshold a provider's native compaction may run on this call,
        # whatever the routes: the compactor gets to store what it would remove first.
        at_threshold = report.input_tokens >= self.compact_threshold()
        if compactor is not None and (report.needs_room or at_threshold):
            compacted, stages = compactor.compact(
                request, provider, lambda r: self.measure(r, provider)
            )
            report = self.measure(compacted, provider)
            report.stages = stages
        # The routes add up to at most the window, so a request within every route's hard
        # limit is within the window too; shared routes are over together, named by the
        # largest.
        over = sorted(
            report.over_hard,
            key=lambda r: (r.name in report.shared, -r.used if r.name in report.shared else 0),
        )
        if over:
            raise BudgetExceeded(over[0].name, over[0].used, over[0].limit, report)
        return report

    def measure(self, request: Mapping[str, Any], provider: Provider) -> BudgetReport:
        """Count request by route, without compacting or raising on limits."""
        if provider not in PROVIDERS:
            raise ConfigError(
                f"provider: unknown request shape {provider!r}; use one of {', '.join(PROVIDERS)}"
            )
        if not isinstance(request, Mapping):
            raise ConfigError(
                f"request: expected a mapping (the request body), got {_kind(request)}"
            )
        if len(self._texts) > MAX_CACHED_TEXTS:
            self._texts.clear()
            self._objects.clear()
        parts: list[tuple[int, str, int]] = []
        _WALKERS[provider](self, request, parts)
        point = _compaction_point(request, provider)
        if point > 0:  # the model reads nothing before a compaction: that costs no tokens
            parts = [(i, k, 0 if 0 <= i < point and k != "system" else t) for i, k, t in parts]
        used = dict.fromkeys(self._routes, 0)
        for _, kind, tokens in parts:
            used[self._kinds[kind]] += tokens
        used[OUTPUT] = self.reserve_output
        input_tokens = sum(t for _, _, t in parts)
        routes = [
            self._shared_use(n, used[n], input_tokens)
            if n in self._shared
            else RouteUse(n, used[n], r.soft, r.limit)
            for n, r in self._routes.items()
        ]
        return BudgetReport(
            provider=provider,
            window=self.window,
            routes=routes,
            input_tokens=input_tokens,
            reserve_output=self.reserve_output,
            request=request,
            parts=parts,
            compactable=frozenset(self._kinds[k] for k in COMPACTABLE),
            shared=self._shared,
        )

    def _shared_use(self, name: str, used: int, input_tokens: int) -> RouteUse:
        """A shared route's use, its limits what the input limit leaves it beside the rest
        of the request: over its soft limit exactly when the whole input is past
        compact_threshold(), over its hard limit when it is past input_limit."""
        rest = input_tokens - used
        return RouteUse(
            name, used, max(self.compact_threshold() - rest, 0), max(self.input_limit - rest, 0)
        )

    def compact_threshold(self) -> int:
        """Where a provider's native compaction should start: the soft share of the input
        limit, so the provider compacts before spillbox's own hard limits are reached."""
        return int(self.input_limit * DEFAULT_SOFT_SHARE)

    # Counting, remembered by content

    def _text(self, text: str) -> int:
        # Keyed by (length, hash), not by the text: the cache must not keep a large tool
        # result alive after the conversation dropped it. A str caches its own hash, so a
        # text seen before costs a look-up; two different texts of one length and one
        # 64-bit hash are a chance of about 1 in 10^9 over the cache's 200,000 entries.
        key = (len(text), hash(text))
        tokens = self._texts.get(key)
        if tokens is None:
            tokens = self._texts[key] = self.counter.count(text)
        return tokens

    def _object(self, value: object) -> int:
        """Tokens of a structured value (a tool definition, a tool call's input), counted as
        its JSON once per object: build a new one rather than changing one in place."""
        if isinstance(value, str):
            return self._text(value)
        known = self._objects.get(id(value))
        if known is not None and known[0] is value:
            return known[1]
        tokens = self.counter.count(json.dumps(value, ensure_ascii=False, default=str))
        self._objects[id(value)] = (value, tokens)  # the reference keeps the id unique
        return tokens


def _known_window(model: str | None) -> int:
    """The window of a model CONTEXT_WINDOWS knows; a clear error otherwise."""
    if model is None:
        raise ConfigError("window: give the model's window in tokens, or model= a known model")
    for pattern, window in CONTEXT_WINDOWS:
        if fnmatch.fnmatchcase(model, pattern):
            return window
    raise ConfigError(
        f"window: spillbox does not know the window of {model!r}: give window= (tokens)"
    )


def default_routes(window: int) -> dict[str, int | Route]:
    """The default routes' limits for a window, to change one and pass them all:
    Budget(w, routes={**default_routes(w), "history": 20_000})."""
    return {name: int(window * share) for name, share in DEFAULT_ROUTE_SHARES.items()}


def _routes(
    window: int, routes: Mapping[str, int | Route] | None, reserve_output: int | None
) -> dict[str, Route]:
    if routes is None:
        routes = default_routes(window)
    if not isinstance(routes, Mapping):
        raise ConfigError(
            f"routes: expected a mapping of route names to limits, got {_kind(routes)}"
        )
    out: dict[str, Route] = {}
    for name, value in routes.items():
        route = (
            value if isinstance(value, Route) else Route(value) if _positive_int(value) else None
        )
        if route is None or not _positive_int(route.limit):
            limit = value.limit if isinstance(value, Route) else value
            raise ConfigError(
                f"routes[{name!r}]: a limit must be a positive number of tokens, got {limit!r}"
            )
        if not _positive_int(route.soft) or route.soft > route.limit:
            raise ConfigError(
                f"routes[{name!r}]: the soft limit must be between 1 and the hard limit "
                f"({route.limit}), got {route.soft!r}"
            )
        out[str(name)] = route
    if reserve_output is not None:
        if not _positive_int(reserve_output):
            raise ConfigError(
                f"reserve_output must be a positive number of tokens, got {reserve_output!r}"
            )
        if OUTPUT in out and out[OUTPUT].limit != reserve_output:
            raise ConfigError(
                f"reserve_output ({reserve_output}) and routes['output'] ({out[OUTPUT].limit}) "
                "disagree: give one of them"
            )
        out[OUTPUT] = Route(reserve_output, reserve_output)
    elif OUTPUT not in out:
        share = int(window * DEFAULT_OUTPUT_SHARE)
        out[OUTPUT] = Route(share, share)
    total = sum(r.limit for r in out.values())
    if total > window:
        listed = ", ".join(f"{n} {r.limit:,}" for n, r in out.items())
        raise ConfigError(
            f"routes: the limits add up to {total:,} tokens, more than the window of "
            f"{window:,} ({listed}): lower a route or reserve_output, or raise window"
        )
    return out


def _kinds(routes: Mapping[str, Route], kinds: Mapping[str, str] | None) -> dict[str, str]:
    given = dict(kinds or {})
    for kind in given:
        if kind not in KINDS:
            raise ConfigError(
                f"kinds[{kind!r}]: not a kind of content; kinds are {', '.join(KINDS)}"
            )
    out: dict[str, str] = {}
    for kind in KINDS:
        route = given.get(kind, kind if kind in routes else given.get("history", "history"))
        if route not in routes or route == OUTPUT:
            raise ConfigError(
                f"kinds[{kind!r}]: no route {route!r} to count {kind} against; name one of "
                f"{', '.join(n for n in routes if n != OUTPUT)} in kinds={{{kind!r}: ...}}"
            )
        out[kind] = route
    return out


def _positive_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _kind(value: object) -> str:
    return type(value).__name__


# The three request shapes. Each walker appends (message index, kind, tokens) to parts;
# top-level parts (instructions, system, tools) have index -1.


class ShapeError(ConfigError):
    """A request that is not in the shape its provider expects; names the field."""


def _list(value: object, path: str, what: str) -> Sequence[Any]:
    if not isinstance(value, list | tuple):
        raise ShapeError(f"{path}: expected a list of {what}, got {_kind(value)}")
    return value


def _mapping(value: object, path: str) -> Mapping[str, Any]:
    # A plain dict first: the ABC check costs more than the rest of a message's walk.
    if type(value) is not dict and not isinstance(value, Mapping):
        raise ShapeError(f"{path}: expected an object, got {_kind(value)}")
    return value


def _tools(budget: Budget, request: Mapping[str, Any], parts: list[tuple[int, str, int]]) -> None:
    for tool in _list(request.get("tools") or [], "request['tools']", "tool definitions"):
        parts.append((-1, "tools", budget._object(tool)))


def _hooked(budget: Budget, item: Mapping[str, Any], kind: str, path: str) -> str:
    if budget.route_of is None:
        return kind
    named = budget.route_of(item)
    if named is None:
        return kind
    if named not in KINDS:
        raise ConfigError(f"route_of({path}) returned {named!r}: return one of {', '.join(KINDS)}")
    return named


_CHAT_ROLES = {
    "system": "system",
    "developer": "system",
    "user": "history",
    "assistant": "history",
    "tool": "tool_results",
    "function": "tool_results",
}
_CHAT_TEXT_PARTS = ("text", "refusal")
_CHAT_MEDIA_PARTS = ("image_url", "input_audio", "file")


def _chat(budget: Budget, request: Mapping[str, Any], parts: list[tuple[int, str, int]]) -> None:
    if "messages" not in request:
        raise ShapeError("request['messages']: a chat_completions request needs messages")
    for i, raw in enumerate(_list(request["messages"], "request['messages']", "messages")):
        path = f"request['messages'][{i}]"
        message = _mapping(raw, path)
        kind = _CHAT_ROLES.get(message.get("role"))  # type: ignore[arg-type]
        if kind is None:
            raise ShapeError(
                f"{path}['role']: {message.get('role')!r} is not a chat_completions role "
                f"({', '.join(_CHAT_ROLES)})"
            )
        kind = _hooked(budget, message, kind, path)
        tokens = MESSAGE_OVERHEAD_TOKENS + _chat_content(budget, message.get("content"), path)
        for call in message.get("tool_calls") or ():
            function = _mapping(call, f"{path}['tool_calls']").get("function") or {}
            tokens += budget._text(str(function.get("name", "")))
            tokens += budget._object(function.get("arguments") or "")
        for item in message.get(PROVIDER_CONTENT) or ():
            # A compaction's summary, where the provider shows it (Anthropic); an encrypted
            # one (OpenAI) is opaque and counted by what it shows: nothing.
            tokens += budget._text(
                str(_mapping(item, f"{path}[{PROVIDER_CONTENT!r}]").get("content") or "")
            )
        parts.append((i, kind, tokens))
    _tools(budget, request, parts)


def _chat_content(budget: Budget, content: object, path: str) -> int:
    if content is None:
        return 0
    if type(content) is str:
        return budget._text(content)
    return _content(budget, content, path, "chat_completions", _CHAT_TEXT_PARTS, _CHAT_MEDIA_PARTS)


def _content(
    budget: Budget,
    content: object,
    path: str,
    provider: str,
    text_parts: tuple[str, ...],
    media_parts: tuple[str, ...],
    key: str = "content",
) -> int:
    """Tokens of a message's content (or a tool output, under key): a string, or a list of
    text and media parts."""
    if isinstance(content, str):
        return budget._text(content)
    tokens = 0
    for j, raw in enumerate(_list(content, f"{path}[{key!r}]", "content parts")):
        part = _mapping(raw, f"{path}[{key!r}][{j}]")
        kind = part.get("type")
        if kind in text_parts:
            tokens += budget._text(str(part.get("text", part.get("refusal", ""))))
        elif kind in media_parts:
            tokens += IMAGE_TOKENS
        else:
            raise ShapeError(
                f"{path}[{key!r}][{j}]['type']: {kind!r} is not a {provider} content part "
                f"({', '.join(text_parts + media_parts)})"
            )
    return tokens


_RESPONSES_TEXT = ("input_text", "output_text", "text", "refusal", "summary_text", "reasoning_text")
_RESPONSES_MEDIA = ("input_image", "input_file", "input_audio")


def _responses(
    budget: Budget, request: Mapping[str, Any], parts: list[tuple[int, str, int]]
) -> None:
    if "input" not in request:
        raise ShapeError("request['input']: a responses request needs input")
    instructions = request.get("instructions")
    if instructions:
        if not isinstance(instructions, str):
            raise ShapeError(
                f"request['instructions']: expected a string, got {_kind(instructions)}"
            )
        parts.append((-1, "system", budget._text(instructions)))
    items = request["input"]
    if isinstance(items, str):
        parts.append((0, "history", MESSAGE_OVERHEAD_TOKENS + budget._text(items)))
        items = []
    for i, raw in enumerate(_list(items, "request['input']", "input items")):
        path = f"request['input'][{i}]"
        item = _mapping(raw, path)
        kind, tokens = _responses_item(budget, item, path)
        parts.append((i, _hooked(budget, item, kind, path), tokens))
    _tools(budget, request, parts)


def _responses_item(budget: Budget, item: Mapping[str, Any], path: str) -> tuple[str, int]:
    kind = item.get("type", "message")
    if kind == "message":
        role = item.get("role")
        if role not in ("system", "developer", "user", "assistant"):
            raise ShapeError(
                f"{path}['role']: {role!r} is not a responses message role "
                "(system, developer, user, assistant)"
            )
        tokens = MESSAGE_OVERHEAD_TOKENS + _content(
            budget, item.get("content"), path, "responses", _RESPONSES_TEXT, _RESPONSES_MEDIA
        )
        return ("system" if role in ("system", "developer") else "history"), tokens
    if kind == "function_call_output":
        output = item.get("output", "")
        if isinstance(output, list):  # text and images: each image counts IMAGE_TOKENS
            tokens = _content(
                budget, output, path, "responses", _RESPONSES_TEXT, _RESPONSES_MEDIA, "output"
            )
            return "tool_results", MESSAGE_OVERHEAD_TOKENS + tokens
        return "tool_results", MESSAGE_OVERHEAD_TOKENS + budget._object(output)
    if kind == "function_call":
        name, arguments = str(item.get("name", "")), item.get("arguments") or ""
        return "history", MESSAGE_OVERHEAD_TOKENS + budget._text(name) + budget._object(arguments)
    if kind in ("reasoning", "compaction"):
        # Opaque to the client (encrypted): counted by its visible text only.
        text = "".join(
            str(s.get("text", "")) for s in item.get("summary") or () if isinstance(s, Mapping)
        )
        return "history", MESSAGE_OVERHEAD_TOKENS + budget._text(text)
    if isinstance(kind, str) and kind.endswith(("_call", "_call_output")):
        return "tool_results" if kind.endswith("_output") else "history", budget._object(item)
    if kind == "item_reference":
        return "history", 0  # the item it names is on the provider's side: not counted here
    raise ShapeError(
        f"{path}['type']: {kind!r} is not a responses input item (message, function_call, "
        "function_call_output, reasoning, compaction, item_reference, or a built-in tool's "
        "*_call)"
    )


_ANTHROPIC_RETRIEVED = ("document", "search_result")


def _anthropic(
    budget: Budget, request: Mapping[str, Any], parts: list[tuple[int, str, int]]
) -> None:
    if "messages" not in request:
        raise ShapeError("request['messages']: an anthropic request needs messages")
    system = request.get("system")
    if system:
        parts.append((-1, "system", _anthropic_blocks(budget, system, "request['system']")[1]))
    for i, raw in enumerate(_list(request["messages"], "request['messages']", "messages")):
        path = f"request['messages'][{i}]"
        message = _mapping(raw, path)
        if message.get("role") not in ("user", "assistant"):
            raise ShapeError(
                f"{path}['role']: {message.get('role')!r} is not an anthropic role (user, "
                "assistant; the system prompt goes in request['system'])"
            )
        content = message.get("content")
        if isinstance(content, str):
            kind = _hooked(budget, message, "history", path)
            parts.append((i, kind, MESSAGE_OVERHEAD_TOKENS + budget._text(content)))
            continue
        by_kind: dict[str, int] = {}
        for j, raw_block in enumerate(_list(content, f"{path}['content']", "content blocks")):
            block_path = f"{path}['content'][{j}]"
            kind, tokens = _anthropic_block(budget, _mapping(raw_block, block_path), block_path)
            by_kind[kind] = by_kind.get(kind, 0) + tokens
        first = True
        for kind, tokens in by_kind.items():
            overhead = MESSAGE_OVERHEAD_TOKENS if first else 0
            parts.append((i, _hooked(budget, message, kind, path), tokens + overhead))
            first = False
    _tools(budget, request, parts)


def _anthropic_blocks(budget: Budget, content: object, path: str) -> tuple[str, int]:
    if isinstance(content, str):
        return "system", budget._text(content)
    tokens = 0
    for j, raw in enumerate(_list(content, path, "content blocks")):
        tokens += _anthropic_block(budget, _mapping(raw, f"{path}[{j}]"), f"{path}[{j}]")[1]
    return "system", tokens


def _anthropic_block(budget: Budget, block: Mapping[str, Any], path: str) -> tuple[str, int]:
    kind = block.get("type")
    if kind == "text":
        return "history", budget._text(str(block.get("text", "")))
    if kind == "tool_result":
        content = block.get("content", "")
        if isinstance(content, str):
            return "tool_results", budget._text(content)
        return "tool_results", _anthropic_blocks(budget, content, f"{path}['content']")[1]
    if kind == "tool_use":
        name = budget._text(str(block.get("name", "")))
        return "history", name + budget._object(block.get("input") or {})
    if kind in ("thinking", "compaction"):
        return "history", budget._text(str(block.get(kind, block.get("content")) or ""))
    if kind == "redacted_thinking":
        return "history", 0
    if kind in _ANTHROPIC_RETRIEVED:
        return "retrieved", budget._object(block)
    if kind == "image":
        return "history", IMAGE_TOKENS
    if isinstance(kind, str) and kind.endswith("tool_result"):  # server and MCP tools' results
        return "tool_results", budget._object(block)
    if isinstance(kind, str) and kind.endswith("tool_use"):
        return "history", budget._object(block)
    raise ShapeError(
        f"{path}['type']: {kind!r} is not an anthropic content block (text, image, *tool_use, "
        "*tool_result, document, search_result, thinking, compaction)"
    )


_WALKERS: dict[str, Callable[[Budget, Mapping[str, Any], list[tuple[int, str, int]]], None]] = {
    "chat_completions": _chat,
    "responses": _responses,
    "anthropic": _anthropic,
}


PROVIDER_CONTENT = "provider_content"
"""The key of a Chat Completions-shaped assistant message (the loop's history) that holds
a provider's own blocks or items to send back, such as a compaction."""


def _compaction_point(request: Mapping[str, Any], provider: Provider) -> int:
    """The index of the message holding the latest compaction the provider reads from, or
    -1. Anthropic drops every block before a compaction block; the loop's history keeps a
    provider's compaction in PROVIDER_CONTENT, and its Responses model sends nothing before
    the latest compaction item. A Responses request as given is counted whole: it is what
    the request carries."""
    if provider == "responses":
        return -1
    messages = request.get("messages") or ()
    for i in range(len(messages) - 1, -1, -1):
        message = messages[i]
        blocks = (
            message.get(PROVIDER_CONTENT) if provider == "chat_completions"
            else message.get("content")
        )  # fmt: skip
        if isinstance(blocks, list) and any(
            isinstance(b, Mapping) and b.get("type") == "compaction" for b in blocks
        ):
            return i
    return -1


def message_list_key(provider: Provider) -> str:
    """The request key that holds the conversation in provider's shape."""
    return "input" if provider == "responses" else "messages"


__all__ = [
    "Budget",
    "BudgetExceeded",
    "BudgetReport",
    "Compactor",
    "Provider",
    "Route",
    "RouteUse",
    "ShapeError",
    "Stage",
]
