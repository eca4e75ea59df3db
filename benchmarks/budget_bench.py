"""Budget benchmark: checking a long conversation after one new message.

A 500-message, ~150k-token Chat Completions conversation (a system prompt, a task, then
assistant turns with tool calls and their results, each different) is checked once whole
(the first count: every text is counted), then one new 1 KB message is appended and the
conversation checked again. The second check counts only the new message; every other
text is found in the budget's cache by its content. Medians of fresh runs:

- first count: Budget.check of the whole conversation with an empty cache;
- full recount floor: tiktoken's count of every message's text, what a check that keeps
  nothing pays each time;
- incremental: Budget.check after one new 1 KB message (the cache warm), for ten
  different new messages after each first count.

Target (issue 11): the incremental check under 2 ms; the first count beside it.

    python benchmarks/budget_bench.py           # full run, a few seconds
    python benchmarks/budget_bench.py --quick   # a smoke run
"""

from __future__ import annotations

import json
import random
import sys
from typing import Any

import common
from common import Target
from spillbox.budget import Budget
from spillbox.tokens import default_counter

MESSAGES = 500
TOKENS = 150_000
NEW_MESSAGE_BYTES = 1_024
NEW_MESSAGES_PER_RUN = 10
TARGET_MS = 2.0

_WORDS = (
    "the build failed in step seven because the cache key changed after the dependency "
    "bump so the worker fetched a stale artifact and the retry loop gave up after three "
    "attempts; logs show a timeout in the uploader 2024-05-01T12:00:00Z id=4821 ok"
).split()


def conversation(messages: int, tokens: int, seed: int = 0) -> list[dict[str, Any]]:
    """A chat history of about `tokens` tokens in `messages` messages, every text unique."""
    rng = random.Random(seed)
    per_message_words = max(1, int(tokens / messages / 1.45))  # ~1.45 tokens a word
    history: list[dict[str, Any]] = [
        {"role": "system", "content": "You are a careful build engineer."},
        {"role": "user", "content": "Find why the nightly build fails."},
    ]
    while len(history) < messages:
        n = len(history)
        text = f"[{n}] " + " ".join(rng.choices(_WORDS, k=per_message_words))
        if n % 2 == 0:
            call = {
                "id": f"call_{n}",
                "type": "function",
                "function": {"name": "logs", "arguments": json.dumps({"step": n})},
            }
            history.append({"role": "assistant", "content": text, "tool_calls": [call]})
        else:
            history.append({"role": "tool", "tool_call_id": f"call_{n - 1}", "content": text})
    return history


def new_message(size: int, seed: int) -> dict[str, Any]:
    rng = random.Random(seed)
    text = ""
    while len(text) < size:
        text += rng.choice(_WORDS) + " "
    return {"role": "user", "content": text[:size]}


def run(quick: bool = False) -> dict[str, Any]:
    runs = 3 if quick else 7
    window = 400_000
    history = conversation(MESSAGES, TOKENS)
    counter = default_counter()
    first_ms, incremental_ms, floor_ms, used = [], [], [], 0
    for i in range(runs):
        budget = Budget(window=window)  # a fresh cache each run
        seconds, report = common.timed(
            lambda b=budget: b.check({"messages": history}, provider="chat_completions")
        )
        first_ms.append(seconds)
        used = report.input_tokens
        for j in range(NEW_MESSAGES_PER_RUN):  # each a different message after the same 500
            grown = [*history, new_message(NEW_MESSAGE_BYTES, seed=i * 100 + j)]
            seconds, _ = common.timed(
                lambda b=budget, g=grown: b.check({"messages": g}, provider="chat_completions")
            )
            incremental_ms.append(seconds)
        texts = [str(m.get("content") or "") for m in grown]
        floor_ms.append(common.timed(lambda t=texts: sum(counter.count(x) for x in t))[0])
    return {
        "messages": MESSAGES,
        "tokens": used,
        "first_ms": common.median_ms(first_ms),
        "incremental_ms": common.median_ms(incremental_ms),
        "floor_ms": common.median_ms(floor_ms),
        "runs": runs,
    }


def markdown(results: dict[str, Any]) -> str:
    r = results
    return "\n".join(
        [
            "| conversation | first count | full recount floor | after one new 1 KB message "
            "| incremental / first |",
            "|---|---|---|---|---|",
            f"| {r['messages']} messages, {r['tokens']:,} tokens | {r['first_ms']:.1f} ms "
            f"| {r['floor_ms']:.1f} ms | {r['incremental_ms']:.2f} ms "
            f"| {r['incremental_ms'] / r['first_ms']:.4f} |",
            "",
            f"Medians of {r['runs']} runs, each with a fresh budget (an empty cache), and of "
            f"{NEW_MESSAGES_PER_RUN} different new messages after each first count. The "
            "full recount floor is tiktoken counting every message's text again, what a "
            "check that remembers nothing pays on every model call.",
        ]
    )


def targets(results: dict[str, Any]) -> list[Target]:
    r = results
    return [
        Target(
            goal=f"a budget check after one new 1 KB message in a {r['messages']}-message, "
            f"~150k-token conversation under {TARGET_MS:g} ms",
            met=r["incremental_ms"] < TARGET_MS,
            measured=f"{r['incremental_ms'] / r['first_ms']:.4f} of the first count: "
            f"{r['incremental_ms']:.2f} ms against {r['first_ms']:.1f} ms",
        )
    ]


if __name__ == "__main__":
    raise SystemExit(common.bench_main(run, markdown, targets, sys.argv[1:]))
