"""search_artifacts: find text in a task's history and text artifacts, without code mode.

A store-only task (sandbox="none") has no SQL or grep; paging alone would read a history
from its first line. search() matches a query's words, case-insensitively, line by line
(an NDJSON or history line is one record), and returns short snippets with where they
are, ranked by how often the words occur:

    body = search(task, "timeout page 7", top_k=5, budget=4_000)
    body["results"][0]   # {"artifact_id": ..., "line": 12, "offset": 310, "snippet": ...}

The work is bounded (MAX_SCAN_BYTES read, MAX_LINE_SCAN_CHARS of a line looked at) and so
is the answer: at most top_k snippets of SNIPPET_CHARS, within the token budget given (the
per-call limit, as read_artifact's pages); what was left unsearched is said, not hidden.
"""

from __future__ import annotations

import heapq
import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from spillbox.errors import ConfigError

if TYPE_CHECKING:
    from spillbox.protocols import TaskHandle
    from spillbox.types import ArtifactRow

DEFAULT_TOP_K = 10
MAX_TOP_K = 50
SNIPPET_CHARS = 240
"""A snippet's length: the first match with the text around it."""
MAX_SCAN_BYTES = 64 * 1024 * 1024
"""Bytes read per search, over all artifacts; past it the rest is named as not searched."""
MAX_LINE_SCAN_CHARS = 1_000_000
"""Characters of one line looked at: a single huge line (compact JSON) is searched this far."""
MAX_QUERY_CHARS = 500
SEARCHED_KINDS = ("text", "ndjson", "json_array", "json_object", "json_scalar", "csv")
"""Shape kinds searched as text (binary artifacts are not)."""


@dataclass(frozen=True, order=True)
class _Hit:
    """A matching line; ordered worst first (fewer matches, older artifact, later line)."""

    score: int
    newness: int
    """Minus the artifact's place from the newest: the newest is 0."""
    before: int
    """Minus the line number: an earlier line ranks higher."""
    at: int
    """Minus the offset."""
    row: ArtifactRow = field(compare=False)
    snippet: str = field(compare=False)


def search(
    task: TaskHandle,
    query: str,
    top_k: int | None = None,
    artifact: str | None = None,
    budget: int | None = None,
) -> dict[str, Any]:
    """The lines of the task's text artifacts (or of one, by reference) that hold every
    word of query, best first: how often the words occur, then the newest artifact, then
    the earliest line. budget: the most tokens the answer may take (None: no bound)."""
    words = _words(query)
    top = DEFAULT_TOP_K if top_k is None else top_k
    if isinstance(top, bool) or not isinstance(top, int) or not 1 <= top <= MAX_TOP_K:
        raise ConfigError(f"top_k must be a whole number from 1 to {MAX_TOP_K}, got {top_k!r}")
    rows = [task.artifact(artifact)] if artifact else task.artifacts()
    rows = [r for r in rows if (r.kind or "text") in SEARCHED_KINDS]
    best: list[_Hit] = []  # a heap of the top hits so far, the worst on top
    matched = 0
    skipped: list[str] = []
    scanned = 0
    for order, row in enumerate(reversed(rows)):  # the newest first
        if scanned + row.bytes > MAX_SCAN_BYTES:
            skipped.append(row.artifact_id)
            continue
        scanned += row.bytes
        text = task.read(row, actor="search_artifacts").decode("utf-8", "replace")
        for hit in _matches(row, order, text, words):
            matched += 1
            heapq.heappush(best, hit)
            if len(best) > top:
                heapq.heappop(best)
    hits = sorted(best, reverse=True)
    body: dict[str, Any] = {"query": query, "matched_lines": matched, "results": []}
    if skipped:
        body["not_searched"] = {
            "artifacts": skipped,
            "why": f"over the {MAX_SCAN_BYTES:,}-byte bound of one search: name one with artifact",
        }
    for hit in hits:
        body["results"].append(
            {
                "artifact_id": hit.row.artifact_id,
                "path": hit.row.path,
                "tool": hit.row.tool,
                "line": -hit.before,
                "offset": -hit.at,
                "snippet": hit.snippet,
            }
        )
        if budget is not None and task.counter.count(_text(body)) > budget:
            body["results"].pop()
            break
    body["shown"] = len(body["results"])
    body["more"] = matched > body["shown"]
    return body


def _text(body: dict[str, Any]) -> str:
    return json.dumps(body, ensure_ascii=False)


def _words(query: object) -> list[str]:
    if not isinstance(query, str) or not query.strip():
        raise ConfigError("query must be a non-empty string: the words to find")
    if len(query) > MAX_QUERY_CHARS:
        raise ConfigError(f"query is {len(query):,} characters: at most {MAX_QUERY_CHARS}")
    return list(dict.fromkeys(w.casefold() for w in query.split()))


def _matches(row: ArtifactRow, order: int, text: str, words: list[str]) -> Iterator[_Hit]:
    # Lines end at "\n" alone, as in NDJSON and read_artifact's pages: str.splitlines would
    # also break at U+2028, U+0085 and the like, which JSON leaves raw inside a record.
    for number, line in enumerate(text.removesuffix("\n").split("\n")):
        line = line.removesuffix("\r")
        folded = line[:MAX_LINE_SCAN_CHARS].casefold()
        if not all(w in folded for w in words):
            continue
        # casefold keeps lengths for nearly all text; a rare change of length only shifts
        # the snippet, whose offset is then approximate.
        first = min(folded.index(w) for w in words)
        start = max(first - SNIPPET_CHARS // 4, 0)
        snippet = line[start : start + SNIPPET_CHARS]
        score = sum(folded.count(w) for w in words)
        yield _Hit(score, -order, -number, -first, row, snippet)
