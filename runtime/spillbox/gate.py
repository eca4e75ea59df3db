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
from dataclasses import dataclass, field

from spillbox.config import Policy
from spillbox.digest import Digest
from spillbox.tokens import TokenCounter, count_within, total
from spillbox.types import Artifact, Reason, Text, TokenCount, ToolResult

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
    text: Text | None
    reason: Reason
    tokens: TokenCount | None
    per_call: PerCallLimit
    """The per-call limit of the step, which a per_call notice names."""
    digest: Digest | None = None
    """data's sha256, begun by the gate as soon as it had the bytes (see spillbox.digest);
    None: begun when stored."""


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
    payloads = [r.payload() for r in results]
    # A large payload's hash begins now: it runs beside the count below and the store's
    # profile and write, not after them.
    digests = [Digest(data) for data, _ in payloads]
    step = _Step(results, payloads, digests, PerCallLimit.of(policy, remaining))
    # Every result is judged before any is stored: a counter that fails (an encoding that
    # cannot be loaded) fails the step whole, with nothing offloaded.
    verdicts = [_per_call(counter, text, step.per_call) for _, text in step.payloads]
    for i, (reason, tokens) in enumerate(verdicts):
        if reason is None:
            assert tokens is not None  # an inline result is counted whole
            step.inline[i] = tokens.tokens
        else:
            step.store(i, offload, reason, tokens)
    for i in step.largest_first(policy, offloadable=True):
        if step.inline_total() <= policy.aggregate_tokens:
            break
        step.store(i, offload, "aggregate", TokenCount(step.inline.pop(i), exact=True))
    if step.inline_total() > policy.aggregate_tokens:  # counted only for an over-full step
        _withhold(step, policy, counter)
    return step.decisions()


def _per_call(
    counter: TokenCounter, text: Text | None, per_call: PerCallLimit
) -> tuple[Reason | None, TokenCount | None]:
    """Rules 1 and 2 for one result: (None, its exact count) if it may stay inline, else
    the reason it is offloaded and its tokens (None for binary)."""
    if text is None:
        return "binary", None
    within, exact = count_within(counter, text, per_call.tokens)
    if exact is not None:
        return None if within else "per_call", TokenCount(exact, exact=True)
    return "per_call", total(counter, text)


def _withhold(step: _Step, policy: Policy, counter: TokenCounter) -> None:
    """Rule 4: withhold the largest results rule 3 may not offload until the step fits."""
    withheld = WITHHELD.format(limit=policy.aggregate_tokens)
    withheld_tokens = counter.count(withheld)
    for i in step.largest_first(policy, offloadable=False):
        if step.inline_total() <= policy.aggregate_tokens:
            break
        if step.inline[i] > withheld_tokens:
            tokens = TokenCount(step.inline.pop(i), exact=True)
            step.decided[i] = Decision(
                step.results[i], withheld, withheld_tokens, tokens, "withheld", None
            )


@dataclass
class _Step:
    """One step's results as the rules go: what is decided, and what is inline so far."""

    results: Sequence[ToolResult]
    payloads: list[tuple[bytes, Text | None]]
    digests: list[Digest]
    per_call: PerCallLimit
    decided: dict[int, Decision] = field(default_factory=dict)
    inline: dict[int, int] = field(default_factory=dict)
    """Results inline so far, by index: their exact tokens."""

    def store(self, i: int, offload: OffloadFn, reason: Reason, tokens: TokenCount | None) -> None:
        data, text = self.payloads[i]
        request = Offload(
            self.results[i], data, text, reason, tokens, self.per_call, self.digests[i]
        )
        artifact, notice, notice_tokens = offload(request)
        self.decided[i] = Decision(self.results[i], notice, notice_tokens, tokens, reason, artifact)

    def inline_total(self) -> int:
        offloaded = sum(d.inline_tokens for d in self.decided.values())
        return offloaded + sum(self.inline.values())

    def largest_first(self, policy: Policy, offloadable: bool) -> list[int]:
        # Non-errors before errors, ties by call order. A result no larger than a notice
        # can be is left inline: replacing it would not shrink the total.
        results, inline = self.results, self.inline
        candidates = [
            i
            for i in inline
            if results[i].offloadable == offloadable and inline[i] > policy.notice_max_tokens
        ]
        return sorted(candidates, key=lambda i: (results[i].is_error, -inline[i], i))

    def decisions(self) -> list[Decision]:
        """Every result's decision, in call order: what is still inline stays."""
        for i, tokens in self.inline.items():
            text = self.payloads[i][1]
            assert text is not None
            counted = TokenCount(tokens, exact=True)
            self.decided[i] = Decision(self.results[i], str(text), tokens, counted, None, None)
        return [self.decided[i] for i in range(len(self.results))]
