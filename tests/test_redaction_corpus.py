"""Recall and false positives of redaction, per kind, over tests/redaction_corpus.py.

Run with -s to see the table (it is also in the README's Retention section):

    pytest -s tests/test_redaction_corpus.py
"""

from __future__ import annotations

import json
from collections.abc import Mapping

import pytest

from redaction_corpus import KNOWN_FALSE_POSITIVES, KNOWN_MISSES, NEGATIVES, POSITIVES
from spillbox.redaction import redact

MIN_RECALL = 1.0
"""Every secret of the corpus is replaced: a miss here is a regression."""


def _recall_row(
    kind: str, corpus: Mapping[str, list[tuple[str, list[str]]]] = POSITIVES
) -> tuple[int, int]:
    """(secrets replaced, secrets) over one kind's samples; a sample with no secret
    listed counts as found if anything in it was replaced."""
    found = total = 0
    for text, secrets in corpus[kind]:
        clean, replaced = redact(text)
        if not secrets:
            total += 1
            found += replaced > 0
        for secret in secrets:
            total += 1
            found += secret not in clean and secret not in _parsed(clean)
    return found, total


def _parsed(text: str) -> str:
    """The strings a JSON parser reads in text, decoded (and those of JSON in them), or
    text itself: a secret written with escapes is not in the raw text to look for."""
    try:
        value = json.loads(text)
    except ValueError:
        return text
    found: list[str] = []
    stack = [value]
    while stack:
        item = stack.pop()
        if isinstance(item, dict):
            found += item
            stack += item.values()
        elif isinstance(item, list):
            stack += item
        elif isinstance(item, str):
            found += [item, _parsed(item)]
    return "\n".join(found)


def _false_positives(kind: str, corpus: Mapping[str, list[str]] = NEGATIVES) -> tuple[int, int]:
    """(replacements, texts) over the look-alikes of one kind."""
    replaced = sum(redact(text)[1] for text in corpus[kind])
    return replaced, len(corpus[kind])


def table() -> str:
    """The per-kind table, as printed and as in the README."""
    lines = ["| kind | samples | secrets replaced | recall |", "|---|---:|---:|---:|"]
    for kind in POSITIVES:
        found, total = _recall_row(kind)
        lines.append(f"| {kind} | {len(POSITIVES[kind])} | {found}/{total} | {found / total:.2f} |")
    for kind in KNOWN_MISSES:
        found, total = _recall_row(kind, KNOWN_MISSES)
        lines.append(
            f"| {kind} (known limit) | {len(KNOWN_MISSES[kind])} | {found}/{total} "
            f"| {found / total:.2f} |"
        )
    lines += ["", "| look-alike | texts | replacements (false positives) |", "|---|---:|---:|"]
    for kind in NEGATIVES:
        replaced, texts = _false_positives(kind)
        lines.append(f"| {kind} | {texts} | {replaced} |")
    for kind in KNOWN_FALSE_POSITIVES:
        replaced, texts = _false_positives(kind, KNOWN_FALSE_POSITIVES)
        lines.append(f"| {kind} (known limit) | {texts} | {replaced} |")
    return "\n".join(lines)


def test_the_corpus_has_two_samples_of_each_kind_at_least() -> None:
    assert all(len(samples) >= 2 for samples in POSITIVES.values())
    assert all(len(texts) >= 2 for texts in NEGATIVES.values())


@pytest.mark.parametrize("kind", list(POSITIVES))
def test_recall_per_kind(kind: str) -> None:
    found, total = _recall_row(kind)
    assert found / total >= MIN_RECALL, f"{kind}: {total - found} of {total} secrets left"


@pytest.mark.parametrize("kind", list(NEGATIVES))
def test_no_false_positive_on_look_alikes(kind: str) -> None:
    replaced, _ = _false_positives(kind)
    assert replaced == 0, [redact(text)[0][:300] for text in NEGATIVES[kind] if redact(text)[1]]


def test_print_the_table() -> None:
    print("\n" + table())
