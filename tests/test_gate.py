"""The gate's rules, with a fake offload (no storage): per-call and aggregate thresholds,
largest first, errors last, ties by call order, deterministic."""

from __future__ import annotations

from collections.abc import Sequence

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from spillbox.config import Policy
from spillbox.errors import ConfigError
from spillbox.gate import WITHHELD, Decision, Offload, PerCallLimit, admit
from spillbox.tokens import TokenCounter, default_counter
from spillbox.types import LARGE_TEXT_BYTES, LargeText, TokenCount, ToolResult


class FakeStore:
    """Records what the gate asked to offload; the notice is one short line."""

    def __init__(self) -> None:
        self.calls: list[Offload] = []

    def __call__(self, offload: Offload) -> tuple[object, str, int]:
        self.calls.append(offload)
        notice = f"[offloaded {offload.result.call_id}: {offload.reason}]"
        return offload.data, notice, default_counter().count(notice)


def gate(results: Sequence[ToolResult], policy: Policy) -> tuple[list[Decision], FakeStore]:
    store = FakeStore()
    return admit(results, policy, default_counter(), store), store


def words(n: int, word: str = "token") -> str:
    return " ".join([word] * n)


def check_invariants(
    results: Sequence[ToolResult],
    decisions: Sequence[Decision],
    policy: Policy,
    counter: TokenCounter,
) -> None:
    """Every rule of the gate, checked from the outside."""
    assert [d.result for d in decisions] == list(results)
    sizes: dict[int, int] = {}
    for i, (result, decision) in enumerate(zip(results, decisions, strict=True)):
        _, text = result.payload()
        assert decision.inline_tokens == counter.count(decision.text)
        if text is None:
            assert decision.reason == "binary"
            continue
        size = counter.count(text)
        if size > policy.per_call_tokens:
            assert decision.reason == "per_call"
            continue
        sizes[i] = size
        assert decision.tokens == TokenCount(size, exact=True)
        if decision.reason is None:
            assert decision.text == text
        elif decision.reason == "withheld":
            assert decision.text == WITHHELD.format(limit=policy.aggregate_tokens)
            assert decision.artifact is None
        else:
            assert decision.reason == "aggregate"

    # No inline result is over the per-call threshold.
    assert all(d.inline_tokens <= policy.per_call_tokens for d in decisions if d.reason is None)

    # The aggregate rule offloads a prefix of its candidates (results larger than any
    # notice can be), then withholds a prefix of the results it may not offload (larger
    # than a notice and than the withheld line): each list non-errors before errors,
    # largest first, ties by call order; the shortest prefix that fits, or all of them
    # if none does. Others never go.
    withheld_tokens = counter.count(WITHHELD.format(limit=policy.aggregate_tokens))
    offload_order = candidates(results, sizes, policy, offloadable=True, above=0)
    withhold_order = candidates(results, sizes, policy, offloadable=False, above=withheld_tokens)
    gone = {"aggregate": offload_order, "withheld": withhold_order}
    assert all(decisions[i].reason is None for i in sizes if i not in sum(gone.values(), []))
    inline_total = sum(d.inline_tokens for d in decisions)
    # The step's total when the offloading ended: before any result was withheld.
    after_phase = {
        "aggregate": inline_total + sum(sizes[i] - withheld_tokens for i in withhold_order
                                        if decisions[i].reason == "withheld"),
        "withheld": inline_total,
    }  # fmt: skip
    cut = {}
    for reason, order in gone.items():
        taken = {i for i in order if decisions[i].reason == reason}
        cut[reason] = k = len(taken)
        assert taken == set(order[:k])
        if k < len(order):
            assert inline_total <= policy.aggregate_tokens
        if k:
            last = order[k - 1]
            before_last = after_phase[reason] - decisions[last].inline_tokens + sizes[last]
            assert before_last > policy.aggregate_tokens
    if cut["withheld"]:  # withholding starts only once every offload candidate went
        assert cut["aggregate"] == len(offload_order)


def candidates(
    results: Sequence[ToolResult],
    sizes: dict[int, int],
    policy: Policy,
    offloadable: bool,
    above: int,
) -> list[int]:
    chosen = [
        i
        for i in sizes
        if results[i].offloadable == offloadable and sizes[i] > max(policy.notice_max_tokens, above)
    ]
    return sorted(chosen, key=lambda i: (results[i].is_error, -sizes[i], i))


def test_empty_step() -> None:
    assert gate([], Policy())[0] == []


def test_small_results_stay_inline_untouched() -> None:
    results = [ToolResult("c1", "echo", "hello"), ToolResult("c2", "echo", b"bytes ok")]
    decisions, store = gate(results, Policy())
    assert [d.text for d in decisions] == ["hello", "bytes ok"]
    assert [d.reason for d in decisions] == [None, None]
    assert [d.artifact for d in decisions] == [None, None]
    assert store.calls == []


def test_a_result_over_the_per_call_threshold_is_offloaded() -> None:
    big = words(7_000)
    decisions, store = gate([ToolResult("c1", "read", big)], Policy())
    (decision,) = decisions
    assert decision.reason == "per_call"
    assert decision.text == "[offloaded c1: per_call]"
    assert decision.tokens is not None and decision.tokens.tokens > 6_000
    assert store.calls[0].data == big.encode()


def test_exactly_at_the_per_call_threshold_stays_inline() -> None:
    text = words(100)
    exact = default_counter().count(text)
    decisions, _ = gate([ToolResult("c1", "t", text)], Policy(per_call_tokens=exact))
    assert decisions[0].reason is None
    decisions, _ = gate([ToolResult("c1", "t", text)], Policy(per_call_tokens=exact - 1))
    assert decisions[0].reason == "per_call"


def test_aggregate_offloads_largest_first_until_it_fits() -> None:
    results = [
        ToolResult("small", "t", words(2_000)),
        ToolResult("large", "t", words(5_000)),
        ToolResult("medium", "t", words(3_000)),
        ToolResult("tiny", "t", words(500)),
    ]
    decisions, store = gate(results, Policy())
    assert [d.reason for d in decisions] == [None, "aggregate", None, None]
    assert [o.result.call_id for o in store.calls] == ["large"]
    assert sum(d.inline_tokens for d in decisions) <= 10_000
    check_invariants(results, decisions, Policy(), default_counter())


def test_errors_are_offloaded_only_after_every_non_error() -> None:
    results = [
        ToolResult("err", "t", words(5_000), is_error=True),
        ToolResult("ok1", "t", words(3_000)),
        ToolResult("ok2", "t", words(3_000)),
    ]
    decisions, _ = gate(results, Policy())
    # 11,000 tokens: one offload is enough, and it is not the (largest) error.
    assert [d.reason for d in decisions] == [None, "aggregate", None]


def test_ties_go_by_call_order() -> None:
    results = [ToolResult(f"c{i}", "t", words(4_000)) for i in range(3)]
    decisions, _ = gate(results, Policy())
    assert [d.reason for d in decisions] == ["aggregate", None, None]


def test_notices_count_toward_the_aggregate() -> None:
    # Two per-call offloads leave two notices; the inline rest must fit beside them.
    results = [
        ToolResult("big1", "t", words(7_000)),
        ToolResult("big2", "t", words(7_000)),
        ToolResult("fits", "t", words(500)),
    ]
    counter = default_counter()
    notices = 2 * counter.count("[offloaded big1: per_call]")
    policy = Policy(aggregate_tokens=notices + counter.count(words(500)) - 1)
    decisions, _ = gate(results, policy)
    assert [d.reason for d in decisions] == ["per_call", "per_call", "aggregate"]


def test_results_no_larger_than_a_notice_stay_inline() -> None:
    # Offloading a result smaller than a notice would grow the total, not shrink it: the
    # gate leaves such results inline even when the step stays over the threshold.
    results = [ToolResult(f"c{i}", "t", "ok") for i in range(5)]
    policy = Policy(aggregate_tokens=3)
    decisions, _ = gate(results, policy)
    assert all(d.reason is None for d in decisions)
    assert sum(d.inline_tokens for d in decisions) > policy.aggregate_tokens
    check_invariants(results, decisions, policy, default_counter())


def test_pages_that_fill_a_step_are_withheld_after_every_offload() -> None:
    # Pages read back from an artifact may not be offloaded (that would loop); three of
    # them are over the step's limit, so the largest is withheld, after the offloadable
    # result went, and the step fits.
    results = [
        ToolResult("page1", "read_artifact", words(4_000), offloadable=False),
        ToolResult("other", "t", words(3_000)),
        ToolResult("page2", "read_artifact", words(4_500), offloadable=False),
        ToolResult("page3", "read_artifact", words(3_500), offloadable=False),
    ]
    decisions, store = gate(results, Policy())
    assert [d.reason for d in decisions] == [None, "aggregate", "withheld", None]
    assert [o.result.call_id for o in store.calls] == ["other"]
    assert decisions[2].text.startswith("[spillbox] result withheld: ")
    assert "10000-token limit" in decisions[2].text
    assert sum(d.inline_tokens for d in decisions) <= 10_000
    check_invariants(results, decisions, Policy(), default_counter())


@pytest.mark.parametrize(
    "content",
    [
        b"\x89PNG\r\n\x1a\n\x00\x00",
        b"valid \xff\xfe invalid",
        "lone surrogate \udc80",
        b"ustar-like header\x00\x00\x00 valid UTF-8 by chance",
        "a str holding a NUL \x00",
    ],
    ids=["png", "invalid-utf8", "surrogate-str", "utf8-with-nul", "str-with-nul"],
)
def test_non_utf8_results_are_offloaded_as_binary_whatever_their_size(content: str | bytes) -> None:
    decisions, store = gate([ToolResult("c1", "t", content)], Policy())
    assert decisions[0].reason == "binary"
    assert decisions[0].tokens is None
    expected = content if isinstance(content, bytes) else content.encode("utf-8", "surrogatepass")
    assert store.calls[0].data == expected
    assert store.calls[0].text is None


def test_payload_of_str_and_bytes() -> None:
    assert ToolResult("c", "t", "héllo").payload() == ("héllo".encode(), "héllo")
    assert ToolResult("c", "t", "héllo".encode()).payload() == ("héllo".encode(), "héllo")
    assert ToolResult("c", "t", b"\xff").payload() == (b"\xff", None)
    assert ToolResult("c", "t", "nul\x00").payload() == (b"nul\x00", None)


def test_large_bytes_are_read_as_large_text_when_ascii() -> None:
    """From LARGE_TEXT_BYTES, ASCII bytes are text read a window at a time (LargeText);
    other UTF-8 is decoded as before, and a NUL still makes them binary."""
    ascii_text = b"[1, 2]" + b" " * LARGE_TEXT_BYTES
    data, text = ToolResult("c", "t", ascii_text).payload()
    assert data is ascii_text and isinstance(text, LargeText)
    assert (len(text), text[:6], text[-1:], str(text)) == (len(data), "[1, 2]", " ", data.decode())
    accented = "é".encode() * LARGE_TEXT_BYTES
    assert ToolResult("c", "t", accented).payload() == (accented, accented.decode())
    assert ToolResult("c", "t", ascii_text + b"\x00").payload()[1] is None
    small = b"[1, 2]"
    assert ToolResult("c", "t", small).payload() == (small, "[1, 2]")


contents = st.one_of(
    st.integers(min_value=0, max_value=120).map(words),
    st.integers(min_value=0, max_value=60).map(lambda n: words(n, "中文")),
    st.sampled_from(["", "ok", words(40), words(40)]),  # repeats make ties
    st.binary(max_size=20).filter(lambda b: b[:1] == b"\xff"),
    st.text(max_size=200),
)
steps = st.lists(st.tuples(contents, st.booleans(), st.booleans()), max_size=8).map(
    lambda items: [
        ToolResult(f"c{i}", "tool", content, is_error=is_error, offloadable=offloadable)
        for i, (content, is_error, offloadable) in enumerate(items)
    ]
)


# Step contents stay under 150 tokens (fast examples), so the notice bound is drawn small
# too: with the default 400 no result here could ever be offloaded by the aggregate rule.
notice_bounds = st.integers(min_value=1, max_value=60)


@settings(max_examples=200, deadline=None)
@given(
    results=steps,
    per_call=st.integers(min_value=1, max_value=150),
    aggregate=st.integers(min_value=1, max_value=500),
    notice_max=notice_bounds,
)
def test_gate_invariants_hold_for_any_step(
    results: list[ToolResult], per_call: int, aggregate: int, notice_max: int
) -> None:
    policy = Policy(
        per_call_tokens=per_call, aggregate_tokens=aggregate, notice_max_tokens=notice_max
    )
    decisions, _ = gate(results, policy)
    check_invariants(results, decisions, policy, default_counter())


@settings(max_examples=150, deadline=None)
@given(results=steps, fraction=st.floats(min_value=0.05, max_value=1.1), notice_max=notice_bounds)
def test_gate_invariants_hold_when_the_aggregate_cuts_into_the_step(
    results: list[ToolResult], fraction: float, notice_max: int
) -> None:
    # An aggregate threshold as a fraction of the step's size: mostly partial offloads.
    counter = default_counter()
    texts = [text for _, text in (r.payload() for r in results) if text is not None]
    policy = Policy(
        per_call_tokens=150,
        aggregate_tokens=max(1, int(fraction * sum(counter.count(t) for t in texts))),
        notice_max_tokens=notice_max,
    )
    decisions, _ = gate(results, policy)
    check_invariants(results, decisions, policy, counter)


@settings(max_examples=100, deadline=None)
@given(results=steps, aggregate=st.integers(min_value=1, max_value=500))
def test_same_step_gives_the_same_decisions(results: list[ToolResult], aggregate: int) -> None:
    policy = Policy(per_call_tokens=100, aggregate_tokens=aggregate)
    first, _ = gate(results, policy)
    second, _ = gate(list(results), policy)
    assert [(d.text, d.reason, d.inline_tokens) for d in first] == [
        (d.text, d.reason, d.inline_tokens) for d in second
    ]


def test_the_dynamic_per_call_limit_is_a_share_of_what_remains() -> None:
    policy = Policy(per_call_share=0.3)
    result = ToolResult("c1", "t", words(2_000))
    for remaining in (None, 100_000):  # none said, or 30% of it above the fixed 6,000
        decisions = admit([result], policy, default_counter(), FakeStore(), remaining)
        assert decisions[0].reason is None, remaining
    decisions = admit([result], policy, default_counter(), store := FakeStore(), 4_000)
    assert decisions[0].reason == "per_call"
    [request] = store.calls
    assert request.per_call == PerCallLimit(1_200, 0.3, 4_000)
    assert request.per_call.describe() == (
        "1200-token dynamic per-call limit: 30% of the 4000 tokens left for tool results"
    )
    # Nothing left: results no larger than a notice still stay, offloading them saves nothing.
    small = ToolResult("c2", "t", words(policy.notice_max_tokens - 10))
    assert admit([small], policy, default_counter(), FakeStore(), 0)[0].reason is None
    assert PerCallLimit.of(policy, 0).tokens == policy.notice_max_tokens
    # Without a share, what remains changes nothing.
    assert PerCallLimit.of(Policy(), 10) == PerCallLimit(Policy().per_call_tokens)


@pytest.mark.parametrize("share", [0, -0.1, 1.5, True, "0.3"])
def test_a_per_call_share_outside_0_to_1_is_refused_naming_it(share: object) -> None:
    with pytest.raises(ConfigError, match="per_call_share must be a share above 0"):
        Policy(per_call_share=share)  # type: ignore[arg-type]
