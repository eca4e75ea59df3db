"""The gate: which results of one step stay in context and which are offloaded.

Rules, in order:
1. A result that is not text (not UTF-8, or holding a NUL) is offloaded ("binary").
2. A result over the per-call threshold is offloaded ("per_call"); deciding this costs
   time bounded by the threshold (tokens.count_within), never a full count. The threshold
   is the policy's per_call_tokens, or, with a per_call_share and the tokens that remain
   for tool results, that share of them where it is lower (PerCallLimit).
3. If the step's inline total (notices included) is over the aggregate threshold, the
   largest inline result is offloaded ("aggregate"), then the next largest, until it
   fits. Error results go only after every non-error result; ties go by call order,
   so the same step always gives the same decisions. Results no larger than a notice
   may be (notice_max_tokens) stay: offloading them would not shrink the total.
4. Results the aggregate rule may not offload (pages read back from an artifact) can
   still fill a step: if it is over after rule 3, the largest of them are withheld
   ("withheld"), in the same order, until it fits. The model gets one line saying to
   repeat the call in a later step; nothing is lost, a page can always be read again.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass

from spillbox.config import Policy
from spillbox.tokens import TokenCounter, count_within, total
from spillbox.types import Artifact, Reason, TokenCount, ToolResult

WITHHELD = (
    "[spillbox] result withheld: this step's results are over the {limit}-token limit "
    "for one step. Nothing is lost: repeat this call, with the same arguments, in a "
    "later step."
)


@dataclass(frozen=True)
class PerCallLimit:
    """The per-call threshold a step is gated by, and the rule that set it."""

    tokens: int
    share: float | None = None
    """Set when the dynamic rule applied: this share of `remaining`."""
    remaining: int | None = None

    @classmethod
    def of(cls, policy: Policy, remaining: int | None = None) -> PerCallLimit:
        """The fixed limit, or the dynamic one where the policy has a share, the caller
        said what remains for tool results, and that share of it is lower (never below a
        notice's size: offloading a smaller result would not save anything)."""
        share = policy.per_call_share
        if share is None or remaining is None:
            return cls(policy.per_call_tokens)
        dynamic = max(int(share * max(remaining, 0)), policy.notice_max_tokens)
        if dynamic >= policy.per_call_tokens:
            return cls(policy.per_call_tokens)
        return cls(dynamic, share, remaining)

    def describe(self) -> str:
        """'6000-token per-call limit', or the dynamic rule with what it was a share of."""
        if self.share is None:
            return f"{self.tokens}-token per-call limit"
        return (
            f"{self.tokens}-token dynamic per-call limit: {self.share:.0%} of the "
            f"{self.remaining} tokens left for tool results"
        )


@dataclass(frozen=True)
class Offload:
    """What the gate asks the task to do with one result: store it and return a notice."""

    result: ToolResult
    data: bytes
    text: str | None
    reason: Reason
    tokens: TokenCount | None
    per_call: PerCallLimit
    """The per-call limit of the step, which a per_call notice names."""


OffloadFn = Callable[[Offload], tuple[Artifact, str, int]]
"""Stores one result; returns (artifact, notice text, the notice's tokens)."""


@dataclass(frozen=True)
class Decision:
    """The gate's decision for one result, in the order the results were given."""

    result: ToolResult
    text: str
    """What goes into context: the content itself, or the notice."""
    inline_tokens: int
    """Tokens of text."""
    tokens: TokenCount | None
    """Tokens of the whole result (None for binary)."""
    reason: Reason | None
    artifact: Artifact | None


def admit(
    results: Sequence[ToolResult],
    policy: Policy,
    counter: TokenCounter,
    offload: OffloadFn,
    remaining: int | None = None,
) -> list[Decision]:
    """Gate one step's results; offload(...) stores what does not stay inline.

    remaining: tokens that remain for tool results (a budget's tool_results route), for
    the policy's dynamic per-call limit; None: the fixed one."""
    decisions: list[Decision | None] = [None] * len(results)
    inline: dict[int, tuple[str, int]] = {}
    payloads = [r.payload() for r in results]
    per_call = PerCallLimit.of(policy, remaining)

    def store(i: int, reason: Reason, tokens: TokenCount | None) -> None:
        data, text = payloads[i]
        request = Offload(results[i], data, text, reason, tokens, per_call)
        artifact, notice, notice_tokens = offload(request)
        decisions[i] = Decision(results[i], notice, notice_tokens, tokens, reason, artifact)

    for i, (_, text) in enumerate(payloads):
        if text is None:
            store(i, "binary", None)
            continue
        within, exact = count_within(counter, text, per_call.tokens)
        if within and exact is not None:
            inline[i] = (text, exact)
        else:
            whole = TokenCount(exact, exact=True) if exact is not None else total(counter, text)
            store(i, "per_call", whole)

    def inline_total() -> int:
        offloaded = sum(d.inline_tokens for d in decisions if d is not None)
        return offloaded + sum(tokens for _, tokens in inline.values())

    def largest_first(offloadable: bool) -> list[int]:
        # Non-errors before errors, ties by call order. A result no larger than a notice
        # can be is left inline: replacing it would not shrink the total.
        candidates = [
            i
            for i in inline
            if results[i].offloadable == offloadable and inline[i][1] > policy.notice_max_tokens
        ]
        return sorted(candidates, key=lambda i: (results[i].is_error, -inline[i][1], i))

    for i in largest_first(offloadable=True):
        if inline_total() <= policy.aggregate_tokens:
            break
        _, exact = inline.pop(i)
        store(i, "aggregate", TokenCount(exact, exact=True))

    if inline_total() > policy.aggregate_tokens:  # counted only for an over-full step
        withheld = WITHHELD.format(limit=policy.aggregate_tokens)
        withheld_tokens = counter.count(withheld)
        for i in largest_first(offloadable=False):
            if inline_total() <= policy.aggregate_tokens:
                break
            _, exact = inline[i]
            if exact > withheld_tokens:
                del inline[i]
                tokens = TokenCount(exact, exact=True)
                decisions[i] = Decision(
                    results[i], withheld, withheld_tokens, tokens, "withheld", None
                )

    for i, (text, exact) in inline.items():
        decisions[i] = Decision(results[i], text, exact, TokenCount(exact, exact=True), None, None)
    return [d for d in decisions if d is not None]
