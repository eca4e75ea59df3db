"""The notice: what the model reads in place of an offloaded result.

One stable, line-oriented format everywhere, so the model learns it and code can parse
it back (parse_notice). Values that could hold anything (previews, keys) are JSON-quoted,
so no payload can break a line or forge a field. Example:

    [spillbox offloaded v1]
    reason: per_call (over the 6000-token per-call limit)
    tool: list_prs
    call_id: c1
    path: /sandbox/offload/c1.json
    bytes: 1933450
    tokens: ~482130 (estimated)
    sha256: 3b1f...
    shape: JSON array of 500 objects
    keys: ["id", "title", "body", "state"]
    head: "[{\\"id\\": 1, \\"title\\": \\"Fix the ..."
    tail: "...\\"state\\": \\"open\\"}]"
    hint: sql: SELECT count(*) FROM "c1"
    [/spillbox]

A JSON object that wraps records (an API response: {"total_count": 2, "items": [...]})
also gets a `records:` line, the path of its largest array of objects and its length:
`records: data.search.nodes, about 27,000 objects`. read_artifact pages that path, and
the hints query it.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import regex

from spillbox.profile import path_text
from spillbox.tokens import TokenCounter
from spillbox.types import ArrayFacts, Shape, TokenCount

NOTICE_VERSION = 1
OPEN = f"[spillbox offloaded v{NOTICE_VERSION}]"
CLOSE = "[/spillbox]"

MAX_KEYS = 40
MAX_KEY_CHARS = 40
MAX_ID_CHARS = 128
"""Tool names and call ids are shown up to this many characters (the path names the file)."""
MIN_ID_CHARS = 16
BINARY_HEAD_BYTES = 16

_REASONS = {
    "per_call": "over the {per_call}",
    "aggregate": "the step was over the {aggregate}-token limit; largest offloaded first",
    "binary": "not UTF-8 text",
    "compaction": "an older tool result moved out of the conversation history",
    "output": "a file a script left in /sandbox/outputs",
}


@dataclass(frozen=True)
class Hint:
    """A ready-to-run inspection, one line: code in a code-mode language, or a tool call.

    Rendered as `hint: sql: SELECT ...` when the model runs code mode through the
    harness, or `hint: sandbox_exec {"lang": "sql", "code": "..."}` when spillbox's
    tools are registered (the arguments are the tool's JSON arguments, ready to send).
    """

    lang: str
    code: str
    tool: str | None = None
    args: Mapping[str, str] | None = None

    def line(self) -> str:
        if self.tool is not None:
            return f"{self.tool} {json.dumps(self.args, ensure_ascii=False)}"
        return f"{self.lang}: {self.code}"


@dataclass(frozen=True)
class NoticeFacts:
    """Everything a notice states about one offloaded result."""

    reason: str
    tool: str
    call_id: str
    path: str
    size: int
    tokens: TokenCount | None
    sha256: str
    shape: Shape
    start: str
    """The payload's first characters (at least twice the preview length), or "" if binary."""
    end: str
    """The payload's last characters, as many."""
    length: int
    """The payload's length in characters (0 if binary)."""
    binary_head: bytes = b""
    hints: Sequence[Hint] = ()
    per_call_limit: str = ""
    """The per-call limit that applied, as PerCallLimit.describe() says it."""
    aggregate_limit: int = 0
    redactions: int | None = None
    """Secrets replaced before storing, when the task's policy redacts (None: it does not)."""


def render(
    facts: NoticeFacts, counter: TokenCounter, max_tokens: int, preview_chars: int
) -> tuple[str, int]:
    """The notice text and its tokens, shrunk (fewer keys, shorter previews, then shorter
    ids) until it fits max_tokens."""
    keys_shown, chars, id_chars = MAX_KEYS, preview_chars, MAX_ID_CHARS
    while True:
        text = _render(facts, keys_shown, chars, id_chars)
        tokens = counter.count(text)
        if tokens <= max_tokens or id_chars <= MIN_ID_CHARS:
            return text, tokens
        if keys_shown > 5:
            keys_shown //= 2
        elif chars > 10:
            chars //= 2
        elif keys_shown or chars:
            keys_shown, chars = 0, 0
        else:
            # Only a huge tool name or call id can still be over: they come from the
            # caller, not the payload, but must not break the bound either.
            id_chars //= 2


def _render(facts: NoticeFacts, keys_shown: int, preview_chars: int, id_chars: int) -> str:
    reason = _REASONS[facts.reason].format(
        per_call=facts.per_call_limit, aggregate=facts.aggregate_limit
    )
    lines = [
        OPEN,
        f"reason: {facts.reason} ({reason})",
        f"tool: {_one_line(facts.tool, id_chars)}",
        f"call_id: {_one_line(facts.call_id, id_chars)}",
        f"path: {facts.path}",
        f"bytes: {facts.size}",
        f"tokens: {facts.tokens.label() if facts.tokens else 'n/a (binary)'}",
        f"sha256: {facts.sha256}",
        *([] if facts.redactions is None else [f"redactions: {facts.redactions}"]),
        f"shape: {describe(facts.shape)}",
    ]
    if facts.shape.keys and keys_shown:
        shown = [cut_head(k, MAX_KEY_CHARS) for k in facts.shape.keys[:keys_shown]]
        more = len(facts.shape.keys) - len(shown)
        label = "columns" if facts.shape.kind == "csv" else "keys"
        suffix = f" (+{more} more)" if more else ""
        lines.append(f"{label}: {_quote(shown)}{suffix}")
    records = facts.shape.records if facts.shape.kind == "json_object" else None
    if records is not None and (keys_shown or preview_chars):
        lines.append(f"records: {path_text(records.path)}, {_counted(records)}")
    if facts.shape.kind == "binary":
        lines.append(f"head_hex: {facts.binary_head[:BINARY_HEAD_BYTES].hex()}")
    elif preview_chars:
        if facts.length <= 2 * preview_chars:
            head, tail = facts.start, ""
        else:
            head, tail = cut_head(facts.start, preview_chars), cut_tail(facts.end, preview_chars)
        lines.append(f"head: {_quote(head)}")
        if tail:
            lines.append(f"tail: {_quote(tail)}")
    lines.extend(f"hint: {hint.line()}" for hint in facts.hints)
    lines.append(CLOSE)
    return "\n".join(lines)


def _counted(facts: ArrayFacts) -> str:
    if facts.count is None:
        return f"{facts.element or 'elements'} (count unknown)"
    return f"{'' if facts.count_exact else 'about '}{facts.count:,} {facts.element or 'elements'}"


def describe(shape: Shape) -> str:
    """One line: what the payload is, e.g. "JSON array of 500 objects"."""
    count = "" if shape.count is None else f"{'' if shape.count_exact else 'about '}{shape.count:,}"
    match shape.kind:
        case "json_array":
            whole = ArrayFacts((), shape.count, shape.count_exact, shape.element)
            return f"JSON array of {_counted(whole)}"
        case "json_object":
            if len(shape.keys) == 1 and shape.count_exact:
                return "JSON object with 1 key"
            return f"JSON object with {len(shape.keys)}{'' if shape.count_exact else '+'} keys"
        case "json_scalar":
            return "JSON scalar"
        case "ndjson":
            return f"NDJSON, {count} records"
        case "csv":
            return f"CSV, {count} rows, {len(shape.keys)} columns"
        case "text":
            return f"text, {count} lines"
        case "binary":
            return f"binary ({shape.mime or 'unknown type'})"


_GRAPHEME = regex.compile(r"\X")
"""One user-perceived character: a base with its marks, an emoji ZWJ sequence or skin
tone, a flag (a pair of regional indicators), a Hangul syllable in jamo, CR LF."""


def cut_head(text: str, chars: int) -> str:
    """At most `chars` characters from the start, never splitting a grapheme cluster."""
    if len(text) <= chars:
        return text
    if text[: chars + 1].isascii():  # the common case, fast: only CR LF is a pair
        return text[: chars - 1] if text[chars - 1 : chars + 1] == "\r\n" else text[:chars]
    end = 0
    for cluster in _GRAPHEME.finditer(text):
        if cluster.end() > chars:
            break
        end = cluster.end()
    return text[:end]


def cut_tail(text: str, chars: int) -> str:
    """At most `chars` characters from the end, never starting inside a grapheme cluster.

    Clusters are found from the start of text (a flag's pairing depends on what precedes
    it), so text should be a short window, as the previews are.
    """
    if len(text) <= chars:
        return text
    first = len(text) - chars
    if text[first - 1 :].isascii():  # the common case, fast: only CR LF is a pair
        return text[first + 1 :] if text[first - 1 : first + 1] == "\r\n" else text[first:]
    for cluster in _GRAPHEME.finditer(text):
        if cluster.start() >= first:
            return text[cluster.start() :]
    return ""


def _one_line(value: str, max_chars: int) -> str:
    if len(value) > max_chars:
        value = cut_head(value, max_chars) + "…"
    return value if value.isprintable() else _quote(value)


# JSON leaves these raw, but they end a line for str.splitlines (and for some readers),
# so a payload holding one could split a field in two or forge the next.
_LINE_BREAKS_JSON_KEEPS = str.maketrans(
    {"\x85": "\\u0085", "\u2028": "\\u2028", "\u2029": "\\u2029"}
)


def _quote(value: object) -> str:
    """JSON for one line of the notice: readable unicode, but never a line break."""
    return json.dumps(value, ensure_ascii=False).translate(_LINE_BREAKS_JSON_KEEPS)


def parse_notice(text: str) -> dict[str, str] | None:
    """The fields of a notice (hints as "hint" lines joined by newlines), or None if none.

    >>> parse_notice(OPEN + "\\nbytes: 5\\n" + CLOSE)["bytes"]
    '5'
    """
    lines = text.strip().splitlines()
    if not lines or lines[0] != OPEN or lines[-1] != CLOSE:
        return None
    fields: dict[str, str] = {}
    for line in lines[1:-1]:
        key, _, value = line.partition(": ")
        fields[key] = f"{fields[key]}\n{value}" if key in fields else value
    return fields
