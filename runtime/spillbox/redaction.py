"""Redaction: secrets replaced by `[REDACTED:<kind>]` before a payload is stored.

    result = redact_payload(b'{"user": "ann", "db_password": "hunter2!"}')
    result.data      # b'{"user": "ann", "db_password": "[REDACTED:password]"}'
    result.counts    # {"password": 1}

Two sources of rules, run in one pass:

- **provider rules**: gitleaks' own rules, shipped as data (redaction_rules/gitleaks.toml,
  MIT, with its licence file): AWS, GCP, Azure, Stripe, GitHub, GitLab, Bitbucket, Slack,
  Discord, Telegram, OpenAI, Anthropic, Hugging Face, npm, PyPI, private keys, JWTs, ...
  Each rule's secret (its first group) is replaced, kind = the rule's id.
- **field rules** (below): credentials inside URLs, Authorization headers, and values of
  secret-named fields (`*secret*`, `*password*`, `*token*`, `*api_key*`, `*private_key*`,
  ... in any case or separator) in JSON, NDJSON, YAML, .env, logs and CSV. In JSON a
  secret-named key's whole value is replaced whatever its format (a number or an object
  becomes the string "[REDACTED:<kind>]"), so the document stays valid; in CSV every
  value of a secret-named column is replaced.

What a JSON parser reads, not only the bytes: every JSON string that holds an escape
(`\\u0077`, `\\/`, `\\"`, `\\n`) is decoded and its text runs through the same rules, so
`ghp_\\u0041...`, a key `"pass\\u0077ord"`, `\\u0026access_token\\u003d...` in a URL and JSON
nested in strings (to MAX_NESTING strings deep) are found. A secret found in decoded text
is replaced in the escaped bytes, whole escapes at a time, so the document still parses.
Payloads that are not text are scanned as the bytes they are.

Speed: one Hyperscan pass over the bytes finds every place a rule could match (gitleaks'
keywords, as gitleaks does with Aho-Corasick); the rules' regexes then run only around
those places. A 40 MB payload takes a few tens of milliseconds more than the scan itself
when it holds few candidates (benchmarks/gate_bench.py reports it against the store floor).
A JSON string with escapes is decoded only when it holds a candidate place or an escape
that could hide one, and then whole (json, in C).
"""

from __future__ import annotations

import base64
import binascii
import csv
import io
import json
import math
import re
import threading
import tomllib
from bisect import bisect_right
from collections import Counter
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from functools import cache
from pathlib import Path

import hyperscan

from spillbox import metrics

RULES_FILES = (
    Path(__file__).parent / "redaction_rules" / "gitleaks.toml",
    Path(__file__).parent / "redaction_rules" / "spillbox.toml",
)
"""gitleaks' rules (a subset, verbatim, MIT), then spillbox's own in the same format."""
MARK = b"[REDACTED:"
WINDOW = 1024
"""How far (bytes) around a candidate place a provider rule's regex looks."""
PRIVATE_KEY_WINDOW = 64 * 1024
KEY_CHARS = 100
"""Longest field name a field rule looks back over from its keyword."""
MAX_NESTING = 16
"""JSON strings decoded inside JSON strings, at most. Each level doubles the backslashes
before a quote, so a string this deep has 65,535 of them before each of its quotes: only a
crafted payload goes further. A string that still holds escapes at this depth is replaced
whole (kind NESTED_KIND), never passed on unread."""
NESTED_KIND = "nested_too_deep"

# Field names that hold secrets: any case, any separator, anywhere in the name.
_SECRET_WORDS = (
    rb"secret|passw(?:or)?d|passphrase|pwd|token|api[_.\- ]?key|apikey|private[_.\- ]?key"
    rb"|access[_.\- ]?key|account[_.\- ]?key|credential|auth[_.\- ]?key|client[_.\- ]?secret"
    rb"|session[_.\- ]?id"
)
_SECRET_NAME = re.compile(rb"(?i)" + _SECRET_WORDS)
# Names that contain a secret word but name a count, a kind or a place, not a secret:
# the model needs `usage.total_tokens`, and a token's type or URL is no credential.
_NOT_SECRET_NAME = re.compile(
    rb"(?i)(?:tokens|tokeni[sz]er|[_.\- ]?(?:type|count|counts|limit|length|size|name|url"
    rb"|uri|endpoint|expires?_?(?:in|at)?|expiry|expiration|ttl|file|path|format))$"
)
_KIND_BY_NAME: tuple[tuple[re.Pattern[bytes], str], ...] = (
    (re.compile(rb"(?i)secret[_.\- ]?access[_.\- ]?key"), "aws_secret_access_key"),
    (re.compile(rb"(?i)private[_.\- ]?key"), "private_key"),
    (re.compile(rb"(?i)passw(?:or)?d|passphrase|pwd"), "password"),
    (re.compile(rb"(?i)api[_.\- ]?key|apikey"), "api_key"),
    (re.compile(rb"(?i)client[_.\- ]?secret"), "client_secret"),
    (re.compile(rb"(?i)token"), "token"),
    (re.compile(rb"(?i)(?:access|account|auth)[_.\- ]?key"), "access_key"),
    (re.compile(rb"(?i)credential"), "credential"),
    (re.compile(rb"(?i)session"), "session_id"),
)

# "name": value, with the name ending at the keyword's place. A name with escapes is
# read decoded (_escaped_key_spans); JSON nested in a string is read in its decoded text.
_JSON_KEY = re.compile(rb'"([^"\\\n]{0,%d})"\s*:\s*' % KEY_CHARS)
_JSON_STRING = re.compile(rb'"(?:[^"\\]|\\.)*"', re.DOTALL)
# One escape: a surrogate pair (one character), \uXXXX, one JSON knows, or any other.
_ESCAPE = re.compile(
    rb"\\(?:u([dD][89abAB][0-9a-fA-F]{2})\\u([dD][c-fC-F][0-9a-fA-F]{2})"
    rb"|u([0-9a-fA-F]{4})|([\"\\/bfnrt])|[^\n])"
)
_ESCAPED_CHAR = {
    b'"': b'"', b"\\": b"\\", b"/": b"/", b"b": b"\b", b"f": b"\f", b"n": b"\n", b"r": b"\r",
    b"t": b"\t",
}  # fmt: skip
_BARE_QUOTE = re.compile(rb'"(?<!\\")')
"""A quote with no backslash before it (as a lookbehind after the quote: found in C)."""
# A quote, then (reversed) a byte that comes before a JSON string or a quoted log value.
_REVERSED_OPENING = re.compile(rb'"[:,\[{ \n\t\r=(>]')
_KEY_COLON = re.compile(rb"[ \t\r\n]*:[ \t\r\n]*")
_JSON_NUMBER = re.compile(rb"-?\d+(?:\.\d+)?(?:[eE][+-]?\d+)?")
_JSON_TOKEN = re.compile(rb'"(?:[^"\\]|\\.)*"|[\[\]{}]', re.DOTALL)
# name=value / name: value outside JSON: .env and YAML lines, logs, query strings,
# connection strings (Password=...;), command lines (--password value is not covered).
_ASSIGNMENT = re.compile(
    rb"(?i)(?<![A-Za-z0-9_.\-])([A-Za-z0-9_.\-]{1,%d})['\"]?[ \t]*(?:=|:)[ \t]*" % KEY_CHARS
)
# A NUL ends a value too: in bytes that are not text it is the usual end of a string.
_ASSIGNED_VALUE = re.compile(rb""""([^"\r\n]*)"|'([^'\r\n]*)'|([^\s"'&;,<>`{}\[\]\x00]+)""")
# gitleaks ends most secrets at a quote, a space, a semicolon or a line's end; in logs and
# prose a secret is as often followed by "." or ")" or "&": any non-token byte ends it.
_GITLEAKS_END = r"""(?:[\x60'"\s;]|\\[nr]|$)"""
_TOKEN_END = r"(?![A-Za-z0-9_\-])"
_URL_CREDENTIALS = re.compile(
    rb"(?i)\b[a-z][a-z0-9+.\-]{1,20}://[^\s:/@\"'<>]{0,256}:([^\s/@\"'<>]{1,256})@"
)
_AUTHORIZATION = re.compile(
    rb"(?i)\b(?:proxy-)?authori[sz]ation['\"]?\s*[:=]\s*['\"]?"
    rb"(bearer|basic|token|digest|negotiate|ntlm|apikey)?\s*([^\s\"'\\,;]{6,})"
)
_BEARER = re.compile(rb"(?i)\bbearer\s+([A-Za-z0-9._~+/=\-]{16,})")
_BASIC = re.compile(rb"\bBasic\s+([A-Za-z0-9+/]{8,}={0,2})")

_NOT_VALUES = (b"null", b"true", b"false", b"None", b"|", b">", b"|-", b">-", b"|+", b">+")
"""Left as they are: no secret (null, booleans), or a YAML block whose value is on the
following lines (not covered)."""

FIELD_KEYWORDS = (
    "secret", "passw", "passphrase", "pwd", "token", "api_key", "api-key", "apikey",
    "api key", "api.key", "private_key", "private-key", "privatekey", "private key",
    "access_key", "access-key", "accesskey", "account_key", "accountkey", "credential",
    "auth_key", "authkey",
    "session_id", "sessionid",
)  # fmt: skip
"""The Hyperscan keywords of the field rules: each is part of some secret-named field."""


@dataclass(frozen=True)
class Rule:
    """One provider rule: its regex runs around each place one of its triggers matched."""

    kind: str
    pattern: re.Pattern[bytes]
    triggers: tuple[str, ...]
    """Hyperscan expressions, matched case-insensitively (escaped keywords by default)."""
    entropy: float = 0.0
    """The secret's least Shannon entropy (bits per byte), as gitleaks checks it."""
    window: int = WINDOW


@dataclass(frozen=True)
class Redaction:
    """What redaction made of one payload."""

    data: bytes
    counts: Mapping[str, int] = field(default_factory=dict)
    """Replacements per kind."""
    scanned: bool = True
    """False for a payload kept as it came, unscanned (logged so). redact_payload scans
    every payload, text or not, so only a caller that skips it makes one."""

    @property
    def count(self) -> int:
        return sum(self.counts.values())

    def audit_detail(self, call_id: str | None = None) -> str:
        """The access log's record of it: replacements per kind, never a secret (and the
        call it was in, for a result that stayed in context and so has no artifact).

        >>> Redaction(b"", {"github_pat": 2}).audit_detail()
        '{"replaced": 2, "kinds": {"github_pat": 2}}'
        """
        record: dict[str, object] = {
            "replaced": self.count,
            "kinds": dict(sorted(self.counts.items())),
        }
        if call_id is not None:
            record["call_id"] = call_id
        if not self.scanned:
            record["scanned"] = "no"
        return json.dumps(record)


@dataclass(order=True)
class _Span:
    start: int
    end: int
    kind: str = field(compare=False)
    rank: int = field(default=0, compare=False)
    """Of spans at one place the lowest rank wins: provider rules (0), JSON fields (1),
    other fields (2), URLs and headers (3)."""
    quote: bool = field(default=False, compare=False)
    """Replace with a JSON string (quotes included): the span was a non-string value."""
    escape: int = field(default=0, compare=False)
    """How many JSON strings the span was found inside: its quotes are escaped as often."""


def redact_payload(data: bytes) -> Redaction:
    """The payload with every secret found replaced, and how many of each kind: text or
    not (a payload that is not UTF-8, or holds a NUL, is scanned as the bytes it is)."""
    data, counts = _apply(data, _find(data, 0))
    csv_data, csv_counts = _redact_csv_columns(data)
    if csv_counts:
        data = csv_data
        counts.update(csv_counts)
    metrics.redacted(counts)
    return Redaction(data, dict(counts))


def redact(text: str) -> tuple[str, int]:
    """The text with every secret replaced, and how many were.

    >>> redact("key AKIAABCDEFGHIJKLMNOP here")
    ('key [REDACTED:aws_access_token] here', 1)
    """
    result = redact_payload(text.encode("utf-8"))
    return result.data.decode("utf-8"), result.count


def kinds() -> list[str]:
    """Every kind a replacement can name: the provider rules' and the field rules'."""
    names = [rule.kind for rule in _engine().rules]
    names += [kind for _, kind in _KIND_BY_NAME]
    names += ["secret", "url_password", "authorization", "bearer_token", "basic_auth"]
    names.append(NESTED_KIND)
    return sorted(set(names))


# Finding


class _Engine:
    """The compiled rules and one Hyperscan database of every trigger."""

    def __init__(self, rules: list[Rule]) -> None:
        self.rules = rules
        expressions: list[bytes] = []
        self.owners: list[int | None] = []  # the rule's index; None: a field keyword
        for index, rule in enumerate(rules):
            for trigger in rule.triggers:
                expressions.append(trigger.encode())
                self.owners.append(index)
        for keyword in FIELD_KEYWORDS:
            expressions.append(re.escape(keyword).encode())
            self.owners.append(None)
        self.database = _database(expressions, [hyperscan.HS_FLAG_CASELESS] * len(expressions))
        # A Hyperscan database has one scratch space: one scan at a time.
        self.lock = threading.Lock()

    def places(self, data: bytes) -> tuple[dict[int, list[int]], list[int]]:
        """Where each rule (by index) could match, and where a field keyword ends."""
        by_rule: dict[int, list[int]] = {}
        keywords: list[int] = []
        for id_, end in _scan(self.database, self.lock, data):
            owner = self.owners[id_]
            if owner is None:
                keywords.append(end)
            else:
                by_rule.setdefault(owner, []).append(end)
        return by_rule, keywords


def _database(expressions: list[bytes], flags: list[int]) -> hyperscan.Database:
    database = hyperscan.Database()
    database.compile(
        expressions=expressions,
        ids=list(range(len(expressions))),
        elements=len(expressions),
        flags=flags,
    )
    return database


def _scan(database: hyperscan.Database, lock: threading.Lock, data: bytes) -> list[tuple[int, int]]:
    """(expression id, end offset) of every match of the database in data."""
    found: list[tuple[int, int]] = []

    def on_match(id_: int, start: int, end: int, flags: int, context: object) -> None:
        found.append((id_, end))

    with lock:
        database.scan(data, match_event_handler=on_match)
    return found


@cache
def _engine() -> _Engine:
    return _Engine([rule for path in RULES_FILES for rule in load_rules(path)])


def load_rules(path: Path) -> list[Rule]:
    """The provider rules of a gitleaks-format TOML file, in Python's regex dialect."""
    rules = []
    for entry in tomllib.loads(path.read_text(encoding="utf-8"))["rules"]:
        triggers = (
            (entry["trigger"],)
            if "trigger" in entry
            else tuple(re.escape(keyword) for keyword in entry["keywords"])
        )
        kind = entry["id"].replace("-", "_")
        rules.append(
            Rule(
                kind=kind,
                pattern=re.compile(
                    go_regex(entry["regex"]).replace(_GITLEAKS_END, _TOKEN_END).encode()
                ),
                triggers=triggers,
                entropy=float(entry.get("entropy", 0.0)),
                window=PRIVATE_KEY_WINDOW if kind == "private_key" else WINDOW,
            )
        )
    return rules


def go_regex(pattern: str) -> str:
    """A Go (RE2) regex as Python's: RE2 lets `(?i)` stand mid-pattern, flagging the rest
    of its group; Python wants `(?i:...)` there. `\\z` is Python's `\\Z`.

    >>> go_regex(r"\\b(SG\\.(?i)[a-z]{66})(?:;|$)")
    '\\\\b(SG\\\\.(?i:[a-z]{66}))(?:;|$)'
    """
    pattern = pattern.replace(r"\z", r"\Z")
    at = pattern.find("(?i)", 1)
    while at > 0:
        depth, end, i = 0, len(pattern), at + 4
        while i < len(pattern):
            char = pattern[i]
            if char == "\\":
                i += 2
                continue
            if char == "[":
                i = pattern.index("]", i + 2)
            elif char == "(":
                depth += 1
            elif char == ")":
                if depth == 0:
                    end = i
                    break
                depth -= 1
            i += 1
        pattern = pattern[:at] + "(?i:" + pattern[at + 4 : end] + ")" + pattern[end:]
        at = pattern.find("(?i)", 1)
    return pattern


def _find(data: bytes, depth: int) -> list[_Span]:
    """Every span to replace in data: the rules' over its bytes, and over the decoded text
    of each JSON string in it with escapes and a place a rule looks at (found in that text
    the same way, so JSON in a string in a string is read too, down to MAX_NESTING)."""
    places = _places(data)
    literals = _escaped_literals(data, places.every())
    if not literals:
        return list(_spans(data, places))
    # Inside such a string only its decoded text counts: a rule over the escaped bytes can
    # stop at an escape (leaving a secret's tail) or begin inside one (breaking it).
    starts = [start for start, _ in literals]
    spans = [span for span in _spans(data, places) if not _cuts(span, literals, starts)]
    if depth == MAX_NESTING:
        return spans + [_Span(start + 1, end - 1, NESTED_KIND) for start, end in literals]
    decoded = _decoded(data, literals)
    spans += _escaped_key_spans(data, literals, decoded)
    offsets = []
    at = 0
    for text in decoded:
        offsets.append(at)
        at += len(text) + 1
    escapes: dict[int, _Escapes] = {}
    # In order, so that each place in a string is found from the one before (_Escapes).
    for inner in sorted(_find(b"\n".join(decoded), depth + 1)):
        i = bisect_right(offsets, inner.start) - 1
        if i not in escapes:
            escapes[i] = _Escapes(data[literals[i][0] + 1 : literals[i][1] - 1], len(decoded[i]))
        span = escapes[i].raw_span(inner, offsets[i], literals[i][0] + 1)
        if span is not None:
            spans.append(span)
    return spans


def _escaped_literals(data: bytes, places: list[int]) -> list[tuple[int, int]]:
    """The JSON strings with escapes that hold one of the places (a match's end), each
    found from a place (_opening_quote, _closing_quote). Decoding any other string
    changes only whitespace, quotes, backslashes and non-ASCII letters, where no rule can
    begin: the places include the escapes that could hide one (`\\u00XX` of a trigger's
    character, `\\/`, an escape after Bearer)."""
    found: list[tuple[int, int]] = []
    floor = 0  # no string that holds a later place begins before this
    for end in places:
        place = end - 1
        if place < floor:
            continue
        quote = _opening_quote(data, floor, place)
        floor = place
        close = _closing_quote(data, quote + 1) if quote >= 0 else -1
        # No line break inside: a stray quote in a log must not pair with one lines away.
        escaped = close >= end and data.find(b"\\", quote, close) >= 0
        if escaped and data.find(b"\n", quote, close) < 0:
            found.append((quote, close + 1))
            floor = close + 1
    return found


def _opening_quote(data: bytes, floor: int, place: int) -> int:
    """The last quote in data[floor:place] after one of the bytes that come before a JSON
    string (or at the start), or -1. A quote inside a string has a backslash before it,
    so in JSON this is the opening quote of the string `place` is in. Looked for in C, in
    reversed windows growing from `place`: a long string may hold a million \\" first."""
    reach = 4096
    while True:
        start = max(floor, place - reach)
        found = _REVERSED_OPENING.search(data[start:place][::-1])
        if found is not None:
            return place - 1 - found.start()
        if start == floor:
            return 0 if floor == 0 and data.startswith(b'"') else -1
        reach *= 8


def _closing_quote(data: bytes, start: int) -> int:
    """The first quote from `start` (just inside a string) on that no backslash escapes,
    or -1: in C, as a long string may hold a million \\" first."""
    bare = _BARE_QUOTE.search(data, start)
    limit = bare.start() if bare is not None else len(data)
    after_backslashes = data.find(b'\\\\"', start, limit)  # an escaped backslash, then?
    while after_backslashes >= 0:
        quote = after_backslashes + 2
        if not _escaped(data, quote, start):
            return quote
        after_backslashes = data.find(b'\\\\"', quote, limit)
    return limit if bare is not None else -1


def _escaped(data: bytes, at: int, floor: int = 0) -> bool:
    """Whether an odd run of backslashes (from `floor` on) ends just before `at`. Counted a
    chunk at a time in C: a string nested deep has tens of thousands before a quote."""
    run = 0
    while at > floor:
        chunk = data[max(floor, at - 4096) : at]
        kept = len(chunk.rstrip(b"\\"))
        run += len(chunk) - kept
        if kept:
            break
        at -= len(chunk)
    return run % 2 == 1


def _cuts(span: _Span, literals: list[tuple[int, int]], starts: list[int]) -> bool:
    """Whether the span begins or ends inside one of the literals' content (a span over
    all of a content, or around whole literals, does not)."""
    for place in (span.start, span.end):
        i = bisect_right(starts, place - 1) - 1
        if i >= 0 and literals[i][0] + 1 < place < literals[i][1] - 1:
            return True
    return False


def _decoded(data: bytes, literals: list[tuple[int, int]]) -> list[bytes]:
    """The text of each literal as a JSON parser reads it (UTF-8; a lone surrogate kept as
    its three bytes), all parsed in one call when they are all valid JSON."""
    raw = [data[start:end] for start, end in literals]
    try:
        texts = json.loads(b"[" + b",".join(raw) + b"]", strict=False)
    except ValueError:  # an escape JSON does not know, or bytes that are not UTF-8
        return [_unescape(literal[1:-1]) for literal in raw]
    return [text.encode("utf-8", "surrogatepass") for text in texts]


def _escaped_key_spans(
    data: bytes, literals: list[tuple[int, int]], decoded: list[bytes]
) -> Iterator[_Span]:
    """Values of secret-named fields whose name has escapes (`"pass\\u0077ord": ...`)."""
    for (_, end), name in zip(literals, decoded, strict=True):
        colon = _KEY_COLON.match(data, end) if len(name) <= KEY_CHARS else None
        kind = _field_kind(name) if colon else None
        value = _json_value(data, colon.end()) if colon and kind else None
        if kind and value is not None:
            yield _Span(value[0], value[1], kind, rank=1, quote=value[2])


class _Escapes:
    """One JSON string's escaped bytes, and where places of its decoded text are in them:
    to carry a span found in the text back onto whole escapes. A place is found from the
    nearest one found before, by decoding the bytes between in chunks (json, in C), not
    escape by escape: one string can hold millions of escapes."""

    def __init__(self, raw: bytes, size: int) -> None:
        self.raw = raw
        self.size = size
        """The decoded text's length."""
        self.known, self.known_raw = [0], [0]  # places found so far, in the text and raw

    def raw_span(self, span: _Span, offset: int, content: int) -> _Span | None:
        """The span (found at `offset` in a text of joined strings) over this string's
        escaped bytes (which start at `content`), widened to whole escapes."""
        start, end = span.start - offset, min(span.end - offset, self.size)
        if start >= end:
            return None  # on the line break that joins the strings
        return _Span(
            content + self._raw(start, wide=False),
            content + self._raw(end, wide=True),
            span.kind,
            span.rank,
            span.quote,
            span.escape + 1,
        )

    def _raw(self, place: int, wide: bool) -> int:
        """Where the text's byte `place` begins in the raw bytes; inside the bytes that one
        escape decodes to, that escape's start (or, wide, its end)."""
        raw = self.raw
        i = bisect_right(self.known, place) - 1
        text_at, at = self.known[i], self.known_raw[i]
        while text_at < place:
            # No raw byte decodes to more than one: this many raw bytes never pass `place`.
            end = _escape_boundary(raw, at, min(len(raw), at + place - text_at))
            if end > at:
                text_at += _text_size(raw[at:end])
                at = end
                continue
            escape = _ESCAPE.match(raw, at)  # one escape, longer than what is left
            if escape is None or escape.lastindex is None:
                text_at, at = text_at + 1, at + 1  # one JSON does not know: byte for byte
                continue
            size = len(_unescaped(escape))
            if text_at + size > place:
                return escape.end() if wide else at
            text_at, at = text_at + size, escape.end()
        self.known.insert(i + 1, place)
        self.known_raw.insert(i + 1, at)
        return at


def _escape_boundary(raw: bytes, start: int, end: int) -> int:
    """end, or the start of the escape it would cut (a surrogate pair is one escape);
    start is where one begins."""
    look = max(start, end - 12)
    backslash = raw.rfind(b"\\", look, end)
    while backslash >= look:
        if not _escaped(raw, backslash, start):
            pair = backslash - 6  # this one may be the second half of a pair
            if pair >= start and not _escaped(raw, pair, start):
                first = _ESCAPE.match(raw, pair)
                backslash = pair if first is not None and first.lastindex == 2 else backslash
            escape = _ESCAPE.match(raw, backslash)
            return backslash if escape is not None and escape.end() > end else end
        backslash = raw.rfind(b"\\", look, backslash)
    return end


def _text_size(raw: bytes) -> int:
    """The length of whole escaped bytes decoded, in C where they are JSON."""
    try:
        return len(json.loads(b'"' + raw + b'"', strict=False).encode("utf-8", "surrogatepass"))
    except ValueError:
        return len(_unescape(raw))


def _unescape(raw: bytes) -> bytes:
    """A JSON string's content decoded (leniently: an escape JSON does not know stands for
    itself), as json.loads reads it, in UTF-8 with a lone surrogate kept as its 3 bytes."""
    return _ESCAPE.sub(_unescaped, raw)


def _unescaped(match: re.Match[bytes]) -> bytes:
    if match.lastindex == 4:
        return _ESCAPED_CHAR[match[4]]
    if match.lastindex == 2:  # a surrogate pair: one character
        code = 0x10000 + ((int(match[1], 16) - 0xD800) << 10) + int(match[2], 16) - 0xDC00
    elif match.lastindex == 3:
        code = int(match[3], 16)
    else:
        return match[0]
    return chr(code).encode("utf-8", "surrogatepass")


@dataclass(frozen=True)
class _Places:
    """Where each rule could match (ends of Hyperscan's matches), and where an escape
    could hide such a place."""

    by_rule: dict[int, list[int]]
    keywords: list[int]
    urls: list[int]
    headers: list[int]
    escapes: list[int]

    def every(self) -> list[int]:
        ends = [*self.keywords, *self.urls, *self.headers, *self.escapes]
        for rule_ends in self.by_rule.values():
            ends += rule_ends
        return sorted(ends)


def _places(data: bytes) -> _Places:
    by_rule, keywords = _engine().places(data)
    urls: list[int] = []
    headers: list[int] = []
    escapes: list[int] = []
    for id_, end in _scan(_header_database(), _header_lock, data):
        (urls if id_ == 0 else headers if id_ < _ESCAPE_HINTS else escapes).append(end)
    return _Places(by_rule, keywords, urls, headers, escapes)


def _spans(data: bytes, places: _Places) -> Iterator[_Span]:
    engine = _engine()
    for index, ends in places.by_rule.items():
        rule = engine.rules[index]
        for start, end in _windows(ends, rule.window, len(data)):
            for match in rule.pattern.finditer(data, start, end):
                span = _secret_span(match)
                if span is None:
                    continue
                if rule.entropy and _entropy(data[span[0] : span[1]]) < rule.entropy:
                    continue
                yield _Span(span[0], _word_end(data, span[1]), rule.kind)
    for start, end in _windows(places.keywords, KEY_CHARS + 16, len(data)):
        yield from _field_spans(data, start, end)
    yield from _url_and_header_spans(data, places)


def _windows(ends: list[int], reach: int, size: int) -> Iterator[tuple[int, int]]:
    """Merged byte ranges of `reach` either side of each place."""
    start = end = -1
    for place in sorted(ends):
        lo, hi = max(0, place - reach), min(size, place + reach)
        if lo > end:
            if end >= 0:
                yield start, end
            start = lo
        end = max(end, hi)
    if end >= 0:
        yield start, end


def _secret_span(match: re.Match[bytes]) -> tuple[int, int] | None:
    """The secret in a rule's match: its first group that matched, else all of it."""
    for group in range(1, match.re.groups + 1):
        if match.end(group) > match.start(group) >= 0:
            return match.start(group), match.end(group)
    return (match.start(), match.end()) if match.end() > match.start() else None


def _word_end(data: bytes, end: int) -> int:
    """A secret's end moved past the token characters that follow it: a rule of fixed
    length must not leave the tail of a longer token behind."""
    if not end or not _TOKEN_TAIL.match(data, end - 1):
        return end
    match = _TOKEN_TAIL.match(data, end)
    return match.end() if match else end


_TOKEN_TAIL = re.compile(rb"[A-Za-z0-9_\-]+")


def _entropy(secret: bytes) -> float:
    """Shannon entropy in bits per byte, of the first 64 bytes: gitleaks' thresholds
    (2 to 4.5) are far below what 64 bytes can show (6), and a long token costs no more."""
    secret = secret[:64]
    size = len(secret)
    return math.log2(size) - sum(n * math.log2(n) for n in Counter(secret).values()) / size


def _field_kind(name: bytes) -> str | None:
    """The kind of a secret-named field, or None when the name is no secret's."""
    if not _SECRET_NAME.search(name) or _NOT_SECRET_NAME.search(name):
        return None
    return next((kind for pattern, kind in _KIND_BY_NAME if pattern.search(name)), "secret")


def _field_spans(data: bytes, start: int, end: int) -> Iterator[_Span]:
    """Values of secret-named fields whose name lies in data[start:end]."""
    for match in _JSON_KEY.finditer(data, start, end):
        kind = _field_kind(match[1])
        if kind is None:
            continue
        value = _json_value(data, match.end())
        if value is not None:
            yield _Span(value[0], value[1], kind, rank=1, quote=value[2])
    for match in _ASSIGNMENT.finditer(data, start, end):
        kind = _field_kind(match[1])
        assigned = _ASSIGNED_VALUE.match(data, match.end()) if kind else None
        group = next((g for g in (1, 2, 3) if assigned and assigned[g]), None)
        if kind is None or assigned is None or group is None:
            continue
        if assigned[group].startswith(MARK) or assigned[group] in _NOT_VALUES:
            continue
        yield _Span(assigned.start(group), assigned.end(group), kind, rank=2)


def _json_value(data: bytes, at: int) -> tuple[int, int, bool] | None:
    """The span of the JSON value at `at`: (start, end, whether it needs quotes).
    Strings lose only their content; numbers, objects and arrays become a string;
    true, false and null stay (they hold no secret)."""
    head = data[at : at + 1]
    if head == b'"':
        match = _JSON_STRING.match(data, at)
        if not match or data.startswith(MARK, at + 1):
            return None
        return match.start() + 1, match.end() - 1, False
    if head in (b"{", b"["):
        depth = 0
        for token in _JSON_TOKEN.finditer(data, at):
            if token[0] in (b"{", b"["):
                depth += 1
            elif token[0] in (b"}", b"]"):
                depth -= 1
                if depth == 0:
                    return at, token.end(), True
        return None
    match = _JSON_NUMBER.match(data, at)
    return (at, match.end(), True) if match else None


def _url_and_header_spans(data: bytes, places: _Places) -> Iterator[_Span]:
    """Passwords in URLs, and Authorization headers' credentials, found by their own
    Hyperscan pass (their anchors, "://" and "bearer", are too common to look around)."""
    for start, end in _windows(places.urls, 600, len(data)):
        for match in _URL_CREDENTIALS.finditer(data, start, end):
            if not match[1].startswith(MARK):
                yield _Span(match.start(1), match.end(1), "url_password", rank=3)
    for start, end in _windows(places.headers, 300, len(data)):
        for match in _AUTHORIZATION.finditer(data, start, end):
            if match[2].startswith(MARK):
                continue
            scheme = (match[1] or b"").lower()
            kind = {b"bearer": "bearer_token", b"basic": "basic_auth"}.get(scheme, "authorization")
            yield _Span(match.start(2), match.end(2), kind, rank=3)
        for pattern, kind, check in _BARE_SCHEMES:
            for match in pattern.finditer(data, start, end):
                if not match[1].startswith(MARK) and check(match[1]):
                    yield _Span(match.start(1), match.end(1), kind, rank=3)


def _basic_credentials(token: bytes) -> bool:
    """A Basic scheme's token is base64 of user:password."""
    try:
        return b":" in base64.b64decode(token + b"=" * (-len(token) % 4), validate=True)
    except (binascii.Error, ValueError):
        return False


_BARE_SCHEMES: tuple[tuple[re.Pattern[bytes], str, Callable[[bytes], bool]], ...] = (
    (_BEARER, "bearer_token", lambda token: _entropy(token) >= 3.0),
    (_BASIC, "basic_auth", _basic_credentials),
)


_ESCAPE_HINTS = 4
"""The header database's expressions from this index on are escapes that could hide a
place some rule looks at, in a JSON string (see _escaped_literals)."""
_TRIGGER_CHARS = " -./:=@_~0123456789ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz"
"""Every character of the rules' triggers, and of a URL's credentials ("://", ":", "@")."""


@cache
def _header_database() -> hyperscan.Database:
    caseless = hyperscan.HS_FLAG_CASELESS
    # From _ESCAPE_HINTS: the escapes that could hide a trigger's character, as literals
    # (one pattern over "\\u00" costs a fifth of the whole scan where that is frequent).
    hints = [re.escape(b"\\u%04x" % ord(char)) for char in _TRIGGER_CHARS]
    expressions = [
        rb"://[^\s/@\"'<>]*:[^\s/@\"'<>]*@",
        rb"authori[sz]ation",
        rb"bearer\s",
        rb"Basic\s",
        *hints,
        rb"\\/",
        rb"bearer\\",
        rb"basic\\",
    ]
    flags = [caseless, caseless, caseless, 0, *[caseless] * len(hints), 0, caseless, caseless]
    return _database(expressions, flags)


_header_lock = threading.Lock()


# Replacing


def _apply(data: bytes, spans: list[_Span]) -> tuple[bytes, Counter[str]]:
    """data with each span replaced; of overlapping spans the first (then longest) wins,
    and reaches as far as the longest of them: no tail of a secret is left."""
    counts: Counter[str] = Counter()
    if not spans:
        return data, counts
    spans.sort(key=lambda s: (s.start, -s.end, s.rank))
    out: list[bytes] = []
    at = 0
    last: _Span | None = None
    for span in spans:
        start, end = span.start, _whole_escapes(data, span.start, span.end)
        if start < at:
            # A JSON value's replacement is a whole string: it is not widened.
            if last is not None and not (last.quote or span.quote):
                at = max(at, end)
            continue
        if end <= start:
            continue
        mark = MARK + span.kind.encode() + b"]"
        out += [data[at:start], _quoted(mark, span.escape) if span.quote else mark]
        at, last = end, span
        counts[span.kind] += 1
    out.append(data[at:])
    return b"".join(out), counts


def _whole_escapes(data: bytes, start: int, end: int) -> int:
    """The span's end moved back off a trailing backslash: never cut a JSON escape in two
    (that backslash would escape the quote after)."""
    while end > start and _escaped(data, end, start):
        end -= 1
    return end


def _quoted(mark: bytes, escape: int) -> bytes:
    """The mark as a JSON string, escaped for each string it is inside."""
    text = b'"' + mark + b'"'
    for _ in range(escape):
        text = text.replace(b"\\", b"\\\\").replace(b'"', b'\\"')
    return text


def _redact_csv_columns(data: bytes) -> tuple[bytes, Counter[str]]:
    """CSV whose header names a secret column: every value of that column replaced.

    Only a payload whose first line reads as a header (two or more comma-separated
    names, each a short identifier-like name) and whose second line has as many fields
    is parsed as CSV, so that a log line with a comma is not taken for one."""
    counts: Counter[str] = Counter()
    lines = data.split(b"\n", 2)
    if len(lines) < 2 or not _CSV_HEADER.match(lines[0]):
        return data, counts
    try:
        text = data.decode("utf-8")
        header, second = (next(csv.reader([line.decode().rstrip("\r")])) for line in lines[:2])
    except (UnicodeDecodeError, csv.Error, StopIteration):
        return data, counts
    columns = {i: _field_kind(name.encode()) for i, name in enumerate(header)}
    secret = {i: kind for i, kind in columns.items() if kind}
    if not secret or len(second) != len(header):
        return data, counts
    line_end = "\r\n" if lines[0].endswith(b"\r") else "\n"
    out = io.StringIO()
    writer = csv.writer(out, lineterminator=line_end)
    for number, row in enumerate(csv.reader(io.StringIO(text))):
        for i, kind in secret.items():
            if number and i < len(row) and row[i] and not row[i].startswith("[REDACTED:"):
                row[i] = f"[REDACTED:{kind}]"
                counts[kind] += 1
        writer.writerow(row)
    result = out.getvalue()
    if not text.endswith("\n"):
        result = result[: -len(line_end)]
    return result.encode("utf-8"), counts


_CSV_HEADER = re.compile(rb'^"?[A-Za-z_][\w .\-]{0,63}"?(?:,"?[A-Za-z_][\w .\-]{0,63}"?)+\r?$')
