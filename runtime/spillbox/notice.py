"""The notice: what the model reads in place of an offloaded result.

One stable, line-oriented format everywhere, so the model learns it and code can parse
it back (parse_notice). Values that could hold anything (previews, keys, the records path,
an id that is not printable) are JSON-quoted and cut, and a hint that is not one line is
left out, so no payload can break a line, forge a field or push the notice past its
bound. Example:

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
from dataclasses import dataclass, replace

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
"""Tool names and call ids are shown up to this many characters; a notice over its bound
with nothing else left to take away shows less."""
MAX_PATH_CHARS = 4096
"""The path (and the digest) are shown whole up to Linux's PATH_MAX (a host path, with
sandbox="none", is as long as the home's), and cut only after the ids."""
MAX_REASON_CHARS = 160
"""The reason, the shape and the records' count, in spillbox's own words, are cut only
past this."""
MAX_HINT_CHARS = 1_000
"""A hint longer than this is left out: it would take most of the notice's bound (and
costs a count of all its tokens each time the notice is shrunk to fit)."""
BINARY_HEAD_BYTES = 16

_REASONS = {
    "per_call": "over the {per_call}",
    "aggregate": "the step was over the {aggregate}-token limit; largest offloaded first",
    "binary": "not text: not UTF-8, or holding a NUL",
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
            return f"{self.tool} {_quote(self.args)}"
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
    same_as: str | None = None
    """The earlier artifact that holds these very bytes, when it is another call's: a
    repeated result is stored once, and is read, queried and pinned by that artifact's id,
    not by its own call id."""


@dataclass(frozen=True)
class _Layout:
    """How much of the optional content one rendering shows."""

    keys: int
    preview: int
    hints: tuple[Hint, ...]
    records: bool
    id_chars: int
    path_chars: int


def render(
    facts: NoticeFacts, counter: TokenCounter, max_tokens: int, preview_chars: int
) -> tuple[str, int]:
    """The notice text and its tokens, within max_tokens whatever the payload held.

    Every value is made one line and cut where it goes into a line (_text, _quote). A
    hint that is not one line, or is over MAX_HINT_CHARS, is left out: cutting or
    escaping code would change what it runs. Then, until the notice fits: fewer keys,
    shorter previews, hints left out from the last (they come in the order to try
    them), no keys, previews or records, and last the tool and call id cut, then the
    path and digest, down to "…". Only a bound below that barest notice (123 tokens
    with 19-digit numbers and the dynamic limit's reason, cl100k) is not met.
    """
    hints = tuple(hint for hint in facts.hints if _is_hint_line(hint.line()))
    layout = _Layout(MAX_KEYS, preview_chars, hints, True, MAX_ID_CHARS, MAX_PATH_CHARS)
    while True:
        text = _render(facts, layout)
        tokens = counter.count(text)
        smaller = _smaller(layout)
        if tokens <= max_tokens or smaller is None:
            return text, tokens
        layout = smaller


def _smaller(layout: _Layout) -> _Layout | None:
    """The next layout to try, showing less; None when nothing is left to take away."""
    if layout.keys > 5:
        return replace(layout, keys=layout.keys // 2)
    if layout.preview > 10:
        return replace(layout, preview=layout.preview // 2)
    if layout.hints:
        return replace(layout, hints=layout.hints[:-1])
    if layout.keys or layout.preview or layout.records:
        return replace(layout, keys=0, preview=0, records=False)
    if layout.id_chars:
        return replace(layout, id_chars=layout.id_chars // 2)
    if layout.path_chars:
        return replace(layout, path_chars=layout.path_chars // 2)
    return None


def _render(facts: NoticeFacts, layout: _Layout) -> str:
    ids = layout.id_chars
    reason = _REASONS[facts.reason].format(
        per_call=facts.per_call_limit, aggregate=facts.aggregate_limit
    )
    lines = [
        OPEN,
        f"reason: {facts.reason} ({_text(reason, max(ids, MAX_REASON_CHARS))})",
        f"tool: {_text(facts.tool, ids)}",
        f"call_id: {_text(facts.call_id, ids)}",
        *_same_as(facts.same_as, ids),
        f"path: {_text(facts.path, layout.path_chars)}",
        f"bytes: {facts.size}",
        f"tokens: {facts.tokens.label() if facts.tokens else 'n/a (binary)'}",
        f"sha256: {_text(facts.sha256, layout.path_chars)}",
        *([] if facts.redactions is None else [f"redactions: {facts.redactions}"]),
        f"shape: {_text(describe(facts.shape), max(ids, MAX_REASON_CHARS))}",
    ]
    if facts.shape.keys and layout.keys:
        shown = [_cut(k, MAX_KEY_CHARS) for k in facts.shape.keys[: layout.keys]]
        more = len(facts.shape.keys) - len(shown)
        label = "columns" if facts.shape.kind == "csv" else "keys"
        suffix = f" (+{more} more)" if more else ""
        lines.append(f"{label}: {_quote(shown)}{suffix}")
    records = facts.shape.records if facts.shape.kind == "json_object" else None
    if records is not None and layout.records:
        path = tuple(_cut(key, MAX_KEY_CHARS) for key in records.path)
        lines.append(f"records: {path_text(path)}, {_text(_counted(records), MAX_REASON_CHARS)}")
    if facts.shape.kind == "binary":
        lines.append(f"head_hex: {facts.binary_head[:BINARY_HEAD_BYTES].hex()}")
    elif layout.preview:
        if facts.length <= 2 * layout.preview:
            head, tail = facts.start, ""
        else:
            head = cut_head(facts.start, layout.preview)
            tail = cut_tail(facts.end, layout.preview)
        lines.append(f"head: {_quote(head)}")
        if tail:
            lines.append(f"tail: {_quote(tail)}")
    lines.extend(f"hint: {hint.line()}" for hint in layout.hints)
    lines.append(CLOSE)
    return "\n".join(lines)


def _same_as(artifact_id: str | None, ids: int) -> list[str]:
    if artifact_id is None:
        return []
    said = "the same bytes as an earlier result, stored once: read, query and pin them by this id"
    return [f"same_as: {_text(artifact_id, ids)} ({said})"]


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


def _cut(value: str, max_chars: int) -> str:
    """At most max_chars characters of value, and "…" if that is not all of it."""
    return value if len(value) <= max_chars else cut_head(value, max_chars) + "…"


def _text(value: str, max_chars: int) -> str:
    """A short value as it goes into a line: cut, and JSON-quoted unless printable."""
    value = _cut(value, max_chars)
    return value if value.isprintable() else _quote(value)


_NOT_IN_A_LINE = regex.compile(r"[\p{Cc}\p{Zl}\p{Zp}\p{Cs}]")
"""What no line of a notice holds: the controls (among them \\n, \\r, \\v, \\f, NUL, the
separators \\x1c-\\x1e and U+0085 that str.splitlines and some readers end a line at),
U+2028 and U+2029, and lone surrogates (no UTF-8 encoder takes them)."""


def _is_hint_line(line: str) -> bool:
    return len(line) <= MAX_HINT_CHARS and _NOT_IN_A_LINE.search(line) is None


def _quote(value: object) -> str:
    """JSON for one line of the notice: readable unicode, but what JSON leaves raw of
    _NOT_IN_A_LINE (DEL, U+0085, U+2028, U+2029, lone surrogates) escaped as well."""
    text = json.dumps(value, ensure_ascii=False)
    return _NOT_IN_A_LINE.sub(lambda m: f"\\u{ord(m[0]):04x}", text)


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
